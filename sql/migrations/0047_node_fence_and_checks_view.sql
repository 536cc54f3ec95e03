-- 0047 Fleet view of fencing and of what the control connection cannot prove: v_nodes gains the fence
-- (fenced_at, fenced_reason) and the last peer-network and shared-storage checks each prepare reports.
-- CREATE OR REPLACE VIEW may only append columns, so the earlier columns are restated unchanged.

CREATE OR REPLACE VIEW tuneplane.v_nodes AS
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
       n.fleet_id,
       n.fenced_at,
       n.fenced_reason,
       n.last_peer_check,
       n.last_storage_check
  FROM tuneplane.nodes n
  JOIN tuneplane.fleets f ON f.id = n.fleet_id
  LEFT JOIN LATERAL (
        SELECT count(*)::integer AS gpus,
               string_agg(DISTINCT gg.model || CASE WHEN gg.simulated THEN ' (simulated)' ELSE '' END, ', ') AS models,
               sum(gg.memory_bytes)::bigint AS gpu_memory_bytes,
               (count(*) FILTER (WHERE gg.simulated))::integer AS simulated
          FROM tuneplane.node_gpus gg WHERE gg.node_id = n.id) g ON true
  CROSS JOIN LATERAL tuneplane.node_allocation(n.id) a;
