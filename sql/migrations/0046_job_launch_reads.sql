-- 0046 job launch reads: what the job page and `tuneplane jobs show` tell a job's owner (or an admin)
-- about its launch: attempts with their decisions, members, and the queue position while it waits.
-- Read-only; each refuses (404 job_id, through get_job) a job the actor may not see.

-- job_attempts_of: a visible job's attempts, newest first, each with its launch decision if any.
CREATE FUNCTION tuneplane.job_attempts_of(p_actor_id bigint, p_job_id bigint)
RETURNS TABLE (number integer, state text, reason text, decision text, decision_reason text,
               decided_at timestamptz, created_at timestamptz, committed_at timestamptz,
               running_at timestamptz, ended_at timestamptz, prepare_deadline timestamptz,
               cancel_requested_at timestamptz, capsule_digest text, master_addr text, master_port integer)
LANGUAGE plpgsql STABLE AS $$
BEGIN
    PERFORM 1 FROM tuneplane.get_job(p_actor_id, p_job_id);
    RETURN QUERY
        SELECT a.number, a.state, a.reason, d.decision, d.reason, d.decided_at, a.created_at, a.committed_at,
               a.running_at, a.ended_at, a.prepare_deadline, a.cancel_requested_at, a.capsule_digest,
               a.master_addr, a.master_port
          FROM tuneplane.attempts a
          LEFT JOIN tuneplane.launch_decisions d ON d.attempt_id = a.id
         WHERE a.job_id = p_job_id
         ORDER BY a.number DESC;
END;
$$;

-- job_members_of: a visible job's members, newest attempt first, then by rank.
CREATE FUNCTION tuneplane.job_members_of(p_actor_id bigint, p_job_id bigint)
RETURNS TABLE (attempt integer, rank integer, member_id bigint, node text, gpu_indices integer[], cpus integer,
               memory_bytes bigint, state text, reason text, exit_code integer, started_at timestamptz,
               ended_at timestamptz, updated_at timestamptz, resources_held boolean)
LANGUAGE plpgsql STABLE AS $$
BEGIN
    PERFORM 1 FROM tuneplane.get_job(p_actor_id, p_job_id);
    RETURN QUERY
        SELECT a.number, m.rank, m.id, n.name, m.gpu_indices, m.cpus, m.memory_bytes, m.state, m.reason,
               m.exit_code, m.started_at, m.ended_at, m.updated_at, m.released_at IS NULL
          FROM tuneplane.members m
          JOIN tuneplane.attempts a ON a.id = m.attempt_id
          JOIN tuneplane.nodes n ON n.id = m.node_id
         WHERE m.job_id = p_job_id
         ORDER BY a.number DESC, m.rank;
END;
$$;

-- job_queue_position: while a visible job is queued, its place in its fleet's queue (v_queue order:
-- priority, then age), how many wait in that fleet, and the job at the head. No row when not queued.
CREATE FUNCTION tuneplane.job_queue_position(p_actor_id bigint, p_job_id bigint)
RETURNS TABLE (job_id bigint, fleet text, queue_position bigint, queued_in_fleet bigint, head_job_id bigint,
               waiting interval, state_reason text)
LANGUAGE plpgsql STABLE AS $$
BEGIN
    PERFORM 1 FROM tuneplane.get_job(p_actor_id, p_job_id);
    RETURN QUERY
        WITH queue AS (SELECT * FROM tuneplane.v_queue)
        SELECT q.job_id, q.fleet, q.position,
               (SELECT count(*) FROM queue o WHERE o.fleet = q.fleet),
               (SELECT h.job_id FROM queue h WHERE h.fleet = q.fleet AND h.position = 1),
               q.waiting, q.state_reason
          FROM queue q
         WHERE q.job_id = p_job_id;
END;
$$;
