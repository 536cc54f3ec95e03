-- sql/functions/placement.sql — the current definition of every placement function, view and trigger.
-- Placement: node usage accounting, the queue, reservations (reserve_next) and their views.
--
-- Repeatable file (ADR 0012): `tuneplane db migrate` re-applies every file of sql/functions/ (in the order
-- of order.txt, one transaction) whenever one changes. Edit definitions here, never in a migration.
-- Tables, columns and data changes go in a new numbered migration. A changed signature or a view whose
-- columns change: add its DROP below (it runs before the new definition is created), e.g.
--   DROP FUNCTION IF EXISTS tuneplane.f(bigint, text);
--
-- Drops (signature changes):

CREATE OR REPLACE FUNCTION tuneplane.node_usage_follow_nodes() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO tuneplane.node_usage (node_id, fleet_id) VALUES (NEW.id, NEW.fleet_id) ON CONFLICT DO NOTHING;
    RETURN NULL;
END;
$$;

CREATE OR REPLACE TRIGGER node_usage_on_node AFTER INSERT ON tuneplane.nodes
    FOR EACH ROW EXECUTE FUNCTION tuneplane.node_usage_follow_nodes();

CREATE OR REPLACE FUNCTION tuneplane.node_usage_follow_gpus() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO tuneplane.node_usage AS u (node_id, fleet_id, total_gpus)
    SELECT d.node_id, (SELECT n.fleet_id FROM tuneplane.nodes n WHERE n.id = d.node_id),
           (SELECT count(*) FROM tuneplane.node_gpus g WHERE g.node_id = d.node_id)
      FROM (SELECT DISTINCT node_id FROM changed) d
     WHERE EXISTS (SELECT 1 FROM tuneplane.nodes n WHERE n.id = d.node_id)
    ON CONFLICT (node_id) DO UPDATE SET total_gpus = EXCLUDED.total_gpus;
    RETURN NULL;
END;
$$;

CREATE OR REPLACE TRIGGER node_usage_on_gpu_insert AFTER INSERT ON tuneplane.node_gpus
    REFERENCING NEW TABLE AS changed FOR EACH STATEMENT EXECUTE FUNCTION tuneplane.node_usage_follow_gpus();

CREATE OR REPLACE TRIGGER node_usage_on_gpu_delete AFTER DELETE ON tuneplane.node_gpus
    REFERENCING OLD TABLE AS changed FOR EACH STATEMENT EXECUTE FUNCTION tuneplane.node_usage_follow_gpus();

CREATE OR REPLACE TRIGGER launch_decisions_immutable
    BEFORE UPDATE OR DELETE ON tuneplane.launch_decisions
    FOR EACH ROW EXECUTE FUNCTION tuneplane.refuse_change();

-- Eligible nodes of a fleet with their free capacity right now.
CREATE OR REPLACE FUNCTION tuneplane.fleet_free_capacity(p_fleet_id bigint)
RETURNS TABLE (node_id bigint, node_name text, address text, total_gpus integer, free_gpus integer,
               free_cpus integer, free_memory bigint, cpus integer, memory_bytes bigint)
LANGUAGE sql STABLE AS $$
    SELECT n.id, n.name, n.address, u.total_gpus, u.total_gpus - u.used_gpus,
           n.cpus - u.used_cpus, n.memory_bytes - u.used_memory, n.cpus, n.memory_bytes
      FROM tuneplane.nodes n
      JOIN tuneplane.node_usage u ON u.node_id = n.id
     WHERE n.fleet_id = p_fleet_id
       AND n.scheduling_state = 'active'
       AND n.fenced_at IS NULL
       AND tuneplane.node_connectivity(n.last_heartbeat_at) = 'connected';
$$;

-- Human-readable resource request of a job.
CREATE OR REPLACE FUNCTION tuneplane.describe_request(p_job tuneplane.jobs)
RETURNS text
LANGUAGE sql IMMUTABLE AS $$
    SELECT format('%s node%s × %s GPU%s, %s CPU%s, %s memory',
                  p_job.nodes, CASE WHEN p_job.nodes = 1 THEN '' ELSE 's' END,
                  p_job.gpus_per_node, CASE WHEN p_job.gpus_per_node = 1 THEN '' ELSE 's' END,
                  p_job.cpus_per_node, CASE WHEN p_job.cpus_per_node = 1 THEN '' ELSE 's' END,
                  pg_size_pretty(p_job.memory_per_node));
$$;

-- set_job_state: the one writer of jobs.state/state_reason outside submission. Writes only on change
-- (each change is a job_events row, by trigger).
CREATE OR REPLACE FUNCTION tuneplane.set_job_state(p_job_id bigint, p_state text, p_reason text,
                                        p_detail jsonb DEFAULT NULL)
RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    IF p_detail IS NOT NULL THEN
        PERFORM set_config('tuneplane.event_detail', p_detail::text, true);
    END IF;
    UPDATE tuneplane.jobs SET state = p_state, state_reason = p_reason
     WHERE id = p_job_id AND (state IS DISTINCT FROM p_state OR state_reason IS DISTINCT FROM p_reason);
    IF p_detail IS NOT NULL THEN
        PERFORM set_config('tuneplane.event_detail', '', true);
    END IF;
END;
$$;

-- reserve_job_on: allocate the envelope of p_job on p_nodes (rank order) as a new attempt. Returns the
-- attempt id. Enqueues the pgqueuer `launch` job in the same transaction. Set-based (one statement for
-- all members and their GPUs) because placement throughput is bounded by statements per placement.
CREATE OR REPLACE FUNCTION tuneplane.reserve_job_on(p_job tuneplane.jobs, p_nodes bigint[])
RETURNS bigint
LANGUAGE plpgsql AS $$
DECLARE
    v_attempt   bigint;
    v_number    integer;
    v_settings  tuneplane.launch_settings;
BEGIN
    SELECT * INTO v_settings FROM tuneplane.launch_settings;
    SELECT coalesce(max(number), 0) + 1 INTO v_number FROM tuneplane.attempts WHERE job_id = p_job.id;
    INSERT INTO tuneplane.attempts (job_id, number, fleet_id, reason, master_addr, master_port)
    VALUES (p_job.id, v_number, p_job.fleet_id, 'reserved',
            (SELECT address FROM tuneplane.nodes WHERE id = p_nodes[1]),
            v_settings.rendezvous_port_base + ((p_job.id * 31 + v_number) % v_settings.rendezvous_port_span))
    RETURNING id INTO v_attempt;

    WITH picks AS (
        SELECT r.ord - 1 AS rank, r.node_id,
               (SELECT coalesce(array_agg(x.gpu_index ORDER BY x.gpu_index), '{}')
                  FROM (SELECT ng.gpu_index FROM tuneplane.node_gpus ng
                         WHERE ng.node_id = r.node_id
                           AND NOT EXISTS (SELECT 1 FROM tuneplane.gpu_allocations a
                                            WHERE a.node_id = ng.node_id AND a.gpu_index = ng.gpu_index
                                              AND a.released_at IS NULL)
                         ORDER BY ng.gpu_index
                         LIMIT p_job.gpus_per_node) x) AS gpus
          FROM unnest(p_nodes) WITH ORDINALITY AS r (node_id, ord)
    ), added AS (
        INSERT INTO tuneplane.members (attempt_id, job_id, rank, node_id, gpu_indices, cpus, memory_bytes)
        SELECT v_attempt, p_job.id, picks.rank, picks.node_id, picks.gpus, p_job.cpus_per_node, p_job.memory_per_node
          FROM picks
        RETURNING id, node_id, gpu_indices
    )
    INSERT INTO tuneplane.gpu_allocations (member_id, node_id, gpu_index)
    SELECT added.id, added.node_id, unnest(added.gpu_indices) FROM added;

    IF EXISTS (SELECT 1 FROM tuneplane.members
                WHERE attempt_id = v_attempt AND cardinality(gpu_indices) < p_job.gpus_per_node) THEN
        RAISE EXCEPTION 'a node has fewer free GPUs than its usage row says' USING ERRCODE = 'TP500';
    END IF;
    UPDATE tuneplane.node_usage
       SET used_gpus = used_gpus + p_job.gpus_per_node,
           used_cpus = used_cpus + p_job.cpus_per_node,
           used_memory = used_memory + p_job.memory_per_node
     WHERE node_id = ANY (p_nodes);
    PERFORM tuneplane.set_job_state(p_job.id, 'reserved',
        format('reserved %s on %s (attempt %s); waiting for a worker to prepare it',
               tuneplane.describe_request(p_job),
               (SELECT string_agg(name, ', ' ORDER BY array_position(p_nodes, id))
                  FROM tuneplane.nodes WHERE id = ANY (p_nodes)),
               v_number),
        jsonb_build_object('attempt', v_number, 'nodes', to_jsonb(p_nodes)));
    -- Same transaction as the reservation (GUIDE-postgres rule 6); the dedupe key makes it once.
    INSERT INTO public.pgqueuer (priority, status, entrypoint, payload, dedupe_key)
    VALUES (greatest(least(p_job.priority, 1000), -1000), 'queued', 'launch',
            convert_to(jsonb_build_object('attempt_id', v_attempt)::text, 'UTF8'), 'launch:' || v_attempt)
    ON CONFLICT DO NOTHING;
    RETURN v_attempt;
END;
$$;

-- reserve_next: one placement pass over a fleet's queue. Serialized per fleet by a transaction-level
-- advisory lock. Reserves every job that fits (see the backfill rule above) and refreshes the reason of
-- every job that does not. Returns the attempts it created.
-- Why no snapshot table: each candidate search is an index range scan on node_usage_fit that sees this
-- transaction's own allocations, and stops at the first nodes that fit (best fit = fewest free GPUs).
CREATE OR REPLACE FUNCTION tuneplane.reserve_next(p_fleet_id bigint, p_max_jobs integer DEFAULT 1000)
RETURNS TABLE (job_id bigint, attempt_id bigint)
LANGUAGE plpgsql AS $$
DECLARE
    v_job        tuneplane.jobs;
    v_nodes      bigint[];
    v_head       tuneplane.jobs;
    v_claim      bigint[] := '{}';
    v_fit        integer;
    v_best       text;
    v_reason     text;
    v_fresh      timestamptz;
    v_fits       jsonb := '{}';
    v_shape      text;
BEGIN
    PERFORM pg_advisory_xact_lock(hashtext('tuneplane.placement'), p_fleet_id::integer);
    -- Connected = heartbeat younger than stale_after (the same rule as node_connectivity()).
    SELECT now() - s.stale_after INTO v_fresh FROM tuneplane.node_settings s;

    FOR v_job IN
        SELECT * FROM tuneplane.jobs j
         WHERE j.fleet_id = p_fleet_id AND j.state = 'queued'
         ORDER BY j.priority DESC, j.created_at, j.id
         LIMIT p_max_jobs
         FOR UPDATE SKIP LOCKED
    LOOP
        SELECT coalesce(array_agg(c.node_id ORDER BY c.free_gpus, c.node_id), '{}') INTO v_nodes
          FROM (SELECT u.node_id, u.free_gpus
                  FROM tuneplane.node_usage u
                  JOIN tuneplane.nodes n ON n.id = u.node_id
                 WHERE u.fleet_id = p_fleet_id
                   AND u.free_gpus >= v_job.gpus_per_node
                   AND n.cpus - u.used_cpus >= v_job.cpus_per_node
                   AND n.memory_bytes - u.used_memory >= v_job.memory_per_node
                   AND n.scheduling_state = 'active' AND n.fenced_at IS NULL AND n.last_heartbeat_at > v_fresh
                   AND (v_head.id IS NULL
                        OR NOT u.node_id = ANY (v_claim)
                        OR (u.free_gpus - v_job.gpus_per_node >= v_head.gpus_per_node
                            AND n.cpus - u.used_cpus - v_job.cpus_per_node >= v_head.cpus_per_node
                            AND n.memory_bytes - u.used_memory - v_job.memory_per_node >= v_head.memory_per_node))
                 ORDER BY u.free_gpus, u.node_id
                 LIMIT v_job.nodes) c;

        IF coalesce(array_length(v_nodes, 1), 0) = v_job.nodes THEN
            attempt_id := tuneplane.reserve_job_on(v_job, v_nodes);
            job_id := v_job.id;
            -- Capacity changed: recompute the "why not" figures when next needed.
            v_best := NULL;
            v_fits := '{}';
            RETURN NEXT;
            CONTINUE;
        END IF;

        -- Why not: how many nodes could take one member now (counted once per request shape while
        -- capacity is unchanged), and the roomiest node.
        v_shape := format('%s/%s/%s', v_job.gpus_per_node, v_job.cpus_per_node, v_job.memory_per_node);
        v_fit := (v_fits ->> v_shape)::integer;
        IF v_fit IS NULL THEN
            SELECT count(*) INTO v_fit
              FROM tuneplane.node_usage u JOIN tuneplane.nodes n ON n.id = u.node_id
             WHERE u.fleet_id = p_fleet_id AND u.free_gpus >= v_job.gpus_per_node
               AND n.cpus - u.used_cpus >= v_job.cpus_per_node
               AND n.memory_bytes - u.used_memory >= v_job.memory_per_node
               AND n.scheduling_state = 'active' AND n.fenced_at IS NULL AND n.last_heartbeat_at > v_fresh;
            v_fits := v_fits || jsonb_build_object(v_shape, v_fit);
        END IF;
        IF v_best IS NULL THEN
            SELECT coalesce(max(format('largest free: %s GPUs, %s CPUs on %s', u.free_gpus, n.cpus - u.used_cpus,
                                       n.name)), 'no schedulable connected node in the fleet')
              INTO v_best
              FROM (SELECT u2.node_id FROM tuneplane.node_usage u2 JOIN tuneplane.nodes n2 ON n2.id = u2.node_id
                     WHERE u2.fleet_id = p_fleet_id AND n2.scheduling_state = 'active' AND n2.fenced_at IS NULL
                       AND n2.last_heartbeat_at > v_fresh
                     ORDER BY u2.free_gpus DESC, n2.cpus - u2.used_cpus DESC, u2.node_id
                     LIMIT 1) b
              JOIN tuneplane.node_usage u ON u.node_id = b.node_id
              JOIN tuneplane.nodes n ON n.id = b.node_id;
        END IF;
        v_reason := format('waiting for resources: needs %s; best fit now: %s node%s can take a member (%s)',
                           tuneplane.describe_request(v_job), v_fit, CASE WHEN v_fit = 1 THEN '' ELSE 's' END,
                           v_best);
        IF v_head.id IS NULL THEN
            v_head := v_job;
            -- The head claims the capable nodes with the most free GPUs now.
            SELECT coalesce(array_agg(x.node_id), '{}') INTO v_claim
              FROM (SELECT u.node_id FROM tuneplane.node_usage u JOIN tuneplane.nodes n ON n.id = u.node_id
                     WHERE u.fleet_id = p_fleet_id
                       AND n.scheduling_state = 'active' AND n.fenced_at IS NULL AND n.last_heartbeat_at > v_fresh
                       AND u.total_gpus >= v_job.gpus_per_node
                       AND n.cpus >= v_job.cpus_per_node
                       AND n.memory_bytes >= v_job.memory_per_node
                     ORDER BY u.free_gpus DESC, n.cpus - u.used_cpus DESC, u.node_id
                     LIMIT v_job.nodes) x;
            IF coalesce(array_length(v_claim, 1), 0) < v_job.nodes THEN
                v_reason := v_reason || format('; only %s schedulable node(s) could ever hold a member',
                                               coalesce(array_length(v_claim, 1), 0));
            END IF;
        ELSE
            v_reason := v_reason || format('; behind job %s at the head of the queue', v_head.id);
        END IF;
        PERFORM tuneplane.set_job_state(v_job.id, 'queued', v_reason);
    END LOOP;
END;
$$;

-- release_member: give back a member's GPUs, CPUs and memory (idempotent). Called by the lifecycle
-- functions once the member's node has confirmed it stopped, or when nothing ever started.
CREATE OR REPLACE FUNCTION tuneplane.release_member(p_member_id bigint)
RETURNS boolean
LANGUAGE plpgsql AS $$
DECLARE
    m tuneplane.members;
    v_gpus integer;
BEGIN
    UPDATE tuneplane.members SET released_at = clock_timestamp(), updated_at = clock_timestamp()
     WHERE id = p_member_id AND released_at IS NULL
    RETURNING * INTO m;
    IF m.id IS NULL THEN
        RETURN false;
    END IF;
    UPDATE tuneplane.gpu_allocations SET released_at = clock_timestamp()
     WHERE member_id = m.id AND released_at IS NULL;
    GET DIAGNOSTICS v_gpus = ROW_COUNT;
    UPDATE tuneplane.node_usage
       SET used_gpus = used_gpus - v_gpus, used_cpus = used_cpus - m.cpus, used_memory = used_memory - m.memory_bytes
     WHERE node_id = m.node_id;
    -- Capacity came free: wake the schedulers (debounced by NOTIFY's per-transaction de-duplication).
    PERFORM pg_notify('tuneplane_placement', (SELECT fleet_id::text FROM tuneplane.nodes WHERE id = m.node_id));
    RETURN true;
END;
$$;

-- Operators: the queue with positions, and live reservations.
CREATE OR REPLACE VIEW tuneplane.v_queue AS
SELECT j.id AS job_id, f.name AS fleet, j.priority,
       row_number() OVER (PARTITION BY j.fleet_id ORDER BY j.priority DESC, j.created_at, j.id) AS position,
       u.username AS owner, j.nodes, j.gpus_per_node, j.cpus_per_node, j.memory_per_node,
       j.created_at, now() - j.created_at AS waiting, j.state_reason
  FROM tuneplane.jobs j
  JOIN tuneplane.fleets f ON f.id = j.fleet_id
  JOIN tuneplane.users u ON u.id = j.owner_id
 WHERE j.state = 'queued';

CREATE OR REPLACE VIEW tuneplane.v_reservations AS
SELECT m.job_id, a.number AS attempt, a.state AS attempt_state, m.id AS member_id, m.rank, n.name AS node,
       m.gpu_indices, m.cpus, m.memory_bytes, m.state AS member_state, m.reason,
       tuneplane.node_connectivity(n.last_heartbeat_at) AS node_connectivity, a.created_at AS reserved_at
  FROM tuneplane.members m
  JOIN tuneplane.attempts a ON a.id = m.attempt_id
  JOIN tuneplane.nodes n ON n.id = m.node_id
 WHERE m.released_at IS NULL;
