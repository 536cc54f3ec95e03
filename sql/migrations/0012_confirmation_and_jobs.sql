-- 0012 confirmation and jobs: a preview + its digest + a retry key become exactly one queued job, and
-- the functions through which users (their own jobs) and admins (all jobs) read them.

-- v_jobs: one row per job with its owner, fleet, digest and the retry key that created it (operators).
CREATE VIEW tuneplane.v_jobs AS
SELECT j.id,
       j.owner_id,
       u.username AS owner,
       j.preview_id,
       p.digest,
       c.retry_key,
       j.fleet_id,
       f.name AS fleet,
       f.backend,
       j.state,
       j.state_reason,
       j.priority,
       j.nodes,
       j.gpus_per_node,
       j.nodes * j.gpus_per_node AS total_gpus,
       j.cpus_per_node,
       j.memory_per_node,
       j.max_attempts,
       j.spec -> 'input' ->> 'kind' AS input_kind,
       CASE j.spec -> 'input' ->> 'kind'
           WHEN 'recipe' THEN 'recipe ' || (j.spec -> 'input' ->> 'name')
           WHEN 'source' THEN 'source ' || left(j.spec -> 'input' -> 'archive' ->> 'sha256', 12)
                              || ': ' || (j.spec -> 'input' ->> 'entrypoint')
           WHEN 'image' THEN (j.spec -> 'input' ->> 'image') || ': ' || (j.spec -> 'input' ->> 'command')
       END AS input_summary,
       j.spec,
       j.created_at,
       j.updated_at
  FROM tuneplane.jobs j
  JOIN tuneplane.users u ON u.id = j.owner_id
  JOIN tuneplane.fleets f ON f.id = j.fleet_id
  JOIN tuneplane.previews p ON p.id = j.preview_id
  LEFT JOIN tuneplane.confirmations c ON c.job_id = j.id;

-- confirm_preview: preview (owned by the actor) + digest + retry key → a receipt.
-- From nothing to a job in `queued` (with an event saying it waits for resources); NOTIFY
-- tuneplane_job_queued wakes placement, which also polls.
-- Idempotent: the same key with the same preview, or with another preview of the same digest (the same
-- resolved content, e.g. `tuneplane submit` run twice), returns the first receipt (replayed = true),
-- even after the preview expired. The retry key is claimed by the confirmations primary key before the
-- job is written, so N concurrent identical confirmations make one job.
-- Refuses: a malformed key or digest (400), a preview that is not the actor's (404), a digest that does
-- not match (409), the key already used for a preview with other content (409), a preview already
-- confirmed under another key (409), an expired preview (410).
CREATE FUNCTION tuneplane.confirm_preview(p_actor_id bigint, p_preview_id uuid, p_digest text, p_retry_key text)
RETURNS TABLE (job_id bigint, preview_id uuid, digest text, retry_key text, state text, state_reason text,
               created_at timestamptz, replayed boolean)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    v_preview tuneplane.previews;
    v_conf    tuneplane.confirmations;
    v_job_id  bigint;
    v_res     jsonb;
    v_other   record;
BEGIN
    IF p_retry_key IS NULL OR p_retry_key !~ '^[A-Za-z0-9._:-]{1,200}$' THEN
        RAISE EXCEPTION 'retry key must be 1-200 characters of A-Z a-z 0-9 . _ : -'
            USING ERRCODE = 'TP400', COLUMN = 'retry_key';
    END IF;
    IF p_digest IS NULL OR p_digest !~ '^[0-9a-f]{64}$' THEN
        RAISE EXCEPTION 'digest must be the preview''s 64-character sha256 hex digest'
            USING ERRCODE = 'TP400', COLUMN = 'digest';
    END IF;
    SELECT p.* INTO v_preview FROM tuneplane.previews p WHERE p.id = p_preview_id AND p.owner_id = p_actor_id;
    IF v_preview.id IS NULL THEN
        RAISE EXCEPTION 'no preview % of yours', p_preview_id USING ERRCODE = 'TP404', COLUMN = 'preview_id';
    END IF;
    IF v_preview.digest <> p_digest THEN
        RAISE EXCEPTION 'digest does not match preview %: what you confirm is not what was previewed', p_preview_id
            USING ERRCODE = 'TP409', COLUMN = 'digest';
    END IF;

    SELECT c.* INTO v_conf FROM tuneplane.confirmations c
     WHERE c.owner_id = p_actor_id AND c.retry_key = p_retry_key;
    IF v_conf.job_id IS NULL THEN
        IF v_preview.expires_at <= now() THEN
            RAISE EXCEPTION 'preview % expired at %; preview the job again', p_preview_id, v_preview.expires_at
                USING ERRCODE = 'TP410', COLUMN = 'preview_id';
        END IF;
        v_job_id := nextval(pg_get_serial_sequence('tuneplane.jobs', 'id'));
        -- Claim the key. A concurrent holder makes this wait for its commit, then do nothing.
        INSERT INTO tuneplane.confirmations (owner_id, retry_key, preview_id, digest, job_id)
        VALUES (p_actor_id, p_retry_key, p_preview_id, p_digest, v_job_id)
        ON CONFLICT ON CONSTRAINT confirmations_pkey DO NOTHING;
        IF FOUND THEN
            v_res := v_preview.resolved -> 'resources';
            INSERT INTO tuneplane.jobs (id, owner_id, preview_id, fleet_id, state, state_reason, priority,
                                        nodes, gpus_per_node, cpus_per_node, memory_per_node, max_attempts, spec)
            VALUES (v_job_id, p_actor_id, p_preview_id, v_preview.fleet_id, 'queued',
                    format('waiting for resources: %s × (%s GPU, %s CPU, %s) on fleet %s',
                           (v_res ->> 'nodes')::integer, (v_res ->> 'gpus_per_node')::integer,
                           (v_res ->> 'cpus_per_node')::integer,
                           tuneplane.format_bytes((v_res ->> 'memory_per_node')::bigint),
                           v_preview.resolved -> 'fleet' ->> 'name'),
                    (v_preview.resolved ->> 'priority')::integer,
                    (v_res ->> 'nodes')::integer, (v_res ->> 'gpus_per_node')::integer,
                    (v_res ->> 'cpus_per_node')::integer, (v_res ->> 'memory_per_node')::bigint,
                    (v_preview.resolved ->> 'max_attempts')::integer, v_preview.resolved)
            ON CONFLICT (preview_id) DO NOTHING;
            IF NOT FOUND THEN
                SELECT j.id, c.retry_key INTO v_other
                  FROM tuneplane.jobs j JOIN tuneplane.confirmations c ON c.job_id = j.id
                 WHERE j.preview_id = p_preview_id;
                RAISE EXCEPTION 'preview % was already confirmed as job % with another retry key (%)',
                    p_preview_id, v_other.id, v_other.retry_key
                    USING ERRCODE = 'TP409', COLUMN = 'retry_key';
            END IF;
            PERFORM pg_notify('tuneplane_job_queued', v_job_id::text);
            RETURN QUERY
                SELECT j.id, j.preview_id, p_digest, p_retry_key, j.state, j.state_reason, j.created_at, false
                  FROM tuneplane.jobs j WHERE j.id = v_job_id;
            RETURN;
        END IF;
        -- Lost the race for this key: read the winner's committed row (a new statement, a new snapshot).
        SELECT c.* INTO v_conf FROM tuneplane.confirmations c
         WHERE c.owner_id = p_actor_id AND c.retry_key = p_retry_key;
    END IF;

    IF v_conf.preview_id <> p_preview_id AND v_conf.digest <> p_digest THEN
        RAISE EXCEPTION 'retry key % was already used to confirm preview % (job %); a different preview needs a new retry key',
            p_retry_key, v_conf.preview_id, v_conf.job_id
            USING ERRCODE = 'TP409', COLUMN = 'retry_key';
    END IF;
    RETURN QUERY
        SELECT j.id, j.preview_id, v_conf.digest, v_conf.retry_key, j.state, j.state_reason, j.created_at, true
          FROM tuneplane.jobs j WHERE j.id = v_conf.job_id;
END;
$$;

-- list_jobs: the actor's jobs (an admin's: everyone's), newest first, optionally by state; at most 500.
CREATE FUNCTION tuneplane.list_jobs(p_actor_id bigint, p_state text DEFAULT NULL, p_limit integer DEFAULT 100,
                                    p_before_id bigint DEFAULT NULL)
RETURNS SETOF tuneplane.v_jobs
LANGUAGE plpgsql STABLE AS $$
DECLARE
    actor tuneplane.users;
BEGIN
    SELECT * INTO actor FROM tuneplane.users WHERE id = p_actor_id AND disabled_at IS NULL;
    IF actor.id IS NULL THEN
        RAISE EXCEPTION 'no such active user' USING ERRCODE = 'TP401', COLUMN = 'user';
    END IF;
    IF p_state IS NOT NULL
       AND p_state NOT IN ('queued', 'reserved', 'preparing', 'running', 'succeeded', 'failed', 'cancelled') THEN
        RAISE EXCEPTION 'state must be one of queued, reserved, preparing, running, succeeded, failed, cancelled'
            USING ERRCODE = 'TP400', COLUMN = 'state';
    END IF;
    RETURN QUERY
        SELECT v.* FROM tuneplane.v_jobs v
         WHERE (actor.role = 'admin' OR v.owner_id = actor.id)
           AND (p_state IS NULL OR v.state = p_state)
           AND (p_before_id IS NULL OR v.id < p_before_id)
         ORDER BY v.id DESC
         LIMIT least(greatest(coalesce(p_limit, 100), 1), 500);
END;
$$;

-- get_job: one job its owner (or an admin) may see; 404 for anyone else (existence is not leaked).
CREATE FUNCTION tuneplane.get_job(p_actor_id bigint, p_job_id bigint)
RETURNS SETOF tuneplane.v_jobs
LANGUAGE plpgsql STABLE AS $$
BEGIN
    RETURN QUERY
        SELECT v.* FROM tuneplane.v_jobs v, tuneplane.users a
         WHERE v.id = p_job_id AND a.id = p_actor_id AND a.disabled_at IS NULL
           AND (a.role = 'admin' OR v.owner_id = a.id);
    IF NOT FOUND THEN
        RAISE EXCEPTION 'no job % of yours', p_job_id USING ERRCODE = 'TP404', COLUMN = 'job_id';
    END IF;
END;
$$;

-- job_events_of: a visible job's events, oldest first.
CREATE FUNCTION tuneplane.job_events_of(p_actor_id bigint, p_job_id bigint)
RETURNS SETOF tuneplane.job_events
LANGUAGE plpgsql STABLE AS $$
BEGIN
    PERFORM 1 FROM tuneplane.get_job(p_actor_id, p_job_id);
    RETURN QUERY SELECT e.* FROM tuneplane.job_events e WHERE e.job_id = p_job_id ORDER BY e.id;
END;
$$;

-- job_transition: moves a job from p_from to p_to with a reason; the jobs trigger writes the event
-- (with p_detail). Refuses (409) when the job is not in p_from or would leave a terminal state.
-- For placement, launch and cancellation functions to build on; enqueues nothing itself.
CREATE FUNCTION tuneplane.job_transition(p_job_id bigint, p_from text, p_to text, p_reason text,
                                         p_detail jsonb DEFAULT '{}'::jsonb)
RETURNS tuneplane.jobs
LANGUAGE plpgsql AS $$
DECLARE
    result tuneplane.jobs;
    v_now  text;
BEGIN
    IF coalesce(p_reason, '') = '' THEN
        RAISE EXCEPTION 'a transition needs a reason' USING ERRCODE = 'TP400', COLUMN = 'reason';
    END IF;
    PERFORM set_config('tuneplane.event_detail', coalesce(p_detail, '{}'::jsonb)::text, true);
    UPDATE tuneplane.jobs SET state = p_to, state_reason = p_reason
     WHERE id = p_job_id AND state = p_from
    RETURNING * INTO result;
    PERFORM set_config('tuneplane.event_detail', '', true);
    IF result.id IS NULL THEN
        SELECT state INTO v_now FROM tuneplane.jobs WHERE id = p_job_id;
        RAISE EXCEPTION 'job % is %, not %', p_job_id, coalesce(v_now, 'missing'), p_from
            USING ERRCODE = CASE WHEN v_now IS NULL THEN 'TP404' ELSE 'TP409' END, COLUMN = 'state';
    END IF;
    RETURN result;
END;
$$;

-- explain_job: a new reason for a job that stays in p_state (why it still waits); an event only when the
-- reason really changes. Returns false when the job is no longer in p_state.
CREATE FUNCTION tuneplane.explain_job(p_job_id bigint, p_state text, p_reason text)
RETURNS boolean
LANGUAGE plpgsql AS $$
BEGIN
    IF coalesce(p_reason, '') = '' THEN
        RAISE EXCEPTION 'a reason cannot be empty' USING ERRCODE = 'TP400', COLUMN = 'reason';
    END IF;
    UPDATE tuneplane.jobs SET state_reason = p_reason
     WHERE id = p_job_id AND state = p_state AND state_reason IS DISTINCT FROM p_reason;
    RETURN FOUND OR EXISTS (SELECT 1 FROM tuneplane.jobs WHERE id = p_job_id AND state = p_state);
END;
$$;
