-- 0043 launch processes: what the node backend worker, the node gateway and the agents need around the
-- launch core (0040–0042).
--
--   * report_node_probe: the agents' peer-network probe port (reported on every control session), which
--     begin_prepare (0042) puts in PREPARE's peers;
--   * abort_launch: a worker that cannot build the capsule aborts the attempt (fenced by its epoch);
--   * requeue_stalled_launches: a `launch` job lost by pgqueuer (a handler that failed terminally is
--     deleted) is enqueued again while its attempt is still `reserved`;
--   * node_may_read_capsule: the gateway serves a capsule only to a node holding a member that uses it;
--   * issue_member_telemetry_token: an agent gets a telemetry token for one of its members; the agent
--     makes the secret, only its hash reaches the database;
--   * placement_fleets: the node-backend fleets that have queued jobs (the scheduler loop's work list).

-- report_node_probe (report kind `probe`): the agent's probe port and, optionally, the address peers
-- should use for it (default: the address the gateway saw). p_payload: {"port": 41234, "address": "10.0.0.5"}
CREATE FUNCTION tuneplane.report_node_probe(p_node_id bigint, p_epoch bigint, p_payload jsonb)
RETURNS jsonb
LANGUAGE plpgsql AS $$
DECLARE
    n tuneplane.nodes;
BEGIN
    PERFORM tuneplane.require_node_session(p_node_id, p_epoch);
    IF jsonb_typeof(p_payload -> 'port') IS DISTINCT FROM 'number'
       OR (p_payload ->> 'port')::integer NOT BETWEEN 1 AND 65535 THEN
        RAISE EXCEPTION 'probe report needs a port between 1 and 65535' USING ERRCODE = 'TP400', COLUMN = 'port';
    END IF;
    UPDATE tuneplane.nodes
       SET probe_port = (p_payload ->> 'port')::integer,
           address = coalesce(nullif(p_payload ->> 'address', ''), address)
     WHERE id = p_node_id
    RETURNING * INTO n;
    RETURN jsonb_build_object('address', n.address, 'probe_port', n.probe_port);
END;
$$;

-- abort_launch: the worker holding the launch lease (epoch) could not build the capsule: ABORT the
-- attempt with that reason (reserved → aborted, resources released; the job is retried or fails by
-- its max_attempts). Refuses a stale epoch (409). Returns false when a decision already existed.
CREATE FUNCTION tuneplane.abort_launch(p_attempt_id bigint, p_epoch bigint, p_reason text)
RETURNS boolean
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM tuneplane.require_launch_epoch(p_attempt_id, p_epoch);
    RETURN tuneplane.decide_abort(p_attempt_id,
        'the capsule could not be built: ' || coalesce(nullif(p_reason, ''), 'no reason given'));
END;
$$;

-- requeue_stalled_launches: enqueue `launch` again for attempts still `reserved` after p_older_than whose
-- pgqueuer job is gone (pgqueuer deletes a job whose handler failed). The dedupe key makes it a no-op
-- while the job is queued or picked (a crashed worker's picked job is re-picked by pgqueuer itself).
CREATE FUNCTION tuneplane.requeue_stalled_launches(p_older_than interval DEFAULT interval '10 seconds')
RETURNS integer
LANGUAGE plpgsql AS $$
DECLARE
    v_count integer;
BEGIN
    INSERT INTO public.pgqueuer (priority, status, entrypoint, payload, dedupe_key)
    SELECT greatest(least(j.priority, 1000), -1000), 'queued', 'launch',
           convert_to(jsonb_build_object('attempt_id', a.id)::text, 'UTF8'), 'launch:' || a.id
      FROM tuneplane.attempts a JOIN tuneplane.jobs j ON j.id = a.job_id
     WHERE a.state = 'reserved' AND a.created_at < now() - p_older_than
       AND NOT EXISTS (SELECT 1 FROM public.pgqueuer q
                        WHERE q.dedupe_key = 'launch:' || a.id AND q.status IN ('queued', 'picked'))
    ON CONFLICT DO NOTHING;
    GET DIAGNOSTICS v_count = ROW_COUNT;
    RETURN v_count;
END;
$$;

-- node_may_read_capsule: true when the node holds a member (resources not released) of an attempt whose
-- capsule is p_digest. The gateway's `capsule` file provider serves nothing else.
CREATE FUNCTION tuneplane.node_may_read_capsule(p_node_id bigint, p_digest text)
RETURNS boolean
LANGUAGE sql STABLE AS $$
    SELECT EXISTS (SELECT 1 FROM tuneplane.members m JOIN tuneplane.attempts a ON a.id = m.attempt_id
                    WHERE m.node_id = p_node_id AND m.released_at IS NULL AND a.capsule_digest = p_digest);
$$;

-- issue_member_telemetry_token (report kind `telemetry_token`): the agent made a token for one of its
-- members (starting or running) and sends only its sha256; the token may write that member's telemetry
-- only. p_payload: {"member_id": 1, "token_hash": "…64 hex…"}. Refuses another node's member (404), a
-- member that is not starting/running (409) and a malformed hash (400, issue_telemetry_token).
CREATE FUNCTION tuneplane.issue_member_telemetry_token(p_node_id bigint, p_epoch bigint, p_payload jsonb)
RETURNS jsonb
LANGUAGE plpgsql AS $$
DECLARE
    m tuneplane.members;
    a tuneplane.attempts;
    t tuneplane.telemetry_tokens;
BEGIN
    PERFORM tuneplane.require_node_session(p_node_id, p_epoch);
    m := tuneplane.member_of_node(p_node_id, (p_payload ->> 'member_id')::bigint);
    IF m.state NOT IN ('starting', 'running') THEN
        RAISE EXCEPTION 'member % is %, not starting or running: no telemetry token', m.id, m.state
            USING ERRCODE = 'TP409', COLUMN = 'member_id';
    END IF;
    SELECT * INTO a FROM tuneplane.attempts WHERE id = m.attempt_id;
    SELECT * INTO t FROM tuneplane.telemetry_tokens WHERE token_hash = p_payload ->> 'token_hash';
    IF t.id IS NULL THEN
        t := tuneplane.issue_telemetry_token(m.job_id, a.number, m.rank, p_payload ->> 'token_hash');
    ELSIF (t.job_id, t.attempt, t.member_rank) IS DISTINCT FROM (m.job_id, a.number, m.rank) THEN
        RAISE EXCEPTION 'that token hash is already in use' USING ERRCODE = 'TP409', COLUMN = 'token_hash';
    END IF;
    RETURN jsonb_build_object('token_id', t.id, 'job_id', t.job_id, 'attempt', t.attempt,
                              'member_rank', t.member_rank, 'expires_at', t.expires_at);
END;
$$;

-- placement_fleets: fleets of a backend with at least one queued job (what a scheduler pass visits).
CREATE FUNCTION tuneplane.placement_fleets(p_backend text)
RETURNS TABLE (fleet_id bigint, queued integer)
LANGUAGE sql STABLE AS $$
    SELECT j.fleet_id, count(*)::integer
      FROM tuneplane.jobs j JOIN tuneplane.fleets f ON f.id = j.fleet_id
     WHERE j.state = 'queued' AND f.backend = p_backend
     GROUP BY j.fleet_id
     ORDER BY j.fleet_id;
$$;

-- v_launches: live attempts with their worker lease, capsule and decision (operators).
CREATE VIEW tuneplane.v_launches AS
SELECT a.job_id, a.number AS attempt, a.id AS attempt_id, a.state, a.reason, a.launch_owner, a.launch_epoch,
       a.capsule_digest, d.decision, d.reason AS decision_reason, a.prepare_deadline, a.created_at,
       a.committed_at, a.running_at
  FROM tuneplane.attempts a
  LEFT JOIN tuneplane.launch_decisions d ON d.attempt_id = a.id
 WHERE a.state IN ('reserved', 'preparing', 'running', 'stopping');
