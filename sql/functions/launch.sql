-- sql/functions/launch.sql — the current definition of every launch function, view and trigger.
-- Launch: prepare/commit decisions, member reports, cancel, lost contact, reconcile, fencing, the
-- launch worker's claims and the job launch reads.
-- Read top-down: the contract (the state machine, the lock order, the transitions table and the trigger
-- that enforces it), then helpers (predicates, lock helpers, the one writer per state column, commands),
-- transitions (by who drives them), sweeps, reads.
--
-- Repeatable file (ADR 0012): `tuneplane db migrate` re-applies every file of sql/functions/ (in the order
-- of order.txt, one transaction) whenever one changes. Edit definitions here, never in a migration.
-- Tables, columns and data changes go in a new numbered migration. A changed signature or a view whose
-- columns change: add its DROP below (it runs before the new definition is created), e.g.
--   DROP FUNCTION IF EXISTS tuneplane.f(bigint, text);
--
-- Drops (signature changes):
DROP FUNCTION IF EXISTS tuneplane.job_queue_position(bigint, bigint);  -- gained the team columns
DROP FUNCTION IF EXISTS tuneplane.job_members_of(bigint, bigint);
DROP FUNCTION IF EXISTS tuneplane.lose_node_members(bigint, text);
DROP FUNCTION IF EXISTS tuneplane.lock_jobs_of_node(bigint);

-- ==== The launch state machine ===========================================================================
-- Every change of jobs.state, attempts.state and members.state is checked against this table by the
-- trigger guard_state_transition: a pair that is not listed, or made by no function listed beside it, is
-- refused (TP409) naming the function that tried. One writer per column: set_job_state (placement.sql,
-- job_transition in submission.sql), set_attempt_state, set_member_state. Inserts are not transitions
-- (a job is born queued by confirm_preview, an attempt and its members reserved by reserve_next).
--
--   job      queued → reserved                               reserve_next
--            queued → preparing                              slurm_allocation_started (slurm.sql)
--            queued → failed | cancelled                     finish_attempt_if_done (a Slurm attempt ended
--                                                            before its allocation started)
--            reserved → preparing                            begin_prepare
--            reserved | preparing → running                  record_commit (COMMIT)
--            reserved | preparing | running → queued         finish_attempt_if_done (retry by max_attempts;
--                                                            a free re-launch after an ABORT in prepare)
--            reserved | preparing | running → succeeded | failed | cancelled   finish_attempt_if_done
--            queued → cancelled                              cancel_job
--   attempt  reserved → preparing                            begin_prepare
--            preparing → running                             record_commit (COMMIT)
--            reserved | preparing → stopping                 decide_abort (ABORT)
--            running → stopping                              stop_attempt
--            any live → succeeded | failed | aborted | cancelled   finish_attempt_if_done
--            any live → preempted | timed_out                finish_attempt_if_done (asked to stop:
--                                                            request_preemption, preemption.sql)
--   member   reserved → preparing                            begin_prepare
--            preparing → prepared                            member_prepared, slurm_member_prepared
--            prepared → starting                             record_commit (COMMIT)
--            starting → running                              member_started
--            starting | running → stopping                   stop_attempt
--            reserved | preparing | prepared → aborted       decide_abort
--            starting | running | stopping → exited | failed | cancelled   record_member_exit
--            any live → lost                                 lose_node_members (fence_node, retire)
-- Contact loss is not a state: members.contact_lost_at marks it (sweep_lost_nodes) and reconcile clears
-- it; the member keeps the state it had, and its resources stay held.
--
-- ==== Lock order: no exceptions but the three named below (tests/isolation, the concurrency tests) ======
-- Every function takes its locks in this order and never against it (a lock already held is free to take
-- again, so helpers repeat them safely):
--   1. the node's session lock (advisory: shared by reports in require_node_session, exclusive in
--      node_session_opened)
--   2. the fleet's placement lock (advisory xact: reserve_next, fence_node, retire)
--   3. jobs, by id (FOR UPDATE; sweeps take them SKIP LOCKED and come back on the next sweep)
--   4. attempts, by id
--   5. members, by id: every member of the attempts taken (a failure stops the rest of an attempt, on
--      other nodes too)
--   6. the node row: FOR NO KEY UPDATE by fence, retire, reconcile and the check results of a prepare
--      report; FOR UPDATE only by cordon, drain, uncordon and unfence, which hold no other row
--   7. node_usage rows, in node id order, all at once before the first release (lock_usage_of_attempts),
--      or the one row of the one node a function releases on
--   8. leaf rows: gpu_allocations, node_commands, launch_decisions, job_events, node_events, usage_ledger,
--      pgqueuer; and through triggers:
--      telemetry_members then telemetry_tokens (telemetry_member_ended, on a member's end),
--      telemetry_tokens (telemetry_node_fenced, on nodes.fenced_at), artifacts and artifact_chunks
--      (artifacts_of_lost_member, on a member becoming lost), job_events (jobs_event_on_change),
--      job_idle (jobs_idle_watch, idle.sql), team_event_deliveries (jobs_team_event → enqueue_team_event,
--      team_events.sql, on a job's state).
-- No function waits for a lock of steps 1-7 while it holds a leaf row another transaction may want: a
-- member's gpu_allocations and usage_ledger rows and an attempt's launch_decisions row are written only
-- under their job's lock (release_member writes them just before its node_usage row); a command row is
-- written by its acknowledgement after launch_command_locks, or taken SKIP LOCKED by claim_node_commands
-- (or claim_sessions_commands, for several nodes), which hold nothing else but session locks (shared); the
-- rest are inserts.
-- Foreign-key share locks: inserting node_commands, node_events, members or gpu_allocations takes FOR KEY
-- SHARE on the node row named, job_events on the job row. KEY SHARE conflicts only with FOR UPDATE, which
-- only the functions of step 6 that hold no other row take: such a wait never closes a cycle.
-- Exceptions:
--   * claim_launch updates an attempt row without its job: it holds nothing else, so it only waits.
--   * the sweeps take jobs SKIP LOCKED in their own order (they never wait for a job).
--   * reserve_next (placement.sql) locks node rows (KEY SHARE) before jobs, both SKIP LOCKED: it never
--     waits for either. It updates node_usage rows in placement order while it holds earlier ones: the one
--     cycle left possible, with a release on several nodes of the same fleet at the same moment (those
--     take their rows in node id order; fence and retire hold the placement lock, so never). The victim is
--     run again where it happens: the worker's placement pass and the gateway's reports (call_retrying,
--     bounded, logged), the console's calls (Database.call_retrying).
--   * reserve_next's first pass on a fleet (team_fleet_held_fold, placement.sql) takes LOCK TABLE members IN
--     SHARE MODE right after the placement lock, once per fleet ever: it waits for every transaction
--     writing members while it holds only the placement lock, which no transaction waits for after
--     writing members (step 2 comes before step 5), so the wait closes no cycle.
-- Entry points: lock_attempt (one attempt: its job, then it), member_of_node (a node's report on one
-- member: lock_members of it), lock_members (a set of members: their jobs, attempts, every member of those
-- attempts), lock_node_rows (many jobs on one node: lock_members of every member held there, the node row,
-- the usage rows), launch_command_locks (an acknowledgement: lock_members and usage rows of the members a
-- START/STOP/KILL names, before the command row).
--
-- What each function may lock, in order (steps 3-5 are always the jobs, attempts and members named):
--   reconcile_node     session (shared) → lock_node_rows: jobs of the members held on the node and of every
--                      member the list names → their attempts → every member of those attempts → the node
--                      row → node_usage of every node of those attempts → leaf rows: gpu_allocations and
--                      usage_ledger (releases), node_commands (STOP again, KILL; `abort` and STOP on other
--                      nodes: FK share on their node rows), launch_decisions (decide_abort), pgqueuer
--                      never; through triggers: job_events, job_idle, team_event_deliveries (a job's state),
--                      telemetry_members then telemetry_tokens (a member's end); the node row's
--                      session_reconciled_epoch last (already held). Nothing else.
--   fence_node         placement lock → lose_node_members (as reconcile: lock_node_rows of the node's held
--                      members) → leaf rows as reconcile, node_events → the node row's fenced_at (held;
--                      trigger: telemetry_tokens of every member ever placed on the node).
--   retire (change_node_scheduling, nodes.sql) placement lock → lose_node_members as fence → the node row's
--                      scheduling_state → node_credentials, node_events.
--   cancel_job         the job → its live attempt → decide_abort or stop_attempt (every member of the
--                      attempt, usage rows in node order, STOP/abort commands on their nodes) → job_events.
--   member_prepared, member_prepare_failed, member_started, member_exited, issue_member_telemetry_token,
--   member_prepare_progress (runtimes.sql)
--                      session (shared) → member_of_node: the job → the attempt → every member of the
--                      attempt → the node row (check results of a prepare report only) → usage rows
--                      (decide_abort: in node order; record_member_exit: its own node's) → leaf rows
--                      (START commands on every member's node at COMMIT and, for members whose agent
--                      sent a token hash, telemetry_tokens then telemetry_members; STOP on a failure).
--   member_reports     as one report, for several: every node's session (shared) in node id order →
--                      lock_members of every member named → the reports in node id order (node rows).
--   ack_node_command (nodes.sql) session (shared) → launch_command_locks: the jobs, attempts and members of
--                      the members a failed START/STOP or a done KILL names (jobs in id order) → their
--                      usage rows (none for any other acknowledgement) → the command row →
--                      launch_command_acked: record_member_exit (KILL done, START failed) or
--                      send_kill (STOP failed: the member's kill_requested_at, a KILL command).
--   begin_prepare, abort_launch  the job → the attempt (require_launch_epoch) → every member → PREPARE /
--                      abort commands, usage rows in node order (abort).
--   expire_prepare_deadlines, expire_member_deadlines, sweep_lost_nodes  each job SKIP LOCKED → as above
--                      (sweep_lost_nodes: the coordinator_clock row first, before any job);
--                      sweep_lost_nodes releases node by node (usage rows in node id order).
--   unfence_node, cordon/drain/uncordon  the node row FOR UPDATE → node_events.
DELETE FROM tuneplane.state_transitions;
INSERT INTO tuneplane.state_transitions (entity, from_state, to_state, writers)
-- job_transition (submission.sql) is the generic, checked writer that operators' scripts may use for any
-- listed job transition.
SELECT 'job', f, t, w || '{job_transition}' FROM (VALUES
    ('queued', 'reserved', '{reserve_next}'::text[]),
    ('reserved', 'preparing', '{begin_prepare}'),
    ('reserved', 'running', '{record_commit}'),
    ('preparing', 'running', '{record_commit}'),
    ('queued', 'cancelled', '{cancel_job,finish_attempt_if_done}'),
    -- Slurm (slurm.sql): the job stays queued while Slurm keeps it pending; its attempt ends there if
    -- Slurm ends it before the allocation starts.
    ('queued', 'preparing', '{slurm_allocation_started}'),
    ('queued', 'failed', '{finish_attempt_if_done}')
) v(f, t, w)
UNION ALL
SELECT 'job', f, t, '{finish_attempt_if_done,job_transition}'
  FROM unnest('{reserved,preparing,running}'::text[]) f, unnest('{queued,succeeded,failed,cancelled}'::text[]) t
UNION ALL
SELECT 'attempt', f, t, w FROM (VALUES
    ('reserved', 'preparing', '{begin_prepare,slurm_allocation_started}'::text[]),
    ('preparing', 'running', '{record_commit}'),
    ('reserved', 'stopping', '{decide_abort}'),
    ('preparing', 'stopping', '{decide_abort}'),
    ('running', 'stopping', '{stop_attempt}')
) v(f, t, w)
UNION ALL
SELECT 'attempt', f, t, '{finish_attempt_if_done}'
  FROM unnest('{reserved,preparing,running,stopping}'::text[]) f,
       unnest('{succeeded,failed,aborted,cancelled,preempted,timed_out}'::text[]) t
UNION ALL
SELECT 'member', f, t, w FROM (VALUES
    ('reserved', 'preparing', '{begin_prepare}'::text[]),
    ('preparing', 'prepared', '{member_prepared,slurm_member_prepared}'),
    ('prepared', 'starting', '{record_commit}'),
    ('starting', 'running', '{member_started,slurm_member_started}'),
    ('starting', 'stopping', '{stop_attempt}'),
    ('running', 'stopping', '{stop_attempt}')
) v(f, t, w)
UNION ALL
SELECT 'member', f, 'aborted', '{decide_abort}' FROM unnest('{reserved,preparing,prepared}'::text[]) f
UNION ALL
SELECT 'member', f, t, '{record_member_exit}'
  FROM unnest('{starting,running,stopping}'::text[]) f, unnest('{exited,failed,cancelled}'::text[]) t
UNION ALL
SELECT 'member', f, 'lost', '{lose_node_members}'
  FROM unnest('{reserved,preparing,prepared,starting,running,stopping}'::text[]) f;

-- ==== Contract enforced: every state change is checked against the table above ==========================

-- guard_state_transition: BEFORE UPDATE OF state on jobs, attempts and members. Refuses a change that is
-- not a row of state_transitions, or that no function allowed to make it is making (the functions on the
-- call stack are read from PG_CONTEXT), naming the function that tried. An operator repairing data by hand
-- sets `SET LOCAL tuneplane.operator_repair = 'why'` (docs/runbook.md) and is let through.
CREATE OR REPLACE FUNCTION tuneplane.guard_state_transition() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    v_entity  text := CASE TG_TABLE_NAME WHEN 'jobs' THEN 'job' WHEN 'attempts' THEN 'attempt' ELSE 'member' END;
    v_stack   text;
    v_callers text[];
    v_writers text[];
BEGIN
    IF OLD.state = NEW.state OR coalesce(current_setting('tuneplane.operator_repair', true), '') <> '' THEN
        RETURN NEW;
    END IF;
    GET DIAGNOSTICS v_stack = PG_CONTEXT;
    SELECT writers INTO v_writers FROM tuneplane.state_transitions
     WHERE entity = v_entity AND from_state = OLD.state AND to_state = NEW.state;
    -- The common case (a listed transition made by a listed writer) is decided by plain substring
    -- searches of the call stack: this trigger runs on every state change, placement's included.
    IF v_writers IS NOT NULL AND EXISTS (
            SELECT 1 FROM unnest(v_writers) w
             WHERE strpos(v_stack, ' ' || w || '(') > 0 OR strpos(v_stack, '.' || w || '(') > 0
                OR strpos(v_stack, '"' || w || '"') > 0) THEN
        RETURN NEW;
    END IF;
    SELECT coalesce(array_agg(coalesce(x[1], x[2]) ORDER BY ord DESC), '{}') INTO v_callers
      FROM regexp_matches(v_stack, 'function (?:tuneplane\.)?(\w+)\(|SQL function "(\w+)"', 'g')
           WITH ORDINALITY AS r(x, ord)
     WHERE coalesce(x[1], x[2]) <> 'guard_state_transition';
    IF v_writers IS NULL THEN
        RAISE EXCEPTION '% %: % → % is not a transition of the % lifecycle (attempted by %)', v_entity, OLD.id,
            OLD.state, NEW.state, v_entity, coalesce(v_callers[1], 'a direct UPDATE')
            USING ERRCODE = 'TP409', COLUMN = 'state';
    END IF;
    RAISE EXCEPTION '% %: % → % may be made only by % (attempted by %)', v_entity, OLD.id, OLD.state,
        NEW.state, array_to_string(v_writers, ', '), coalesce(v_callers[1], 'a direct UPDATE')
        USING ERRCODE = 'TP409', COLUMN = 'state';
    RETURN NEW;
END;
$$;

CREATE OR REPLACE TRIGGER jobs_state_transition
    BEFORE UPDATE OF state ON tuneplane.jobs
    FOR EACH ROW EXECUTE FUNCTION tuneplane.guard_state_transition();

CREATE OR REPLACE TRIGGER attempts_state_transition
    BEFORE UPDATE OF state ON tuneplane.attempts
    FOR EACH ROW EXECUTE FUNCTION tuneplane.guard_state_transition();

CREATE OR REPLACE TRIGGER members_state_transition
    BEFORE UPDATE OF state ON tuneplane.members
    FOR EACH ROW EXECUTE FUNCTION tuneplane.guard_state_transition();

-- ==== Helpers: predicates, the lock helpers, the one writer per state column, commands ==================

CREATE OR REPLACE FUNCTION tuneplane.member_is_live(p_state text)
RETURNS boolean
LANGUAGE sql IMMUTABLE AS $$
    SELECT p_state IN ('reserved', 'preparing', 'prepared', 'starting', 'running', 'stopping');
$$;

-- node_takes_commands: whether a node has an outbox someone reads: a node of a `node`-backend fleet (its
-- agent) that is not retired. Slurm nodes are driven by their backend's worker (scancel), not commands.
CREATE OR REPLACE FUNCTION tuneplane.node_takes_commands(p_node_id bigint)
RETURNS boolean
LANGUAGE sql STABLE AS $$
    SELECT n.scheduling_state <> 'retired' AND f.backend = 'node'
      FROM tuneplane.nodes n JOIN tuneplane.fleets f ON f.id = n.fleet_id
     WHERE n.id = p_node_id;
$$;

-- lock_attempt: the lock order's first steps for one attempt: its job, then the attempt (FOR UPDATE).
-- Every function that changes an attempt or its members starts here (or holds the job lock already).
CREATE OR REPLACE FUNCTION tuneplane.lock_attempt(p_attempt_id bigint)
RETURNS tuneplane.attempts
LANGUAGE plpgsql AS $$
DECLARE
    a tuneplane.attempts;
BEGIN
    PERFORM 1 FROM tuneplane.jobs WHERE id = (SELECT job_id FROM tuneplane.attempts WHERE id = p_attempt_id)
        FOR UPDATE;
    SELECT * INTO a FROM tuneplane.attempts WHERE id = p_attempt_id FOR UPDATE;
    RETURN a;
END;
$$;

-- lock_members: the lock order's steps for a set of members (a node's report, an acknowledgement,
-- reconcile, fence, retire): their jobs in id order, then their attempts in id order, then every member of
-- those attempts in id order (a failure stops the rest of an attempt, on other nodes too). Nothing else
-- before: the node row and leaf rows come after.
CREATE OR REPLACE FUNCTION tuneplane.lock_members(p_member_ids bigint[])
RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    v_jobs bigint[];
    v_attempts bigint[];
BEGIN
    SELECT coalesce(array_agg(DISTINCT m.job_id), '{}'), coalesce(array_agg(DISTINCT m.attempt_id), '{}')
      INTO v_jobs, v_attempts FROM tuneplane.members m WHERE m.id = ANY (p_member_ids);
    PERFORM 1 FROM tuneplane.jobs WHERE id = ANY (v_jobs) ORDER BY id FOR UPDATE;
    PERFORM 1 FROM tuneplane.attempts WHERE id = ANY (v_attempts) ORDER BY id FOR UPDATE;
    PERFORM 1 FROM tuneplane.members WHERE attempt_id = ANY (v_attempts) ORDER BY id FOR UPDATE;
END;
$$;

-- lock_usage_of_attempts: the node_usage rows a function may change while it releases members of these
-- attempts, in node id order, taken at once (a release updates its node's row; one that releases on
-- several nodes must not hold one usage row while it waits for another).
CREATE OR REPLACE FUNCTION tuneplane.lock_usage_of_attempts(p_attempt_ids bigint[])
RETURNS void
LANGUAGE sql AS $$
    SELECT 1 FROM tuneplane.node_usage
     WHERE node_id IN (SELECT node_id FROM tuneplane.members
                        WHERE attempt_id = ANY (p_attempt_ids) AND released_at IS NULL)
     ORDER BY node_id FOR NO KEY UPDATE;
$$;

-- lock_node_rows: the lock order for functions that touch members of many jobs on one node (reconcile,
-- fence, retire): lock_members of every member held there and of every member of this node named in
-- p_members (a reconcile list may name one already released), then the node row (FOR NO KEY UPDATE: it
-- does not conflict with the foreign-key share locks of commands and events), then the node_usage rows
-- of every node of those attempts (lock_usage_of_attempts). Returns the node row as it is now.
CREATE OR REPLACE FUNCTION tuneplane.lock_node_rows(p_node_id bigint, p_members bigint[] DEFAULT '{}')
RETURNS tuneplane.nodes
LANGUAGE plpgsql AS $$
DECLARE
    v_members bigint[];
    n tuneplane.nodes;
BEGIN
    SELECT coalesce(array_agg(id), '{}') INTO v_members FROM tuneplane.members
     WHERE node_id = p_node_id AND (released_at IS NULL OR id = ANY (p_members));
    PERFORM tuneplane.lock_members(v_members);
    SELECT * INTO n FROM tuneplane.nodes WHERE id = p_node_id FOR NO KEY UPDATE;
    PERFORM tuneplane.lock_usage_of_attempts(
        ARRAY(SELECT DISTINCT attempt_id FROM tuneplane.members WHERE id = ANY (v_members)));
    RETURN n;
END;
$$;

-- member_of_node: the member a node reports on, locked in the contract's order (lock_members: job →
-- attempt → every member of the attempt); refuses a member of another node (404).
CREATE OR REPLACE FUNCTION tuneplane.member_of_node(p_node_id bigint, p_member_id bigint)
RETURNS tuneplane.members
LANGUAGE plpgsql AS $$
DECLARE
    m tuneplane.members;
BEGIN
    SELECT * INTO m FROM tuneplane.members WHERE id = p_member_id AND node_id = p_node_id;
    IF m.id IS NULL THEN
        RAISE EXCEPTION 'member % is not placed on this node', p_member_id USING ERRCODE = 'TP404',
            COLUMN = 'member_id';
    END IF;
    PERFORM tuneplane.lock_members(ARRAY[m.id]);
    SELECT * INTO m FROM tuneplane.members WHERE id = p_member_id;
    RETURN m;
END;
$$;

-- require_launch_epoch: refuses (409) a worker whose lease on the attempt was taken over.
CREATE OR REPLACE FUNCTION tuneplane.require_launch_epoch(p_attempt_id bigint, p_epoch bigint)
RETURNS tuneplane.attempts
LANGUAGE plpgsql AS $$
DECLARE
    a tuneplane.attempts;
BEGIN
    a := tuneplane.lock_attempt(p_attempt_id);
    IF a.id IS NULL THEN
        RAISE EXCEPTION 'no attempt %', p_attempt_id USING ERRCODE = 'TP404', COLUMN = 'attempt_id';
    END IF;
    IF a.launch_epoch <> p_epoch THEN
        RAISE EXCEPTION 'launch of attempt % was taken over (epoch % is stale; current %)', p_attempt_id, p_epoch,
            a.launch_epoch USING ERRCODE = 'TP409', COLUMN = 'epoch';
    END IF;
    RETURN a;
END;
$$;

-- set_member_state: the one writer of members.state.
CREATE OR REPLACE FUNCTION tuneplane.set_member_state(p_member_id bigint, p_state text, p_reason text,
                                           p_exit_code integer DEFAULT NULL)
RETURNS void
LANGUAGE sql AS $$
    UPDATE tuneplane.members
       SET state = p_state, reason = coalesce(p_reason, reason), updated_at = clock_timestamp(),
           exit_code = coalesce(p_exit_code, exit_code),
           ended_at = CASE WHEN tuneplane.member_is_live(p_state) THEN ended_at ELSE clock_timestamp() END
     WHERE id = p_member_id;
$$;

-- set_attempt_state: the one writer of attempts.state.
CREATE OR REPLACE FUNCTION tuneplane.set_attempt_state(p_attempt_id bigint, p_state text, p_reason text)
RETURNS void
LANGUAGE sql AS $$
    UPDATE tuneplane.attempts
       SET state = p_state, reason = coalesce(p_reason, reason),
           ended_at = CASE WHEN p_state IN ('succeeded', 'failed', 'aborted', 'cancelled', 'preempted', 'timed_out')
                           THEN clock_timestamp() ELSE ended_at END,
           committed_at = CASE WHEN p_state = 'running' THEN coalesce(committed_at, clock_timestamp())
                               ELSE committed_at END
     WHERE id = p_attempt_id;
$$;

-- member_now_running: starting → running for one member whose runner was started (pid), on every backend
-- (member_started for node agents, slurm_member_started for Slurm steps). The one rule of "running": the
-- attempt is running (attempts.running_at, the job's event "all N member(s) running") once EVERY member
-- has started — the last one's start sets it, never the first's (ADR 0165). A member that already ended
-- counts as started (it ran). Caller holds the attempt's lock (lock_attempt) and the member's row; refuses
-- nothing (the callers check the member is `starting`). Returns {running, started, of}.
CREATE OR REPLACE FUNCTION tuneplane.member_now_running(p_member_id bigint, p_pid integer, p_reason text)
RETURNS jsonb
LANGUAGE plpgsql AS $$
DECLARE
    a tuneplane.attempts;
    v_total integer;
    v_started integer;
    v_running integer;
BEGIN
    UPDATE tuneplane.members SET pid = p_pid, started_at = clock_timestamp() WHERE id = p_member_id;
    PERFORM tuneplane.set_member_state(p_member_id, 'running', p_reason);
    SELECT a2.* INTO a FROM tuneplane.attempts a2 JOIN tuneplane.members m ON m.attempt_id = a2.id
     WHERE m.id = p_member_id;
    SELECT count(*), count(*) FILTER (WHERE started_at IS NOT NULL), count(*) FILTER (WHERE state = 'running')
      INTO v_total, v_started, v_running
      FROM tuneplane.members WHERE attempt_id = a.id;
    IF v_total = v_started AND a.state = 'running' AND a.running_at IS NULL THEN
        UPDATE tuneplane.attempts SET running_at = clock_timestamp() WHERE id = a.id;
        PERFORM tuneplane.set_job_state(a.job_id, 'running',
            format('attempt %s: all %s member(s) running', a.number, v_total));
    END IF;
    RETURN jsonb_build_object('running', v_running, 'started', v_started, 'of', v_total);
END;
$$;

-- send_stop: STOP (SIGTERM, the stop grace, then SIGKILL on the node) for one member, unless one is still
-- waiting in its node's outbox. Records when, so expire_member_deadlines can escalate to KILL.
CREATE OR REPLACE FUNCTION tuneplane.send_stop(p_member tuneplane.members, p_reason text)
RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    IF NOT tuneplane.node_takes_commands(p_member.node_id)
       OR EXISTS (SELECT 1 FROM tuneplane.node_commands c
                   WHERE c.node_id = p_member.node_id AND c.kind = 'stop' AND c.acked_at IS NULL
                     AND (c.payload ->> 'member_id')::bigint = p_member.id) THEN
        RETURN;
    END IF;
    PERFORM tuneplane.enqueue_node_command(p_member.node_id, 'stop', jsonb_build_object(
        'member_id', p_member.id, 'attempt_id', p_member.attempt_id, 'reason', p_reason,
        'grace_seconds', extract(epoch FROM (SELECT stop_grace FROM tuneplane.launch_settings))));
END;
$$;

-- send_kill: KILL for members of one node (the node kills whatever runs for them and acknowledges; the
-- acknowledgement is the proof launch_command_acked acts on). Marks kill_requested_at. A member whose KILL
-- still waits in the outbox is not sent another.
CREATE OR REPLACE FUNCTION tuneplane.send_kill(p_node_id bigint, p_member_ids bigint[], p_reason text)
RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    SELECT coalesce(array_agg(DISTINCT u.mid ORDER BY u.mid), '{}') INTO p_member_ids
      FROM unnest(p_member_ids) u(mid)
     WHERE NOT EXISTS (SELECT 1 FROM tuneplane.node_commands c
                        WHERE c.node_id = p_node_id AND c.kind = 'kill' AND c.acked_at IS NULL
                          AND c.payload -> 'member_ids' @> to_jsonb(u.mid));
    IF coalesce(cardinality(p_member_ids), 0) = 0
       OR NOT tuneplane.node_takes_commands(p_node_id) THEN
        RETURN;
    END IF;
    UPDATE tuneplane.members SET kill_requested_at = clock_timestamp()
     WHERE id = ANY (p_member_ids) AND node_id = p_node_id;
    PERFORM tuneplane.enqueue_node_command(p_node_id, 'kill',
        jsonb_build_object('member_ids', to_jsonb(p_member_ids), 'reason', p_reason));
END;
$$;

-- ==== Transitions =======================================================================================
-- ---- the launch worker: claim, prepare, abort ----------------------------------------------------------

-- claim_launch: a backend worker takes over launching an attempt. Bumps the fencing epoch (a worker that
-- crashed and comes back holds an older epoch and is refused). Returns nothing when the attempt is past
-- preparation (nothing to do: pgqueuer re-ran a finished job).
CREATE OR REPLACE FUNCTION tuneplane.claim_launch(p_attempt_id bigint, p_owner text)
RETURNS TABLE (attempt_id bigint, epoch bigint, state text, job_id bigint, attempt_number integer)
LANGUAGE plpgsql AS $$
BEGIN
    RETURN QUERY
    UPDATE tuneplane.attempts a
       SET launch_epoch = a.launch_epoch + 1, launch_owner = p_owner
     WHERE a.id = p_attempt_id AND a.state IN ('reserved', 'preparing')
    RETURNING a.id, a.launch_epoch, a.state, a.job_id, a.number;
END;
$$;

-- begin_prepare: reserved → preparing. Records the capsule digest, sets the prepare deadline and sends
-- PREPARE to every member's node, all in one transaction. A second call (a worker re-running after a
-- crash) changes nothing and sends nothing. Each peer in PREPARE carries its node's address and probe port
-- (the agents' peer-network check), and `resume`: the checkpoint the member materializes as
-- $TUNEPLANE_RESUME_DIR (attempts.resume_artifact_id, chosen here). Refuses a stale epoch.
CREATE OR REPLACE FUNCTION tuneplane.begin_prepare(p_attempt_id bigint, p_epoch bigint, p_capsule_digest text)
RETURNS text
LANGUAGE plpgsql AS $$
DECLARE
    a       tuneplane.attempts;
    j       tuneplane.jobs;
    m       tuneplane.members;
    v_peers jsonb;
    v_timeout interval;
BEGIN
    a := tuneplane.require_launch_epoch(p_attempt_id, p_epoch);
    IF a.state <> 'reserved' THEN
        RETURN a.state;
    END IF;
    SELECT * INTO j FROM tuneplane.jobs WHERE id = a.job_id;
    SELECT prepare_timeout INTO v_timeout FROM tuneplane.launch_settings;
    -- The checkpoint this attempt resumes from is chosen now, as late as possible (preemption.sql).
    UPDATE tuneplane.attempts SET capsule_digest = p_capsule_digest, prepare_deadline = now() + v_timeout,
                                  resume_artifact_id = (tuneplane.resume_checkpoint_of(a.job_id)).id
     WHERE id = a.id;
    PERFORM tuneplane.set_attempt_state(a.id, 'preparing', 'preparing');
    SELECT jsonb_agg(jsonb_build_object('rank', mm.rank, 'node_id', mm.node_id, 'node', n.name,
                                        'address', n.address, 'probe_port', n.probe_port) ORDER BY mm.rank)
      INTO v_peers
      FROM tuneplane.members mm JOIN tuneplane.nodes n ON n.id = mm.node_id
     WHERE mm.attempt_id = a.id;
    FOR m IN SELECT * FROM tuneplane.members WHERE attempt_id = a.id ORDER BY id FOR UPDATE LOOP
        PERFORM tuneplane.set_member_state(m.id, 'preparing', 'preparing on its node');
        PERFORM tuneplane.enqueue_node_command(m.node_id, 'prepare', jsonb_build_object(
            'member_id', m.id, 'attempt_id', a.id, 'attempt', a.number, 'job_id', a.job_id, 'rank', m.rank,
            'world_size', j.nodes, 'gpu_indices', to_jsonb(m.gpu_indices), 'cpus', m.cpus,
            'memory_bytes', m.memory_bytes, 'capsule_digest', p_capsule_digest,
            'master_addr', a.master_addr, 'master_port', a.master_port, 'peers', v_peers,
            'deadline', extract(epoch FROM now() + v_timeout), 'resume', tuneplane.resume_pin(a.id),
            'checkpoint_numbers', tuneplane.checkpoint_numbers(a.job_id, m.rank),
            'shared_path', (SELECT f.capabilities ->> 'shared_path' FROM tuneplane.fleets f WHERE f.id = a.fleet_id)));
    END LOOP;
    PERFORM tuneplane.set_job_state(j.id, 'preparing',
        format('attempt %s: preparing %s member(s); commit once every member is prepared (deadline %s)%s',
               a.number, j.nodes, to_char(now() + v_timeout, 'YYYY-MM-DD HH24:MI:SS TZ'),
               tuneplane.resume_words(a.id)));
    RETURN 'preparing';
END;
$$;

-- decide_abort: record ABORT for an attempt that has no decision yet, abort and release every member
-- that never started, and tell each node to clean up. Returns false when COMMIT was already recorded.
CREATE OR REPLACE FUNCTION tuneplane.decide_abort(p_attempt_id bigint, p_reason text)
RETURNS boolean
LANGUAGE plpgsql AS $$
DECLARE
    a tuneplane.attempts;
    d tuneplane.launch_decisions;
    m tuneplane.members;
BEGIN
    -- Every decision is taken under the attempt's row lock (after its job's), so COMMIT and ABORT cannot
    -- race.
    a := tuneplane.lock_attempt(p_attempt_id);
    INSERT INTO tuneplane.launch_decisions (attempt_id, decision, reason)
    VALUES (p_attempt_id, 'abort', p_reason)
    ON CONFLICT (attempt_id) DO NOTHING;
    SELECT * INTO d FROM tuneplane.launch_decisions WHERE attempt_id = p_attempt_id;
    IF d.decision <> 'abort' THEN
        RETURN false;
    END IF;
    PERFORM 1 FROM tuneplane.members WHERE attempt_id = p_attempt_id ORDER BY id FOR UPDATE;
    PERFORM tuneplane.lock_usage_of_attempts(ARRAY[p_attempt_id]);
    FOR m IN SELECT * FROM tuneplane.members WHERE attempt_id = p_attempt_id AND tuneplane.member_is_live(state)
              ORDER BY id LOOP
        PERFORM tuneplane.set_member_state(m.id, 'aborted', 'launch aborted: ' || d.reason);
        -- Nothing started (agents start only after COMMIT), so the resources can go back at once.
        PERFORM tuneplane.release_member(m.id);
        IF tuneplane.node_takes_commands(m.node_id) THEN
            PERFORM tuneplane.enqueue_node_command(m.node_id, 'abort',
                jsonb_build_object('member_id', m.id, 'attempt_id', p_attempt_id, 'reason', d.reason));
        END IF;
    END LOOP;
    IF a.state IN ('reserved', 'preparing') THEN
        PERFORM tuneplane.set_attempt_state(p_attempt_id, 'stopping', 'aborting: ' || d.reason);
    END IF;
    PERFORM tuneplane.finish_attempt_if_done(p_attempt_id);
    RETURN true;
END;
$$;

-- abort_launch: the worker holding the launch lease (epoch) could not build the capsule: ABORT the
-- attempt with that reason (reserved → aborted, resources released; the job is retried or fails by
-- its max_attempts). Refuses a stale epoch (409). Returns false when a decision already existed.
CREATE OR REPLACE FUNCTION tuneplane.abort_launch(p_attempt_id bigint, p_epoch bigint, p_reason text)
RETURNS boolean
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM tuneplane.require_launch_epoch(p_attempt_id, p_epoch);
    RETURN tuneplane.decide_abort(p_attempt_id,
        'the capsule could not be built: ' || coalesce(nullif(p_reason, ''), 'no reason given'));
END;
$$;

-- ---- node reports: prepared, started, exited, probes, tokens, reconcile, acknowledgements --------------

-- record_commit: the COMMIT decision, the same for every backend (member_prepared here, slurm_member_prepared
-- in slurm.sql). When every member of the attempt is prepared, the attempt is reserved or preparing and no
-- decision exists: records COMMIT ('all N member(s) prepared'), the attempt becomes running (committed_at),
-- every member starting, the job running, and — on a node fleet, whose agents read an outbox — each
-- member's node gets START, all in the caller's transaction. Otherwise changes nothing and returns false.
-- Locks: the caller holds the job and the attempt (lock_attempt); the members by id (FOR UPDATE), then leaf
-- rows (launch_decisions, node_commands, job_events).
CREATE OR REPLACE FUNCTION tuneplane.record_commit(p_attempt_id bigint)
RETURNS boolean
LANGUAGE plpgsql AS $$
DECLARE
    a        tuneplane.attempts;
    v_count  integer;
    v_start  boolean;
    v_token  boolean;
    v_member tuneplane.members;
BEGIN
    SELECT * INTO a FROM tuneplane.attempts WHERE id = p_attempt_id;
    IF a.state NOT IN ('reserved', 'preparing')
       OR EXISTS (SELECT 1 FROM tuneplane.members WHERE attempt_id = a.id AND state <> 'prepared') THEN
        RETURN false;
    END IF;
    SELECT count(*) INTO v_count FROM tuneplane.members WHERE attempt_id = a.id;
    INSERT INTO tuneplane.launch_decisions (attempt_id, decision, reason)
    VALUES (a.id, 'commit', format('all %s member(s) prepared', v_count))
    ON CONFLICT (attempt_id) DO NOTHING;
    IF NOT FOUND THEN
        RETURN false;
    END IF;
    SELECT f.backend = 'node' INTO v_start
      FROM tuneplane.jobs j JOIN tuneplane.fleets f ON f.id = j.fleet_id WHERE j.id = a.job_id;
    PERFORM tuneplane.set_attempt_state(a.id, 'running', 'committed');
    FOR v_member IN SELECT * FROM tuneplane.members WHERE attempt_id = a.id ORDER BY id FOR UPDATE LOOP
        PERFORM tuneplane.set_member_state(v_member.id, 'starting', 'commit recorded; starting');
        IF v_start THEN
            -- The telemetry token whose hash the agent sent with member_prepared is valid from here on, and
            -- START says so: the member starts without a `telemetry_token` round trip (migration 0230). A
            -- hash already in use (never by chance: a node reusing one) is not issued; START then lacks
            -- the flag and the agent asks for a token as before.
            v_token := v_member.telemetry_token_hash IS NOT NULL AND NOT EXISTS (
                SELECT 1 FROM tuneplane.telemetry_tokens t WHERE t.token_hash = v_member.telemetry_token_hash);
            IF v_token THEN
                PERFORM tuneplane.issue_telemetry_token(a.job_id, a.number, v_member.rank,
                                                        v_member.telemetry_token_hash);
            END IF;
            PERFORM tuneplane.enqueue_node_command(v_member.node_id, 'start',
                jsonb_build_object('member_id', v_member.id, 'attempt_id', a.id)
                || CASE WHEN v_token THEN jsonb_build_object('telemetry_token', true) ELSE '{}' END);
        END IF;
    END LOOP;
    PERFORM tuneplane.set_job_state(a.job_id, 'running',
        format('attempt %s: commit recorded; starting %s member(s)', a.number, v_count));
    RETURN true;
END;
$$;

-- member_prepared (report kind `member_prepared`): preparing → prepared. When it is the last member to
-- prepare, records COMMIT and sends START to every member's node in the same transaction (record_commit). A report from
-- a fenced node is ignored (its members are lost).
-- p_payload: {"member_id": 1, "peer_check": {...}, "storage_check": {...}, "telemetry_token_hash": "…64 hex…"}
-- (the hash is optional: the token it names is issued at COMMIT; a malformed one is refused, 400).
CREATE OR REPLACE FUNCTION tuneplane.member_prepared(p_node_id bigint, p_epoch bigint, p_payload jsonb)
RETURNS jsonb
LANGUAGE plpgsql AS $$
DECLARE
    n        tuneplane.nodes;
    m        tuneplane.members;
    a        tuneplane.attempts;
    v_left   integer;
    v_member tuneplane.members;
BEGIN
    n := tuneplane.require_node_session(p_node_id, p_epoch);
    IF p_payload ? 'telemetry_token_hash'
       AND (jsonb_typeof(p_payload -> 'telemetry_token_hash') IS DISTINCT FROM 'string'
            OR (p_payload ->> 'telemetry_token_hash') !~ '^[0-9a-f]{64}$') THEN
        RAISE EXCEPTION 'telemetry_token_hash must be a sha256 hex digest (64 lowercase hex digits)'
            USING ERRCODE = 'TP400', COLUMN = 'telemetry_token_hash';
    END IF;
    m := tuneplane.member_of_node(p_node_id, (p_payload ->> 'member_id')::bigint);
    -- The node row after the job, its attempt and members (lock order).
    UPDATE tuneplane.nodes SET last_peer_check = coalesce(p_payload -> 'peer_check', last_peer_check),
                               last_storage_check = coalesce(p_payload -> 'storage_check', last_storage_check)
     WHERE id = p_node_id;
    SELECT * INTO a FROM tuneplane.attempts WHERE id = m.attempt_id;
    IF m.state <> 'preparing' OR n.fenced_at IS NOT NULL
       OR EXISTS (SELECT 1 FROM tuneplane.launch_decisions WHERE attempt_id = a.id) THEN
        RETURN jsonb_build_object('ignored', true, 'state', m.state);
    END IF;
    -- The hash of the telemetry token the agent made for this member: issued at COMMIT (record_commit).
    UPDATE tuneplane.members SET telemetry_token_hash = p_payload ->> 'telemetry_token_hash'
     WHERE id = m.id AND p_payload ? 'telemetry_token_hash';
    PERFORM tuneplane.set_member_state(m.id, 'prepared', 'prepared; waiting for the commit decision');
    SELECT count(*) INTO v_left FROM tuneplane.members WHERE attempt_id = a.id AND state <> 'prepared';
    IF v_left > 0 THEN
        RETURN jsonb_build_object('committed', false, 'waiting_for', v_left);
    END IF;
    IF NOT tuneplane.record_commit(a.id) THEN
        RETURN jsonb_build_object('ignored', true, 'state', 'decided');
    END IF;
    RETURN jsonb_build_object('committed', true);
END;
$$;

-- member_prepare_failed (report kind `member_prepare_failed`): records ABORT with the node's reason.
-- p_payload: {"member_id": 1, "reason": "capsule digest mismatch", "peer_check": …, "storage_check": …}
CREATE OR REPLACE FUNCTION tuneplane.member_prepare_failed(p_node_id bigint, p_epoch bigint, p_payload jsonb)
RETURNS jsonb
LANGUAGE plpgsql AS $$
DECLARE
    m tuneplane.members;
    v_node text;
BEGIN
    PERFORM tuneplane.require_node_session(p_node_id, p_epoch);
    m := tuneplane.member_of_node(p_node_id, (p_payload ->> 'member_id')::bigint);
    -- The node row after the job, its attempt and members (lock order).
    UPDATE tuneplane.nodes SET last_peer_check = coalesce(p_payload -> 'peer_check', last_peer_check),
                               last_storage_check = coalesce(p_payload -> 'storage_check', last_storage_check)
     WHERE id = p_node_id
    RETURNING name INTO v_node;
    IF m.state NOT IN ('reserved', 'preparing', 'prepared') THEN
        RETURN jsonb_build_object('ignored', true, 'state', m.state);
    END IF;
    RETURN jsonb_build_object('aborted', tuneplane.decide_abort(m.attempt_id,
        format('rank %s on %s failed to prepare: %s', m.rank, v_node,
               coalesce(nullif(p_payload ->> 'reason', ''), 'no reason given'))));
END;
$$;

-- member_reports: several agents' reports of one kind (member_prepared or member_started) in one
-- transaction, for the node gateway's burst of them when a gang prepares or starts together (issue 23: eight
-- such reports took eight turns of the job lock, one after another). Each item is the report function on its
-- own (the same checks, refusals and result), run in a subtransaction so one refusal does not undo the
-- others. Lock order: every node's session lock (shared) in node id order, then lock_members of every member
-- named (jobs, attempts, members, each in id order), then the items in node id order (a member_prepared
-- updates its node row). p_items: [{"node_id", "epoch", "payload"}]; returns one entry per item, in the
-- order given: {"result": <the function's result>} or {"error": {"sqlstate", "message", "column"}}. A
-- deadlock or serialization failure is raised (the caller runs the whole batch again, or item by item).
CREATE OR REPLACE FUNCTION tuneplane.member_reports(p_kind text, p_items jsonb)
RETURNS jsonb
LANGUAGE plpgsql AS $$
DECLARE
    v_item    record;
    v_result  jsonb;
    v_out     jsonb[];
    v_state   text;
    v_message text;
    v_column  text;
BEGIN
    IF p_kind NOT IN ('member_prepared', 'member_started') THEN
        RAISE EXCEPTION 'reports of kind % are not taken together', p_kind USING ERRCODE = 'TP400', COLUMN = 'kind';
    END IF;
    IF jsonb_typeof(p_items) IS DISTINCT FROM 'array' THEN
        RAISE EXCEPTION 'items must be an array' USING ERRCODE = 'TP400', COLUMN = 'items';
    END IF;
    PERFORM pg_advisory_xact_lock_shared(hashtext('tuneplane.node_session'), s.node_id::integer)
       FROM (SELECT DISTINCT (i ->> 'node_id')::bigint AS node_id FROM jsonb_array_elements(p_items) i
              ORDER BY 1) s;
    PERFORM tuneplane.lock_members(ARRAY(
        SELECT m.id FROM jsonb_array_elements(p_items) i
          JOIN tuneplane.members m ON m.id = (i -> 'payload' ->> 'member_id')::bigint
                                  AND m.node_id = (i ->> 'node_id')::bigint));
    v_out := array_fill(NULL::jsonb, ARRAY[jsonb_array_length(p_items)]);
    FOR v_item IN SELECT i.value AS item, i.ordinality AS n FROM jsonb_array_elements(p_items) WITH ORDINALITY i
                   ORDER BY (i.value ->> 'node_id')::bigint, i.ordinality LOOP
        BEGIN
            EXECUTE format('SELECT tuneplane.%I($1, $2, $3)', p_kind) INTO v_result
              USING (v_item.item ->> 'node_id')::bigint, (v_item.item ->> 'epoch')::bigint, v_item.item -> 'payload';
            v_out[v_item.n] := jsonb_build_object('result', v_result);
        EXCEPTION WHEN OTHERS THEN
            GET STACKED DIAGNOSTICS v_state = RETURNED_SQLSTATE, v_message = MESSAGE_TEXT, v_column = COLUMN_NAME;
            IF v_state IN ('40P01', '40001') THEN
                RAISE;
            END IF;
            v_out[v_item.n] := jsonb_build_object('error', jsonb_build_object(
                'sqlstate', v_state, 'message', v_message, 'column', nullif(v_column, '')));
        END;
    END LOOP;
    RETURN to_jsonb(v_out);
END;
$$;

-- member_started (report kind `member_started`): starting → running (member_now_running: the attempt is
-- running once every member started). Records the session it was started in (reconcile never releases a
-- member started in the session it reconciles). p_payload: {member_id, pid}
CREATE OR REPLACE FUNCTION tuneplane.member_started(p_node_id bigint, p_epoch bigint, p_payload jsonb)
RETURNS jsonb
LANGUAGE plpgsql AS $$
DECLARE
    n tuneplane.nodes;
    m tuneplane.members;
    v_result jsonb;
BEGIN
    n := tuneplane.require_node_session(p_node_id, p_epoch);
    m := tuneplane.member_of_node(p_node_id, (p_payload ->> 'member_id')::bigint);
    IF m.state <> 'starting' OR n.fenced_at IS NOT NULL THEN
        IF m.state IN ('running', 'stopping') THEN
            UPDATE tuneplane.members SET started_epoch = p_epoch, contact_lost_at = NULL WHERE id = m.id;
        END IF;
        RETURN jsonb_build_object('ignored', true, 'state', m.state);
    END IF;
    UPDATE tuneplane.members SET started_epoch = p_epoch, contact_lost_at = NULL WHERE id = m.id;
    v_result := tuneplane.member_now_running(m.id, (p_payload ->> 'pid')::integer, 'running');
    RETURN v_result - 'started';
END;
$$;

-- record_member_exit: a member's node confirmed it ended: exited (status 0) or failed; its resources go
-- back. A failure stops the rest of the attempt. Shared by member_exited, reconcile_node and the
-- acknowledgements of START and KILL. Caller holds the job lock.
CREATE OR REPLACE FUNCTION tuneplane.record_member_exit(p_member tuneplane.members, p_exit_code integer, p_reason text)
RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    a tuneplane.attempts;
    m tuneplane.members;
    v_state text;
    v_reason text;
BEGIN
    a := tuneplane.lock_attempt(p_member.attempt_id);
    SELECT * INTO m FROM tuneplane.members WHERE id = p_member.id FOR UPDATE;
    IF NOT tuneplane.member_is_live(m.state) THEN
        -- Already ended (cancelled, lost …): only make sure nothing stays held.
        PERFORM tuneplane.release_member(m.id);
        PERFORM tuneplane.finish_attempt_if_done(a.id);
        RETURN;
    END IF;
    IF p_exit_code = 0 THEN
        v_state := 'exited';
        v_reason := 'exited with status 0';
    ELSE
        v_state := 'failed';
        v_reason := coalesce(nullif(p_reason, ''),
                             CASE WHEN p_exit_code IS NULL THEN 'ended; exit status unknown'
                                  WHEN p_exit_code < 0 THEN format('killed by signal %s', -p_exit_code)
                                  ELSE format('exited with status %s', p_exit_code) END);
    END IF;
    IF m.state = 'stopping' AND a.cancel_requested_at IS NOT NULL THEN
        v_state := 'cancelled';
        v_reason := 'stopped on cancel';
    END IF;
    IF m.state IN ('reserved', 'preparing', 'prepared') THEN
        -- Not started: an end reported before START can only mean the launch failed on that node.
        PERFORM tuneplane.decide_abort(a.id, format('rank %s ended before it was started: %s', m.rank, v_reason));
        RETURN;
    END IF;
    UPDATE tuneplane.members SET contact_lost_at = NULL WHERE id = m.id;
    PERFORM tuneplane.set_member_state(m.id, v_state, v_reason, p_exit_code);
    PERFORM tuneplane.release_member(m.id);
    IF v_state = 'failed' AND a.state = 'running' THEN
        PERFORM tuneplane.stop_attempt(a.id, format('rank %s %s; stopping the other members', m.rank,
                                                    v_reason));
    END IF;
    PERFORM tuneplane.finish_attempt_if_done(a.id);
END;
$$;

-- member_exited (report kind `member_exited`): p_payload: {member_id, exit_code, reason}
CREATE OR REPLACE FUNCTION tuneplane.member_exited(p_node_id bigint, p_epoch bigint, p_payload jsonb)
RETURNS jsonb
LANGUAGE plpgsql AS $$
DECLARE
    m tuneplane.members;
BEGIN
    PERFORM tuneplane.require_node_session(p_node_id, p_epoch);
    m := tuneplane.member_of_node(p_node_id, (p_payload ->> 'member_id')::bigint);
    PERFORM tuneplane.record_member_exit(m, (p_payload ->> 'exit_code')::integer, p_payload ->> 'reason');
    RETURN jsonb_build_object('state', (SELECT state FROM tuneplane.members WHERE id = m.id));
END;
$$;

-- report_node_probe (report kind `probe`): the agent's probe port and, optionally, the address peers
-- should use for it (default: the address the gateway saw). p_payload: {"port": 41234, "address": "10.0.0.5"}
CREATE OR REPLACE FUNCTION tuneplane.report_node_probe(p_node_id bigint, p_epoch bigint, p_payload jsonb)
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

-- issue_member_telemetry_token (report kind `telemetry_token`): the agent made a token for one of its
-- members (starting or running) and sends only its sha256; the token may write that member's telemetry
-- only. p_payload: {"member_id": 1, "token_hash": "…64 hex…"}. Refuses another node's member (404), a
-- member that is not starting/running (409) and a malformed hash (400, issue_telemetry_token).
CREATE OR REPLACE FUNCTION tuneplane.issue_member_telemetry_token(p_node_id bigint, p_epoch bigint, p_payload jsonb)
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

-- reconcile_node (report kind `reconcile`): after (re)connecting, the agent says what it runs and what
-- ended while it was away. p_payload: {"running": [{"member_id": 1, "pid": 2}],
--                                       "exited": [{"member_id": 3, "exit_code": 0, "reason": "…"}]}
-- * ended members are recorded with the node's exit status (never as "gone");
-- * held members it still runs keep their state and lose their contact-lost mark; a `stopping` one gets
--   STOP again unless one is still waiting in the outbox;
-- * a member not yet started whose START is still unacknowledged stays `starting` (the START is delivered
--   after this reconcile);
-- * a member started in this very session is never released (its report raced this list);
-- * any other held member it does not mention is gone: failed, released — and KILLed all the same, in
--   case something of it still runs;
-- * whatever it runs that is not live here (cancelled, lost to a fence, unknown) gets KILL.
-- Marks the session reconciled: only then does claim_node_commands deliver commands to it.
CREATE OR REPLACE FUNCTION tuneplane.reconcile_node(p_node_id bigint, p_epoch bigint, p_payload jsonb)
RETURNS jsonb
LANGUAGE plpgsql AS $$
DECLARE
    n tuneplane.nodes;
    m tuneplane.members;
    v_running bigint[];
    v_exited jsonb;
    v_item jsonb;
    v_kill bigint[] := '{}';
    v_gone bigint[] := '{}';
    v_restored integer := 0;
    v_waiting integer := 0;
BEGIN
    PERFORM tuneplane.require_node_session(p_node_id, p_epoch);
    SELECT coalesce(array_agg((e ->> 'member_id')::bigint), '{}') INTO v_running
      FROM jsonb_array_elements(coalesce(p_payload -> 'running', '[]'::jsonb)) e;
    v_exited := coalesce(p_payload -> 'exited', '[]'::jsonb);
    -- Every job it may touch (held here, or named by the list), their attempts and members, then the node
    -- row, read again under its lock (a fence that committed while this waited is seen).
    n := tuneplane.lock_node_rows(p_node_id, v_running || ARRAY(
        SELECT (e ->> 'member_id')::bigint FROM jsonb_array_elements(v_exited) e));

    FOR v_item IN SELECT * FROM jsonb_array_elements(v_exited) LOOP
        SELECT * INTO m FROM tuneplane.members
         WHERE id = (v_item ->> 'member_id')::bigint AND node_id = p_node_id;
        IF m.id IS NOT NULL THEN
            PERFORM tuneplane.record_member_exit(m, (v_item ->> 'exit_code')::integer, v_item ->> 'reason');
        END IF;
    END LOOP;

    FOR m IN SELECT * FROM tuneplane.members
              WHERE node_id = p_node_id AND released_at IS NULL
                AND state IN ('starting', 'running', 'stopping')
              ORDER BY id LOOP
        IF m.id = ANY (v_running) AND n.fenced_at IS NULL THEN
            IF m.contact_lost_at IS NOT NULL THEN
                UPDATE tuneplane.members SET contact_lost_at = NULL,
                       reason = format('node %s reconnected; still %s', n.name, m.state)
                 WHERE id = m.id;
                PERFORM tuneplane.set_job_state(m.job_id, (SELECT state FROM tuneplane.jobs WHERE id = m.job_id),
                    format('node %s reconnected; member rank %s is still %s', n.name, m.rank, m.state));
                v_restored := v_restored + 1;
            END IF;
            IF m.state = 'stopping' THEN
                PERFORM tuneplane.send_stop(m, m.reason);
            END IF;
        ELSIF m.state = 'starting' AND m.started_at IS NULL AND n.fenced_at IS NULL AND EXISTS (
                SELECT 1 FROM tuneplane.node_commands c
                 WHERE c.node_id = p_node_id AND c.kind = 'start' AND c.acked_at IS NULL
                   AND (c.payload ->> 'member_id')::bigint = m.id) THEN
            -- Not started yet: START is still in the outbox and is delivered after this reconcile.
            UPDATE tuneplane.members SET contact_lost_at = NULL WHERE id = m.id;
            v_waiting := v_waiting + 1;
        ELSIF m.started_epoch = p_epoch THEN
            -- Reported started in this session, after the agent took its list: not gone.
            NULL;
        ELSIF NOT EXISTS (SELECT 1 FROM jsonb_array_elements(v_exited) e
                           WHERE (e ->> 'member_id')::bigint = m.id) THEN
            PERFORM tuneplane.record_member_exit(m, NULL,
                format('node %s reconnected and does not run it (exit status unknown)', n.name));
            v_gone := v_gone || m.id;
        END IF;
    END LOOP;

    SELECT coalesce(array_agg(r), '{}') INTO v_kill
      FROM unnest(v_running) r
     WHERE n.fenced_at IS NOT NULL
        OR NOT EXISTS (SELECT 1 FROM tuneplane.members mm
                        WHERE mm.id = r AND mm.node_id = p_node_id AND mm.released_at IS NULL
                          AND mm.state IN ('starting', 'running', 'stopping'));
    v_kill := v_kill || v_gone;
    PERFORM tuneplane.send_kill(p_node_id, v_kill,
        CASE WHEN n.fenced_at IS NOT NULL THEN 'node was fenced: ' || coalesce(n.fenced_reason, '')
             ELSE 'the control plane does not consider these members live on this node' END);
    UPDATE tuneplane.nodes SET session_reconciled_epoch = p_epoch WHERE id = p_node_id;
    -- Commands were withheld until now: wake the gateway holding this session.
    PERFORM pg_notify('tuneplane_node_commands', p_node_id::text);
    RETURN jsonb_build_object('restored', v_restored, 'gone', cardinality(v_gone), 'starting', v_waiting,
                              'kill', to_jsonb(v_kill));
END;
$$;

-- launch_command_locks: what the first acknowledgement of a launch command will lock, taken by
-- ack_node_command before it writes the command row (lock order): lock_members of the members a failed
-- START or STOP or a done KILL names on its node, then the node_usage rows their release may change.
-- Nothing for an acknowledgement that means nothing to the lifecycle (a START or STOP done, a KILL
-- failed, other kinds): the common one takes no job lock. p_cmd.error is the acknowledgement's error.
CREATE OR REPLACE FUNCTION tuneplane.launch_command_locks(p_cmd tuneplane.node_commands)
RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    v_ids bigint[];
BEGIN
    IF NOT ((p_cmd.kind IN ('start', 'stop') AND p_cmd.error IS NOT NULL)
            OR (p_cmd.kind = 'kill' AND p_cmd.error IS NULL)) THEN
        RETURN;
    END IF;
    SELECT coalesce(array_agg(m.id), '{}') INTO v_ids FROM tuneplane.members m
     WHERE m.node_id = p_cmd.node_id
       AND m.id IN (SELECT (p_cmd.payload ->> 'member_id')::bigint WHERE p_cmd.kind <> 'kill'
                    UNION ALL
                    SELECT (e #>> '{}')::bigint FROM jsonb_array_elements(p_cmd.payload -> 'member_ids') e
                     WHERE p_cmd.kind = 'kill');
    PERFORM tuneplane.lock_members(v_ids);
    PERFORM tuneplane.lock_usage_of_attempts(
        ARRAY(SELECT DISTINCT attempt_id FROM tuneplane.members WHERE id = ANY (v_ids)));
END;
$$;

-- launch_command_acked: what an acknowledgement means for the lifecycle (called by ack_node_command once,
-- on the first ack of a command, after launch_command_locks):
--   START with an error → the node did not start the member: failed, released, the attempt stopped;
--   STOP with an error  → escalate to KILL;
--   KILL without error  → every listed member the node killed or does not run has ended: it is recorded
--                         (failed, or cancelled when a cancel asked for its stop) and released; a member
--                         lost to a fence, held until now, is released (its job may be retried elsewhere).
-- A KILL with an error changes nothing: the member stays held; unfence_node waits for a later KILL that
-- succeeds.
CREATE OR REPLACE FUNCTION tuneplane.launch_command_acked(p_cmd tuneplane.node_commands)
RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    m tuneplane.members;
    v_id bigint;
BEGIN
    PERFORM tuneplane.launch_command_locks(p_cmd);
    IF p_cmd.kind = 'start' AND p_cmd.error IS NOT NULL THEN
        SELECT * INTO m FROM tuneplane.members
         WHERE id = (p_cmd.payload ->> 'member_id')::bigint AND node_id = p_cmd.node_id;
        IF m.id IS NOT NULL AND m.state = 'starting' AND m.started_at IS NULL THEN
            PERFORM tuneplane.record_member_exit(m, NULL, 'could not be started: ' || left(p_cmd.error, 500));
        END IF;
    ELSIF p_cmd.kind = 'stop' AND p_cmd.error IS NOT NULL THEN
        SELECT * INTO m FROM tuneplane.members
         WHERE id = (p_cmd.payload ->> 'member_id')::bigint AND node_id = p_cmd.node_id;
        IF m.id IS NOT NULL AND m.released_at IS NULL THEN
            PERFORM tuneplane.send_kill(p_cmd.node_id, ARRAY[m.id], 'STOP failed: ' || left(p_cmd.error, 500));
        END IF;
    ELSIF p_cmd.kind = 'kill' AND p_cmd.error IS NULL THEN
        FOR v_id IN SELECT (e #>> '{}')::bigint FROM jsonb_array_elements(p_cmd.payload -> 'member_ids') e
                     ORDER BY 1 LOOP
            SELECT * INTO m FROM tuneplane.members WHERE id = v_id AND node_id = p_cmd.node_id;
            CONTINUE WHEN m.id IS NULL OR m.released_at IS NOT NULL;
            PERFORM tuneplane.record_member_exit(m, -9,
                'killed by the control plane: ' || coalesce(p_cmd.payload ->> 'reason', ''));
        END LOOP;
    END IF;
END;
$$;

-- ---- ends and stops: an attempt finishes, stops, a job is cancelled ------------------------------------

-- finish_attempt_if_done: once every member of an attempt has ended and been released, the attempt gets
-- its outcome and the job its next state: succeeded, cancelled, back to queued for a retry (while
-- attempts remain), or failed. An attempt of a node fleet aborted after PREPARE was sent (a member failed
-- to prepare, the prepare deadline passed) started nothing: it is queued again without using up one of
-- max_attempts, at most launch_settings.free_relaunches times per job (jobs.free_relaunches_used); the
-- attempts that count are number - free_relaunches_used (- preemptions_used - corrupt_resumes_used: an
-- attempt whose checkpoint to resume from was found corrupt while it prepared is queued again from the
-- previous checkpoint, counting against nothing). Caller holds the job lock (lock_attempt).
CREATE OR REPLACE FUNCTION tuneplane.finish_attempt_if_done(p_attempt_id bigint)
RETURNS text
LANGUAGE plpgsql AS $$
DECLARE
    a        tuneplane.attempts;
    j        tuneplane.jobs;
    d        tuneplane.launch_decisions;
    v_bad    tuneplane.members;
    v_state  text;
    v_reason text;
    v_free   integer;
    v_counted integer;
BEGIN
    a := tuneplane.lock_attempt(p_attempt_id);
    IF a.state IN ('succeeded', 'failed', 'aborted', 'cancelled', 'preempted', 'timed_out') THEN
        RETURN a.state;
    END IF;
    IF EXISTS (SELECT 1 FROM tuneplane.members m WHERE m.attempt_id = a.id
                AND (tuneplane.member_is_live(m.state) OR m.released_at IS NULL)) THEN
        RETURN NULL;
    END IF;
    SELECT * INTO d FROM tuneplane.launch_decisions WHERE attempt_id = a.id;
    SELECT * INTO v_bad FROM tuneplane.members m
     WHERE m.attempt_id = a.id AND m.state <> 'exited' ORDER BY m.rank LIMIT 1;
    IF a.cancel_requested_at IS NOT NULL THEN
        v_state := 'cancelled'; v_reason := 'cancelled';
    ELSIF a.stop_kind IS NOT NULL THEN
        -- Asked to checkpoint and stop: preempted or timed out whatever the exit status (preemption.sql).
        v_state := a.stop_kind; v_reason := tuneplane.settle_stopped_attempt(a.id);
    ELSIF d.decision = 'abort' THEN
        v_state := 'aborted'; v_reason := 'launch aborted: ' || d.reason;
    ELSIF v_bad.id IS NULL THEN
        v_state := 'succeeded';
        v_reason := format('all %s member(s) exited with status 0',
                           (SELECT count(*) FROM tuneplane.members WHERE attempt_id = a.id));
    ELSE
        v_state := 'failed';
        v_reason := format('member rank %s %s: %s', v_bad.rank, v_bad.state, v_bad.reason);
    END IF;
    PERFORM tuneplane.set_attempt_state(a.id, v_state, v_reason);
    IF v_state = 'failed' THEN
        PERFORM tuneplane.lost_work_of_failed(a.id);  -- the work since its last checkpoint (preemption.sql)
    END IF;

    SELECT * INTO j FROM tuneplane.jobs WHERE id = a.job_id;
    SELECT free_relaunches INTO v_free FROM tuneplane.launch_settings;
    v_counted := a.number - j.free_relaunches_used - j.preemptions_used - j.corrupt_resumes_used;
    IF v_state = 'succeeded' THEN
        PERFORM tuneplane.set_job_state(j.id, 'succeeded', format('attempt %s: %s', a.number, v_reason));
    ELSIF v_state = 'cancelled' THEN
        PERFORM tuneplane.set_job_state(j.id, 'cancelled',
            format('cancelled; every member of attempt %s stopped and its resources were released', a.number));
    ELSIF v_state = 'preempted' AND tuneplane.idle_reclaim_ends_job(a.id) THEN
        -- Reclaimed for idle GPUs (idle.sql): the job ends; it runs again only if its owner resubmits it
        -- (or it was submitted with resume_when_idle_reclaimed: the branch below).
        PERFORM tuneplane.set_job_state(j.id, 'cancelled',
            format('attempt %s preempted (idle): %s; not resumed: resubmit the job to run it again (or submit it '
                   'with resume_when_idle_reclaimed)', a.number, v_reason));
    ELSIF v_state = 'preempted' THEN
        -- Preemptions have their own budget (max_preemptions, kept by the planner), not max_attempts.
        UPDATE tuneplane.jobs SET preemptions_used = preemptions_used + 1 WHERE id = j.id;
        PERFORM tuneplane.set_job_state(j.id, 'queued',
            format('attempt %s %s%s; queued for attempt %s (preemptions do not count against max_attempts)',
                   a.number, CASE WHEN tuneplane.idle_reclaimed(a.id) THEN 'preempted (idle): ' ELSE '' END,
                   v_reason, a.number + 1));
        PERFORM pg_notify('tuneplane_placement', j.fleet_id::text);
    ELSIF v_state = 'aborted' AND a.resume_artifact_id IS NOT NULL
          AND tuneplane.artifact_is_corrupt(a.resume_artifact_id)
          AND coalesce(j.spec -> 'resume' ->> 'mode', 'latest') = 'latest' THEN
        -- Its checkpoint was found corrupt while the members prepared (mark_artifact_corrupt): the next
        -- attempt resumes from the previous one, and this one counts against nothing. Bounded: each such
        -- abort marks one more of the job's checkpoints, which is never picked again.
        UPDATE tuneplane.jobs SET corrupt_resumes_used = corrupt_resumes_used + 1 WHERE id = j.id;
        PERFORM tuneplane.set_job_state(j.id, 'queued',
            format('attempt %s: %s; its checkpoint %s is corrupt, so it does not count against max_attempts: '
                   'launching again as attempt %s from %s', a.number, v_reason,
                   (SELECT tuneplane.checkpoint_label(c) FROM tuneplane.artifacts c WHERE c.id = a.resume_artifact_id),
                   a.number + 1,
                   coalesce((SELECT tuneplane.checkpoint_label(r) FROM tuneplane.resume_checkpoint_of(j.id) r
                              WHERE r.id IS NOT NULL), 'scratch (no other verified checkpoint)')));
        PERFORM pg_notify('tuneplane_placement', j.fleet_id::text);
    ELSIF v_state = 'aborted' AND j.free_relaunches_used < v_free AND a.capsule_digest IS NOT NULL
          AND (SELECT f.backend FROM tuneplane.fleets f WHERE f.id = a.fleet_id) = 'node' THEN
        -- Nothing was started (no COMMIT): the user's attempts are not spent on what the nodes met while
        -- preparing. A capsule that could not be built (no digest: aborted before PREPARE) would fail the
        -- same way again, so it counts.
        UPDATE tuneplane.jobs SET free_relaunches_used = free_relaunches_used + 1 WHERE id = j.id;
        PERFORM tuneplane.set_job_state(j.id, 'queued',
            format('attempt %s: %s; nothing was started, so it does not count against max_attempts (%s): '
                   'launching again as attempt %s (free re-launch %s of %s)', a.number, v_reason,
                   j.max_attempts, a.number + 1, j.free_relaunches_used + 1, v_free));
        PERFORM pg_notify('tuneplane_placement', j.fleet_id::text);
    ELSIF v_counted < j.max_attempts THEN
        PERFORM tuneplane.set_job_state(j.id, 'queued',
            format('attempt %s of %s %s (%s); queued for attempt %s', v_counted, j.max_attempts,
                   CASE WHEN v_state = 'timed_out' THEN 'timed out' ELSE 'failed' END, v_reason, v_counted + 1));
        PERFORM pg_notify('tuneplane_placement', j.fleet_id::text);
    ELSE
        PERFORM tuneplane.set_job_state(j.id, 'failed',
            format('attempt %s of %s %s: %s', v_counted, j.max_attempts,
                   CASE WHEN v_state = 'timed_out' THEN 'timed out' ELSE 'failed' END, v_reason));
    END IF;
    RETURN v_state;
END;
$$;

-- stop_attempt: committed attempt → stopping; sends STOP to every member still live (members on a retired
-- node were already lost by the retire). Caller holds the job lock.
CREATE OR REPLACE FUNCTION tuneplane.stop_attempt(p_attempt_id bigint, p_reason text)
RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    a tuneplane.attempts;
    m tuneplane.members;
    v_grace interval;
BEGIN
    a := tuneplane.lock_attempt(p_attempt_id);
    SELECT stop_grace INTO v_grace FROM tuneplane.launch_settings;
    IF a.state = 'running' THEN
        PERFORM tuneplane.set_attempt_state(p_attempt_id, 'stopping', p_reason);
    END IF;
    FOR m IN SELECT * FROM tuneplane.members
              WHERE attempt_id = p_attempt_id AND state IN ('starting', 'running', 'stopping')
              ORDER BY id FOR UPDATE LOOP
        IF m.state IN ('starting', 'running') THEN
            PERFORM tuneplane.set_member_state(m.id, 'stopping', p_reason);
        END IF;
        PERFORM tuneplane.send_stop(m, p_reason);
    END LOOP;
END;
$$;

-- cancel_job: a user who may act on the job (require_job_access 'act': its owner or an admin) cancels. queued → cancelled at once; before COMMIT the launch is
-- aborted (nothing started) and the job is cancelled; after COMMIT every member gets STOP and the job
-- is cancelled only when every node has confirmed its member stopped (resources are released then).
-- Members on a fenced or retired node were already lost (and released) by the fence or retire.
CREATE OR REPLACE FUNCTION tuneplane.cancel_job(p_job_id bigint, p_actor_id bigint, p_reason text DEFAULT NULL)
RETURNS tuneplane.jobs
LANGUAGE plpgsql AS $$
DECLARE
    j tuneplane.jobs;
    a tuneplane.attempts;
    actor tuneplane.users;
    v_why text;
BEGIN
    PERFORM tuneplane.require_job_access(p_actor_id, p_job_id, 'act');
    SELECT * INTO actor FROM tuneplane.users WHERE id = p_actor_id;
    SELECT * INTO j FROM tuneplane.jobs WHERE id = p_job_id FOR UPDATE;
    IF j.state IN ('succeeded', 'failed', 'cancelled') THEN
        RAISE EXCEPTION 'job % already %', p_job_id, j.state USING ERRCODE = 'TP409', COLUMN = 'job';
    END IF;
    v_why := format('cancel requested by %s%s', actor.username,
                    CASE WHEN coalesce(p_reason, '') = '' THEN '' ELSE ': ' || p_reason END);
    SELECT * INTO a FROM tuneplane.attempts
     WHERE job_id = j.id AND state IN ('reserved', 'preparing', 'running', 'stopping') FOR UPDATE;
    IF a.id IS NULL THEN
        PERFORM tuneplane.set_job_state(j.id, 'cancelled', v_why);
    ELSE
        UPDATE tuneplane.attempts SET cancel_requested_at = coalesce(cancel_requested_at, clock_timestamp())
         WHERE id = a.id;
        IF NOT tuneplane.decide_abort(a.id, v_why) THEN
            PERFORM tuneplane.stop_attempt(a.id, v_why);
            PERFORM tuneplane.set_job_state(j.id, j.state,
                v_why || format('; waiting for %s member(s) to stop',
                                (SELECT count(*) FROM tuneplane.members
                                  WHERE attempt_id = a.id AND released_at IS NULL)));
        END IF;
        PERFORM tuneplane.finish_attempt_if_done(a.id);
    END IF;
    SELECT * INTO j FROM tuneplane.jobs WHERE id = p_job_id;
    RETURN j;
END;
$$;

-- ---- operators: fence, unfence (retire is nodes.sql), losing a node's members --------------------------

-- lose_node_members: an operator declared a node dead (fence) or gone (retire). Every live member held
-- there becomes `lost` and gets KILL in the node's outbox; the attempts they belonged to are aborted
-- (before COMMIT) or stopped (after). What they hold is released at once only when the node is known
-- gone: p_gone (retire), a node that takes no commands, or one whose last heartbeat is past lost_after.
-- A connected (or stale) node may still run them: they stay held, so their jobs are not retried
-- elsewhere, until the node acknowledges their KILL (launch_command_acked), reports them ended, or goes
-- lost (sweep_lost_nodes) or is retired. The caller holds the fleet's placement lock, so no member is
-- placed on the node meanwhile. Locks: lock_node_rows (jobs → attempts → members → node row → usage
-- rows), then leaf rows. Returns how many members became lost.
CREATE OR REPLACE FUNCTION tuneplane.lose_node_members(p_node_id bigint, p_why text, p_gone boolean)
RETURNS integer
LANGUAGE plpgsql AS $$
DECLARE
    n tuneplane.nodes;
    m tuneplane.members;
    v_release boolean;
    v_lost integer := 0;
    v_kill bigint[] := '{}';
    v_attempts bigint[] := '{}';
    v_attempt bigint;
BEGIN
    n := tuneplane.lock_node_rows(p_node_id);
    v_release := p_gone OR NOT coalesce(tuneplane.node_takes_commands(n.id), false)
                 OR tuneplane.node_connectivity(n.last_heartbeat_at) = 'lost';
    FOR m IN SELECT * FROM tuneplane.members WHERE node_id = p_node_id AND released_at IS NULL ORDER BY id LOOP
        IF tuneplane.member_is_live(m.state) THEN
            PERFORM tuneplane.set_member_state(m.id, 'lost', p_why);
            v_lost := v_lost + 1;
        END IF;
        -- Never started (no START before COMMIT): nothing of it can run there, it goes back at once.
        IF v_release OR m.state IN ('reserved', 'preparing', 'prepared') THEN
            PERFORM tuneplane.release_member(m.id);
        ELSE
            PERFORM tuneplane.set_job_state(m.job_id, (SELECT state FROM tuneplane.jobs WHERE id = m.job_id),
                format('%s; member rank %s stays held until node %s acknowledges its KILL (or goes lost, or '
                       'is retired)', p_why, m.rank, n.name));
        END IF;
        v_kill := v_kill || m.id;
        v_attempts := v_attempts || m.attempt_id;
    END LOOP;
    PERFORM tuneplane.send_kill(p_node_id, v_kill, p_why);
    FOR v_attempt IN SELECT DISTINCT unnest(v_attempts) ORDER BY 1 LOOP
        IF NOT tuneplane.decide_abort(v_attempt, p_why) THEN
            PERFORM tuneplane.stop_attempt(v_attempt, p_why || '; stopping the other members');
        END IF;
        PERFORM tuneplane.finish_attempt_if_done(v_attempt);
    END LOOP;
    RETURN v_lost;
END;
$$;

-- fence_node: an operator declares a node dead. Its live members become `lost` with KILL queued for its
-- agent, and their attempts aborted or stopped (lose_node_members: released at once only if the node is
-- known gone; a connected node's are released when it acknowledges the KILL); the node gets no new work
-- and its reports start nothing until unfence_node, which needs the agent back. Locks: the fleet's
-- placement lock, then lose_node_members' (jobs → attempts → members → node row → leaf rows); the node
-- row is written last (its trigger telemetry_node_fenced revokes the telemetry tokens of every member
-- ever placed there: telemetry_tokens rows).
CREATE OR REPLACE FUNCTION tuneplane.fence_node(p_node text, p_reason text DEFAULT NULL, p_actor text DEFAULT NULL)
RETURNS TABLE (node_id bigint, node text, members_lost integer)
LANGUAGE plpgsql AS $$
DECLARE
    v_id bigint := tuneplane.resolve_node(p_node);
    v_node tuneplane.nodes;
    v_why text;
BEGIN
    SELECT * INTO v_node FROM tuneplane.nodes WHERE id = v_id;
    PERFORM pg_advisory_xact_lock(hashtext('tuneplane.placement'), v_node.fleet_id::integer);
    v_why := format('node %s fenced by %s%s', v_node.name, coalesce(nullif(p_actor, ''), 'db:' || session_user),
                    CASE WHEN coalesce(p_reason, '') = '' THEN '' ELSE ': ' || p_reason END);
    members_lost := tuneplane.lose_node_members(v_node.id, v_why, false);
    -- now(): the transaction's start, not later than the KILLs this fence queued (unfence_node counts a
    -- KILL that failed since the fence by its created_at).
    UPDATE tuneplane.nodes SET fenced_at = coalesce(fenced_at, now()),
                               fenced_reason = coalesce(p_reason, fenced_reason)
     WHERE id = v_node.id;
    PERFORM tuneplane.log_node_event(v_node.fleet_id, v_node.id, 'fenced', p_actor, coalesce(p_reason, ''));
    node_id := v_node.id; node := v_node.name;
    RETURN NEXT;
END;
$$;

-- unfence_node: the operator lets a fenced node take work again. Refused (409) until the node's agent is
-- connected in a session it reconciled (opened after the fence when the node was away, or the session
-- that was open and reconciled all along when it was fenced while connected) and has acknowledged every
-- KILL sent to it (an unacknowledged one of any age, or one it failed since the fence, unless every member
-- that one named was named again by a later KILL the agent acknowledged without error) — until then
-- something of its lost members may still run on its GPUs. The KILL acknowledgement is the proof: the
-- agent acknowledges only once no process of the member is left. Locks the node row only.
CREATE OR REPLACE FUNCTION tuneplane.unfence_node(p_node text, p_reason text DEFAULT NULL, p_actor text DEFAULT NULL)
RETURNS boolean
LANGUAGE plpgsql AS $$
DECLARE
    v_id bigint := tuneplane.resolve_node(p_node);
    n tuneplane.nodes;
    v_pending integer;
BEGIN
    SELECT * INTO n FROM tuneplane.nodes WHERE id = v_id FOR UPDATE;
    IF n.fenced_at IS NULL THEN
        RETURN false;
    END IF;
    IF n.session_opened_at IS NULL OR n.session_closed_at IS NOT NULL
       OR n.session_reconciled_epoch <> n.session_epoch THEN
        RAISE EXCEPTION 'node % cannot be unfenced yet: its agent must reconnect and reconcile first '
            '(fenced %, last session opened %)', n.name, to_char(n.fenced_at, 'YYYY-MM-DD HH24:MI:SS'),
            coalesce(to_char(n.session_opened_at, 'YYYY-MM-DD HH24:MI:SS'), 'never')
            USING ERRCODE = 'TP409', COLUMN = 'node';
    END IF;
    SELECT count(*) INTO v_pending FROM tuneplane.node_commands c
     WHERE c.node_id = v_id AND c.kind = 'kill'
       AND (c.acked_at IS NULL
            OR (c.error IS NOT NULL AND c.created_at >= n.fenced_at
                AND EXISTS (SELECT 1 FROM jsonb_array_elements(c.payload -> 'member_ids') e
                             WHERE NOT EXISTS (SELECT 1 FROM tuneplane.node_commands k
                                                WHERE k.node_id = c.node_id AND k.kind = 'kill' AND k.id > c.id
                                                  AND k.acked_at IS NOT NULL AND k.error IS NULL
                                                  AND k.payload -> 'member_ids' @> e))));
    IF v_pending > 0 THEN
        RAISE EXCEPTION 'node % cannot be unfenced yet: % KILL command(s) are not acknowledged by its agent '
            '(or failed since the fence)', n.name, v_pending USING ERRCODE = 'TP409', COLUMN = 'node';
    END IF;
    UPDATE tuneplane.nodes SET fenced_at = NULL, fenced_reason = NULL WHERE id = v_id;
    PERFORM tuneplane.log_node_event(n.fleet_id, v_id, 'unfenced', p_actor, coalesce(p_reason, ''));
    RETURN true;
END;
$$;

-- ==== Sweeps (deadlines and lost contact; run periodically) =============================================

-- expire_prepare_deadlines: ABORT every attempt whose members were not all prepared in time. Follows the
-- lock order: the job first (SKIP LOCKED: a job busy with a report is taken on the next sweep).
CREATE OR REPLACE FUNCTION tuneplane.expire_prepare_deadlines()
RETURNS integer
LANGUAGE plpgsql AS $$
DECLARE
    v_attempt bigint;
    v_count integer := 0;
BEGIN
    FOR v_attempt IN SELECT a.id FROM tuneplane.attempts a
                      WHERE a.state = 'preparing' AND a.prepare_deadline < now() ORDER BY a.id LOOP
        PERFORM 1 FROM tuneplane.jobs WHERE id = (SELECT job_id FROM tuneplane.attempts WHERE id = v_attempt)
            FOR UPDATE SKIP LOCKED;
        CONTINUE WHEN NOT FOUND;
        CONTINUE WHEN (SELECT state FROM tuneplane.attempts WHERE id = v_attempt) <> 'preparing';
        IF tuneplane.decide_abort(v_attempt, format('prepare deadline passed; not prepared: rank %s',
                (SELECT string_agg(rank::text, ', ' ORDER BY rank) FROM tuneplane.members
                  WHERE attempt_id = v_attempt AND state <> 'prepared'))) THEN
            v_count := v_count + 1;
        END IF;
    END LOOP;
    RETURN v_count;
END;
$$;

-- expire_member_deadlines: bounds `starting` and `stopping`. A member whose START was delivered to the
-- node's current, reconciled session more than start_timeout ago and never reported started, or that is
-- still stopping stop_grace + stop_timeout after its STOP was delivered, gets KILL (once). Its resources
-- stay held until the node acknowledges the KILL (launch_command_acked) or an operator fences it. Returns
-- how many got KILL.
CREATE OR REPLACE FUNCTION tuneplane.expire_member_deadlines()
RETURNS integer
LANGUAGE plpgsql AS $$
DECLARE
    s tuneplane.launch_settings;
    r record;
    v_count integer := 0;
BEGIN
    SELECT * INTO s FROM tuneplane.launch_settings;
    FOR r IN SELECT mm.id, mm.node_id, mm.job_id, mm.state, c.delivered_at
               FROM tuneplane.members mm
               JOIN tuneplane.nodes n ON n.id = mm.node_id
               JOIN LATERAL (SELECT max(c.delivered_at) AS delivered_at FROM tuneplane.node_commands c
                              WHERE c.node_id = mm.node_id AND c.kind = CASE mm.state WHEN 'starting' THEN 'start'
                                                                                       ELSE 'stop' END
                                AND (c.payload ->> 'member_id')::bigint = mm.id) c ON true
              WHERE mm.released_at IS NULL AND mm.state IN ('starting', 'stopping')
                AND mm.kill_requested_at IS NULL AND n.fenced_at IS NULL
                AND n.session_reconciled_epoch = n.session_epoch AND n.session_closed_at IS NULL
                AND c.delivered_at < now() - CASE mm.state WHEN 'starting' THEN s.start_timeout
                                                          ELSE s.stop_grace + s.stop_timeout END
              ORDER BY mm.job_id, mm.id LOOP
        PERFORM 1 FROM tuneplane.jobs WHERE id = r.job_id FOR UPDATE SKIP LOCKED;
        CONTINUE WHEN NOT FOUND;
        PERFORM tuneplane.send_kill(r.node_id, ARRAY[r.id],
            CASE r.state WHEN 'starting' THEN format('not started within %s of START', s.start_timeout)
                         ELSE format('still stopping %s after STOP', s.stop_grace + s.stop_timeout) END);
        v_count := v_count + 1;
    END LOOP;
    RETURN v_count;
END;
$$;

-- sweep_lost_nodes: members whose node lost contact get contact_lost_at (their state is kept: a lost
-- connection is not proof that a workload stopped) and their resources stay held. Driven from the nodes
-- that are lost and their held members (index members_node_held), so its cost does not grow with
-- history. A fenced node that is lost too is known gone: the members its fence left held (waiting for the
-- KILL's acknowledgement) are released, so their jobs may be retried elsewhere. Lock order: the job
-- first (SKIP LOCKED: one busy now is taken on the next sweep), then its attempt and member; releases go
-- node by node (node_usage rows in node id order). Returns how many members were marked or released.
-- Silence is counted from the later of a node's last heartbeat and the coordinator's return
-- (coordinator_clock, migration 0250): a database outage or failover, during which no heartbeat could be
-- written, never makes a node lost; the clock row is locked first, before any job.
CREATE OR REPLACE FUNCTION tuneplane.sweep_lost_nodes()
RETURNS integer
LANGUAGE plpgsql AS $$
DECLARE
    m record;
    v_member tuneplane.members;
    v_count integer := 0;
    v_lost_before timestamptz;
BEGIN
    UPDATE tuneplane.coordinator_clock c
       SET back_at = CASE WHEN c.swept_at < now() - s.stale_after THEN now() ELSE c.back_at END,
           swept_at = now()
      FROM tuneplane.node_settings s
    -- Within lost_after of the coordinator's return nobody is silent long enough (-infinity: no heartbeat).
    RETURNING CASE WHEN c.back_at > now() - s.lost_after THEN '-infinity'::timestamptz
                   ELSE now() - s.lost_after END
      INTO v_lost_before;
    FOR m IN SELECT mm.id, mm.job_id, mm.attempt_id, n.name AS node_name, n.last_heartbeat_at
               FROM tuneplane.nodes n
               JOIN tuneplane.members mm ON mm.node_id = n.id AND mm.released_at IS NULL
              WHERE n.fenced_at IS NOT NULL AND mm.state = 'lost'
                AND (n.last_heartbeat_at IS NULL OR n.last_heartbeat_at <= v_lost_before)
              ORDER BY n.id, mm.job_id, mm.id LOOP
        PERFORM 1 FROM tuneplane.jobs WHERE id = m.job_id FOR UPDATE SKIP LOCKED;
        CONTINUE WHEN NOT FOUND;
        PERFORM tuneplane.lock_members(ARRAY[m.id]);
        SELECT * INTO v_member FROM tuneplane.members WHERE id = m.id AND released_at IS NULL;
        CONTINUE WHEN v_member.id IS NULL;
        PERFORM tuneplane.record_member_exit(v_member, NULL, format(
            'node %s was fenced and lost contact (last heartbeat %s): taken for gone', m.node_name,
            to_char(m.last_heartbeat_at, 'YYYY-MM-DD HH24:MI:SS TZ')));
        v_count := v_count + 1;
    END LOOP;
    FOR m IN SELECT mm.id, mm.job_id, mm.rank, n.name AS node_name, n.last_heartbeat_at
               FROM tuneplane.nodes n
               JOIN tuneplane.members mm ON mm.node_id = n.id AND mm.released_at IS NULL
              WHERE n.fenced_at IS NULL AND n.scheduling_state <> 'retired'
                -- node_connectivity(…) = 'lost', with the threshold read once rather than per node
                AND (n.last_heartbeat_at IS NULL OR n.last_heartbeat_at <= v_lost_before)
                AND mm.contact_lost_at IS NULL
                AND mm.state IN ('starting', 'running', 'stopping')
              ORDER BY mm.job_id, mm.id LOOP
        PERFORM 1 FROM tuneplane.jobs WHERE id = m.job_id FOR UPDATE SKIP LOCKED;
        CONTINUE WHEN NOT FOUND;
        UPDATE tuneplane.members
           SET contact_lost_at = clock_timestamp(),
               reason = format('node %s lost contact (last heartbeat %s); resources held until it reconnects '
                               'or an operator fences it', m.node_name,
                               to_char(m.last_heartbeat_at, 'YYYY-MM-DD HH24:MI:SS TZ'))
         WHERE id = m.id AND contact_lost_at IS NULL AND released_at IS NULL;
        CONTINUE WHEN NOT FOUND;
        PERFORM tuneplane.set_job_state(m.job_id, (SELECT state FROM tuneplane.jobs WHERE id = m.job_id),
            format('contact lost with member rank %s (node %s); waiting for it to reconnect or be fenced',
                   m.rank, m.node_name));
        v_count := v_count + 1;
    END LOOP;
    RETURN v_count;
END;
$$;

-- requeue_stalled_launches: enqueue `launch` again for attempts still `reserved` after p_older_than whose
-- pgqueuer job is gone (pgqueuer deletes a job whose handler failed). The dedupe key makes it a no-op
-- while the job is queued or picked (a crashed worker's picked job is re-picked by pgqueuer itself).
CREATE OR REPLACE FUNCTION tuneplane.requeue_stalled_launches(p_older_than interval DEFAULT interval '10 seconds')
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

-- ==== Reads (gateway checks, scheduler passes, operators' views, a job's launch pages) ==================

-- node_may_read_capsule: true when the node holds a member (resources not released) of an attempt whose
-- capsule is p_digest. The gateway's `capsule` file provider serves nothing else.
CREATE OR REPLACE FUNCTION tuneplane.node_may_read_capsule(p_node_id bigint, p_digest text)
RETURNS boolean
LANGUAGE sql STABLE AS $$
    SELECT EXISTS (SELECT 1 FROM tuneplane.members m JOIN tuneplane.attempts a ON a.id = m.attempt_id
                    WHERE m.node_id = p_node_id AND m.released_at IS NULL AND a.capsule_digest = p_digest);
$$;

-- attempt_storage: the S3 store of the attempt's fleet (fleets.storage, migration 0245), where the worker
-- writes its capsule (workers/backend/capsule_build.py); NULL for the server's own store. Never credentials.
CREATE OR REPLACE FUNCTION tuneplane.attempt_storage(p_attempt_id bigint)
RETURNS jsonb
LANGUAGE sql STABLE AS $$
    SELECT f.storage FROM tuneplane.attempts t JOIN tuneplane.fleets f ON f.id = t.fleet_id
     WHERE t.id = p_attempt_id AND f.storage ->> 'kind' = 's3';
$$;

-- node_capsule_storage: the S3 store that holds capsule p_digest for a member placed on node p_node_id (its
-- attempt's fleet's store, where attempt_storage sent the worker), NULL when there is none (the server's own
-- store). The node gateway asks it after node_may_read_capsule, to redirect the node to a presigned GET.
CREATE OR REPLACE FUNCTION tuneplane.node_capsule_storage(p_node_id bigint, p_digest text)
RETURNS jsonb
LANGUAGE sql STABLE AS $$
    SELECT f.storage FROM tuneplane.members m JOIN tuneplane.attempts a ON a.id = m.attempt_id
      JOIN tuneplane.fleets f ON f.id = a.fleet_id
     WHERE m.node_id = p_node_id AND m.released_at IS NULL AND a.capsule_digest = p_digest
       AND f.storage ->> 'kind' = 's3'
     LIMIT 1;
$$;

-- placement_fleets: fleets of a backend with at least one queued job (what a scheduler pass visits).
CREATE OR REPLACE FUNCTION tuneplane.placement_fleets(p_backend text)
RETURNS TABLE (fleet_id bigint, queued integer)
LANGUAGE sql STABLE AS $$
    SELECT j.fleet_id, count(*)::integer
      FROM tuneplane.jobs j JOIN tuneplane.fleets f ON f.id = j.fleet_id
     WHERE j.state = 'queued' AND f.backend = p_backend
     GROUP BY j.fleet_id
     ORDER BY j.fleet_id;
$$;

CREATE OR REPLACE VIEW tuneplane.v_uncertain AS
SELECT m.job_id, a.number AS attempt, m.id AS member_id, m.rank, n.name AS node, m.state, m.reason,
       n.last_heartbeat_at, tuneplane.node_connectivity(n.last_heartbeat_at) AS connectivity,
       m.gpu_indices, m.updated_at, m.contact_lost_at
  FROM tuneplane.members m
  JOIN tuneplane.attempts a ON a.id = m.attempt_id
  JOIN tuneplane.nodes n ON n.id = m.node_id
 WHERE m.contact_lost_at IS NOT NULL AND m.released_at IS NULL;

-- v_launches: live attempts with their worker lease, capsule and decision (operators).
CREATE OR REPLACE VIEW tuneplane.v_launches AS
SELECT a.job_id, a.number AS attempt, a.id AS attempt_id, a.state, a.reason, a.launch_owner, a.launch_epoch,
       a.capsule_digest, d.decision, d.reason AS decision_reason, a.prepare_deadline, a.created_at,
       a.committed_at, a.running_at
  FROM tuneplane.attempts a
  LEFT JOIN tuneplane.launch_decisions d ON d.attempt_id = a.id
 WHERE a.state IN ('reserved', 'preparing', 'running', 'stopping');

-- job_attempts_of: a visible job's attempts, newest first, each with its launch decision if any.
CREATE OR REPLACE FUNCTION tuneplane.job_attempts_of(p_actor_id bigint, p_job_id bigint)
RETURNS TABLE (number integer, state text, reason text, decision text, decision_reason text,
               decided_at timestamptz, created_at timestamptz, committed_at timestamptz,
               running_at timestamptz, ended_at timestamptz, prepare_deadline timestamptz,
               cancel_requested_at timestamptz, capsule_digest text, master_addr text, master_port integer)
LANGUAGE plpgsql STABLE AS $$
BEGIN
    PERFORM tuneplane.require_job_access(p_actor_id, p_job_id, 'read');
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
CREATE OR REPLACE FUNCTION tuneplane.job_members_of(p_actor_id bigint, p_job_id bigint)
RETURNS TABLE (attempt integer, rank integer, member_id bigint, node text, gpu_indices integer[], cpus integer,
               memory_bytes bigint, state text, reason text, exit_code integer, started_at timestamptz,
               ended_at timestamptz, updated_at timestamptz, resources_held boolean,
               contact_lost_at timestamptz)
LANGUAGE plpgsql STABLE AS $$
BEGIN
    PERFORM tuneplane.require_job_access(p_actor_id, p_job_id, 'read');
    RETURN QUERY
        SELECT a.number, m.rank, m.id, n.name, m.gpu_indices, m.cpus, m.memory_bytes, m.state, m.reason,
               m.exit_code, m.started_at, m.ended_at, m.updated_at, m.released_at IS NULL, m.contact_lost_at
          FROM tuneplane.members m
          JOIN tuneplane.attempts a ON a.id = m.attempt_id
          JOIN tuneplane.nodes n ON n.id = m.node_id
         WHERE m.job_id = p_job_id
         ORDER BY a.number DESC, m.rank;
END;
$$;

-- job_queue_position: while a visible job is queued, its place in its fleet's queue (v_queue order:
-- admission order), how many wait in that fleet, the job at the head, its place among its team's waiting
-- jobs, and (a fleet with quotas) the team's figures of the moment (team_waiting_now). No row when not queued.
CREATE OR REPLACE FUNCTION tuneplane.job_queue_position(p_actor_id bigint, p_job_id bigint)
RETURNS TABLE (job_id bigint, fleet text, queue_position bigint, queued_in_fleet bigint, head_job_id bigint,
               waiting interval, state_reason text, team text, team_position bigint, queued_in_team bigint,
               team_now text)
LANGUAGE plpgsql STABLE AS $$
BEGIN
    PERFORM tuneplane.require_job_access(p_actor_id, p_job_id, 'read');
    RETURN QUERY
        WITH queue AS (SELECT * FROM tuneplane.v_queue)
        SELECT q.job_id, q.fleet, q.position,
               (SELECT count(*) FROM queue o WHERE o.fleet = q.fleet),
               (SELECT h.job_id FROM queue h WHERE h.fleet = q.fleet AND h.position = 1),
               q.waiting, q.state_reason, q.team, q.team_position,
               (SELECT count(*) FROM queue o WHERE o.fleet = q.fleet AND o.team = q.team),
               tuneplane.team_waiting_now(q.job_id)
          FROM queue q
         WHERE q.job_id = p_job_id;
END;
$$;
