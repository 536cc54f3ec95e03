-- sql/functions/idle.sql — the current definition of every idle-GPU function (issue 22, docs/idle.md).
-- Idle GPUs: the policy per fleet and team, the evaluation of a running job from its stored GPU samples,
-- the sweep that warns, gives grace and reclaims, an admin's exemption, and the reads.
--
-- Repeatable file (ADR 0012): `tuneplane db migrate` re-applies every file of sql/functions/ (in the order
-- of order.txt, one transaction) whenever one changes. Edit definitions here, never in a migration.
-- Tables, columns and data changes go in a new numbered migration. A changed signature or a view whose
-- columns change: add its DROP below (it runs before the new definition is created).
--
-- Drops (signature changes):
--
-- ==== The contract ======================================================================================
-- A running job is watched while it holds GPUs. Its GPUs are judged from the samples the collector stored
-- as telemetry (source `system`, names system/gpu.<i>.utilization, .power_watts, .power_limit_watts; the
-- step is the sample's time in milliseconds), over the window (now − idle_after, now]:
--   GPU idle     its samples cover the window (none missing longer than idle_settings.max_sample_gap,
--                at either end included) and every utilization sample is below utilization_below, or
--                every power sample is below power_below × the board's power limit (ADR 0200);
--   GPU busy     a sample shows utilization at or above the threshold and power (where known) at or above
--                its fraction;
--   GPU unknown  anything else (no samples, a gap): never idle.
--   job          idle when every GPU of every member is idle; busy when any GPU is busy; else unknown.
-- job_idle moves:  (none) → watched;  idle → warned (reason and timeline say the numbers and the deadline)
--   → reclaimed when still idle at the deadline (action reclaim);  warned → busy again (warning withdrawn,
--   timeline says so);  exempt (admin, recorded) → never warned or reclaimed.  Refuses nothing: a sweep.
-- Enqueues (team webhooks, enqueue_team_event in team_events.sql, in the same transaction):
--   job.idle_warning, job.idle_withdrawn, job.idle_reclaimed — each once per warning, withdrawal, reclaim.
--
-- ==== Lock order (launch.sql's, of which this is a part) ================================================
--   3. jobs, by id (the sweep takes them FOR UPDATE SKIP LOCKED; exempt_job_idle FOR UPDATE; the trigger
--      jobs_idle_watch runs under the lock of whoever changes the job's state)
--   4. attempts (lock_attempt, only to reclaim)
--   8. leaf rows: job_idle, usage_ledger (its idle_gpu_seconds), events
-- No function here locks a node, a member or a telemetry row; reading samples takes no lock.

-- idle_policy_of: the effective policy for a team's jobs on a fleet: the team's override, else the fleet's
-- row, else the defaults (written here once).
CREATE OR REPLACE FUNCTION tuneplane.idle_policy_of(p_fleet_id bigint, p_team_id bigint DEFAULT NULL)
RETURNS TABLE (idle_after interval, utilization_below double precision, power_below double precision,
               action text, idle_grace interval)
LANGUAGE sql STABLE AS $$
    SELECT coalesce(t.idle_after, f.idle_after, interval '30 minutes'),
           coalesce(t.utilization_below, f.utilization_below, 5),
           coalesce(t.power_below, f.power_below, 0.2),
           coalesce(t.action, f.action, 'warn'),
           coalesce(t.idle_grace, f.idle_grace, interval '30 minutes')
      FROM (SELECT 1) one
      LEFT JOIN tuneplane.idle_policies f ON f.fleet_id = p_fleet_id AND f.team_id IS NULL
      LEFT JOIN tuneplane.idle_policies t ON t.fleet_id = p_fleet_id AND t.team_id = p_team_id;
$$;

-- set_idle_policy: an installation admin sets the fleet's policy (p_team_id NULL) or one team's override.
-- A NULL argument leaves that field as it was (inherited when never set). Refuses a non-admin (403), an
-- unknown fleet or team (404, not the foreign key's raw error) and values out of range (400, naming the
-- field). Locks only its policy row.
CREATE OR REPLACE FUNCTION tuneplane.set_idle_policy(
    p_actor_id bigint, p_fleet text, p_team_id bigint DEFAULT NULL, p_idle_after interval DEFAULT NULL,
    p_utilization_below double precision DEFAULT NULL, p_power_below double precision DEFAULT NULL,
    p_action text DEFAULT NULL, p_idle_grace interval DEFAULT NULL)
RETURNS TABLE (fleet text, team_id bigint, idle_after interval, utilization_below double precision,
               power_below double precision, action text, idle_grace interval)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    v_fleet tuneplane.fleets;
BEGIN
    PERFORM tuneplane.require_admin(p_actor_id, 'changing an idle policy');
    SELECT * INTO v_fleet FROM tuneplane.fleets f WHERE f.name = p_fleet OR f.id::text = p_fleet
     ORDER BY f.name = p_fleet DESC LIMIT 1;
    IF v_fleet.id IS NULL THEN
        RAISE EXCEPTION 'no fleet %', p_fleet USING ERRCODE = 'TP404', COLUMN = 'fleet';
    END IF;
    IF p_team_id IS NOT NULL AND NOT EXISTS (SELECT 1 FROM tuneplane.teams t WHERE t.id = p_team_id) THEN
        RAISE EXCEPTION 'no team %', p_team_id USING ERRCODE = 'TP404', COLUMN = 'team';
    END IF;
    IF p_idle_after IS NOT NULL AND p_idle_after <= interval '0' THEN
        RAISE EXCEPTION 'idle_after must be positive' USING ERRCODE = 'TP400', COLUMN = 'idle_after';
    END IF;
    IF p_utilization_below IS NOT NULL AND NOT (p_utilization_below > 0 AND p_utilization_below <= 100) THEN
        RAISE EXCEPTION 'utilization_below must be a percentage above 0 and at most 100'
            USING ERRCODE = 'TP400', COLUMN = 'utilization_below';
    END IF;
    IF p_power_below IS NOT NULL AND NOT (p_power_below >= 0 AND p_power_below <= 1) THEN
        RAISE EXCEPTION 'power_below must be a fraction of the power limit between 0 and 1'
            USING ERRCODE = 'TP400', COLUMN = 'power_below';
    END IF;
    IF p_action IS NOT NULL AND p_action NOT IN ('off', 'warn', 'reclaim') THEN
        RAISE EXCEPTION 'action must be off, warn or reclaim' USING ERRCODE = 'TP400', COLUMN = 'action';
    END IF;
    IF p_idle_grace IS NOT NULL AND p_idle_grace < interval '0' THEN
        RAISE EXCEPTION 'idle_grace must not be negative' USING ERRCODE = 'TP400', COLUMN = 'idle_grace';
    END IF;
    INSERT INTO tuneplane.idle_policies AS p (fleet_id, team_id, idle_after, utilization_below, power_below,
                                               action, idle_grace, updated_by)
    VALUES (v_fleet.id, p_team_id, p_idle_after, p_utilization_below, p_power_below, p_action, p_idle_grace,
            p_actor_id)
    ON CONFLICT (fleet_id, coalesce(team_id, 0)) DO UPDATE
       SET idle_after = coalesce(EXCLUDED.idle_after, p.idle_after),
           utilization_below = coalesce(EXCLUDED.utilization_below, p.utilization_below),
           power_below = coalesce(EXCLUDED.power_below, p.power_below),
           action = coalesce(EXCLUDED.action, p.action),
           idle_grace = coalesce(EXCLUDED.idle_grace, p.idle_grace),
           updated_at = now(), updated_by = p_actor_id;
    RETURN QUERY SELECT v_fleet.name, p_team_id, e.idle_after, e.utilization_below, e.power_below, e.action,
                        e.idle_grace
                   FROM tuneplane.idle_policy_of(v_fleet.id, p_team_id) e;
END;
$$;

-- idle_policies_of: a fleet's idle policy and each team's override as set (NULL: inherited), with what
-- applies (idle_policy_of), for the fleet page, `tuneplane fleet idle-policy` and GET /fleets/<f>/idle-policy.
-- An unknown fleet is a 404.
CREATE OR REPLACE FUNCTION tuneplane.idle_policies_of(p_fleet text)
RETURNS TABLE (fleet text, team text, idle_after interval, utilization_below double precision,
               power_below double precision, action text, idle_grace interval, applies jsonb)
LANGUAGE plpgsql STABLE AS $$
#variable_conflict use_column
DECLARE
    v_fleet tuneplane.fleets;
BEGIN
    SELECT * INTO v_fleet FROM tuneplane.fleets f WHERE f.name = p_fleet;
    IF v_fleet.id IS NULL THEN
        RAISE EXCEPTION 'no fleet %', left(p_fleet, 100) USING ERRCODE = 'TP404', COLUMN = 'fleet';
    END IF;
    RETURN QUERY
    SELECT v_fleet.name, t.name, p.idle_after, p.utilization_below, p.power_below, p.action, p.idle_grace,
           (SELECT to_jsonb(e) FROM tuneplane.idle_policy_of(v_fleet.id, s.team_id) e)
      FROM (SELECT NULL::bigint AS team_id UNION SELECT q.team_id FROM tuneplane.idle_policies q
             WHERE q.fleet_id = v_fleet.id AND q.team_id IS NOT NULL) s
      LEFT JOIN tuneplane.idle_policies p ON p.fleet_id = v_fleet.id AND p.team_id IS NOT DISTINCT FROM s.team_id
      LEFT JOIN tuneplane.teams t ON t.id = s.team_id
     ORDER BY t.name NULLS FIRST;
END;
$$;

-- idle_series_window: one series' samples over the cells of width 32,768 steps that hold steps lo..hi:
-- how many, the first and last step, the highest finite value, and the widest gap between two cells'
-- samples (a gap within a cell is under 33 s). Reads the rollups' primary key only.
CREATE OR REPLACE FUNCTION tuneplane.idle_series_window(p_series_id bigint, p_lo bigint, p_hi bigint)
RETURNS TABLE (n bigint, first_step bigint, last_step bigint, top double precision, widest bigint)
LANGUAGE sql STABLE AS $$
    SELECT coalesce(sum(q.n), 0)::bigint, min(q.first_step), max(q.last_step), max(q.max), max(q.step_gap)
      FROM (SELECT r.n, r.first_step, r.last_step, r.max,
                   r.first_step - lag(r.last_step) OVER (ORDER BY r.bucket) AS step_gap
              FROM tuneplane.telemetry_rollups r
             WHERE r.series_id = p_series_id AND r.width = 32768
               AND r.bucket BETWEEN p_lo / 32768 AND p_hi / 32768) q;
$$;

-- job_gpu_idleness: the verdict on each GPU of one attempt over (p_from, p_to], from its stored samples.
-- Bounded: per GPU, three series looked up by their unique key and the window's rollup cells of width
-- 32,768 steps (≈ 33 s of a series whose step is in ms: 57 rows for 30 min, where the raw points at one per
-- 10 s would be 180) read by the rollups' primary key; nothing else is read, so its cost does not grow with
-- the number of jobs or with the job's history. Cells are whole: the window's edges may take in up to 33 s
-- of samples beyond it (only ever making a GPU look busy, never idle); a gap longer than max_sample_gap
-- (≥ a cell) always shows between two cells' first and last steps. Non-finite samples count in no cell
-- aggregate (telemetry.sql): a GPU whose samples are all NaN has none, so it is unknown.
CREATE OR REPLACE FUNCTION tuneplane.job_gpu_idleness(p_attempt_id bigint, p_from timestamptz, p_to timestamptz,
                                                      p_utilization_below double precision,
                                                      p_power_below double precision, p_max_gap interval)
RETURNS TABLE (member_rank integer, node_id bigint, gpu_index integer, verdict text, samples bigint,
               max_utilization double precision, max_power_fraction double precision)
LANGUAGE sql STABLE AS $$
    WITH b AS (
        SELECT (extract(epoch FROM p_from) * 1000)::bigint AS lo, (extract(epoch FROM p_to) * 1000)::bigint AS hi,
               -- A gap shorter than a cell cannot be seen in cells: the gap allowed is at least one cell.
               greatest((extract(epoch FROM p_max_gap) * 1000)::bigint, 32768) AS gap),
    g AS (
        SELECT m.rank, m.node_id, gi.gpu, a.job_id, a.number
          FROM tuneplane.attempts a
          JOIN tuneplane.members m ON m.attempt_id = a.id
         CROSS JOIN LATERAL unnest(m.gpu_indices) AS gi(gpu)
         WHERE a.id = p_attempt_id),
    s AS (
        SELECT g.rank, g.node_id, g.gpu,
               (SELECT x.id FROM tuneplane.telemetry_series x
                 WHERE x.job_id = g.job_id AND x.attempt = g.number AND x.member_rank = g.rank
                   AND x.source = 'system' AND x.name = format('system/gpu.%s.utilization', g.gpu)) AS util_id,
               (SELECT x.id FROM tuneplane.telemetry_series x
                 WHERE x.job_id = g.job_id AND x.attempt = g.number AND x.member_rank = g.rank
                   AND x.source = 'system' AND x.name = format('system/gpu.%s.power_watts', g.gpu)) AS power_id,
               (SELECT nullif(x.last_value, 'NaN') FROM tuneplane.telemetry_series x
                 WHERE x.job_id = g.job_id AND x.attempt = g.number AND x.member_rank = g.rank
                   AND x.source = 'system' AND x.name = format('system/gpu.%s.power_limit_watts', g.gpu))
                   AS power_limit
          FROM g),
    st AS (
        SELECT s.rank, s.node_id, s.gpu, s.power_limit, b.lo, b.hi, b.gap,
               u.n AS u_n, u.first_step AS u_first, u.last_step AS u_last, u.top AS u_top, u.widest AS u_gap,
               p.n AS p_n, p.first_step AS p_first, p.last_step AS p_last, p.top AS p_top, p.widest AS p_gap
          FROM s CROSS JOIN b
         CROSS JOIN LATERAL tuneplane.idle_series_window(s.util_id, b.lo, b.hi) u
         CROSS JOIN LATERAL tuneplane.idle_series_window(s.power_id, b.lo, b.hi) p),
    judged AS (
        SELECT st.*,
               (st.u_n > 0 AND st.u_first <= st.lo + st.gap AND st.u_last >= st.hi - st.gap
                AND coalesce(st.u_gap, 0) <= st.gap) AS u_covered,
               (st.p_n > 0 AND st.power_limit > 0 AND st.p_first <= st.lo + st.gap
                AND st.p_last >= st.hi - st.gap AND coalesce(st.p_gap, 0) <= st.gap) AS p_covered
          FROM st)
    SELECT j.rank, j.node_id, j.gpu,
           CASE WHEN (j.u_covered AND j.u_top < p_utilization_below)
                  OR (j.p_covered AND j.p_top < p_power_below * j.power_limit) THEN 'idle'
                WHEN j.u_n > 0 AND j.u_top >= p_utilization_below
                 AND (j.p_n = 0 OR j.power_limit IS NULL OR j.p_top >= p_power_below * j.power_limit) THEN 'busy'
                ELSE 'unknown' END,
           j.u_n, j.u_top, CASE WHEN j.power_limit > 0 THEN j.p_top / j.power_limit END
      FROM judged j
     ORDER BY j.rank, j.gpu;
$$;

-- idle_percent: a threshold as the timeline writes it ("5 %", "2.5 %").
CREATE OR REPLACE FUNCTION tuneplane.idle_percent(p_value double precision)
RETURNS text
LANGUAGE sql IMMUTABLE AS $$
    SELECT trim_scale(round(p_value::numeric, 1))::text || ' %';
$$;

-- idle_minutes: a duration as the timeline writes it ("34 min"; under 90 s in seconds: "45 s").
CREATE OR REPLACE FUNCTION tuneplane.idle_minutes(p_span interval)
RETURNS text
LANGUAGE sql IMMUTABLE AS $$
    SELECT CASE WHEN extract(epoch FROM p_span) < 90 THEN round(extract(epoch FROM p_span))::bigint::text || ' s'
                ELSE round(extract(epoch FROM p_span) / 60)::bigint::text || ' min' END;
$$;

-- idle_reclaim: a warned job whose GPUs are still idle at its deadline is asked to checkpoint and stop
-- through the preemption protocol (request_preemption, preemption.sql: PREEMPT to every member, the job's
-- grace and signal); its attempt ends `preempted` naming its checkpoint, and the job then ends — or is
-- queued again only when it was submitted with resume_when_idle_reclaimed (finish_attempt_if_done asks
-- idle_reclaim_ends_job). Caller holds the job lock.
CREATE OR REPLACE FUNCTION tuneplane.idle_reclaim(p_job tuneplane.jobs, p_attempt_id bigint, p_reason text)
RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    a tuneplane.attempts;
BEGIN
    a := tuneplane.request_preemption(p_job.id, p_reason, NULL, 'preempted', NULL);
    PERFORM tuneplane.set_job_state(p_job.id, p_job.state,
        format('reclaimed (idle): %s; asked to checkpoint and stop by %s UTC', p_reason,
               to_char(a.grace_deadline AT TIME ZONE 'UTC', 'HH24:MI:SS')),
        jsonb_build_object('kind', 'idle_reclaim', 'attempt', a.number, 'grace_deadline', a.grace_deadline));
END;
$$;

-- idle_reclaim_ends_job: whether an attempt that ended preempted was an idle reclaim after which the job
-- ends instead of being queued again (it was not submitted with resume_when_idle_reclaimed). Asked by
-- finish_attempt_if_done (launch.sql).
CREATE OR REPLACE FUNCTION tuneplane.idle_reclaim_ends_job(p_attempt_id bigint)
RETURNS boolean
LANGUAGE sql STABLE AS $$
    SELECT EXISTS (SELECT 1 FROM tuneplane.job_idle w JOIN tuneplane.jobs j ON j.id = w.job_id
                    WHERE w.attempt_id = p_attempt_id AND w.reclaimed_at IS NOT NULL
                      AND NOT coalesce((j.spec ->> 'resume_when_idle_reclaimed')::boolean, false));
$$;

-- idle_reclaimed: whether the attempt was stopped by an idle reclaim (the job's reason says `preempted (idle)`).
CREATE OR REPLACE FUNCTION tuneplane.idle_reclaimed(p_attempt_id bigint)
RETURNS boolean
LANGUAGE sql STABLE AS $$
    SELECT EXISTS (SELECT 1 FROM tuneplane.job_idle w WHERE w.attempt_id = p_attempt_id AND w.reclaimed_at IS NOT NULL);
$$;

-- watch_idle_job: one evaluation of one running job (the sweep's body). Caller holds the job's row lock.
-- Moves its job_idle row as the contract above says and returns what happened: 'warned', 'reclaimed',
-- 'busy_again' or NULL. Writes the job's reason (an event) only on a warning, a withdrawal or a reclaim.
CREATE OR REPLACE FUNCTION tuneplane.watch_idle_job(p_job tuneplane.jobs, p_now timestamptz DEFAULT now())
RETURNS text
LANGUAGE plpgsql AS $$
DECLARE
    pol        record;
    cfg        tuneplane.idle_settings;
    a          tuneplane.attempts;
    w          tuneplane.job_idle;
    v_from     timestamptz;
    v_status   text;
    v_gpus     integer;
    v_idle     integer;
    v_busy     integer;
    v_top_u    double precision;
    v_top_p    double precision;
    v_eval     jsonb;
    v_verdicts jsonb;
    v_since    timestamptz;
    v_add      double precision := 0;
    v_msg      text;
    v_result   text;
BEGIN
    SELECT * INTO a FROM tuneplane.attempts WHERE job_id = p_job.id AND state = 'running';
    IF a.id IS NULL THEN
        -- Its attempt is stopping: nothing to judge; checked, so the next due job comes first.
        UPDATE tuneplane.job_idle SET checked_at = p_now WHERE job_id = p_job.id;
        RETURN NULL;
    END IF;
    SELECT * INTO cfg FROM tuneplane.idle_settings;
    SELECT * INTO pol FROM tuneplane.idle_policy_of(p_job.fleet_id, p_job.team_id);
    v_from := p_now - pol.idle_after;

    SELECT count(*), count(*) FILTER (WHERE g.verdict = 'idle'), count(*) FILTER (WHERE g.verdict = 'busy'),
           max(g.max_utilization), max(g.max_power_fraction),
           coalesce(jsonb_agg(jsonb_build_object('rank', g.member_rank, 'node_id', g.node_id, 'gpu', g.gpu_index,
                                                 'verdict', g.verdict)), '[]'::jsonb)
      INTO v_gpus, v_idle, v_busy, v_top_u, v_top_p, v_verdicts
      FROM tuneplane.job_gpu_idleness(a.id, v_from, p_now, pol.utilization_below, pol.power_below,
                                      cfg.max_sample_gap) g;
    v_status := CASE WHEN v_gpus > 0 AND v_idle = v_gpus THEN 'idle' WHEN v_busy > 0 THEN 'busy' ELSE 'unknown' END;
    v_eval := jsonb_build_object('gpus', v_gpus, 'idle', v_idle, 'busy', v_busy, 'unknown', v_gpus - v_idle - v_busy,
                                 'max_utilization', v_top_u, 'max_power_fraction', v_top_p,
                                 'window_from', v_from, 'window_to', p_now,
                                 'idle_after_s', extract(epoch FROM pol.idle_after),
                                 'utilization_below', pol.utilization_below, 'power_below', pol.power_below,
                                 'action', pol.action, 'verdicts', v_verdicts);

    INSERT INTO tuneplane.job_idle (job_id, attempt_id) VALUES (p_job.id, a.id) ON CONFLICT (job_id) DO NOTHING;
    SELECT * INTO w FROM tuneplane.job_idle WHERE job_id = p_job.id FOR UPDATE;
    IF w.attempt_id IS DISTINCT FROM a.id THEN
        -- A new attempt starts a new watch; the exemption and the GPU-seconds counted so far stay.
        w.attempt_id := a.id; w.status := 'unknown'; w.idle_since := NULL; w.warned_at := NULL; w.warning := NULL;
        w.deadline := NULL; w.reclaimed_at := NULL; w.checked_at := NULL;
    END IF;

    IF v_status = 'idle' THEN
        -- First found idle: the whole window was idle; since then, the time since the last check.
        v_since := coalesce(CASE WHEN w.status = 'idle' THEN w.idle_since END, v_from);
        v_add := v_gpus * extract(epoch FROM p_now - CASE WHEN w.status = 'idle' AND w.checked_at IS NOT NULL
                                                          THEN greatest(w.checked_at, v_from) ELSE v_from END);
    ELSE
        v_since := NULL;
    END IF;

    IF v_status = 'idle' AND w.exempt_at IS NULL AND pol.action <> 'off' AND w.warned_at IS NULL THEN
        w.warned_at := p_now;
        w.deadline := CASE WHEN pol.action = 'reclaim' THEN p_now + pol.idle_grace END;
        v_msg := format('GPUs idle for %s (utilization < %s, power < %s on all %s GPUs); %s',
                        tuneplane.idle_minutes(p_now - v_since), tuneplane.idle_percent(pol.utilization_below),
                        tuneplane.idle_percent(pol.power_below * 100), v_gpus,
                        CASE WHEN pol.action = 'reclaim'
                             THEN format('it will be stopped at %s UTC unless they become busy',
                                         to_char(w.deadline AT TIME ZONE 'UTC', 'HH24:MI'))
                             ELSE 'this fleet''s idle policy only warns: nothing will be stopped' END);
        w.warning := v_msg;
        PERFORM tuneplane.set_job_state(p_job.id, p_job.state, v_msg,
            jsonb_build_object('kind', 'idle_warning', 'deadline', w.deadline) || v_eval);
        PERFORM tuneplane.enqueue_team_event(p_job.id, 'job.idle_warning',
            jsonb_build_object('message', v_msg, 'deadline', w.deadline) || v_eval);
        v_result := 'warned';
    ELSIF v_status = 'idle' AND w.exempt_at IS NULL AND pol.action = 'reclaim' AND w.deadline IS NOT NULL
          AND w.deadline <= p_now AND w.reclaimed_at IS NULL THEN
        w.reclaimed_at := p_now;
        v_msg := format('GPUs idle for %s (utilization < %s, power < %s on all %s GPUs); '
                        'warned at %s UTC, still idle at the end of the %s grace',
                        tuneplane.idle_minutes(p_now - v_since), tuneplane.idle_percent(pol.utilization_below),
                        tuneplane.idle_percent(pol.power_below * 100), v_gpus,
                        to_char(w.warned_at AT TIME ZONE 'UTC', 'HH24:MI'), tuneplane.idle_minutes(pol.idle_grace));
        PERFORM tuneplane.idle_reclaim(p_job, a.id, v_msg);
        PERFORM tuneplane.enqueue_team_event(p_job.id, 'job.idle_reclaimed',
            jsonb_build_object('message', v_msg, 'warned_at', w.warned_at) || v_eval);
        v_result := 'reclaimed';
    ELSIF v_status = 'busy' AND w.warned_at IS NOT NULL AND w.reclaimed_at IS NULL THEN
        v_msg := format('GPUs busy again (utilization up to %s); the idle warning of %s UTC is withdrawn',
                        tuneplane.idle_percent(coalesce(v_top_u, 0)),
                        to_char(w.warned_at AT TIME ZONE 'UTC', 'HH24:MI'));
        w.warned_at := NULL; w.deadline := NULL; w.warning := NULL;
        PERFORM tuneplane.set_job_state(p_job.id, p_job.state, v_msg,
            jsonb_build_object('kind', 'idle_withdrawn') || v_eval);
        PERFORM tuneplane.enqueue_team_event(p_job.id, 'job.idle_withdrawn',
            jsonb_build_object('message', v_msg) || v_eval);
        v_result := 'busy_again';
    END IF;

    IF v_add > 0 THEN
        -- The usage ledger's idle GPU-seconds (issue 20's ledger; this column is ours): each member of the
        -- attempt its GPUs × the idle time just counted.
        UPDATE tuneplane.usage_ledger l
           SET idle_gpu_seconds = l.idle_gpu_seconds + cardinality(m.gpu_indices) * (v_add / v_gpus)::numeric
          FROM tuneplane.members m
         WHERE m.attempt_id = a.id AND l.member_id = m.id AND cardinality(m.gpu_indices) > 0;
    END IF;

    UPDATE tuneplane.job_idle
       SET attempt_id = w.attempt_id, status = v_status, idle_since = v_since, warned_at = w.warned_at,
           warning = w.warning,
           deadline = w.deadline, reclaimed_at = w.reclaimed_at, checked_at = p_now, evaluation = v_eval,
           idle_gpu_seconds = idle_gpu_seconds + greatest(v_add, 0)
     WHERE job_id = p_job.id;
    RETURN v_result;
END;
$$;

-- jobs_idle_watch (trigger on jobs.state): a job that becomes running with GPUs is watched (its job_idle
-- row, made here if new, is due at once); one that leaves running is not. In the transaction of the state
-- change, under the job lock its writer holds; job_idle is a leaf row.
CREATE OR REPLACE FUNCTION tuneplane.jobs_idle_watch() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.state = 'running' AND NEW.gpus_per_node > 0 THEN
        INSERT INTO tuneplane.job_idle AS w (job_id, watching) VALUES (NEW.id, true)
        ON CONFLICT (job_id) DO UPDATE SET watching = true;
    ELSIF OLD.state = 'running' THEN
        UPDATE tuneplane.job_idle SET watching = false WHERE job_id = NEW.id AND watching;
    END IF;
    RETURN NULL;
END;
$$;

CREATE OR REPLACE TRIGGER jobs_idle_watch AFTER UPDATE OF state ON tuneplane.jobs
    FOR EACH ROW WHEN (OLD.state IS DISTINCT FROM NEW.state AND (OLD.state = 'running' OR NEW.state = 'running'))
    EXECUTE FUNCTION tuneplane.jobs_idle_watch();

-- sweep_idle_jobs: evaluates the watched jobs (running, with GPUs) not evaluated within
-- idle_settings.check_every, least recently evaluated first, at most p_limit of them (a call stays short;
-- the scheduler calls again at its next tick). The candidates come from the partial index job_idle_due, so
-- a call reads only what it evaluates. Jobs are locked FOR UPDATE SKIP LOCKED (a job being changed right
-- now is evaluated next time). Returns how many were checked, warned, reclaimed and busy again.
CREATE OR REPLACE FUNCTION tuneplane.sweep_idle_jobs(p_limit integer DEFAULT 200, p_now timestamptz DEFAULT now())
RETURNS TABLE (checked integer, warned integer, reclaimed integer, busy_again integer)
LANGUAGE plpgsql AS $$
DECLARE
    j        tuneplane.jobs;
    v_id     bigint;
    v_every  interval := (SELECT check_every FROM tuneplane.idle_settings);
    v_what   text;
BEGIN
    checked := 0; warned := 0; reclaimed := 0; busy_again := 0;
    -- Each candidate's job row is then locked by its primary key (never a scan of jobs), skipped when
    -- another transaction holds it.
    FOR v_id IN SELECT w.job_id FROM tuneplane.job_idle w
                 WHERE w.watching AND (w.checked_at IS NULL OR w.checked_at <= p_now - v_every)
                 ORDER BY w.checked_at NULLS FIRST, w.job_id
                 LIMIT p_limit LOOP
        SELECT * INTO j FROM tuneplane.jobs WHERE id = v_id AND state = 'running' FOR UPDATE SKIP LOCKED;
        CONTINUE WHEN j.id IS NULL;
        v_what := tuneplane.watch_idle_job(j, p_now);
        checked := checked + 1;
        warned := warned + (v_what IS NOT DISTINCT FROM 'warned')::integer;
        reclaimed := reclaimed + (v_what IS NOT DISTINCT FROM 'reclaimed')::integer;
        busy_again := busy_again + (v_what IS NOT DISTINCT FROM 'busy_again')::integer;
    END LOOP;
    RETURN NEXT;
END;
$$;

-- exempt_job_idle: an installation admin exempts a job from the idle policy (never warned or reclaimed
-- again; a pending deadline is dropped), with a reason. Recorded on the job_idle row and as the job's
-- reason (an event). Refuses a non-admin (403), an empty or over-long reason (400), an unknown job (404)
-- and a finished one (409). Locks the job, then its job_idle row.
CREATE OR REPLACE FUNCTION tuneplane.exempt_job_idle(p_actor_id bigint, p_job_id bigint, p_reason text)
RETURNS tuneplane.job_idle
LANGUAGE plpgsql AS $$
DECLARE
    actor  tuneplane.users;
    j      tuneplane.jobs;
    result tuneplane.job_idle;
BEGIN
    actor := tuneplane.require_admin(p_actor_id, 'exempting a job from the idle policy');
    IF p_reason IS NULL OR length(btrim(p_reason)) = 0 OR length(p_reason) > 500 THEN
        RAISE EXCEPTION 'a reason of 1 to 500 characters is required' USING ERRCODE = 'TP400', COLUMN = 'reason';
    END IF;
    SELECT * INTO j FROM tuneplane.jobs WHERE id = p_job_id FOR UPDATE;
    IF j.id IS NULL THEN
        RAISE EXCEPTION 'no job %', p_job_id USING ERRCODE = 'TP404', COLUMN = 'job';
    END IF;
    IF j.state IN ('succeeded', 'failed', 'cancelled') THEN
        RAISE EXCEPTION 'job % already %', p_job_id, j.state USING ERRCODE = 'TP409', COLUMN = 'job';
    END IF;
    INSERT INTO tuneplane.job_idle AS w (job_id, exempt_at, exempt_by, exempt_reason)
    VALUES (j.id, now(), actor.id, btrim(p_reason))
    ON CONFLICT (job_id) DO UPDATE
       SET exempt_at = now(), exempt_by = actor.id, exempt_reason = btrim(p_reason), warned_at = NULL,
           deadline = NULL, warning = NULL
    RETURNING * INTO result;
    PERFORM tuneplane.set_job_state(j.id, j.state,
        format('exempt from the idle policy by %s: %s', actor.username, btrim(p_reason)),
        jsonb_build_object('kind', 'idle_exempt', 'by', actor.username));
    RETURN result;
END;
$$;

-- job_idle_of: what the idle policy says of a visible job now (the job page, the dashboard and
-- `tuneplane jobs show`): status, warning, deadline, exemption, idle GPU-seconds. No row: not watched yet.
CREATE OR REPLACE FUNCTION tuneplane.job_idle_of(p_actor_id bigint, p_job_id bigint)
RETURNS TABLE (status text, idle_since timestamptz, warned_at timestamptz, deadline timestamptz,
               reclaimed_at timestamptz, checked_at timestamptz, exempt_at timestamptz, exempt_by text,
               exempt_reason text, idle_gpu_seconds double precision, evaluation jsonb, warning text)
LANGUAGE plpgsql STABLE AS $$
BEGIN
    PERFORM 1 FROM tuneplane.get_job(p_actor_id, p_job_id);
    RETURN QUERY
        SELECT w.status, w.idle_since, w.warned_at, w.deadline, w.reclaimed_at, w.checked_at, w.exempt_at,
               u.username, w.exempt_reason, w.idle_gpu_seconds, w.evaluation, w.warning
          FROM tuneplane.job_idle w
          LEFT JOIN tuneplane.users u ON u.id = w.exempt_by
         WHERE w.job_id = p_job_id;
END;
$$;

-- fleet_gpus: every GPU of a fleet's nodes (all fleets when NULL) with what it is doing, for the Fleet page:
-- the member holding it, its last utilization, memory used, power and power limit from the member's stored
-- samples (the series' last values, by their unique key), when they were stored, and whether the idle
-- sweep's last evaluation of the holding job found this GPU idle.
CREATE OR REPLACE FUNCTION tuneplane.fleet_gpus(p_fleet text DEFAULT NULL)
RETURNS TABLE (node_id bigint, gpu_index integer, model text, memory_bytes bigint, simulated boolean,
               job_id bigint, member_rank integer, utilization double precision, memory_used double precision,
               power_watts double precision, power_limit_watts double precision, sampled_at timestamptz,
               idle boolean)
LANGUAGE sql STABLE AS $$
    SELECT g.node_id, g.gpu_index, g.model, g.memory_bytes, g.simulated, m.job_id, m.rank,
           x.utilization, x.memory_used, x.power_watts, x.power_limit_watts, x.sampled_at,
           coalesce(w.watching AND w.evaluation -> 'verdicts' @> jsonb_build_array(
               jsonb_build_object('node_id', g.node_id, 'gpu', g.gpu_index, 'verdict', 'idle')), false)
      FROM tuneplane.node_gpus g
      JOIN tuneplane.nodes n ON n.id = g.node_id
      JOIN tuneplane.fleets f ON f.id = n.fleet_id
      LEFT JOIN tuneplane.gpu_allocations ga
        ON ga.node_id = g.node_id AND ga.gpu_index = g.gpu_index AND ga.released_at IS NULL
      LEFT JOIN tuneplane.members m ON m.id = ga.member_id
      LEFT JOIN tuneplane.attempts a ON a.id = m.attempt_id
      LEFT JOIN tuneplane.job_idle w ON w.job_id = m.job_id
      LEFT JOIN LATERAL (
          SELECT max(s.last_value) FILTER (WHERE s.name LIKE '%.utilization') AS utilization,
                 max(s.last_value) FILTER (WHERE s.name LIKE '%.memory_used') AS memory_used,
                 max(s.last_value) FILTER (WHERE s.name LIKE '%.power_watts') AS power_watts,
                 max(s.last_value) FILTER (WHERE s.name LIKE '%.power_limit_watts') AS power_limit_watts,
                 max(s.last_at) AS sampled_at
            FROM tuneplane.telemetry_series s
           WHERE s.job_id = m.job_id AND s.attempt = a.number AND s.member_rank = m.rank AND s.source = 'system'
             AND s.name IN (format('system/gpu.%s.utilization', g.gpu_index),
                            format('system/gpu.%s.memory_used', g.gpu_index),
                            format('system/gpu.%s.power_watts', g.gpu_index),
                            format('system/gpu.%s.power_limit_watts', g.gpu_index))) x ON m.id IS NOT NULL
     WHERE p_fleet IS NULL OR f.name = p_fleet
     ORDER BY g.node_id, g.gpu_index;
$$;

-- idle_warnings_of: the actor's running jobs whose idle warning stands, newest deadline last (the
-- dashboard). Reads the warnings that stand through their partial index.
CREATE OR REPLACE FUNCTION tuneplane.idle_warnings_of(p_actor_id bigint)
RETURNS TABLE (job_id bigint, warning text, warned_at timestamptz, deadline timestamptz)
LANGUAGE sql STABLE AS $$
    SELECT w.job_id, w.warning, w.warned_at, w.deadline
      FROM tuneplane.job_idle w
      JOIN tuneplane.jobs j ON j.id = w.job_id
     WHERE w.warned_at IS NOT NULL AND w.reclaimed_at IS NULL AND j.owner_id = p_actor_id
       AND j.state = 'running'
     ORDER BY w.deadline NULLS LAST, w.job_id;
$$;

-- v_idle_jobs: for operators (docs/runbook.md): every watched job that is not finished, with its verdict,
-- warning and deadline.
CREATE OR REPLACE VIEW tuneplane.v_idle_jobs AS
SELECT w.job_id, j.state, f.name AS fleet, w.status, w.idle_since, w.warned_at, w.warning, w.deadline, w.reclaimed_at,
       w.exempt_reason, round(w.idle_gpu_seconds) AS idle_gpu_seconds, w.checked_at, w.evaluation
  FROM tuneplane.job_idle w
  JOIN tuneplane.jobs j ON j.id = w.job_id
  JOIN tuneplane.fleets f ON f.id = j.fleet_id
 WHERE j.state NOT IN ('succeeded', 'failed', 'cancelled');
