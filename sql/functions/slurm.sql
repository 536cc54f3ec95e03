-- sql/functions/slurm.sql — the Slurm backend's functions (issue 13, docs/slurm.md, ADR 0110).
-- A Slurm fleet's jobs go through the same jobs/attempts/members rows, the same launch decisions and the
-- same state machine (launch.sql) as the Node backend. What differs: Slurm places the job (one sbatch per
-- attempt, gang by Slurm), so the attempt is created when the worker submits it, the job stays `queued`
-- while Slurm keeps it pending (with Slurm's reason in TunePlane's words), and members are created on the
-- nodes Slurm allocated when the allocation starts. Prepare/commit and exits are reported by the batch
-- script's steps through files on the fleet's shared path (ADR 0110); the worker turns each file into one
-- call below, and every decision is taken here.
--
-- Repeatable file (ADR 0012). Drops (signature changes):
DROP FUNCTION IF EXISTS tuneplane.slurm_followed(bigint);
-- slurm_submissions_due returns the account of the job's team (fleet_team_access.slurm_account).
DROP FUNCTION IF EXISTS tuneplane.slurm_submissions_due(bigint);
-- slurm_member_exited gained p_signalled_at (when Slurm's signal reached the step: a stop Slurm began).
DROP FUNCTION IF EXISTS tuneplane.slurm_member_exited(bigint, integer, integer, text, boolean, text);

-- slurm_reason_words: a Slurm pending reason in TunePlane's words (the raw code is shown beside it).
CREATE OR REPLACE FUNCTION tuneplane.slurm_reason_words(p_code text)
RETURNS text
LANGUAGE sql IMMUTABLE AS $$
    SELECT CASE
        WHEN p_code IS NULL OR p_code IN ('None', '') THEN 'submitted; Slurm has not considered it yet'
        WHEN p_code IN ('Resources', 'Nodes_required_for_job_are_DOWN,_DRAINED_or_reserved_for_jobs_in_higher_priority_partitions')
             OR p_code LIKE 'ReqNodeNotAvail%' OR p_code = 'NodeDown'
            THEN 'waiting for resources: the partition has no free nodes with what it asks for yet'
        WHEN p_code IN ('Priority', 'PartitionConfig') THEN 'waiting behind jobs of higher priority'
        WHEN p_code LIKE 'QOS%' OR p_code LIKE 'Assoc%' OR p_code LIKE '%Limit%'
            THEN 'held by a QOS or quota limit of the account'
        WHEN p_code LIKE 'Dependency%' THEN 'waiting for a dependency'
        WHEN p_code LIKE 'JobHeld%' OR p_code = 'Held' THEN 'held'
        WHEN p_code = 'BeginTime' THEN 'waiting for its start time'
        ELSE 'pending in Slurm'
    END;
$$;

-- slurm_quota_words: Slurm's association and QOS pending reasons said in the words of TunePlane's own quota
-- reasons (docs/teams.md), naming the team, the fleet, the Slurm account the team's jobs are submitted
-- under and the job's ask; NULL for any other reason (slurm_reason_words says those).
CREATE OR REPLACE FUNCTION tuneplane.slurm_quota_words(p_code text, p_team text, p_fleet text, p_account text,
                                                       p_gpus integer)
RETURNS text
LANGUAGE sql IMMUTABLE AS $$
    SELECT format('%s; this job asks %s GPU%s (Slurm %s of account %s)', w, p_gpus,
                  CASE WHEN p_gpus = 1 THEN '' ELSE 's' END,
                  CASE WHEN p_code LIKE 'QOS%' THEN 'QOS limit' ELSE 'association limit' END,
                  coalesce(p_account, '(default)'))
      FROM (SELECT CASE
                WHEN p_code ~ '^(Assoc|QOS)Grp(GRES|TRES|Cpu|Node|Mem|Jobs|Submit|Wall)'
                    THEN format('team %s would go past its limit on fleet %s', p_team, p_fleet)
                WHEN p_code ~ '^(Assoc|QOS)Max.*PerUser' OR p_code ~ '^QOSMax.*PerAccount'
                    THEN format('team %s would go past what one %s may hold on fleet %s', p_team,
                                CASE WHEN p_code LIKE '%PerAccount%' THEN 'account' ELSE 'user' END, p_fleet)
                WHEN p_code ~ '^(Assoc|QOS)Max.*PerJob' OR p_code ~ '^(Assoc|QOS)Max.*PerNode'
                    THEN format('this job asks more than one job of team %s may use on fleet %s', p_team, p_fleet)
            END AS w) x
     WHERE w IS NOT NULL;
$$;

-- slurm_sync_fleet: what the worker read from the cluster (sinfo/scontrol) at one look. The controller
-- answered: every Slurm node of the partition becomes (or stays) a node of the fleet, with its CPUs, memory
-- and GPUs (gres) as capacity, its Slurm state as scheduling state, and a heartbeat (connectivity: the
-- controller reachable). Members whose contact was lost while the controller did not answer get it back.
-- p_status: {"version": "22.05.8", "partition": {"max_nodes": 2, "max_time_minutes": 60},
--            "nodes": [{"name": "n1", "address": "10.0.0.1", "state": "idle", "reason": null, "cpus": 2,
--                       "memory_mb": 1000, "gpus": 2, "gpu_model": "gpu"}]}
CREATE OR REPLACE FUNCTION tuneplane.slurm_sync_fleet(p_fleet_id bigint, p_status jsonb)
RETURNS integer
LANGUAGE plpgsql AS $$
DECLARE
    r      record;
    v_node bigint;
    v_seen integer := 0;
BEGIN
    UPDATE tuneplane.slurm_fleets
       SET version = p_status ->> 'version', reachable = true, last_error = NULL,
           checked_at = clock_timestamp(), reached_at = clock_timestamp(),
           max_nodes = (p_status -> 'partition' ->> 'max_nodes')::integer,
           max_time_minutes = (p_status -> 'partition' ->> 'max_time_minutes')::integer
     WHERE fleet_id = p_fleet_id;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'fleet % is not a Slurm fleet', p_fleet_id USING ERRCODE = 'TP404', COLUMN = 'fleet';
    END IF;
    FOR r IN SELECT * FROM jsonb_to_recordset(p_status -> 'nodes')
                    AS x(name text, address text, state text, reason text, cpus integer, memory_mb bigint,
                         gpus integer, gpu_model text)
              ORDER BY name LOOP
        INSERT INTO tuneplane.nodes AS n (fleet_id, name, cpus, memory_bytes, address, last_heartbeat_at,
                                          agent_version)
        VALUES (p_fleet_id, r.name, r.cpus, r.memory_mb * 1048576, r.address, clock_timestamp(),
                'slurm ' || coalesce(p_status ->> 'version', '?'))
        ON CONFLICT (fleet_id, name) DO UPDATE
           SET cpus = EXCLUDED.cpus, memory_bytes = EXCLUDED.memory_bytes, address = EXCLUDED.address,
               last_heartbeat_at = EXCLUDED.last_heartbeat_at, agent_version = EXCLUDED.agent_version
        RETURNING n.id INTO v_node;
        IF (SELECT count(*) FROM tuneplane.node_gpus WHERE node_id = v_node) <> r.gpus THEN
            DELETE FROM tuneplane.node_gpus WHERE node_id = v_node;
            INSERT INTO tuneplane.node_gpus (node_id, gpu_index, model)
            SELECT v_node, i, coalesce(r.gpu_model, 'gpu') FROM generate_series(0, r.gpus - 1) i;
        END IF;
        INSERT INTO tuneplane.slurm_nodes (node_id, slurm_state, reason, updated_at)
        VALUES (v_node, r.state, r.reason, clock_timestamp())
        ON CONFLICT (node_id) DO UPDATE
           SET slurm_state = EXCLUDED.slurm_state, reason = EXCLUDED.reason, updated_at = EXCLUDED.updated_at;
        v_seen := v_seen + 1;
    END LOOP;
    -- The controller answers again: contact is back for what it follows (the worker reads each job's state
    -- right after this).
    UPDATE tuneplane.members m SET contact_lost_at = NULL
      FROM tuneplane.nodes n
     WHERE n.id = m.node_id AND n.fleet_id = p_fleet_id AND m.released_at IS NULL
       AND m.contact_lost_at IS NOT NULL;
    RETURN v_seen;
END;
$$;

-- slurm_controller_unreachable: the controller did not answer. Nothing is decided from silence: every held
-- member of the fleet is marked contact-lost (its state is kept, its resources stay held) until the
-- controller answers (slurm_sync_fleet). Returns how many members were marked.
CREATE OR REPLACE FUNCTION tuneplane.slurm_controller_unreachable(p_fleet_id bigint, p_error text)
RETURNS integer
LANGUAGE plpgsql AS $$
DECLARE
    v_count integer;
BEGIN
    UPDATE tuneplane.slurm_fleets SET reachable = false, last_error = p_error, checked_at = clock_timestamp()
     WHERE fleet_id = p_fleet_id;
    UPDATE tuneplane.members m SET contact_lost_at = clock_timestamp()
      FROM tuneplane.nodes n
     WHERE n.id = m.node_id AND n.fleet_id = p_fleet_id AND m.released_at IS NULL
       AND m.contact_lost_at IS NULL;
    GET DIAGNOSTICS v_count = ROW_COUNT;
    RETURN v_count;
END;
$$;

-- slurm_time_limit_minutes: Slurm's own limit for a job (sbatch --time), NULL when its JobSpec has none. At the
-- JobSpec's limit TunePlane asks the job to checkpoint and stop, as on node fleets (expire_time_limits,
-- preemption.sql); Slurm's TIMEOUT only backs that up, so its limit is the JobSpec's plus the job's grace,
-- the stop after it (launch_settings.stop_grace) and a minute for the worker's passes, rounded up to whole
-- minutes and never over the partition's MaxTime (a limit close to MaxTime keeps less of its grace).
CREATE OR REPLACE FUNCTION tuneplane.slurm_time_limit_minutes(p_job_id bigint)
RETURNS integer
LANGUAGE sql STABLE AS $$
    SELECT least(ceil(((j.spec -> 'resources' ->> 'time_limit_minutes')::numeric * 60
                       + extract(epoch FROM tuneplane.preemption_grace_of(j.id) + s.stop_grace) + 60) / 60),
                 coalesce(f.max_time_minutes, 2147483647))::integer
      FROM tuneplane.jobs j
      JOIN tuneplane.slurm_fleets f ON f.fleet_id = j.fleet_id, tuneplane.launch_settings s
     WHERE j.id = p_job_id AND j.spec -> 'resources' ? 'time_limit_minutes';
$$;

-- slurm_submissions_due: queued jobs of a Slurm fleet without a live attempt get one (`reserved`: Slurm
-- holds the request) and a slurm_jobs row; the worker then runs sbatch and calls slurm_submitted. The job
-- stays `queued` (Slurm's queue is a state) with a reason saying so. time_limit_minutes: sbatch --time
-- (slurm_time_limit_minutes).
CREATE OR REPLACE FUNCTION tuneplane.slurm_submissions_due(p_fleet_id bigint)
RETURNS TABLE (attempt_id bigint, job_id bigint, attempt_number integer, nodes integer, gpus_per_node integer,
               cpus_per_node integer, memory_per_node bigint, spec jsonb, account text,
               time_limit_minutes integer)
LANGUAGE plpgsql AS $$
DECLARE
    j tuneplane.jobs;
    v_attempt bigint;
    v_number integer;
BEGIN
    FOR j IN SELECT * FROM tuneplane.jobs q
              WHERE q.fleet_id = p_fleet_id AND q.state = 'queued'
                AND NOT EXISTS (SELECT 1 FROM tuneplane.attempts a WHERE a.job_id = q.id
                                   AND a.state IN ('reserved', 'preparing', 'running', 'stopping'))
              ORDER BY q.priority DESC, q.created_at, q.id
              FOR UPDATE SKIP LOCKED LOOP
        SELECT coalesce(max(a.number), 0) + 1 INTO v_number FROM tuneplane.attempts a WHERE a.job_id = j.id;
        INSERT INTO tuneplane.attempts (job_id, number, fleet_id, reason)
        VALUES (j.id, v_number, p_fleet_id, 'submitting to Slurm')
        RETURNING id INTO v_attempt;
        INSERT INTO tuneplane.slurm_jobs (attempt_id, job_id, fleet_id) VALUES (v_attempt, j.id, p_fleet_id);
        PERFORM tuneplane.set_job_state(j.id, 'queued', format('attempt %s: submitting to Slurm', v_number));
        attempt_id := v_attempt; job_id := j.id; attempt_number := v_number; nodes := j.nodes;
        gpus_per_node := j.gpus_per_node; cpus_per_node := j.cpus_per_node;
        memory_per_node := j.memory_per_node; spec := j.spec;
        time_limit_minutes := tuneplane.slurm_time_limit_minutes(j.id);
        -- The team's Slurm account on this fleet (docs/teams.md), so Slurm's accounting agrees with the ledger.
        account := (SELECT t.slurm_account FROM tuneplane.fleet_team_access t
                     WHERE t.fleet_id = p_fleet_id AND t.team_id = j.team_id);
        RETURN NEXT;
    END LOOP;
END;
$$;

-- slurm_submitted: sbatch answered with the Slurm job id of an attempt.
CREATE OR REPLACE FUNCTION tuneplane.slurm_submitted(p_attempt_id bigint, p_slurm_job_id bigint)
RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    a tuneplane.attempts;
BEGIN
    a := tuneplane.lock_attempt(p_attempt_id);
    UPDATE tuneplane.slurm_jobs SET slurm_job_id = p_slurm_job_id, submitted_at = clock_timestamp(),
                                    slurm_state = 'PENDING'
     WHERE attempt_id = p_attempt_id AND slurm_job_id IS NULL;
    IF a.state = 'reserved' AND a.cancel_requested_at IS NULL THEN
        PERFORM tuneplane.set_job_state(a.job_id, 'queued',
            format('attempt %s: submitted to Slurm as job %s', a.number, p_slurm_job_id));
    END IF;
END;
$$;

-- slurm_pending: Slurm still keeps the job pending. The job stays `queued`; its reason is Slurm's in
-- TunePlane's words, the raw code and how many jobs of the partition are ahead of it (event detail too).
CREATE OR REPLACE FUNCTION tuneplane.slurm_pending(p_attempt_id bigint, p_code text, p_jobs_ahead integer)
RETURNS text
LANGUAGE plpgsql AS $$
DECLARE
    a tuneplane.attempts;
    s tuneplane.slurm_jobs;
    v_reason text;
BEGIN
    a := tuneplane.lock_attempt(p_attempt_id);
    SELECT * INTO s FROM tuneplane.slurm_jobs WHERE attempt_id = p_attempt_id FOR UPDATE;
    UPDATE tuneplane.slurm_jobs SET slurm_state = 'PENDING', slurm_reason = p_code, jobs_ahead = p_jobs_ahead
     WHERE attempt_id = p_attempt_id;
    v_reason := format('%s (Slurm job %s, reason %s); %s job%s ahead of it in partition %s',
                       coalesce((SELECT tuneplane.slurm_quota_words(p_code, t.name, f.name, fa.slurm_account,
                                                                    j.nodes * j.gpus_per_node)
                                   FROM tuneplane.jobs j JOIN tuneplane.teams t ON t.id = j.team_id
                                   JOIN tuneplane.fleets f ON f.id = j.fleet_id
                                   LEFT JOIN tuneplane.fleet_team_access fa
                                          ON fa.fleet_id = j.fleet_id AND fa.team_id = j.team_id
                                  WHERE j.id = a.job_id),
                                tuneplane.slurm_reason_words(p_code)),
                       s.slurm_job_id, coalesce(p_code, 'None'),
                       p_jobs_ahead, CASE WHEN p_jobs_ahead = 1 THEN '' ELSE 's' END,
                       (SELECT partition FROM tuneplane.slurm_fleets WHERE fleet_id = s.fleet_id));
    IF a.state = 'reserved' AND a.cancel_requested_at IS NULL THEN
        PERFORM tuneplane.set_job_state(a.job_id, 'queued', v_reason,
            jsonb_build_object('slurm_job_id', s.slurm_job_id, 'slurm_reason', p_code,
                               'jobs_ahead', p_jobs_ahead));
    END IF;
    RETURN v_reason;
END;
$$;

-- slurm_allocation_started: Slurm started the allocation on p_nodes (in rank order). Members are created
-- there (rank i on p_nodes[i], `preparing`, their CPUs and memory counted as used), rank 0's node is the
-- rendezvous, the attempt and the job become `preparing` with the prepare deadline, and the checkpoint
-- the attempt resumes from is chosen (attempts.resume_artifact_id); the members count for their team on
-- the fleet (a team_fleet_held_changes row, placement.sql). A second call changes nothing. Returns the
-- members.
CREATE OR REPLACE FUNCTION tuneplane.slurm_allocation_started(p_attempt_id bigint, p_nodes text[],
                                                                p_master_port integer, p_capsule_digest text)
RETURNS TABLE (member_id bigint, rank integer, node text, address text)
LANGUAGE plpgsql AS $$
DECLARE
    a tuneplane.attempts;
    j tuneplane.jobs;
    v_ids bigint[];
BEGIN
    a := tuneplane.lock_attempt(p_attempt_id);
    SELECT * INTO j FROM tuneplane.jobs WHERE id = a.job_id;
    IF a.state = 'reserved' AND a.cancel_requested_at IS NULL
       AND NOT EXISTS (SELECT 1 FROM tuneplane.members WHERE attempt_id = a.id) THEN
        IF cardinality(p_nodes) <> j.nodes THEN
            RAISE EXCEPTION 'Slurm allocated % node(s) to attempt %, the job asks for %', cardinality(p_nodes),
                p_attempt_id, j.nodes USING ERRCODE = 'TP409', COLUMN = 'nodes';
        END IF;
        SELECT array_agg(n.id ORDER BY x.ord) INTO v_ids
          FROM unnest(p_nodes) WITH ORDINALITY x(name, ord)
          JOIN tuneplane.nodes n ON n.fleet_id = a.fleet_id AND n.name = x.name;
        IF cardinality(v_ids) IS DISTINCT FROM j.nodes THEN
            RAISE EXCEPTION 'attempt %: Slurm allocated nodes % that the fleet does not know yet', p_attempt_id,
                p_nodes USING ERRCODE = 'TP409', COLUMN = 'nodes';
        END IF;
        INSERT INTO tuneplane.members (attempt_id, job_id, rank, node_id, cpus, memory_bytes, state, reason)
        SELECT a.id, a.job_id, (x.ord - 1)::integer, x.node_id, j.cpus_per_node, j.memory_per_node, 'preparing',
               'preparing inside the Slurm allocation'
          FROM unnest(v_ids) WITH ORDINALITY x(node_id, ord);
        -- The usage ledger opens in the transaction that saw the allocation start (usage.sql).
        PERFORM tuneplane.open_usage(ARRAY[a.id], clock_timestamp());
        -- Its team holds these members on the fleet now (no GPU indices: Slurm picks the GPUs); a change
        -- row, folded by the fleet's next pass (team_fleet_held_fold, placement.sql).
        INSERT INTO tuneplane.team_fleet_held_changes (fleet_id, team_id, gpus, members)
        VALUES (a.fleet_id, j.team_id, 0, j.nodes);
        UPDATE tuneplane.node_usage u
           SET used_cpus = used_cpus + j.cpus_per_node, used_memory = used_memory + j.memory_per_node
         WHERE u.node_id = ANY (v_ids);
        UPDATE tuneplane.attempts
           SET master_addr = (SELECT coalesce(n.address, n.name) FROM tuneplane.nodes n WHERE n.id = v_ids[1]),
               master_port = p_master_port, capsule_digest = p_capsule_digest,
               prepare_deadline = clock_timestamp()
                   + (SELECT prepare_timeout FROM tuneplane.launch_settings),
               -- The checkpoint this attempt resumes from, chosen as late as possible (as begin_prepare does
               -- on node fleets); plan.json carries it to the steps (resume_pin, preemption.sql).
               resume_artifact_id = (tuneplane.resume_checkpoint_of(a.job_id)).id
         WHERE id = a.id;
        UPDATE tuneplane.slurm_jobs SET started_at = clock_timestamp(), node_list = p_nodes, slurm_state = 'RUNNING',
                                        slurm_reason = NULL, jobs_ahead = NULL
         WHERE attempt_id = a.id;
        PERFORM tuneplane.set_attempt_state(a.id, 'preparing', 'Slurm allocation started; preparing');
        PERFORM tuneplane.set_job_state(j.id, 'preparing',
            format('attempt %s: Slurm allocated %s; preparing %s member(s)%s', a.number,
                   array_to_string(p_nodes, ','), j.nodes, tuneplane.resume_words(a.id)));
    END IF;
    RETURN QUERY SELECT m.id, m.rank, n.name, coalesce(n.address, n.name)
                   FROM tuneplane.members m JOIN tuneplane.nodes n ON n.id = m.node_id
                  WHERE m.attempt_id = p_attempt_id ORDER BY m.rank;
END;
$$;

-- slurm_member: one member of an attempt by rank, locked in the lock order (job → attempt → member).
CREATE OR REPLACE FUNCTION tuneplane.slurm_member(p_attempt_id bigint, p_rank integer)
RETURNS tuneplane.members
LANGUAGE plpgsql AS $$
DECLARE
    m tuneplane.members;
BEGIN
    PERFORM tuneplane.lock_attempt(p_attempt_id);
    SELECT * INTO m FROM tuneplane.members WHERE attempt_id = p_attempt_id AND rank = p_rank FOR UPDATE;
    IF m.id IS NULL THEN
        RAISE EXCEPTION 'attempt % has no member of rank %', p_attempt_id, p_rank
            USING ERRCODE = 'TP404', COLUMN = 'rank';
    END IF;
    RETURN m;
END;
$$;

-- slurm_member_prepared: the prepare step of rank p_rank reported PREPARED. When it is the last one, COMMIT
-- is recorded and every member becomes `starting` (the batch script starts the workload step only after
-- the worker has seen this decision). Returns the attempt's decision ('commit', 'abort' or NULL).
CREATE OR REPLACE FUNCTION tuneplane.slurm_member_prepared(p_attempt_id bigint, p_rank integer)
RETURNS text
LANGUAGE plpgsql AS $$
DECLARE
    m tuneplane.members;
    a tuneplane.attempts;
BEGIN
    m := tuneplane.slurm_member(p_attempt_id, p_rank);
    SELECT * INTO a FROM tuneplane.attempts WHERE id = p_attempt_id;
    IF m.state = 'preparing' THEN
        PERFORM tuneplane.set_member_state(m.id, 'prepared', 'prepared inside the Slurm allocation');
    END IF;
    -- The last one records COMMIT (record_commit, launch.sql: the one COMMIT decision of every backend).
    PERFORM tuneplane.record_commit(a.id);
    RETURN (SELECT decision FROM tuneplane.launch_decisions WHERE attempt_id = a.id);
END;
$$;

-- slurm_member_prepare_failed: one prepare step failed: ABORT (nothing of the workload has run anywhere:
-- the batch script starts it only after COMMIT). The worker then cancels the Slurm job.
CREATE OR REPLACE FUNCTION tuneplane.slurm_member_prepare_failed(p_attempt_id bigint, p_rank integer,
                                                                  p_reason text)
RETURNS text
LANGUAGE plpgsql AS $$
DECLARE
    m tuneplane.members;
    n text;
BEGIN
    m := tuneplane.slurm_member(p_attempt_id, p_rank);
    SELECT name INTO n FROM tuneplane.nodes WHERE id = m.node_id;
    PERFORM tuneplane.decide_abort(p_attempt_id, format('rank %s on %s failed to prepare: %s', p_rank, n,
                                                        p_reason));
    RETURN (SELECT decision FROM tuneplane.launch_decisions WHERE attempt_id = p_attempt_id);
END;
$$;

-- slurm_member_started: the workload step started rank p_rank's runner (starting → running). The attempt is
-- running once every member started (member_now_running, launch.sql: the Node backend's rule).
CREATE OR REPLACE FUNCTION tuneplane.slurm_member_started(p_attempt_id bigint, p_rank integer, p_pid integer)
RETURNS text
LANGUAGE plpgsql AS $$
DECLARE
    m tuneplane.members;
BEGIN
    m := tuneplane.slurm_member(p_attempt_id, p_rank);
    IF m.state = 'starting' THEN
        PERFORM tuneplane.member_now_running(m.id, p_pid, 'running in its Slurm step');
    END IF;
    RETURN (SELECT state FROM tuneplane.members WHERE id = m.id);
END;
$$;

-- slurm_member_exited: rank p_rank's runner ended and wrote its exit status. p_signalled: a signal reached
-- the step (reports/<rank>.signalled, p_signalled_at its epoch); the worker then waits for Slurm's end state
-- (p_slurm_state) before it calls this.
--   TunePlane asked the attempt to checkpoint and stop (request_preemption: stop_kind), or asked nothing but
--   Slurm itself preempted the job or ended it at its time limit (slurm_stop_from_end records that as the
--   same request): the exit is recorded as the workload reported it — a workload that trapped the signal,
--   saved and exited 0 has `exited` — and the attempt ends preempted / timed_out whatever the status
--   (finish_attempt_if_done), never succeeded.
--   Any other signal TunePlane did not send (a node failure, the memory limit, a job past its
--   max_preemptions): failed with Slurm's reason even when the workload exited 0 (Slurm itself records a
--   preempted job whose script exits 0 as COMPLETED).
-- Locks: the job, the attempt, the member (slurm_member), then record_member_exit's.
CREATE OR REPLACE FUNCTION tuneplane.slurm_member_exited(p_attempt_id bigint, p_rank integer, p_exit_code integer,
                                                          p_reason text, p_signalled boolean,
                                                          p_slurm_state text DEFAULT NULL,
                                                          p_signalled_at double precision DEFAULT NULL)
RETURNS text
LANGUAGE plpgsql AS $$
DECLARE
    m tuneplane.members;
    a tuneplane.attempts;
    v_code integer := p_exit_code;
    v_reason text := p_reason;
BEGIN
    m := tuneplane.slurm_member(p_attempt_id, p_rank);
    IF p_signalled AND p_slurm_state IS NOT NULL THEN
        PERFORM tuneplane.slurm_stop_from_end(p_attempt_id,
            CASE WHEN split_part(p_slurm_state, ' ', 1) IN ('COMPLETED', 'FAILED') THEN 'SIGNALLED'
                 ELSE p_slurm_state END,
            to_timestamp(p_signalled_at));
    END IF;
    SELECT * INTO a FROM tuneplane.attempts WHERE id = p_attempt_id;
    IF p_signalled AND a.cancel_requested_at IS NULL AND a.stop_kind IS NOT NULL THEN
        -- The signal of a stop the attempt records: the workload's own status stands (0: exited).
        IF coalesce(v_code, 0) <> 0 THEN
            v_reason := format('%s after the request to checkpoint and stop (%s)',
                               coalesce(nullif(p_reason, ''), format('exit status %s', v_code)), a.stop_cause);
        END IF;
    -- A member stopping because another one failed was still ended by Slurm's signal when Slurm says why
    -- (node failure, time or memory limit): that is its reason, not TunePlane's stop.
    ELSIF p_signalled AND a.cancel_requested_at IS NULL
       AND (m.state <> 'stopping'
            OR split_part(p_slurm_state, ' ', 1) IN ('PREEMPTED', 'NODE_FAIL', 'TIMEOUT', 'OUT_OF_MEMORY', 'DEADLINE')) THEN
        -- A preempted job whose batch script exits 0 is COMPLETED to Slurm: the signal is what counts.
        v_reason := tuneplane.slurm_end_words(
            CASE WHEN p_slurm_state IS NULL OR p_slurm_state IN ('COMPLETED', 'FAILED') THEN 'SIGNALLED'
                 ELSE p_slurm_state END, p_reason);
        IF coalesce(v_code, 0) = 0 THEN
            v_code := -15;
        END IF;
    END IF;
    PERFORM tuneplane.record_member_exit(m, v_code, v_reason);
    RETURN (SELECT state FROM tuneplane.members WHERE id = m.id);
END;
$$;

-- slurm_stop_from_end: Slurm itself stopped a job TunePlane had not asked to stop — PREEMPTED (its own
-- preemption), TIMEOUT or DEADLINE (its time limit), or SIGNALLED (a step got a signal TunePlane did not
-- send and the job still ended COMPLETED or FAILED: what Slurm records for a preempted job whose script
-- trapped the signal and exited). The attempt is recorded as asked to checkpoint and stop — stop_kind
-- preempted (PREEMPTED, SIGNALLED) or timed_out (TIMEOUT, DEADLINE), stop_cause Slurm's words,
-- stop_requested_at when the signal reached the step (p_signalled_at, else now), grace_deadline now — so it
-- ends preempted / timed_out naming its checkpoint and the work lost (settle_stopped_attempt) and the next
-- attempt resumes from it, exactly as after TunePlane's own request. Nothing when a request or a cancel
-- stands, for any other state, for SIGNALLED while TunePlane was stopping the attempt (its own scancel's
-- signal), or for a preemption of a job that used up its max_preemptions (that one
-- fails and counts against max_attempts, so a job Slurm keeps preempting cannot loop). Returns whether it
-- recorded a stop. Locks: the job, then the attempt (lock_attempt).
CREATE OR REPLACE FUNCTION tuneplane.slurm_stop_from_end(p_attempt_id bigint, p_slurm_state text,
                                                          p_signalled_at timestamptz DEFAULT NULL)
RETURNS boolean
LANGUAGE plpgsql AS $$
DECLARE
    a      tuneplane.attempts;
    j      tuneplane.jobs;
    v_kind text;
    v_at   timestamptz := least(coalesce(p_signalled_at, clock_timestamp()), clock_timestamp());
BEGIN
    a := tuneplane.lock_attempt(p_attempt_id);
    SELECT * INTO j FROM tuneplane.jobs WHERE id = a.job_id;
    v_kind := CASE split_part(coalesce(p_slurm_state, ''), ' ', 1)
                  WHEN 'PREEMPTED' THEN 'preempted' WHEN 'SIGNALLED' THEN 'preempted'
                  WHEN 'TIMEOUT' THEN 'timed_out' WHEN 'DEADLINE' THEN 'timed_out' END;
    IF v_kind IS NULL OR a.stop_kind IS NOT NULL OR a.cancel_requested_at IS NOT NULL
       OR a.state NOT IN ('reserved', 'preparing', 'running', 'stopping') THEN
        RETURN false;
    END IF;
    -- A signal without Slurm's word for it is TunePlane's own when TunePlane was stopping the attempt (a
    -- member failed: stop_attempt, then the worker's scancel --full --signal=TERM).
    IF split_part(p_slurm_state, ' ', 1) = 'SIGNALLED'
       AND (a.state = 'stopping'
            OR (SELECT s.scancel_at FROM tuneplane.slurm_jobs s WHERE s.attempt_id = a.id) IS NOT NULL) THEN
        RETURN false;
    END IF;
    IF v_kind = 'preempted'
       AND j.preemptions_used >= coalesce((j.spec -> 'preemption' ->> 'max_preemptions')::integer,
                                          (SELECT max_preemptions FROM tuneplane.preemption_settings)) THEN
        RETURN false;
    END IF;
    UPDATE tuneplane.attempts
       SET stop_kind = v_kind, stop_cause = tuneplane.slurm_end_words(p_slurm_state),
           stop_requested_at = least(v_at, clock_timestamp()), grace_deadline = clock_timestamp()
     WHERE id = a.id;
    RETURN true;
END;
$$;

-- slurm_end_words: why a member ended, from the Slurm job's end state.
CREATE OR REPLACE FUNCTION tuneplane.slurm_end_words(p_state text, p_detail text DEFAULT NULL)
RETURNS text
LANGUAGE sql IMMUTABLE AS $$
    SELECT CASE split_part(p_state, ' ', 1)
        WHEN 'NODE_FAIL' THEN 'node failure: Slurm reported NODE_FAIL'
        WHEN 'TIMEOUT' THEN 'time limit reached: Slurm reported TIMEOUT'
        WHEN 'OUT_OF_MEMORY' THEN 'out of memory: Slurm reported OUT_OF_MEMORY'
        WHEN 'PREEMPTED' THEN 'preempted by Slurm (PREEMPTED)'
        WHEN 'CANCELLED' THEN 'cancelled by Slurm or an operator (CANCELLED)'
        WHEN 'BOOT_FAIL' THEN 'node failed to boot: Slurm reported BOOT_FAIL'
        WHEN 'DEADLINE' THEN 'deadline reached: Slurm reported DEADLINE'
        WHEN 'FAILED' THEN 'the Slurm job failed (FAILED)'
        WHEN 'NEVER_SUBMITTED' THEN 'never submitted to Slurm'
        WHEN 'SIGNALLED' THEN 'stopped by a signal TunePlane did not send (preempted or ended by Slurm)'
        ELSE format('the Slurm job ended (%s)', p_state)
    END || CASE WHEN coalesce(p_detail, '') = '' THEN '' ELSE '; ' || p_detail END;
$$;

-- slurm_job_ended: the Slurm job is gone (it left squeue; its end state from scontrol/sacct/jobcomp).
-- Every member still live ended with it: one that never started → ABORT; a started one → failed with the
-- Slurm end state as its reason (NODE_FAIL, TIMEOUT, OUT_OF_MEMORY, PREEMPTED, CANCELLED). A job that never
-- got an allocation is aborted. The attempt then finishes (retried by max_attempts); one Slurm preempted or
-- timed out ends preempted / timed_out (slurm_stop_from_end) and resumes from its checkpoint. Returns the
-- attempt state.
CREATE OR REPLACE FUNCTION tuneplane.slurm_job_ended(p_attempt_id bigint, p_slurm_state text, p_detail text)
RETURNS text
LANGUAGE plpgsql AS $$
DECLARE
    a tuneplane.attempts;
    m tuneplane.members;
    v_why text := tuneplane.slurm_end_words(coalesce(p_slurm_state, 'UNKNOWN'), p_detail);
BEGIN
    a := tuneplane.lock_attempt(p_attempt_id);
    UPDATE tuneplane.slurm_jobs SET slurm_state = p_slurm_state, gone_at = coalesce(gone_at, clock_timestamp())
     WHERE attempt_id = p_attempt_id;
    -- Slurm preempted it or ended it at its time limit: preempted / timed_out, never failed (or succeeded).
    PERFORM tuneplane.slurm_stop_from_end(a.id, p_slurm_state);
    IF NOT EXISTS (SELECT 1 FROM tuneplane.launch_decisions WHERE attempt_id = a.id) THEN
        PERFORM tuneplane.decide_abort(a.id, 'the Slurm job ended before every member prepared: ' || v_why);
    END IF;
    FOR m IN SELECT * FROM tuneplane.members WHERE attempt_id = a.id AND tuneplane.member_is_live(state)
              ORDER BY id FOR UPDATE LOOP
        PERFORM tuneplane.record_member_exit(m, CASE WHEN m.state = 'stopping' THEN -15 ELSE -9 END, v_why);
    END LOOP;
    RETURN tuneplane.finish_attempt_if_done(a.id);
END;
$$;

-- slurm_scancel_due: attempts of a fleet whose Slurm job must be cancelled (a cancel, an ABORT, or a member
-- failure that stopped the attempt) and was not yet; marks them (the worker runs scancel with the grace).
CREATE OR REPLACE FUNCTION tuneplane.slurm_scancel_due(p_fleet_id bigint)
RETURNS TABLE (attempt_id bigint, slurm_job_id bigint, why text)
LANGUAGE sql AS $$
    UPDATE tuneplane.slurm_jobs s SET scancel_at = clock_timestamp()
      FROM tuneplane.attempts a
     WHERE a.id = s.attempt_id AND s.fleet_id = p_fleet_id AND s.gone_at IS NULL AND s.scancel_at IS NULL
       AND s.slurm_job_id IS NOT NULL
       AND (a.state IN ('stopping', 'aborted', 'cancelled', 'failed') OR a.cancel_requested_at IS NOT NULL)
    RETURNING s.attempt_id, s.slurm_job_id, a.reason;
$$;

-- slurm_preemptions_due: attempts of a fleet asked to checkpoint and stop (request_preemption recorded
-- stop_kind: an admin, idle reclaim, the planner) whose Slurm job has not been told yet, once every member
-- runs (a step that has not started its runner yet could not pass the signal on). The worker writes the
-- request into each member's output directory (.tuneplane/preempt.json, as the node agent does), sends the
-- job's signal to the job's steps (`scancel --signal`) and calls slurm_preemption_signalled. `request`:
-- {kind, reason, signal, deadline (epoch s), grace_seconds}. At the grace's end expire_grace_deadlines
-- stops the attempt and slurm_scancel_due cancels the job. Reads only.
CREATE OR REPLACE FUNCTION tuneplane.slurm_preemptions_due(p_fleet_id bigint)
RETURNS TABLE (attempt_id bigint, job_id bigint, slurm_job_id bigint, request jsonb)
LANGUAGE sql STABLE AS $$
    SELECT s.attempt_id, s.job_id, s.slurm_job_id,
           jsonb_build_object(
               'kind', a.stop_kind,
               'reason', CASE WHEN a.preempted_by_job_id IS NULL THEN a.stop_cause
                              ELSE format('preempted by job %s (%s)', a.preempted_by_job_id, a.stop_cause) END,
               'signal', coalesce(j.spec -> 'preemption' ->> 'signal', 'SIGTERM'),
               'deadline', extract(epoch FROM a.grace_deadline)::double precision,
               'grace_seconds', extract(epoch FROM a.grace_deadline - a.stop_requested_at)::double precision)
      FROM tuneplane.slurm_jobs s
      JOIN tuneplane.attempts a ON a.id = s.attempt_id
      JOIN tuneplane.jobs j ON j.id = s.job_id
     WHERE s.fleet_id = p_fleet_id AND s.gone_at IS NULL AND s.slurm_job_id IS NOT NULL
       AND s.preempt_signalled_at IS NULL
       AND a.stop_kind IS NOT NULL AND a.state = 'running' AND a.cancel_requested_at IS NULL
       AND NOT EXISTS (SELECT 1 FROM tuneplane.members m WHERE m.attempt_id = a.id AND m.state = 'starting')
     ORDER BY s.attempt_id;
$$;

-- slurm_preemption_signalled: the worker told the job's steps (slurm_preemptions_due): recorded once, with
-- a job event saying what reached them. A second call changes nothing. Locks: the job, the attempt, then
-- the slurm_jobs row.
CREATE OR REPLACE FUNCTION tuneplane.slurm_preemption_signalled(p_attempt_id bigint, p_signal text,
                                                                 p_files integer)
RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    a tuneplane.attempts;
    s tuneplane.slurm_jobs;
BEGIN
    a := tuneplane.lock_attempt(p_attempt_id);
    UPDATE tuneplane.slurm_jobs SET preempt_signalled_at = clock_timestamp()
     WHERE attempt_id = p_attempt_id AND preempt_signalled_at IS NULL
    RETURNING * INTO s;
    IF s.attempt_id IS NULL THEN
        RETURN;
    END IF;
    INSERT INTO tuneplane.job_events (job_id, from_state, to_state, reason, detail)
    SELECT j.id, j.state, j.state,
           format('attempt %s: %s sent to the steps of Slurm job %s (scancel --signal); the request written for '
                  '%s member(s); grace until %s', a.number, p_signal, s.slurm_job_id, p_files,
                  to_char(a.grace_deadline, 'HH24:MI:SS')),
           jsonb_build_object('kind', 'stop_request_delivered', 'attempt', a.number,
                              'slurm_job_id', s.slurm_job_id, 'signal', p_signal)
      FROM tuneplane.jobs j WHERE j.id = a.job_id;
END;
$$;

-- slurm_followed: the Slurm jobs a worker follows in a fleet (not yet gone), with their attempt's state.
CREATE OR REPLACE FUNCTION tuneplane.slurm_followed(p_fleet_id bigint)
RETURNS TABLE (attempt_id bigint, job_id bigint, attempt_number integer, slurm_job_id bigint,
               attempt_state text, committed boolean, nodes integer, scancel_at timestamptz,
               submitted_at timestamptz, created_at timestamptz, age_s double precision)
LANGUAGE sql STABLE AS $$
    SELECT s.attempt_id, s.job_id, a.number, s.slurm_job_id, a.state,
           EXISTS (SELECT 1 FROM tuneplane.launch_decisions d WHERE d.attempt_id = a.id AND d.decision = 'commit'),
           j.nodes, s.scancel_at, s.submitted_at, s.created_at,
           extract(epoch FROM clock_timestamp() - s.created_at)::double precision
      FROM tuneplane.slurm_jobs s
      JOIN tuneplane.attempts a ON a.id = s.attempt_id
      JOIN tuneplane.jobs j ON j.id = s.job_id
     WHERE s.fleet_id = p_fleet_id AND s.gone_at IS NULL
     ORDER BY s.attempt_id;
$$;

-- create_slurm_fleet: an admin adds a Slurm fleet (backend 'slurm') with its cluster access. Capabilities:
-- {"shared_path": "/shared/tuneplane", "object_delivery": false}; a shared path is required (ADR 0110).
CREATE OR REPLACE FUNCTION tuneplane.create_slurm_fleet(p_name text, p_partition text, p_slurm_conf text,
                                                         p_capabilities jsonb, p_account text DEFAULT NULL,
                                                         p_qos text DEFAULT NULL)
RETURNS tuneplane.fleets
LANGUAGE plpgsql AS $$
DECLARE
    f tuneplane.fleets;
BEGIN
    IF coalesce(p_capabilities ->> 'shared_path', '') !~ '^/' THEN
        RAISE EXCEPTION 'a Slurm fleet needs capabilities.shared_path, an absolute path every node sees'
            USING ERRCODE = 'TP422', COLUMN = 'capabilities.shared_path';
    END IF;
    -- Outputs are delivered on the shared path (its files are verified there), so it is a shared mount.
    INSERT INTO tuneplane.fleets (name, backend, capabilities)
    VALUES (p_name, 'slurm', p_capabilities || '{"shared_mounts": true}'::jsonb)
    RETURNING * INTO f;
    INSERT INTO tuneplane.slurm_fleets (fleet_id, slurm_conf, partition, account, qos)
    VALUES (f.id, p_slurm_conf, p_partition, p_account, p_qos);
    RETURN f;
END;
$$;

-- slurm_node_credential: the Slurm worker acts for a Slurm node where a node agent would (artifact
-- registration of that node's members, whose files it verifies on the shared path): it holds one credential
-- per node, made at its start (only the hash is stored); the node's earlier ones are revoked.
CREATE OR REPLACE FUNCTION tuneplane.slurm_node_credential(p_node_id bigint, p_credential_hash text)
RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM tuneplane.nodes n JOIN tuneplane.fleets f ON f.id = n.fleet_id
                    WHERE n.id = p_node_id AND f.backend = 'slurm') THEN
        RAISE EXCEPTION 'node % is not a node of a Slurm fleet', p_node_id USING ERRCODE = 'TP404', COLUMN = 'node';
    END IF;
    UPDATE tuneplane.node_credentials SET revoked_at = now(), revoked_reason = 'a Slurm worker started again'
     WHERE node_id = p_node_id AND revoked_at IS NULL;
    INSERT INTO tuneplane.node_credentials (node_id, credential_hash) VALUES (p_node_id, p_credential_hash);
END;
$$;

-- slurm_member_log: one chunk of rank p_rank's stdout or stderr, read by the worker from the member's logs
-- on the shared path (payload as member_log's, without member_id). Answers as member_log does (stored,
-- next_offset: where the worker goes on from).
CREATE OR REPLACE FUNCTION tuneplane.slurm_member_log(p_attempt_id bigint, p_rank integer, p_payload jsonb)
RETURNS jsonb
LANGUAGE plpgsql AS $$
DECLARE
    m tuneplane.members;
BEGIN
    SELECT * INTO m FROM tuneplane.members WHERE attempt_id = p_attempt_id AND rank = p_rank;
    IF m.id IS NULL THEN
        RAISE EXCEPTION 'attempt % has no member of rank %', p_attempt_id, p_rank
            USING ERRCODE = 'TP404', COLUMN = 'rank';
    END IF;
    RETURN tuneplane.member_log_store(m.node_id, p_payload || jsonb_build_object('member_id', m.id));
END;
$$;

-- slurm_preview_check: refuses (422) at preview what the fleet's partition can never run — Slurm would
-- accept it and leave it pending forever (PartitionNodeLimit, PartitionTimeLimit): more nodes than the
-- partition's MaxNodes, a time limit over its MaxTime. (Nodes, GPUs, CPUs and memory per node beyond every
-- node are refused by fleet_fit like on any fleet.) Called by create_preview_resolve.
CREATE OR REPLACE FUNCTION tuneplane.slurm_preview_check(p_fleet_id bigint, p_nodes integer, p_minutes integer)
RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    f tuneplane.slurm_fleets;
BEGIN
    SELECT * INTO f FROM tuneplane.slurm_fleets WHERE fleet_id = p_fleet_id;
    IF f.max_nodes IS NOT NULL AND p_nodes > f.max_nodes THEN
        RAISE EXCEPTION 'Slurm partition % allows at most % node(s) per job (MaxNodes); this job asks for %',
            f.partition, f.max_nodes, p_nodes USING ERRCODE = 'TP422', COLUMN = 'resources.nodes';
    END IF;
    IF p_minutes IS NOT NULL AND f.max_time_minutes IS NOT NULL AND p_minutes > f.max_time_minutes THEN
        RAISE EXCEPTION 'Slurm partition % allows at most % minutes per job (MaxTime); this job asks for %',
            f.partition, f.max_time_minutes, p_minutes USING ERRCODE = 'TP422', COLUMN = 'resources.time_limit_minutes';
    END IF;
END;
$$;
