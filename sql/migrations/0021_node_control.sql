-- 0021 node control channel: control sessions (fenced by an epoch), heartbeats, capacity reports,
-- connectivity events and the per-node command outbox.
--
-- Heartbeats are frequent, so node_heartbeats() updates many nodes in one statement and never NOTIFYs
-- (GUIDE-postgres rule 1). Only enqueue_node_command() NOTIFYs, and only as a wake-up: gateways also
-- poll the outbox with a short bound.
-- The connectivity sweep reads the thresholds once and compares inline (not node_connectivity() per
-- node): with 10,000 nodes and a sweep a second that call was a visible share of a small machine.

-- require_node_session: refuses (409) a report or claim from a control session that is no longer current.
CREATE FUNCTION tuneplane.require_node_session(p_node_id bigint, p_epoch bigint)
RETURNS tuneplane.nodes
LANGUAGE plpgsql AS $$
DECLARE
    n tuneplane.nodes;
BEGIN
    SELECT * INTO n FROM tuneplane.nodes WHERE id = p_node_id;
    IF n.id IS NULL THEN
        RAISE EXCEPTION 'no node %', p_node_id USING ERRCODE = 'TP404', COLUMN = 'node';
    END IF;
    IF n.session_epoch <> p_epoch THEN
        RAISE EXCEPTION 'control session % of node % was replaced by session %', p_epoch, n.name, n.session_epoch
            USING ERRCODE = 'TP409', COLUMN = 'epoch';
    END IF;
    RETURN n;
END;
$$;

-- node_session_opened: an authenticated agent connected. Starts a new session epoch (older sessions are
-- fenced off), counts as a heartbeat, writes a `session_opened` event. Returns the epoch and the
-- heartbeat interval the agent must keep.
CREATE FUNCTION tuneplane.node_session_opened(p_node_id bigint, p_address text, p_gateway text)
RETURNS TABLE (epoch bigint, heartbeat_interval_s double precision)
LANGUAGE plpgsql AS $$
DECLARE
    n tuneplane.nodes;
BEGIN
    UPDATE tuneplane.nodes
       SET session_epoch = session_epoch + 1, session_opened_at = now(), session_closed_at = NULL,
           last_heartbeat_at = now(), address = coalesce(p_address, address)
     WHERE id = p_node_id
    RETURNING * INTO n;
    IF n.id IS NULL THEN
        RAISE EXCEPTION 'no node %', p_node_id USING ERRCODE = 'TP404', COLUMN = 'node';
    END IF;
    PERFORM tuneplane.log_node_event(n.fleet_id, n.id, 'session_opened', 'node:' || n.name,
                                     'control connection via ' || p_gateway,
                                     jsonb_build_object('epoch', n.session_epoch, 'address', p_address));
    RETURN QUERY SELECT n.session_epoch, extract(epoch FROM s.heartbeat_interval)::double precision
                   FROM tuneplane.node_settings s;
END;
$$;

-- node_session_closed: the control connection of session p_epoch ended. A close of an already replaced
-- session changes nothing. Connectivity is not changed here: it follows heartbeat age.
CREATE FUNCTION tuneplane.node_session_closed(p_node_id bigint, p_epoch bigint, p_reason text)
RETURNS boolean
LANGUAGE plpgsql AS $$
DECLARE
    n tuneplane.nodes;
BEGIN
    UPDATE tuneplane.nodes SET session_closed_at = now()
     WHERE id = p_node_id AND session_epoch = p_epoch AND session_closed_at IS NULL
    RETURNING * INTO n;
    IF n.id IS NULL THEN
        RETURN false;
    END IF;
    PERFORM tuneplane.log_node_event(n.fleet_id, n.id, 'session_closed', 'gateway', coalesce(p_reason, ''),
                                     jsonb_build_object('epoch', p_epoch));
    RETURN true;
END;
$$;

-- node_heartbeats: liveness for many nodes in one statement. p_batch is a JSON array of
-- {"node_id": 1, "epoch": 3, "running": [...]} ("running" optional: sent when it changed). Heartbeats of
-- replaced sessions are ignored. Returns how many nodes were touched. Never NOTIFYs.
CREATE FUNCTION tuneplane.node_heartbeats(p_batch jsonb)
RETURNS integer
LANGUAGE sql AS $$
    WITH b AS (
        SELECT DISTINCT ON (node_id) node_id, epoch, running
          FROM jsonb_to_recordset(p_batch) AS x(node_id bigint, epoch bigint, running jsonb)
         ORDER BY node_id
    ), touched AS (
        UPDATE tuneplane.nodes n
           SET last_heartbeat_at = now(), reported_running = coalesce(b.running, n.reported_running)
          FROM b
         WHERE n.id = b.node_id AND n.session_epoch = b.epoch
        RETURNING n.id
    )
    SELECT count(*)::integer FROM touched;
$$;

-- report_node_capacity (report kind `capacity`): what the node has. p_payload:
-- {"cpus": 8, "memory_bytes": 1, "agent_version": "0.1.0", "container_runtimes": ["podman"],
--  "hostname": "h", "gpus": [{"index": 0, "model": "…", "memory_bytes": 1, "simulated": false}]}
-- Refuses a malformed report (400) and a replaced session (409). Writes a `capacity` event when the
-- capacity differs from what was stored. Counts as a heartbeat.
CREATE FUNCTION tuneplane.report_node_capacity(p_node_id bigint, p_epoch bigint, p_payload jsonb)
RETURNS jsonb
LANGUAGE plpgsql AS $$
DECLARE
    n tuneplane.nodes;
    before jsonb;
    after jsonb;
    gpus jsonb := coalesce(p_payload -> 'gpus', '[]'::jsonb);
BEGIN
    n := tuneplane.require_node_session(p_node_id, p_epoch);
    IF jsonb_typeof(p_payload) <> 'object' OR jsonb_typeof(p_payload -> 'cpus') <> 'number'
       OR jsonb_typeof(p_payload -> 'memory_bytes') <> 'number' OR jsonb_typeof(gpus) <> 'array'
       OR jsonb_typeof(coalesce(p_payload -> 'container_runtimes', '[]'::jsonb)) <> 'array' THEN
        RAISE EXCEPTION 'capacity report needs numbers cpus and memory_bytes and arrays gpus and container_runtimes'
            USING ERRCODE = 'TP400', COLUMN = 'capacity';
    END IF;
    IF EXISTS (SELECT 1 FROM jsonb_array_elements(gpus) g
                WHERE jsonb_typeof(g -> 'index') <> 'number' OR jsonb_typeof(g -> 'model') <> 'string') THEN
        RAISE EXCEPTION 'each GPU needs an index and a model' USING ERRCODE = 'TP400', COLUMN = 'gpus';
    END IF;
    SELECT jsonb_build_object('cpus', n.cpus, 'memory_bytes', n.memory_bytes, 'agent_version', n.agent_version,
                              'container_runtimes', to_jsonb(n.container_runtimes),
                              'gpus', coalesce((SELECT jsonb_agg(jsonb_build_array(gpu_index, model, memory_bytes, simulated)
                                                         ORDER BY gpu_index)
                                                  FROM tuneplane.node_gpus WHERE node_id = n.id), '[]'::jsonb))
      INTO before;
    UPDATE tuneplane.nodes
       SET cpus = (p_payload ->> 'cpus')::integer,
           memory_bytes = (p_payload ->> 'memory_bytes')::bigint,
           agent_version = p_payload ->> 'agent_version',
           container_runtimes = ARRAY(SELECT jsonb_array_elements_text(coalesce(p_payload -> 'container_runtimes',
                                                                                '[]'::jsonb))),
           hostname = coalesce(p_payload ->> 'hostname', hostname),
           last_heartbeat_at = now()
     WHERE id = n.id;
    DELETE FROM tuneplane.node_gpus g
     WHERE g.node_id = n.id
       AND g.gpu_index NOT IN (SELECT (x ->> 'index')::integer FROM jsonb_array_elements(gpus) x);
    INSERT INTO tuneplane.node_gpus (node_id, gpu_index, model, memory_bytes, simulated)
    SELECT n.id, (x ->> 'index')::integer, x ->> 'model', coalesce((x ->> 'memory_bytes')::bigint, 0),
           coalesce((x ->> 'simulated')::boolean, false)
      FROM jsonb_array_elements(gpus) x
    ON CONFLICT (node_id, gpu_index) DO UPDATE
       SET model = EXCLUDED.model, memory_bytes = EXCLUDED.memory_bytes, simulated = EXCLUDED.simulated;
    SELECT jsonb_build_object('cpus', nn.cpus, 'memory_bytes', nn.memory_bytes, 'agent_version', nn.agent_version,
                              'container_runtimes', to_jsonb(nn.container_runtimes),
                              'gpus', coalesce((SELECT jsonb_agg(jsonb_build_array(gpu_index, model, memory_bytes, simulated)
                                                         ORDER BY gpu_index)
                                                  FROM tuneplane.node_gpus WHERE node_id = nn.id), '[]'::jsonb))
      INTO after FROM tuneplane.nodes nn WHERE nn.id = n.id;
    IF after IS DISTINCT FROM before THEN
        PERFORM tuneplane.log_node_event(n.fleet_id, n.id, 'capacity', 'node:' || n.name, 'capacity reported',
                                         after);
    END IF;
    RETURN jsonb_build_object('changed', after IS DISTINCT FROM before);
END;
$$;

-- record_node_note (report kind `note`): an agent-side observation worth an event (a GPU probe that
-- failed, a handler error). Refuses a replaced session.
CREATE FUNCTION tuneplane.record_node_note(p_node_id bigint, p_epoch bigint, p_payload jsonb)
RETURNS jsonb
LANGUAGE plpgsql AS $$
DECLARE
    n tuneplane.nodes;
    event_id bigint;
BEGIN
    n := tuneplane.require_node_session(p_node_id, p_epoch);
    event_id := tuneplane.log_node_event(n.fleet_id, n.id, 'note', 'node:' || n.name,
                                         left(coalesce(p_payload ->> 'message', ''), 500), p_payload);
    RETURN jsonb_build_object('event_id', event_id);
END;
$$;

-- note_connectivity_changes: writes a `connectivity` event for every node whose computed connectivity
-- differs from the one last written (connected -> stale -> lost, or back). SKIP LOCKED lets several
-- gateways sweep at once without double events. Retired nodes are not swept.
CREATE FUNCTION tuneplane.note_connectivity_changes()
RETURNS integer
LANGUAGE plpgsql AS $$
DECLARE
    changed integer;
    s tuneplane.node_settings;
    stale_before timestamptz;
    lost_before timestamptz;
BEGIN
    SELECT * INTO s FROM tuneplane.node_settings;
    stale_before := now() - s.stale_after;
    lost_before := now() - s.lost_after;
    WITH computed AS (
        SELECT n.id, n.fleet_id, n.connectivity_noted AS was, n.last_heartbeat_at,
               CASE WHEN n.last_heartbeat_at IS NULL OR n.last_heartbeat_at <= lost_before THEN 'lost'
                    WHEN n.last_heartbeat_at <= stale_before THEN 'stale'
                    ELSE 'connected' END AS now_is
          FROM tuneplane.nodes n
         WHERE n.scheduling_state <> 'retired'
    ), candidates AS (
        SELECT c.* FROM computed c JOIN tuneplane.nodes n ON n.id = c.id
         WHERE c.was <> c.now_is
           FOR UPDATE OF n SKIP LOCKED
    ), upd AS (
        UPDATE tuneplane.nodes n SET connectivity_noted = c.now_is FROM candidates c WHERE n.id = c.id
        RETURNING c.*
    ), ev AS (
        INSERT INTO tuneplane.node_events (fleet_id, node_id, kind, actor, reason, details)
        SELECT u.fleet_id, u.id, 'connectivity', 'heartbeat-age', u.was || ' -> ' || u.now_is,
               jsonb_build_object('from', u.was, 'to', u.now_is, 'last_heartbeat_at', u.last_heartbeat_at)
          FROM upd u
        RETURNING 1
    )
    SELECT count(*) INTO changed FROM ev;
    RETURN changed;
END;
$$;

-- The per-node command outbox. A command is delivered over the node's current control session, in id
-- order, at least once (again after a reconnect if it was not acknowledged); agents' handlers are
-- idempotent per command id. Acknowledged rows stay for the record; prune_node_commands trims them.
CREATE TABLE tuneplane.node_commands (
    id              bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    node_id         bigint      NOT NULL REFERENCES tuneplane.nodes (id),
    kind            text        NOT NULL CHECK (kind ~ '^[a-z][a-z0-9_.-]{0,62}$'),
    payload         jsonb       NOT NULL DEFAULT '{}'::jsonb,
    created_at      timestamptz NOT NULL DEFAULT clock_timestamp(),
    created_by      text        NOT NULL,
    -- The session epoch that last took the command for delivery; another epoch may take it again.
    claimed_epoch   bigint,
    delivered_at    timestamptz,
    delivery_count  integer     NOT NULL DEFAULT 0,
    acked_at        timestamptz,
    result          jsonb,
    error           text
);
CREATE INDEX node_commands_pending ON tuneplane.node_commands (node_id, id) WHERE acked_at IS NULL;

-- enqueue_node_command: writes a command to a node's outbox and NOTIFYs `tuneplane_node_commands` with the
-- node id (a wake-up for the gateway holding that node; it also polls). Refuses an unknown or retired node.
CREATE FUNCTION tuneplane.enqueue_node_command(p_node_id bigint, p_kind text, p_payload jsonb DEFAULT '{}'::jsonb,
                                               p_created_by text DEFAULT NULL)
RETURNS tuneplane.node_commands
LANGUAGE plpgsql AS $$
DECLARE
    n tuneplane.nodes;
    v_cmd tuneplane.node_commands;
BEGIN
    SELECT * INTO n FROM tuneplane.nodes WHERE id = p_node_id;
    IF n.id IS NULL THEN
        RAISE EXCEPTION 'no node %', p_node_id USING ERRCODE = 'TP404', COLUMN = 'node';
    END IF;
    IF n.scheduling_state = 'retired' THEN
        RAISE EXCEPTION 'node % is retired', n.name USING ERRCODE = 'TP409', COLUMN = 'node';
    END IF;
    IF p_kind IS NULL OR p_kind !~ '^[a-z][a-z0-9_.-]{0,62}$' THEN
        RAISE EXCEPTION 'command kind must be a lowercase word' USING ERRCODE = 'TP400', COLUMN = 'kind';
    END IF;
    INSERT INTO tuneplane.node_commands (node_id, kind, payload, created_by)
    VALUES (p_node_id, p_kind, coalesce(p_payload, '{}'::jsonb), coalesce(nullif(p_created_by, ''), 'db:' || session_user))
    RETURNING * INTO v_cmd;
    PERFORM pg_notify('tuneplane_node_commands', p_node_id::text);
    RETURN v_cmd;
END;
$$;

-- claim_node_commands: up to p_limit unacknowledged commands of a node, oldest first, that the session
-- p_epoch has not yet taken; marks them taken by it. Refuses a replaced session (409).
CREATE FUNCTION tuneplane.claim_node_commands(p_node_id bigint, p_epoch bigint, p_limit integer DEFAULT 100)
RETURNS SETOF tuneplane.node_commands
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM tuneplane.require_node_session(p_node_id, p_epoch);
    RETURN QUERY
        WITH c AS (
            SELECT id FROM tuneplane.node_commands
             WHERE node_id = p_node_id AND acked_at IS NULL AND claimed_epoch IS DISTINCT FROM p_epoch
             ORDER BY id
             LIMIT p_limit
               FOR UPDATE SKIP LOCKED
        )
        UPDATE tuneplane.node_commands nc
           SET claimed_epoch = p_epoch, delivered_at = clock_timestamp(), delivery_count = nc.delivery_count + 1
          FROM c WHERE nc.id = c.id
        RETURNING nc.*;
END;
$$;

-- nodes_with_pending_commands: the subset of p_node_ids that have commands their current session has not
-- taken yet (the gateway's bounded-poll fallback to NOTIFY).
CREATE FUNCTION tuneplane.nodes_with_pending_commands(p_node_ids bigint[])
RETURNS TABLE (node_id bigint)
LANGUAGE sql STABLE AS $$
    SELECT DISTINCT c.node_id
      FROM tuneplane.node_commands c JOIN tuneplane.nodes n ON n.id = c.node_id
     WHERE c.node_id = ANY (p_node_ids) AND c.acked_at IS NULL
       AND c.claimed_epoch IS DISTINCT FROM n.session_epoch;
$$;

-- ack_node_command: the node handled command p_command_id (result or error). Idempotent: a second ack
-- keeps the first outcome. Refuses a command of another node (404).
CREATE FUNCTION tuneplane.ack_node_command(p_node_id bigint, p_command_id bigint, p_result jsonb DEFAULT NULL,
                                           p_error text DEFAULT NULL)
RETURNS tuneplane.node_commands
LANGUAGE plpgsql AS $$
DECLARE
    v_cmd tuneplane.node_commands;
BEGIN
    UPDATE tuneplane.node_commands
       SET acked_at = coalesce(acked_at, clock_timestamp()),
           result = CASE WHEN node_commands.acked_at IS NULL THEN p_result ELSE node_commands.result END,
           error = CASE WHEN node_commands.acked_at IS NULL THEN p_error ELSE node_commands.error END
     WHERE id = p_command_id AND node_id = p_node_id
    RETURNING * INTO v_cmd;
    IF v_cmd.id IS NULL THEN
        RAISE EXCEPTION 'node % has no command %', p_node_id, p_command_id USING ERRCODE = 'TP404',
            COLUMN = 'command';
    END IF;
    RETURN v_cmd;
END;
$$;

-- prune_node_commands: deletes acknowledged commands older than p_older_than; returns how many.
CREATE FUNCTION tuneplane.prune_node_commands(p_older_than interval DEFAULT interval '7 days')
RETURNS integer
LANGUAGE sql AS $$
    WITH d AS (DELETE FROM tuneplane.node_commands WHERE acked_at < now() - p_older_than RETURNING 1)
    SELECT count(*)::integer FROM d;
$$;
