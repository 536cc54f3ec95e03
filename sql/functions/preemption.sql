-- sql/functions/preemption.sql — the current definition of every preemption and resume function.
-- Resume: the checkpoint each new attempt starts from. The checkpoint grace protocol: an attempt asked to
-- checkpoint and stop (a preemption, its time limit, an idle reclaim), its deadline, and how it ends
-- (`preempted` or `timed_out`, naming the checkpoint and the work lost). docs/preemption.md.
--
-- Repeatable file (ADR 0012): `tuneplane db migrate` re-applies every file of sql/functions/ (in the order
-- of order.txt, one transaction) whenever one changes. Edit definitions here, never in a migration.
--
-- Lock order: the launch contract's (sql/functions/launch.sql): the fleet's placement lock, jobs, attempts,
-- members, leaf rows. The reads below lock nothing.
--
-- Drops (signature changes):
-- plan_preemption takes the preemptor's team numbers (the reclaim rule).
DROP FUNCTION IF EXISTS tuneplane.plan_preemption(tuneplane.jobs, timestamptz, bigint[]);
-- job_attempt_preemption_of gained `lost` (the words: GPU-s and seconds, or seconds and CPU-s; issue 35).
DROP FUNCTION IF EXISTS tuneplane.job_attempt_preemption_of(bigint, bigint);

-- resume_checkpoint_of: the checkpoint a new attempt of the job starts from, or NULL:
--   spec.resume.mode 'none'    → never (the job asked to start from scratch every time);
--   spec.resume.mode 'pinned'  → the checkpoint the preview pinned (spec.resume.artifact_id), while complete;
--   otherwise ('latest')       → the job's newest complete (server-verified) checkpoint, any attempt or rank,
--                                that was not found corrupt since (mark_artifact_corrupt, artifacts.sql).
-- A checkpoint still uploading or failed is never chosen: only bytes the server re-hashed are resumed from.
-- A pinned checkpoint found corrupt is still the one: the job asked for exactly it, and its prepare fails
-- naming it rather than the job silently starting from elsewhere.
CREATE OR REPLACE FUNCTION tuneplane.resume_checkpoint_of(p_job_id bigint)
RETURNS tuneplane.artifacts
LANGUAGE sql STABLE AS $$
    SELECT a.*
      FROM tuneplane.jobs j
      JOIN tuneplane.artifacts a ON a.state = 'complete' AND a.kind = 'checkpoint'
     WHERE j.id = p_job_id
       AND coalesce(j.spec -> 'resume' ->> 'mode', 'latest') <> 'none'
       AND CASE WHEN j.spec -> 'resume' ->> 'mode' = 'pinned'
                THEN a.id = (j.spec -> 'resume' ->> 'artifact_id')::bigint
                ELSE a.job_id = j.id
                     AND NOT EXISTS (SELECT 1 FROM tuneplane.artifact_corruptions c WHERE c.artifact_id = a.id)
           END
     ORDER BY a.completed_at DESC, a.id DESC
     LIMIT 1;
$$;

-- resume_pin: what PREPARE tells a member to materialize as $TUNEPLANE_RESUME_DIR (NULL: start fresh).
CREATE OR REPLACE FUNCTION tuneplane.resume_pin(p_attempt_id bigint)
RETURNS jsonb
LANGUAGE sql STABLE AS $$
    SELECT jsonb_build_object('name', a.name, 'artifact_id', a.id, 'manifest_digest', a.manifest_digest,
                              'job_id', a.job_id, 'attempt', src.number, 'rank', a.rank,
                              'delivery', a.delivery, 'shared_path', a.shared_path)
      FROM tuneplane.attempts t
      JOIN tuneplane.artifacts a ON a.id = t.resume_artifact_id
      LEFT JOIN tuneplane.attempts src ON src.id = a.attempt_id
     WHERE t.id = p_attempt_id;
$$;

-- resume_words: how the job's timeline says where an attempt starts ('' when it starts fresh):
-- `; resumes from ckpt.2 (step 1000, verified 14:02:03)` (no step when the workload did not say it).
CREATE OR REPLACE FUNCTION tuneplane.resume_words(p_attempt_id bigint)
RETURNS text
LANGUAGE sql STABLE AS $$
    SELECT coalesce((
        SELECT format('; resumes from %s%s (%sverified %s)', a.name,
                      CASE WHEN a.job_id <> t.job_id THEN format(' of job %s', a.job_id) ELSE '' END,
                      CASE WHEN a.step IS NULL THEN '' ELSE format('step %s, ', a.step) END,
                      to_char(a.completed_at, 'HH24:MI:SS'))
          FROM tuneplane.attempts t JOIN tuneplane.artifacts a ON a.id = t.resume_artifact_id
         WHERE t.id = p_attempt_id), '');
$$;

-- ==== The checkpoint grace protocol ===================================================================
--
--   request_preemption       running attempt → asked to stop (attempts.stop_kind, grace_deadline); PREEMPT
--                            to every running member's node (the agent writes .tuneplane/preempt.json under
--                            the output directory and sends the job's signal to the workload)
--   expire_grace_deadlines   the grace ended while members still run → stop_attempt (STOP, SIGKILL after
--                            launch_settings.stop_grace)
--   expire_time_limits       a running attempt past its JobSpec time_limit_minutes → request_preemption
--                            (kind timed_out)
--   settle_stopped_attempt   finish_attempt_if_done (launch.sql) of an attempt asked to stop: the checkpoint
--                            it ends with, the work lost, the words of the timeline
-- The attempt then ends `preempted` (the job is queued again without spending max_attempts) or `timed_out`
-- (it counts like a failed attempt); the next attempt resumes from the checkpoint named (begin_prepare).

-- preemption_grace_cap: the longest grace on a fleet — its max_preemption_grace, never above the
-- installation's preemption_settings.max_grace (docs/preemption.md). The one rule: the grace a job gets
-- (preemption_grace_of), one given (request_preemption) and the one a preview may pin
-- (require_priority_grant, teams.sql) are all held to it.
CREATE OR REPLACE FUNCTION tuneplane.preemption_grace_cap(p_fleet_id bigint)
RETURNS interval
LANGUAGE sql STABLE AS $$
    SELECT least(coalesce(f.max_preemption_grace, s.max_grace), s.max_grace)
      FROM tuneplane.fleets f, tuneplane.preemption_settings s
     WHERE f.id = p_fleet_id;
$$;

-- preemption_grace_of: the grace a job gets: its JobSpec's preemption.grace_seconds (else the
-- installation default), at most its fleet's cap (preemption_grace_cap).
CREATE OR REPLACE FUNCTION tuneplane.preemption_grace_of(p_job_id bigint)
RETURNS interval
LANGUAGE sql STABLE AS $$
    SELECT least(coalesce(make_interval(secs => (j.spec -> 'preemption' ->> 'grace_seconds')::double precision),
                          s.default_grace),
                 tuneplane.preemption_grace_cap(j.fleet_id))
      FROM tuneplane.jobs j, tuneplane.preemption_settings s
     WHERE j.id = p_job_id;
$$;

-- request_preemption: ask the job's live attempt to checkpoint and stop within a grace. The one entry
-- point of every stop that should cost at most the work since the last verified checkpoint: the planner
-- (preemptor job), an admin (`tuneplane jobs preempt`), time limits (kind 'timed_out') and idle reclaim.
--   p_grace NULL: the job's own grace (preemption_grace_of); a given grace is capped by the same maximum.
-- Running attempt: records stop_kind, stop_cause (p_reason), stop_requested_at, grace_deadline and the
--   preemptor, sends PREEMPT to the node of every running member (on a Slurm fleet the worker delivers it
--   to the job's steps instead: slurm_preemptions_due), writes a job event with the numbers.
-- Reserved or preparing attempt (nothing started): records the same with a deadline of now and aborts the
--   launch (decide_abort); it ends `preempted`, nothing lost.
-- A second request while one stands changes nothing (the first deadline holds) and returns the attempt.
-- Refuses: an unknown job (404), a job without a live attempt (409, naming its state), an attempt being
-- cancelled (409), a kind other than preempted/timed_out (400, field kind), a negative grace (422, grace).
-- Locks: the job, then its attempt (lock_attempt), then its members; leaf rows (node_commands, events).
CREATE OR REPLACE FUNCTION tuneplane.request_preemption(p_job_id bigint, p_reason text,
                                                        p_grace interval DEFAULT NULL,
                                                        p_kind text DEFAULT 'preempted',
                                                        p_preemptor_job_id bigint DEFAULT NULL)
RETURNS tuneplane.attempts
LANGUAGE plpgsql AS $$
DECLARE
    j        tuneplane.jobs;
    a        tuneplane.attempts;
    m        tuneplane.members;
    v_grace  interval;
    v_signal text;
    v_sent   integer := 0;
    v_now    timestamptz;
BEGIN
    IF p_kind IS NULL OR p_kind NOT IN ('preempted', 'timed_out') THEN
        RAISE EXCEPTION 'kind must be preempted or timed_out' USING ERRCODE = 'TP400', COLUMN = 'kind';
    END IF;
    IF p_grace < interval '0' THEN
        RAISE EXCEPTION 'grace cannot be negative' USING ERRCODE = 'TP422', COLUMN = 'grace';
    END IF;
    IF coalesce(btrim(p_reason), '') = '' THEN
        RAISE EXCEPTION 'a preemption needs a reason' USING ERRCODE = 'TP400', COLUMN = 'reason';
    END IF;
    SELECT * INTO j FROM tuneplane.jobs WHERE id = p_job_id FOR UPDATE;
    IF j.id IS NULL THEN
        RAISE EXCEPTION 'no job %', p_job_id USING ERRCODE = 'TP404', COLUMN = 'job_id';
    END IF;
    SELECT t.* INTO a FROM tuneplane.attempts t
     WHERE t.job_id = j.id AND t.state IN ('reserved', 'preparing', 'running', 'stopping');
    IF a.id IS NULL THEN
        RAISE EXCEPTION 'job % has no running attempt (it is %)', j.id, j.state
            USING ERRCODE = 'TP409', COLUMN = 'job_id';
    END IF;
    a := tuneplane.lock_attempt(a.id);
    IF a.stop_kind IS NOT NULL THEN
        RETURN a;  -- asked already: the first deadline stands
    END IF;
    IF a.cancel_requested_at IS NOT NULL OR a.state = 'stopping' THEN
        RAISE EXCEPTION 'attempt % of job % is already stopping (%)', a.number, j.id, a.reason
            USING ERRCODE = 'TP409', COLUMN = 'job_id';
    END IF;
    v_grace := CASE WHEN p_grace IS NULL THEN tuneplane.preemption_grace_of(j.id)
                    ELSE least(p_grace, tuneplane.preemption_grace_cap(j.fleet_id)) END;
    IF a.state IN ('reserved', 'preparing') THEN
        v_grace := interval '0';
    END IF;
    -- One reading of the clock: two clock_timestamp() calls differ under load, and the
    -- grace a victim is told must be exactly the grace it gets.
    v_now := clock_timestamp();
    UPDATE tuneplane.attempts
       SET stop_kind = p_kind, stop_cause = p_reason, stop_requested_at = v_now,
           grace_deadline = v_now + v_grace, preempted_by_job_id = p_preemptor_job_id
     WHERE id = a.id
    RETURNING * INTO a;
    IF a.state IN ('reserved', 'preparing') THEN
        PERFORM tuneplane.decide_abort(a.id, p_reason || ' before anything started');
        SELECT * INTO a FROM tuneplane.attempts WHERE id = a.id;
        RETURN a;
    END IF;
    v_signal := coalesce(j.spec -> 'preemption' ->> 'signal', 'SIGTERM');
    FOR m IN SELECT * FROM tuneplane.members
              WHERE attempt_id = a.id AND state IN ('starting', 'running') ORDER BY id FOR UPDATE LOOP
        IF tuneplane.node_takes_commands(m.node_id) THEN
            PERFORM tuneplane.enqueue_node_command(m.node_id, 'preempt', jsonb_build_object(
                'member_id', m.id, 'attempt_id', a.id, 'kind', p_kind, 'reason', p_reason,
                'signal', v_signal, 'grace_seconds', extract(epoch FROM v_grace),
                'deadline', extract(epoch FROM a.grace_deadline)));
            v_sent := v_sent + 1;
        ELSIF (SELECT f.backend FROM tuneplane.fleets f WHERE f.id = a.fleet_id) = 'slurm' THEN
            v_sent := v_sent + 1;  -- the Slurm worker tells the job's steps (slurm_preemptions_due, slurm.sql)
        END IF;
    END LOOP;
    INSERT INTO tuneplane.job_events (job_id, from_state, to_state, reason, detail)
    VALUES (j.id, j.state, j.state,
            format('attempt %s asked to checkpoint and stop: %s; grace %s s (until %s), %s to %s member(s)',
                   a.number,
                   CASE WHEN p_preemptor_job_id IS NULL THEN p_reason
                        ELSE format('preempted by job %s (%s)', p_preemptor_job_id, p_reason) END,
                   round(extract(epoch FROM v_grace)),
                   to_char(a.grace_deadline, 'HH24:MI:SS'), v_signal, v_sent),
            jsonb_build_object('kind', 'stop_request', 'stop_kind', p_kind, 'attempt', a.number,
                               'grace_seconds', extract(epoch FROM v_grace),
                               'preemptor_job_id', p_preemptor_job_id));
    RETURN a;
END;
$$;

-- expire_grace_deadlines: attempts asked to stop whose grace ended while they still run → stop_attempt
-- (STOP: SIGTERM, then SIGKILL after launch_settings.stop_grace). Jobs locked SKIP LOCKED (next pass
-- takes the rest). Returns how many attempts it stopped.
CREATE OR REPLACE FUNCTION tuneplane.expire_grace_deadlines()
RETURNS integer
LANGUAGE plpgsql AS $$
DECLARE
    r record;
    n integer := 0;
BEGIN
    FOR r IN SELECT t.id, t.job_id FROM tuneplane.attempts t JOIN tuneplane.jobs j ON j.id = t.job_id
              WHERE t.stop_kind IS NOT NULL AND t.state = 'running' AND t.grace_deadline <= now()
              ORDER BY j.id FOR UPDATE OF j SKIP LOCKED LOOP
        PERFORM tuneplane.stop_attempt(r.id, 'the grace to checkpoint ended; stopping');
        n := n + 1;
    END LOOP;
    RETURN n;
END;
$$;

-- expire_time_limits: running attempts past their JobSpec's time_limit_minutes (counted from the moment the
-- attempt ran) get the same request as a preemption, kind timed_out, on every backend: on a Slurm fleet the
-- worker delivers it (slurm_preemptions_due) and Slurm's own limit is set past the grace
-- (slurm_time_limit_minutes, slurm.sql), so its TIMEOUT only backs the request up. Returns how many it asked.
CREATE OR REPLACE FUNCTION tuneplane.expire_time_limits()
RETURNS integer
LANGUAGE plpgsql AS $$
DECLARE
    r record;
    n integer := 0;
BEGIN
    FOR r IN SELECT t.id, t.job_id, (j.spec -> 'resources' ->> 'time_limit_minutes')::integer AS minutes
               FROM tuneplane.attempts t
               JOIN tuneplane.jobs j ON j.id = t.job_id
              WHERE t.state = 'running' AND t.stop_kind IS NULL AND t.cancel_requested_at IS NULL
                AND j.spec -> 'resources' ? 'time_limit_minutes'
                AND coalesce(t.running_at, t.committed_at)
                    + make_interval(mins => (j.spec -> 'resources' ->> 'time_limit_minutes')::integer) <= now()
              ORDER BY j.id FOR UPDATE OF j SKIP LOCKED LOOP
        PERFORM tuneplane.request_preemption(r.job_id, format('its time limit of %s min was reached', r.minutes),
                                             NULL, 'timed_out');
        n := n + 1;
    END LOOP;
    RETURN n;
END;
$$;

-- record_lost_work: the usage ledger's lost GPU-seconds of every member of the attempt (usage.sql: the
-- column is this lifecycle's to write): its GPUs × the wall time lost since the last verified checkpoint.
CREATE OR REPLACE FUNCTION tuneplane.record_lost_work(p_attempt_id bigint, p_lost_seconds double precision)
RETURNS void
LANGUAGE sql AS $$
    UPDATE tuneplane.usage_ledger SET lost_gpu_seconds = gpus * p_lost_seconds::numeric
     WHERE attempt_id = p_attempt_id;
$$;

-- attempt_gpus: the GPUs an attempt's members hold, for its lost GPU-seconds: on node fleets the indices
-- placement gave each member; on Slurm fleets, which allocate by count (--gres=gpu:G) and record no
-- indices, the job's gpus_per_node per member (the usage ledger's rule, usage.sql).
CREATE OR REPLACE FUNCTION tuneplane.attempt_gpus(p_attempt_id bigint)
RETURNS integer
LANGUAGE sql STABLE AS $$
    SELECT coalesce(sum(CASE WHEN f.backend = 'node' THEN coalesce(cardinality(m.gpu_indices), 0)
                             ELSE j.gpus_per_node END), 0)::integer
      FROM tuneplane.members m
      JOIN tuneplane.jobs j ON j.id = m.job_id
      JOIN tuneplane.attempts t ON t.id = m.attempt_id
      JOIN tuneplane.fleets f ON f.id = t.fleet_id
     WHERE m.attempt_id = p_attempt_id;
$$;

-- attempt_cpus: the CPUs an attempt's members hold (the job's cpus_per_node per member).
CREATE OR REPLACE FUNCTION tuneplane.attempt_cpus(p_attempt_id bigint)
RETURNS integer
LANGUAGE sql STABLE AS $$
    SELECT coalesce(sum(j.cpus_per_node), 0)::integer
      FROM tuneplane.members m JOIN tuneplane.jobs j ON j.id = m.job_id
     WHERE m.attempt_id = p_attempt_id;
$$;

-- attempt_work_ended_at: when the attempt's work ended, the end of its lost work: its last member's end
-- (the attempt itself is settled once resources are released too, which may be later), else now.
CREATE OR REPLACE FUNCTION tuneplane.attempt_work_ended_at(p_attempt_id bigint)
RETURNS timestamptz
LANGUAGE sql STABLE AS $$
    SELECT coalesce(max(m.ended_at), clock_timestamp()) FROM tuneplane.members m WHERE m.attempt_id = p_attempt_id;
$$;

-- lost_words: the work an attempt lost, as every text says it: a GPU job's in GPU-seconds with the seconds
-- (`lost 2,400 GPU-s (1200 s)`), a CPU-only job's in seconds with its CPU-seconds (`lost 12 s (24 CPU-s)`:
-- not "0 GPU-s", which would say nothing was lost). Fractions of a second are kept below 10 s (`2.1 s`).
CREATE OR REPLACE FUNCTION tuneplane.lost_words(p_attempt_id bigint, p_lost_seconds double precision)
RETURNS text
LANGUAGE sql STABLE AS $$
    WITH x AS (SELECT greatest(coalesce(p_lost_seconds, 0), 0) AS s,
                      tuneplane.attempt_gpus(p_attempt_id) AS gpus, tuneplane.attempt_cpus(p_attempt_id) AS cpus),
         f AS (SELECT x.*, CASE WHEN x.s < 10 THEN to_char(round(x.s::numeric, 1), 'FM990.0')
                                ELSE to_char(round(x.s::numeric), 'FM999,999,999,990') END AS secs FROM x)
    SELECT CASE WHEN f.gpus > 0
                THEN format('lost %s GPU-s (%s s)', to_char(round((f.s * f.gpus)::numeric), 'FM999,999,999,990'), f.secs)
                ELSE format('lost %s s (%s CPU-s)', f.secs, to_char(round((f.s * f.cpus)::numeric), 'FM999,999,999,990'))
           END
      FROM f;
$$;

-- lost_work_of_failed: a failed attempt (a member failed, its node lost or fenced) loses the work since the
-- job's last verified checkpoint too: recorded on the attempt and in the usage ledger, the next attempt
-- resumes from that checkpoint (begin_prepare).
CREATE OR REPLACE FUNCTION tuneplane.lost_work_of_failed(p_attempt_id bigint)
RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    a      tuneplane.attempts;
    ck     tuneplane.artifacts;
    v_lost double precision;
BEGIN
    SELECT * INTO a FROM tuneplane.attempts WHERE id = p_attempt_id;
    IF coalesce(a.running_at, a.committed_at) IS NULL THEN
        RETURN;  -- nothing ran
    END IF;
    ck := tuneplane.resume_checkpoint_of(a.job_id);
    v_lost := greatest(extract(epoch FROM tuneplane.attempt_work_ended_at(a.id)
                               - greatest(coalesce(a.running_at, a.committed_at),
                                          coalesce(ck.completed_at, '-infinity'))), 0);
    UPDATE tuneplane.attempts
       SET end_checkpoint_id = ck.id, lost_seconds = v_lost,
           lost_gpu_seconds = v_lost * tuneplane.attempt_gpus(a.id)
     WHERE id = a.id;
    PERFORM tuneplane.record_lost_work(a.id, v_lost);
END;
$$;

-- settle_stopped_attempt: how an attempt asked to stop ends, called by finish_attempt_if_done once every
-- member has ended. Records the checkpoint the next attempt resumes from (the job's newest verified one:
-- end_checkpoint_id) and the work lost since it, measured: the wall time from that checkpoint's
-- verification (or the attempt's start, if there is none) to the end of its work (its last member's end,
-- attempt_work_ended_at), and GPUs × that time. A workload that saves in its grace and exits loses the moment it
-- takes to exit; one that goes on running after a checkpoint completed in its grace loses what it did
-- after it (issue 35: it was recorded as 0). Returns the timeline's words,
-- naming the checkpoint with its step when the workload said it (`checkpoint ckpt.3 (step 1200) verified
-- 38 s into a 120 s grace`, `resumes from ckpt.2 (step 1000)`).
CREATE OR REPLACE FUNCTION tuneplane.settle_stopped_attempt(p_attempt_id bigint)
RETURNS text
LANGUAGE plpgsql AS $$
DECLARE
    a       tuneplane.attempts;
    j       tuneplane.jobs;
    ck      tuneplane.artifacts;
    v_start timestamptz;
    v_saved boolean;
    v_lost  double precision := 0;
    v_gpus  integer;
    v_cause text;
    v_what  text;
BEGIN
    SELECT * INTO a FROM tuneplane.attempts WHERE id = p_attempt_id;
    SELECT * INTO j FROM tuneplane.jobs WHERE id = a.job_id;
    ck := tuneplane.resume_checkpoint_of(j.id);
    v_start := coalesce(a.running_at, a.committed_at);
    v_saved := ck.id IS NOT NULL AND ck.attempt_id = a.id
               AND ck.completed_at BETWEEN a.stop_requested_at AND a.grace_deadline;
    v_gpus := tuneplane.attempt_gpus(a.id);
    IF v_start IS NOT NULL THEN
        v_lost := greatest(extract(epoch FROM tuneplane.attempt_work_ended_at(a.id)
                                   - greatest(v_start, coalesce(ck.completed_at, v_start))), 0);
    END IF;
    UPDATE tuneplane.attempts
       SET end_checkpoint_id = ck.id, lost_seconds = v_lost, lost_gpu_seconds = v_lost * v_gpus
     WHERE id = a.id;
    PERFORM tuneplane.record_lost_work(a.id, v_lost);
    v_cause := CASE WHEN a.preempted_by_job_id IS NOT NULL
                    THEN format('preempted by job %s (%s)', a.preempted_by_job_id, a.stop_cause)
                    ELSE a.stop_cause END;
    IF v_start IS NULL THEN
        v_what := 'stopped before it started; nothing lost';
    ELSIF v_saved THEN
        v_what := format('checkpoint %s verified %s s into a %s s grace; %s since',
                         tuneplane.checkpoint_label(ck),
                         round(extract(epoch FROM ck.completed_at - a.stop_requested_at)),
                         round(extract(epoch FROM a.grace_deadline - a.stop_requested_at)),
                         tuneplane.lost_words(a.id, v_lost));
    ELSE
        v_what := format('%s; %s; %s',
                         CASE WHEN clock_timestamp() >= a.grace_deadline THEN 'stopped at the end of its grace'
                              ELSE 'stopped within its grace without a new verified checkpoint' END,
                         CASE WHEN ck.id IS NULL THEN 'no verified checkpoint: the next attempt starts from scratch'
                              ELSE format('resumes from %s', tuneplane.checkpoint_label(ck)) END,
                         tuneplane.lost_words(a.id, v_lost));
    END IF;
    RETURN format('%s at %s; %s', v_cause, to_char(a.stop_requested_at, 'HH24:MI:SS'), v_what);
END;
$$;

-- admin_preempt_job: `tuneplane jobs preempt JOB [--grace S]` (POST /jobs/<id>/preempt): an installation
-- admin asks a job to checkpoint and stop; one `preemptions` row (rule admin, no preemptor, nothing held)
-- and request_preemption. The job is queued again and resumes from its checkpoint. Refuses a non-admin
-- (403, actor), a grace outside 0..86400 s (422, grace), and what request_preemption refuses.
CREATE OR REPLACE FUNCTION tuneplane.admin_preempt_job(p_actor_id bigint, p_job_id bigint,
                                                       p_grace_seconds integer DEFAULT NULL)
RETURNS tuneplane.attempts
LANGUAGE plpgsql AS $$
DECLARE
    actor tuneplane.users;
    j     tuneplane.jobs;
    a     tuneplane.attempts;
    p_id  bigint;
BEGIN
    actor := tuneplane.require_admin(p_actor_id, 'preempting a job');
    IF p_grace_seconds IS NOT NULL AND p_grace_seconds NOT BETWEEN 0 AND 86400 THEN
        RAISE EXCEPTION 'grace must be 0 to 86400 seconds' USING ERRCODE = 'TP422', COLUMN = 'grace';
    END IF;
    SELECT * INTO j FROM tuneplane.jobs WHERE id = p_job_id;
    IF j.id IS NULL THEN
        RAISE EXCEPTION 'no job %', p_job_id USING ERRCODE = 'TP404', COLUMN = 'job_id';
    END IF;
    a := tuneplane.request_preemption(p_job_id, format('preempted by an admin (user %s)', actor.username),
                                      make_interval(secs => p_grace_seconds), 'preempted', NULL);
    IF NOT EXISTS (SELECT 1 FROM tuneplane.preemption_victims v WHERE v.attempt_id = a.id) THEN
        INSERT INTO tuneplane.preemptions (fleet_id, rule, state, reason, actor, resolved_at, numbers)
        VALUES (j.fleet_id, 'admin', 'done', format('admin %s preempted job %s', actor.username, j.id),
                actor.username, now(), jsonb_build_object('grace_seconds',
                    round(extract(epoch FROM a.grace_deadline - a.stop_requested_at))))
        RETURNING id INTO p_id;
        INSERT INTO tuneplane.preemption_victims (preemption_id, attempt_id, job_id, priority, gpus,
                                                  expected_lost_gpu_seconds)
        SELECT p_id, a.id, j.id, j.priority, tuneplane.attempt_gpus(a.id),
               tuneplane.attempt_gpus(a.id)
               * greatest(extract(epoch FROM now() - greatest(coalesce(a.running_at, a.committed_at, now()),
                          coalesce((tuneplane.resume_checkpoint_of(j.id)).completed_at, '-infinity'))), 0);
    END IF;
    RETURN a;
END;
$$;

-- ==== The preemption planner (called by reserve_next, placement.sql, under the fleet's placement lock) ====
--
--   preemption_holds   at the start of a pass: the nodes held for each waiting preemptor (decisions whose
--                      preemptor left the queue are dropped first)
--   held_from          the held nodes a given job may not use (held for another preemptor)
--   plan_preemption    a job that does not fit: pick victims, hold their nodes, ask them to stop
--   preemptors_placed  after a pass: the decisions of the preemptors it reserved are done
--   preemption_backoff_reason  a job just preempted waits while a job that outranks it is queued
--
-- Rules (docs/preemption.md, "The planner"): a victim is a running attempt not already asked to stop, of
-- a preemptible job that has run at least preemption_settings.min_runtime and has been preempted fewer
-- than its max_preemptions times, and that is either
--   * of strictly lower priority (rule priority, or borrowed when every victim ran on borrowed capacity), or
--   * reclaim: the preemptor is within its team's guarantee (its team's GPUs held + its own GPUs <=
--     guaranteed_gpus: admission_verdict), and the victim, of priority <= the preemptor's, runs on GPUs
--     another team lends: that team holds more GPUs in the fleet than its guarantee, and only its newest
--     attempts whose GPUs add up to at most the excess count as lent (lent_attempts).
-- Two jobs of equal priority never preempt each other except by reclaim; a reclaimer within its guarantee
-- is never itself lent capacity (its team holds no more than its guarantee), so reclaim cannot loop, and a
-- higher-priority borrower is never reclaimed (it would win back by priority). On each node the victims are
-- taken in this order until the preemptor's member fits (GPUs, CPUs and memory): scavenger first, then
-- reclaimed lent capacity, then attempts on borrowed capacity, then the fewest GPU-seconds since their
-- last verified checkpoint, then the lowest priority. The preemptor's `nodes` cheapest nodes (by those
-- GPU-seconds) are chosen; a node that fits without a victim costs nothing.

-- preemption_holds: the nodes each holding decision of the fleet keeps for its preemptor. A decision
-- whose preemptor is no longer queued (cancelled, placed by another path) is dropped here first.
CREATE OR REPLACE FUNCTION tuneplane.preemption_holds(p_fleet_id bigint)
RETURNS TABLE (node_id bigint, job_id bigint)
LANGUAGE plpgsql AS $$
BEGIN
    UPDATE tuneplane.preemptions p SET state = 'dropped', resolved_at = now()
     WHERE p.fleet_id = p_fleet_id AND p.state = 'holding'
       AND NOT EXISTS (SELECT 1 FROM tuneplane.jobs j WHERE j.id = p.preemptor_job_id AND j.state = 'queued');
    RETURN QUERY
    SELECT unnest(p.held_node_ids), p.preemptor_job_id
      FROM tuneplane.preemptions p WHERE p.fleet_id = p_fleet_id AND p.state = 'holding';
END;
$$;

-- held_from: of the held nodes (h_node[i] held for job h_job[i]), those job p_job_id may not use.
CREATE OR REPLACE FUNCTION tuneplane.held_from(h_node bigint[], h_job bigint[], p_job_id bigint)
RETURNS bigint[]
LANGUAGE sql IMMUTABLE AS $$
    SELECT coalesce(array_agg(h.node ORDER BY h.node), '{}')
      FROM unnest(h_node, h_job) AS h (node, job) WHERE h.job IS DISTINCT FROM p_job_id;
$$;

-- preemption_backoff_reason: a job preempted less than preemption_settings.backoff ago is not placed while
-- a queued job of its fleet with a higher priority waits (it would only be preempted again: no thrash);
-- the words of its reason, or NULL when it may be placed.
CREATE OR REPLACE FUNCTION tuneplane.preemption_backoff_reason(p_job tuneplane.jobs)
RETURNS text
LANGUAGE sql STABLE AS $$
    SELECT format('preempted at %s; backing off until %s while job %s (priority %s) waits, so that it is '
                  'not placed where it would be preempted again', to_char(t.ended_at, 'HH24:MI:SS'),
                  to_char(t.ended_at + s.backoff, 'HH24:MI:SS'), w.id, w.priority)
      FROM tuneplane.attempts t, tuneplane.preemption_settings s,
           LATERAL (SELECT q.id, q.priority FROM tuneplane.jobs q
                     WHERE q.fleet_id = p_job.fleet_id AND q.state = 'queued' AND q.priority > p_job.priority
                     ORDER BY q.priority DESC, q.id LIMIT 1) w
     WHERE t.job_id = p_job.id AND t.state = 'preempted' AND t.ended_at > now() - s.backoff
     ORDER BY t.number DESC
     LIMIT 1;
$$;

-- preemptors_placed: the pass reserved these jobs; their holding decisions are done.
CREATE OR REPLACE FUNCTION tuneplane.preemptors_placed(p_job_ids bigint[])
RETURNS void
LANGUAGE sql AS $$
    UPDATE tuneplane.preemptions SET state = 'done', resolved_at = now()
     WHERE state = 'holding' AND preemptor_job_id = ANY (p_job_ids);
$$;

-- lent_attempts: the attempts of the fleet that run on GPUs lent by their team's guarantee — for every
-- team other than p_team_id that holds more GPUs in the fleet than its guarantee (fleet_team_shares), its
-- newest attempts (by reservation) whose held GPUs add up to at most that excess: what a job of p_team_id
-- within its own guarantee may reclaim. An older attempt inside the lender's own guarantee is never lent,
-- so a team is never reclaimed below its guarantee. With each attempt: its team and the team's numbers.
CREATE OR REPLACE FUNCTION tuneplane.lent_attempts(p_fleet_id bigint, p_team_id bigint)
RETURNS TABLE (attempt_id bigint, team_id bigint, team text, held_gpus integer, guaranteed_gpus integer,
               gpus integer)
LANGUAGE sql STABLE AS $$
    WITH lender AS (
        SELECT s.team_id, s.team, s.used_gpus, s.guaranteed_gpus
          FROM tuneplane.fleet_team_shares(p_fleet_id) s
         WHERE s.team_id <> p_team_id AND s.used_gpus > s.guaranteed_gpus
    ), live AS (
        SELECT m.attempt_id, l.team_id, l.team, l.used_gpus, l.guaranteed_gpus,
               sum(cardinality(m.gpu_indices))::integer AS gpus,
               sum(sum(cardinality(m.gpu_indices))) OVER (PARTITION BY l.team_id
                                                          ORDER BY t.created_at DESC, t.id DESC) AS newest
          FROM tuneplane.members m
          JOIN tuneplane.nodes n ON n.id = m.node_id AND n.fleet_id = p_fleet_id
          JOIN tuneplane.jobs j ON j.id = m.job_id
          JOIN lender l ON l.team_id = j.team_id
          JOIN tuneplane.attempts t ON t.id = m.attempt_id
         WHERE m.released_at IS NULL
         GROUP BY m.attempt_id, l.team_id, l.team, l.used_gpus, l.guaranteed_gpus, t.created_at, t.id
        HAVING sum(cardinality(m.gpu_indices)) > 0
    )
    SELECT live.attempt_id, live.team_id, live.team, live.used_gpus, live.guaranteed_gpus, live.gpus
      FROM live WHERE live.newest <= live.used_gpus - live.guaranteed_gpus;
$$;

-- reclaim_words: how a reclaim is said — the preemptor's reason, the decision and each victim's stop
-- cause — in the decision's numbers (fixed when it is made: they are its record, not the moment's).
CREATE OR REPLACE FUNCTION tuneplane.reclaim_words(p_team text, p_held integer, p_guaranteed integer,
                                                   p_asks integer, p_lender text, p_reclaimed integer,
                                                   p_lender_held integer, p_lender_guaranteed integer)
RETURNS text
LANGUAGE sql IMMUTABLE AS $$
    SELECT format('team %s reclaims %s of its %s guaranteed GPU%s lent to team %s (team %s holds %s and this '
                  'job asks %s; team %s holds %s, %s above its guarantee of %s)',
                  p_team, p_reclaimed, p_guaranteed, CASE WHEN p_guaranteed = 1 THEN '' ELSE 's' END, p_lender,
                  p_team, p_held, p_asks, p_lender, p_lender_held, p_lender_held - p_lender_guaranteed,
                  p_lender_guaranteed);
$$;

-- victim_standing: may running attempt p_attempt (of job p_victim) be preempted for p_job now? THE victim
-- rule, read by plan_preemption (it takes the 'eligible' ones) and no_victim_words (it says why none is):
--   NULL        no candidate: not running, already asked to stop, being cancelled, not preemptible, or not
--               outranked (a lower priority; for an attempt in p_lent — running on GPUs p_job's team's
--               guarantee lent, lent_attempts — a priority at most p_job's);
--   'spent'     it was preempted its max_preemptions times (the job's spec, else preemption_settings');
--   'young'     it has run less than min_runtime;
--   'eligible'  it may be preempted now.
-- One SQL expression (inlined where it is called). Reads only.
CREATE OR REPLACE FUNCTION tuneplane.victim_standing(p_attempt tuneplane.attempts, p_victim tuneplane.jobs,
                                                     p_job tuneplane.jobs, p_lent bigint[],
                                                     s tuneplane.preemption_settings)
RETURNS text
LANGUAGE sql STABLE AS $$
    SELECT CASE
        WHEN NOT (p_attempt.state = 'running' AND p_attempt.stop_kind IS NULL
                  AND p_attempt.cancel_requested_at IS NULL AND p_victim.preemptible
                  AND (p_victim.priority < p_job.priority
                       OR (p_attempt.id = ANY (p_lent) AND p_victim.priority <= p_job.priority)))
            THEN NULL
        WHEN p_victim.preemptions_used
             >= coalesce((p_victim.spec -> 'preemption' ->> 'max_preemptions')::integer, s.max_preemptions)
            THEN 'spent'
        WHEN coalesce(p_attempt.running_at, p_attempt.committed_at) > now() - s.min_runtime THEN 'young'
        ELSE 'eligible'
    END;
$$;

-- no_victim_words: why the planner found no victim for a job that would otherwise preempt, in numbers: the
-- running jobs it outranks (or may reclaim from) that are excluded only for now — the soonest one too young
-- (`job 5 can be preempted at 14:09:44 (min runtime 5 min)`) — or for good (`job 5 was preempted 3 times,
-- its max_preemptions`); NULL when none is (nothing it outranks runs). Which runs count is victim_standing's.
-- Read only.
CREATE OR REPLACE FUNCTION tuneplane.no_victim_words(p_job tuneplane.jobs, p_lent bigint[],
                                                     s tuneplane.preemption_settings)
RETURNS text
LANGUAGE plpgsql STABLE AS $$
DECLARE
    v_young record;
    v_spent record;
    v_min   text;
BEGIN
    v_min := CASE WHEN extract(epoch FROM s.min_runtime)::bigint % 60 = 0
                  THEN format('%s min', extract(epoch FROM s.min_runtime)::bigint / 60)
                  ELSE format('%s s', round(extract(epoch FROM s.min_runtime))) END;
    SELECT t.job_id, coalesce(t.running_at, t.committed_at) + s.min_runtime AS at,
           count(*) OVER () AS n
      INTO v_young
      FROM tuneplane.attempts t JOIN tuneplane.jobs j ON j.id = t.job_id
     WHERE t.fleet_id = p_job.fleet_id AND t.state = 'running'
       AND tuneplane.victim_standing(t, j, p_job, p_lent, s) = 'young'
     ORDER BY 2, t.job_id LIMIT 1;
    IF v_young.job_id IS NOT NULL THEN
        RETURN format('no job can be preempted for it yet: job %s can be preempted at %s (min runtime %s)%s',
                      v_young.job_id, to_char(v_young.at, 'HH24:MI:SS'), v_min,
                      CASE WHEN v_young.n > 1 THEN format('; %s more run(s) younger than that', v_young.n - 1)
                           ELSE '' END);
    END IF;
    SELECT t.job_id, j.preemptions_used AS used INTO v_spent
      FROM tuneplane.attempts t JOIN tuneplane.jobs j ON j.id = t.job_id
     WHERE t.fleet_id = p_job.fleet_id AND t.state = 'running'
       AND tuneplane.victim_standing(t, j, p_job, p_lent, s) = 'spent'
     ORDER BY t.job_id LIMIT 1;
    IF v_spent.job_id IS NOT NULL THEN
        RETURN format('no job can be preempted for it: job %s was preempted %s time(s), its max_preemptions',
                      v_spent.job_id, v_spent.used);
    END IF;
    RETURN NULL;
END;
$$;

-- plan_preemption: p_job does not fit now. If preempting lower-priority work — or, for a job within its
-- team's guarantee, reclaiming GPUs its guarantee lent to other teams — makes its whole envelope fit,
-- record one decision (preemptions + preemption_victims), hold the nodes for it and ask every victim to
-- checkpoint and stop (request_preemption). Returns the words for the preemptor's reason, or NULL when no
-- preemption helps. While its decision holds and a victim still runs, it plans nothing new. p_fresh: the
-- pass's connectivity bound; p_held: nodes held for other preemptors (never considered); p_team_used and
-- p_team_guaranteed: when admission found the job within its team's guarantee, the GPUs its team holds in
-- this pass and the guarantee (NULL otherwise: no reclaim).
-- Locks: under the fleet's placement lock; each victim's job, attempt and members (request_preemption).
CREATE OR REPLACE FUNCTION tuneplane.plan_preemption(p_job tuneplane.jobs, p_fresh timestamptz, p_held bigint[],
                                                     p_team_used integer DEFAULT NULL,
                                                     p_team_guaranteed integer DEFAULT NULL)
RETURNS text
LANGUAGE plpgsql AS $$
DECLARE
    s        tuneplane.preemption_settings;
    p        tuneplane.preemptions;
    v_left   integer;
    v_nodes  bigint[];
    v_names  text[];
    v_victims bigint[];
    v_cost   double precision;
    v_rule   text;
    v_team   text;
    v_words  text;
    v_asks   integer := p_job.nodes * p_job.gpus_per_node;
    v_lent   bigint[] := '{}';
    v_lenders jsonb := '[]';
    v_reclaim text;
    v_cause  text;
    v       record;
BEGIN
    SELECT * INTO p FROM tuneplane.preemptions
     WHERE preemptor_job_id = p_job.id AND state = 'holding' ORDER BY id DESC LIMIT 1;
    IF p.id IS NOT NULL THEN
        SELECT count(*) INTO v_left FROM tuneplane.preemption_victims pv
          JOIN tuneplane.attempts t ON t.id = pv.attempt_id
         WHERE pv.preemption_id = p.id AND t.state IN ('reserved', 'preparing', 'running', 'stopping');
        IF v_left > 0 THEN
            RETURN format('preempting: %s victim(s) are checkpointing and stopping (decision %s)', v_left, p.id);
        END IF;
        -- Every victim ended and it still does not fit (the room went away: a node lost, fenced): plan anew.
        UPDATE tuneplane.preemptions SET state = 'dropped', resolved_at = now() WHERE id = p.id;
    END IF;
    -- The common case costs an index probe or two: nothing preemptible of lower priority runs in this fleet,
    -- and (for a job within its guarantee) nothing preemptible of another team of priority <= its own.
    IF p_team_used IS NOT NULL AND v_asks > 0
       AND EXISTS (SELECT 1 FROM tuneplane.attempts t JOIN tuneplane.jobs j ON j.id = t.job_id
                    WHERE t.fleet_id = p_job.fleet_id AND t.state = 'running' AND t.stop_kind IS NULL
                      AND j.preemptible AND j.priority <= p_job.priority AND j.team_id <> p_job.team_id) THEN
        SELECT coalesce(array_agg(l.attempt_id), '{}') INTO v_lent
          FROM tuneplane.lent_attempts(p_job.fleet_id, p_job.team_id) l;
    END IF;
    IF cardinality(v_lent) = 0
       AND NOT EXISTS (SELECT 1 FROM tuneplane.attempts t JOIN tuneplane.jobs j ON j.id = t.job_id
                        WHERE t.fleet_id = p_job.fleet_id AND t.state = 'running' AND t.stop_kind IS NULL
                          AND j.preemptible AND j.priority < p_job.priority) THEN
        RETURN NULL;
    END IF;
    SELECT * INTO s FROM tuneplane.preemption_settings;

    WITH cand AS (
        SELECT t.id AS attempt_id, j.id AS job_id, j.priority, coalesce(pc.scavenger, false) AS scavenger,
               t.id = ANY (v_lent) AS reclaim, t.borrowing,
               (SELECT coalesce(sum(cardinality(m.gpu_indices)), 0) FROM tuneplane.members m
                 WHERE m.attempt_id = t.id)::integer AS gpus,
               greatest(extract(epoch FROM now() - greatest(coalesce(t.running_at, t.committed_at),
                                                            coalesce(ck.completed_at, '-infinity'))), 0) AS lost_s
          FROM tuneplane.attempts t
          JOIN tuneplane.jobs j ON j.id = t.job_id
          LEFT JOIN tuneplane.priority_classes pc ON pc.name = j.priority_class
          LEFT JOIN LATERAL (SELECT a.completed_at FROM tuneplane.artifacts a
                              WHERE a.job_id = j.id AND a.kind = 'checkpoint' AND a.state = 'complete'
                              ORDER BY a.completed_at DESC LIMIT 1) ck ON true
         WHERE t.fleet_id = p_job.fleet_id AND t.state = 'running'
           AND tuneplane.victim_standing(t, j, p_job, v_lent, s) = 'eligible'
    ), on_node AS (
        SELECT m.node_id, c.attempt_id, c.gpus * c.lost_s AS lost_gs, cardinality(m.gpu_indices) AS g,
               m.cpus AS c, m.memory_bytes AS mem,
               row_number() OVER (PARTITION BY m.node_id
                                  ORDER BY c.scavenger DESC, c.reclaim DESC, c.borrowing DESC, c.gpus * c.lost_s,
                                           c.priority, c.attempt_id) AS k
          FROM cand c JOIN tuneplane.members m ON m.attempt_id = c.attempt_id AND m.released_at IS NULL
    ), prefix AS (
        SELECT o.node_id, o.k, sum(o.g) OVER w AS g, sum(o.c) OVER w AS c, sum(o.mem) OVER w AS mem,
               sum(o.lost_gs) OVER w AS cost, array_agg(o.attempt_id) OVER w AS victims
          FROM on_node o WINDOW w AS (PARTITION BY o.node_id ORDER BY o.k)
    ), eligible AS (
        SELECT u.node_id, n.name, u.total_gpus - u.used_gpus AS free_g, n.cpus - u.used_cpus AS free_c,
               n.memory_bytes - u.used_memory AS free_m
          FROM tuneplane.node_usage u JOIN tuneplane.nodes n ON n.id = u.node_id
         WHERE u.fleet_id = p_job.fleet_id AND tuneplane.node_is_connected(n, p_fresh)
           AND NOT u.node_id = ANY (p_held)
           AND u.total_gpus >= p_job.gpus_per_node AND n.cpus >= p_job.cpus_per_node
           AND n.memory_bytes >= p_job.memory_per_node
    ), options AS (
        SELECT e.node_id, e.name, '{}'::bigint[] AS victims, 0::double precision AS cost
          FROM eligible e
         WHERE e.free_g >= p_job.gpus_per_node AND e.free_c >= p_job.cpus_per_node
           AND e.free_m >= p_job.memory_per_node
        UNION ALL
        (SELECT DISTINCT ON (e.node_id) e.node_id, e.name, x.victims, x.cost
           FROM eligible e JOIN prefix x ON x.node_id = e.node_id
          WHERE NOT (e.free_g >= p_job.gpus_per_node AND e.free_c >= p_job.cpus_per_node
                     AND e.free_m >= p_job.memory_per_node)
            AND e.free_g + x.g >= p_job.gpus_per_node AND e.free_c + x.c >= p_job.cpus_per_node
            AND e.free_m + x.mem >= p_job.memory_per_node
          ORDER BY e.node_id, x.k)
    ), chosen AS (
        SELECT * FROM options ORDER BY cost, node_id LIMIT p_job.nodes
    )
    SELECT array_agg(ch.node_id ORDER BY ch.node_id) FILTER (WHERE cardinality(ch.victims) > 0),
           array_agg(ch.name ORDER BY ch.node_id) FILTER (WHERE cardinality(ch.victims) > 0),
           (SELECT array_agg(DISTINCT u.victim) FROM chosen c2, unnest(c2.victims) AS u (victim)),
           count(*)
      INTO v_nodes, v_names, v_victims, v_left
      FROM chosen ch;
    IF v_left < p_job.nodes OR coalesce(cardinality(v_victims), 0) = 0 THEN
        -- Even preempting every candidate would not make it fit now: say why no victim exists (issue 35).
        RETURN tuneplane.no_victim_words(p_job, v_lent, s);
    END IF;

    SELECT tm.name INTO v_team FROM tuneplane.teams tm WHERE tm.id = p_job.team_id;
    -- Reclaim: per lending team, what this decision takes back of the GPUs it borrows (the victims on
    -- lent capacity), with the team's numbers as lent_attempts found them.
    IF v_victims && v_lent THEN
        SELECT jsonb_agg(jsonb_build_object('team_id', x.team_id, 'team', x.team, 'held', x.held_gpus,
                                            'guaranteed', x.guaranteed_gpus, 'reclaimed', x.gpus,
                                            'jobs', to_jsonb(x.jobs)) ORDER BY x.team),
               string_agg(tuneplane.reclaim_words(v_team, p_team_used, p_team_guaranteed, v_asks, x.team, x.gpus,
                                                  x.held_gpus, x.guaranteed_gpus), '; ' ORDER BY x.team)
          INTO v_lenders, v_reclaim
          FROM (SELECT l.team_id, l.team, l.held_gpus, l.guaranteed_gpus, sum(l.gpus)::integer AS gpus,
                       array_agg(t.job_id ORDER BY t.job_id) AS jobs
                  FROM tuneplane.lent_attempts(p_job.fleet_id, p_job.team_id) l
                  JOIN tuneplane.attempts t ON t.id = l.attempt_id
                 WHERE l.attempt_id = ANY (v_victims)
                 GROUP BY l.team_id, l.team, l.held_gpus, l.guaranteed_gpus) x;
        v_rule := 'reclaim';
    ELSE
        SELECT CASE WHEN bool_and(t.borrowing) THEN 'borrowed' ELSE 'priority' END INTO v_rule
          FROM tuneplane.attempts t WHERE t.id = ANY (v_victims);
    END IF;
    v_words := format('team %s, priority %s', coalesce(v_team, '?'),
                      coalesce(p_job.priority_class || ' (' || p_job.priority || ')', p_job.priority::text));
    INSERT INTO tuneplane.preemptions (fleet_id, preemptor_job_id, rule, held_node_ids, reason, numbers)
    VALUES (p_job.fleet_id, p_job.id, v_rule, v_nodes,
            format('job %s (%s) needs %s; %spreempting %s attempt(s) on %s', p_job.id, v_words,
                   tuneplane.describe_request(p_job), coalesce(v_reclaim || '; ', ''), cardinality(v_victims),
                   array_to_string(v_names, ', ')),
            jsonb_build_object('preemptor_priority', p_job.priority, 'nodes', to_jsonb(v_nodes))
            || CASE WHEN v_rule = 'reclaim'
                    THEN jsonb_build_object('reclaim', jsonb_build_object(
                             'team_id', p_job.team_id, 'team', v_team, 'held', p_team_used,
                             'guaranteed', p_team_guaranteed, 'asks', v_asks, 'lenders', v_lenders))
                    ELSE '{}'::jsonb END)
    RETURNING * INTO p;
    v_cost := 0;
    FOR v IN
        SELECT t.id AS attempt_id, t.job_id, j.priority, j.team_id,
               (SELECT coalesce(sum(cardinality(m.gpu_indices)), 0) FROM tuneplane.members m
                 WHERE m.attempt_id = t.id)::integer AS gpus,
               greatest(extract(epoch FROM now() - greatest(coalesce(t.running_at, t.committed_at),
                        coalesce((tuneplane.resume_checkpoint_of(j.id)).completed_at, '-infinity'))), 0) AS lost_s
          FROM tuneplane.attempts t JOIN tuneplane.jobs j ON j.id = t.job_id
         WHERE t.id = ANY (v_victims) ORDER BY t.job_id
    LOOP
        INSERT INTO tuneplane.preemption_victims (preemption_id, attempt_id, job_id, priority, gpus,
                                                  expected_lost_gpu_seconds)
        VALUES (p.id, v.attempt_id, v.job_id, v.priority, v.gpus, v.gpus * v.lost_s);
        v_cost := v_cost + v.gpus * v.lost_s;
        -- A victim on lent capacity is told the reclaim in its team's numbers; any other, who outranks it.
        v_cause := v_words;
        IF v.attempt_id = ANY (v_lent) THEN
            SELECT tuneplane.reclaim_words(v_team, p_team_used, p_team_guaranteed, v_asks, x ->> 'team',
                                           (x ->> 'reclaimed')::integer, (x ->> 'held')::integer,
                                           (x ->> 'guaranteed')::integer)
              INTO v_cause
              FROM jsonb_array_elements(v_lenders) x WHERE (x ->> 'team_id')::bigint = v.team_id;
        END IF;
        PERFORM tuneplane.request_preemption(v.job_id, v_cause, NULL, 'preempted', p_job.id);
    END LOOP;
    UPDATE tuneplane.preemptions
       SET numbers = numbers || jsonb_build_object('victims', cardinality(v_victims),
                                                   'expected_lost_gpu_seconds', round(v_cost::numeric))
     WHERE id = p.id;
    RETURN format('%spreempting job(s) %s on %s (rule %s; %s GPU-s since their last verified checkpoints); '
                  'their resources are held for this job (decision %s)',
                  coalesce(v_reclaim || '; ', ''),
                  (SELECT string_agg(pv.job_id::text, ', ' ORDER BY pv.job_id) FROM tuneplane.preemption_victims pv
                    WHERE pv.preemption_id = p.id),
                  array_to_string(v_names, ', '), v_rule, round(v_cost::numeric), p.id);
END;
$$;

-- ==== Reads ============================================================================================

-- job_attempt_preemption_of: per attempt of a visible job, what the protocol recorded: the checkpoint it
-- resumed from, a standing or past request to stop (kind, cause, grace deadline, preemptor), the
-- checkpoint it ended with and the work lost (the job page's attempts table, `tuneplane jobs show`); the
-- checkpoints named with their step (checkpoint_label: `ckpt.2 (step 1000)`).
CREATE OR REPLACE FUNCTION tuneplane.job_attempt_preemption_of(p_actor_id bigint, p_job_id bigint)
RETURNS TABLE (number integer, resumed_from text, stop_kind text, stop_cause text, preempted_by_job_id bigint,
               stop_requested_at timestamptz, grace_deadline timestamptz, in_grace boolean,
               end_checkpoint text, lost_seconds double precision, lost_gpu_seconds double precision, lost text)
LANGUAGE plpgsql STABLE AS $$
BEGIN
    PERFORM 1 FROM tuneplane.get_job(p_actor_id, p_job_id);
    -- resumed_from only for an attempt that started (an attempt aborted while preparing resumed nothing).
    RETURN QUERY
        SELECT t.number,
               CASE WHEN coalesce(t.running_at, t.committed_at) IS NOT NULL OR t.state IN ('reserved', 'preparing')
                    THEN tuneplane.checkpoint_label(r) END,
               t.stop_kind, t.stop_cause, t.preempted_by_job_id, t.stop_requested_at,
               t.grace_deadline,
               t.stop_kind IS NOT NULL AND t.state IN ('running', 'stopping') AND t.grace_deadline > now(),
               tuneplane.checkpoint_label(e), t.lost_seconds, t.lost_gpu_seconds,
               CASE WHEN t.lost_seconds IS NOT NULL THEN tuneplane.lost_words(t.id, t.lost_seconds) END
          FROM tuneplane.attempts t
          LEFT JOIN tuneplane.artifacts r ON r.id = t.resume_artifact_id
          LEFT JOIN tuneplane.artifacts e ON e.id = t.end_checkpoint_id
         WHERE t.job_id = p_job_id
         ORDER BY t.number DESC;
END;
$$;

-- job_preemptions_of: the planner's and admins' decisions that concern a visible job, as preemptor or as
-- victim, newest first, with the victims' numbers.
CREATE OR REPLACE FUNCTION tuneplane.job_preemptions_of(p_actor_id bigint, p_job_id bigint)
RETURNS TABLE (id bigint, role text, preemptor_job_id bigint, rule text, state text, reason text,
               victims jsonb, created_at timestamptz, resolved_at timestamptz)
LANGUAGE plpgsql STABLE AS $$
BEGIN
    PERFORM 1 FROM tuneplane.get_job(p_actor_id, p_job_id);
    RETURN QUERY
        SELECT p.id, CASE WHEN p.preemptor_job_id = p_job_id THEN 'preemptor' ELSE 'victim' END,
               p.preemptor_job_id, p.rule, p.state, p.reason,
               coalesce((SELECT jsonb_agg(jsonb_build_object('job_id', v.job_id, 'gpus', v.gpus,
                                                            'priority', v.priority,
                                                            'expected_lost_gpu_seconds',
                                                            round(v.expected_lost_gpu_seconds::numeric))
                                          ORDER BY v.job_id)
                           FROM tuneplane.preemption_victims v WHERE v.preemption_id = p.id), '[]'::jsonb),
               p.created_at, p.resolved_at
          FROM tuneplane.preemptions p
         WHERE p.preemptor_job_id = p_job_id
            OR EXISTS (SELECT 1 FROM tuneplane.preemption_victims v WHERE v.preemption_id = p.id
                                                                      AND v.job_id = p_job_id)
         ORDER BY p.id DESC
         LIMIT 50;
END;
$$;

-- v_in_grace: operators and the Fleet page: attempts asked to checkpoint and stop that still run, with
-- the time left (docs/runbook.md, "Which jobs are in their grace").
CREATE OR REPLACE VIEW tuneplane.v_in_grace AS
SELECT t.job_id, t.number AS attempt, f.name AS fleet, t.stop_kind, t.stop_cause, t.preempted_by_job_id,
       t.stop_requested_at, t.grace_deadline,
       greatest(extract(epoch FROM t.grace_deadline - now()), 0)::integer AS seconds_left,
       (SELECT string_agg(DISTINCT n.name, ', ') FROM tuneplane.members m JOIN tuneplane.nodes n ON n.id = m.node_id
         WHERE m.attempt_id = t.id) AS nodes
  FROM tuneplane.attempts t JOIN tuneplane.fleets f ON f.id = t.fleet_id
 WHERE t.stop_kind IS NOT NULL AND t.state IN ('running', 'stopping');
