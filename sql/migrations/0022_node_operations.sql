-- 0022 node operations: the operator functions that change a node's scheduling state (cordon, drain,
-- uncordon, retire), each writing an event with who and why, and the operator views v_fleet, v_nodes,
-- v_node_events and v_node_commands_pending (documented in docs/runbook.md).

-- resolve_node: a node id from a reference: its numeric id, `fleet/name`, or a name unique across fleets.
-- Refuses an unknown (404) or ambiguous (409) reference.
CREATE FUNCTION tuneplane.resolve_node(p_ref text)
RETURNS bigint
LANGUAGE plpgsql STABLE AS $$
DECLARE
    ids bigint[];
BEGIN
    IF p_ref ~ '^[0-9]+$' THEN
        SELECT array_agg(id) INTO ids FROM tuneplane.nodes WHERE id = p_ref::bigint;
    ELSIF position('/' IN p_ref) > 0 THEN
        SELECT array_agg(n.id) INTO ids FROM tuneplane.nodes n JOIN tuneplane.fleets f ON f.id = n.fleet_id
         WHERE f.name = split_part(p_ref, '/', 1) AND n.name = substr(p_ref, position('/' IN p_ref) + 1);
    ELSE
        SELECT array_agg(id) INTO ids FROM tuneplane.nodes WHERE name = p_ref;
    END IF;
    IF ids IS NULL THEN
        RAISE EXCEPTION 'no node %', p_ref USING ERRCODE = 'TP404', COLUMN = 'node';
    END IF;
    IF cardinality(ids) > 1 THEN
        RAISE EXCEPTION 'node name % is used in several fleets; write FLEET/%', p_ref, p_ref
            USING ERRCODE = 'TP409', COLUMN = 'node';
    END IF;
    RETURN ids[1];
END;
$$;

-- change_node_scheduling: the one function that moves a node's scheduling state.
--   cordon:   active | draining  -> cordoned  (no new work; running work continues)
--   drain:    active | cordoned  -> draining  (no new work; running work finishes, then the node is idle)
--   uncordon: cordoned | draining -> active
--   retire:   any but retired    -> retired   (credentials revoked; the node can no longer connect)
-- Asking for the state a node is already in changes nothing and writes no event. Refuses any change of a
-- retired node (409) and an unknown action (400). Writes an event with actor and reason.
CREATE FUNCTION tuneplane.change_node_scheduling(p_node text, p_action text, p_reason text DEFAULT NULL,
                                                 p_actor text DEFAULT NULL)
RETURNS TABLE (node_id bigint, fleet text, node text, scheduling_state text, changed boolean)
LANGUAGE plpgsql AS $$
DECLARE
    v_id bigint := tuneplane.resolve_node(p_node);
    n tuneplane.nodes;
    target text;
    actor text := coalesce(nullif(p_actor, ''), 'db:' || session_user);
BEGIN
    target := CASE p_action WHEN 'cordon' THEN 'cordoned' WHEN 'drain' THEN 'draining'
                            WHEN 'uncordon' THEN 'active' WHEN 'retire' THEN 'retired' END;
    IF target IS NULL THEN
        RAISE EXCEPTION 'unknown scheduling action %; use cordon, drain, uncordon or retire', p_action
            USING ERRCODE = 'TP400', COLUMN = 'action';
    END IF;
    SELECT * INTO n FROM tuneplane.nodes WHERE id = v_id FOR UPDATE;
    IF n.scheduling_state = 'retired' AND target <> 'retired' THEN
        RAISE EXCEPTION 'node % is retired; a retired node does not come back (enroll the machine again)',
                        n.name USING ERRCODE = 'TP409', COLUMN = 'node';
    END IF;
    IF n.scheduling_state <> target THEN
        UPDATE tuneplane.nodes SET scheduling_state = target WHERE id = n.id;
        IF target = 'retired' THEN
            UPDATE tuneplane.node_credentials SET revoked_at = now(), revoked_reason = 'node retired'
             WHERE node_credentials.node_id = n.id AND revoked_at IS NULL;
        END IF;
        PERFORM tuneplane.log_node_event(n.fleet_id, n.id, p_action, actor,
                                         coalesce(nullif(p_reason, ''), '(no reason given)'),
                                         jsonb_build_object('from', n.scheduling_state, 'to', target));
    END IF;
    RETURN QUERY SELECT n.id, f.name, n.name, target, n.scheduling_state <> target
                   FROM tuneplane.fleets f WHERE f.id = n.fleet_id;
END;
$$;

CREATE FUNCTION tuneplane.cordon_node(p_node text, p_reason text DEFAULT NULL, p_actor text DEFAULT NULL)
RETURNS TABLE (node_id bigint, fleet text, node text, scheduling_state text, changed boolean)
LANGUAGE sql AS $$ SELECT * FROM tuneplane.change_node_scheduling(p_node, 'cordon', p_reason, p_actor) $$;

CREATE FUNCTION tuneplane.drain_node(p_node text, p_reason text DEFAULT NULL, p_actor text DEFAULT NULL)
RETURNS TABLE (node_id bigint, fleet text, node text, scheduling_state text, changed boolean)
LANGUAGE sql AS $$ SELECT * FROM tuneplane.change_node_scheduling(p_node, 'drain', p_reason, p_actor) $$;

CREATE FUNCTION tuneplane.uncordon_node(p_node text, p_reason text DEFAULT NULL, p_actor text DEFAULT NULL)
RETURNS TABLE (node_id bigint, fleet text, node text, scheduling_state text, changed boolean)
LANGUAGE sql AS $$ SELECT * FROM tuneplane.change_node_scheduling(p_node, 'uncordon', p_reason, p_actor) $$;

CREATE FUNCTION tuneplane.retire_node(p_node text, p_reason text DEFAULT NULL, p_actor text DEFAULT NULL)
RETURNS TABLE (node_id bigint, fleet text, node text, scheduling_state text, changed boolean)
LANGUAGE sql AS $$ SELECT * FROM tuneplane.change_node_scheduling(p_node, 'retire', p_reason, p_actor) $$;

-- node_allocation: what is allocated on a node right now. Nothing allocates yet; the launch migrations
-- replace this function (same signature, CREATE OR REPLACE) to sum their reservations, and the views
-- below pick that up unchanged.
CREATE FUNCTION tuneplane.node_allocation(p_node_id bigint)
RETURNS TABLE (gpus integer, cpus integer, memory_bytes bigint)
LANGUAGE sql STABLE AS $$ SELECT 0, 0, 0::bigint $$;

CREATE VIEW tuneplane.v_nodes AS
SELECT f.name AS fleet,
       n.id AS node_id,
       n.name AS node,
       n.scheduling_state,
       tuneplane.node_connectivity(n.last_heartbeat_at) AS connectivity,
       round(extract(epoch FROM now() - n.last_heartbeat_at)::numeric, 1) AS heartbeat_age_s,
       n.last_heartbeat_at,
       n.cpus,
       n.memory_bytes,
       coalesce(g.gpus, 0) AS gpus,
       coalesce(g.models, '') AS gpu_models,
       coalesce(g.gpu_memory_bytes, 0) AS gpu_memory_bytes,
       coalesce(g.simulated, 0) AS simulated_gpus,
       a.gpus AS allocated_gpus,
       a.cpus AS allocated_cpus,
       a.memory_bytes AS allocated_memory_bytes,
       n.agent_version,
       n.container_runtimes,
       n.hostname,
       n.address,
       jsonb_array_length(n.reported_running) AS running,
       n.session_epoch,
       n.session_closed_at IS NULL AND n.session_opened_at IS NOT NULL AS session_open,
       n.enrolled_at,
       n.fleet_id
  FROM tuneplane.nodes n
  JOIN tuneplane.fleets f ON f.id = n.fleet_id
  LEFT JOIN LATERAL (
        SELECT count(*)::integer AS gpus,
               string_agg(DISTINCT gg.model || CASE WHEN gg.simulated THEN ' (simulated)' ELSE '' END, ', ') AS models,
               sum(gg.memory_bytes)::bigint AS gpu_memory_bytes,
               (count(*) FILTER (WHERE gg.simulated))::integer AS simulated
          FROM tuneplane.node_gpus gg WHERE gg.node_id = n.id) g ON true
  CROSS JOIN LATERAL tuneplane.node_allocation(n.id) a;

CREATE VIEW tuneplane.v_fleet AS
SELECT f.id AS fleet_id,
       f.name AS fleet,
       f.backend,
       f.capabilities,
       count(v.node_id) FILTER (WHERE v.scheduling_state <> 'retired')::integer AS nodes,
       count(*) FILTER (WHERE v.connectivity = 'connected' AND v.scheduling_state <> 'retired')::integer AS connected,
       count(*) FILTER (WHERE v.connectivity = 'stale' AND v.scheduling_state <> 'retired')::integer AS stale,
       count(*) FILTER (WHERE v.connectivity = 'lost' AND v.scheduling_state <> 'retired')::integer AS lost,
       count(*) FILTER (WHERE v.scheduling_state = 'active')::integer AS active,
       count(*) FILTER (WHERE v.scheduling_state = 'cordoned')::integer AS cordoned,
       count(*) FILTER (WHERE v.scheduling_state = 'draining')::integer AS draining,
       count(*) FILTER (WHERE v.scheduling_state = 'retired')::integer AS retired,
       coalesce(sum(v.gpus) FILTER (WHERE v.scheduling_state <> 'retired'), 0)::integer AS gpus,
       coalesce(sum(v.simulated_gpus) FILTER (WHERE v.scheduling_state <> 'retired'), 0)::integer AS simulated_gpus,
       -- What the scheduler may use now: active and connected nodes only.
       coalesce(sum(v.gpus) FILTER (WHERE v.scheduling_state = 'active' AND v.connectivity = 'connected'), 0)::integer
           AS schedulable_gpus,
       coalesce(sum(v.allocated_gpus), 0)::integer AS allocated_gpus,
       coalesce(sum(v.cpus) FILTER (WHERE v.scheduling_state <> 'retired'), 0)::integer AS cpus,
       coalesce(sum(v.memory_bytes) FILTER (WHERE v.scheduling_state <> 'retired'), 0)::bigint AS memory_bytes,
       f.created_at
  FROM tuneplane.fleets f
  LEFT JOIN tuneplane.v_nodes v ON v.fleet_id = f.id
 GROUP BY f.id;

CREATE VIEW tuneplane.v_node_events AS
SELECT e.id, e.at, f.name AS fleet, n.name AS node, e.node_id, e.kind, e.actor, e.reason, e.details
  FROM tuneplane.node_events e
  LEFT JOIN tuneplane.fleets f ON f.id = e.fleet_id
  LEFT JOIN tuneplane.nodes n ON n.id = e.node_id;

CREATE VIEW tuneplane.v_node_commands_pending AS
SELECT c.id, f.name AS fleet, n.name AS node, c.node_id, c.kind, c.created_at, c.created_by,
       c.delivery_count, c.delivered_at, c.claimed_epoch, n.session_epoch,
       round(extract(epoch FROM now() - c.created_at)::numeric, 1) AS age_s
  FROM tuneplane.node_commands c
  JOIN tuneplane.nodes n ON n.id = c.node_id
  JOIN tuneplane.fleets f ON f.id = n.fleet_id
 WHERE c.acked_at IS NULL;
