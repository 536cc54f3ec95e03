-- 0023 a cheaper connectivity sweep. note_connectivity_changes (0021) called node_connectivity() for
-- every node on every sweep; with 10,000 nodes and a sweep a second that was a visible share of a small
-- machine (bench/gateway_agents.py). Same result, thresholds read once and compared inline.

-- note_connectivity_changes: writes a `connectivity` event for every node whose computed connectivity
-- differs from the one last written (connected -> stale -> lost, or back). SKIP LOCKED lets several
-- gateways sweep at once without double events. Retired nodes are not swept.
CREATE OR REPLACE FUNCTION tuneplane.note_connectivity_changes()
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
