-- sql/functions/submission.sql — the current definition of every submission function, view and trigger.
-- Submission: previews (resolution, input artifacts pinned by reference, the fleet storage check,
-- digest), confirmations with retry keys, jobs and their events, the jobs views.
--
-- Repeatable file (ADR 0012): `tuneplane db migrate` re-applies every file of sql/functions/ (in the order
-- of order.txt, one transaction) whenever one changes. Edit definitions here, never in a migration.
-- Tables, columns and data changes go in a new numbered migration. A changed signature or a view whose
-- columns change: add its DROP below (it runs before the new definition is created), e.g.
--   DROP FUNCTION IF EXISTS tuneplane.f(bigint, text);
--
-- Drops (signature changes):
DROP FUNCTION IF EXISTS tuneplane.list_jobs(bigint, text, integer, bigint);

CREATE OR REPLACE TRIGGER previews_immutable
    BEFORE UPDATE OR DELETE ON tuneplane.previews
    FOR EACH ROW EXECUTE FUNCTION tuneplane.refuse_change();

CREATE OR REPLACE TRIGGER previews_no_truncate
    BEFORE TRUNCATE ON tuneplane.previews
    FOR EACH STATEMENT EXECUTE FUNCTION tuneplane.refuse_change();

-- Guard on every job state change: terminal states are final; updated_at follows every change.
-- Transitions themselves are made by stored functions (job_transition here, placement/launch later).
CREATE OR REPLACE FUNCTION tuneplane.jobs_guard_change() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF OLD.state IN ('succeeded', 'failed', 'cancelled') AND NEW.state IS DISTINCT FROM OLD.state THEN
        RAISE EXCEPTION 'job % is % and cannot become %', OLD.id, OLD.state, NEW.state
            USING ERRCODE = 'TP409', COLUMN = 'state';
    END IF;
    NEW.updated_at := now();
    RETURN NEW;
END;
$$;

CREATE OR REPLACE TRIGGER jobs_guard_change
    BEFORE UPDATE ON tuneplane.jobs
    FOR EACH ROW EXECUTE FUNCTION tuneplane.jobs_guard_change();

-- Every new state or new reason becomes an event. A transition function may attach structured detail
-- for its event with set_config('tuneplane.event_detail', '{"…": …}', true) before it updates the row.
-- Writers should set state_reason only when it changes (each change is an event).
CREATE OR REPLACE FUNCTION tuneplane.jobs_record_event() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    detail jsonb := coalesce(nullif(current_setting('tuneplane.event_detail', true), '')::jsonb, '{}'::jsonb);
BEGIN
    INSERT INTO tuneplane.job_events (job_id, from_state, to_state, reason, detail)
    VALUES (NEW.id, CASE WHEN TG_OP = 'UPDATE' THEN OLD.state END, NEW.state, NEW.state_reason, detail);
    RETURN NULL;
END;
$$;

CREATE OR REPLACE TRIGGER jobs_event_on_insert
    AFTER INSERT ON tuneplane.jobs
    FOR EACH ROW EXECUTE FUNCTION tuneplane.jobs_record_event();

CREATE OR REPLACE TRIGGER jobs_event_on_change
    AFTER UPDATE OF state, state_reason ON tuneplane.jobs
    FOR EACH ROW
    WHEN (OLD.state IS DISTINCT FROM NEW.state OR OLD.state_reason IS DISTINCT FROM NEW.state_reason)
    EXECUTE FUNCTION tuneplane.jobs_record_event();

-- canonical_json: the one text form a digest is computed over. Object keys sorted by code point, no
-- whitespace, strings escaped as jsonb escapes them, numbers in PostgreSQL's numeric text form.
-- app/submission/canonical.py writes the same text from Python.
CREATE OR REPLACE FUNCTION tuneplane.canonical_json(p_value jsonb) RETURNS text
LANGUAGE plpgsql IMMUTABLE STRICT AS $$
DECLARE
    result text;
BEGIN
    CASE jsonb_typeof(p_value)
        WHEN 'object' THEN
            SELECT '{' || coalesce(string_agg(to_jsonb(e.key)::text || ':' || tuneplane.canonical_json(e.value),
                                              ',' ORDER BY e.key COLLATE "C"), '') || '}'
              INTO result
              FROM jsonb_each(p_value) AS e;
        WHEN 'array' THEN
            SELECT '[' || coalesce(string_agg(tuneplane.canonical_json(e.value), ',' ORDER BY e.ord), '') || ']'
              INTO result
              FROM jsonb_array_elements(p_value) WITH ORDINALITY AS e(value, ord);
        ELSE
            result := p_value::text;
    END CASE;
    RETURN result;
END;
$$;

-- format_bytes: 17179869184 → '16 GiB' (messages and summaries).
CREATE OR REPLACE FUNCTION tuneplane.format_bytes(p_bytes bigint) RETURNS text
LANGUAGE sql IMMUTABLE STRICT AS $$
    SELECT CASE
        WHEN p_bytes >= 1024::numeric ^ 4 THEN trim_scale(round(p_bytes / 1024::numeric ^ 4, 1)) || ' TiB'
        WHEN p_bytes >= 1024::numeric ^ 3 THEN trim_scale(round(p_bytes / 1024::numeric ^ 3, 1)) || ' GiB'
        WHEN p_bytes >= 1024::numeric ^ 2 THEN trim_scale(round(p_bytes / 1024::numeric ^ 2, 1)) || ' MiB'
        WHEN p_bytes >= 1024 THEN trim_scale(round(p_bytes / 1024::numeric, 1)) || ' KiB'
        ELSE p_bytes || ' B'
    END;
$$;

-- submission_setting: an installation setting by name (refuses an unknown name).
CREATE OR REPLACE FUNCTION tuneplane.submission_setting(p_name text) RETURNS bigint
LANGUAGE plpgsql STABLE AS $$
DECLARE
    result bigint;
BEGIN
    SELECT value INTO result FROM tuneplane.submission_settings WHERE name = p_name;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'no submission setting named %', p_name USING ERRCODE = 'TP404', COLUMN = 'name';
    END IF;
    RETURN result;
END;
$$;

-- set_submission_setting: admins change an installation setting.
CREATE OR REPLACE FUNCTION tuneplane.set_submission_setting(p_actor_id bigint, p_name text, p_value bigint)
RETURNS tuneplane.submission_settings
LANGUAGE plpgsql AS $$
DECLARE
    result tuneplane.submission_settings;
BEGIN
    PERFORM tuneplane.require_admin(p_actor_id, 'changing submission settings');
    IF p_value IS NULL OR p_value < 0 THEN
        RAISE EXCEPTION 'a setting is a non-negative integer' USING ERRCODE = 'TP400', COLUMN = 'value';
    END IF;
    UPDATE tuneplane.submission_settings SET value = p_value WHERE name = p_name RETURNING * INTO result;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'no submission setting named %', p_name USING ERRCODE = 'TP404', COLUMN = 'name';
    END IF;
    RETURN result;
END;
$$;

-- set_user_limits: admins set a user's per-job GPU and node limits (NULL = the installation default).
CREATE OR REPLACE FUNCTION tuneplane.set_user_limits(p_actor_id bigint, p_username text,
                                          p_max_gpus_per_job integer, p_max_nodes_per_job integer)
RETURNS tuneplane.user_limits
LANGUAGE plpgsql AS $$
DECLARE
    target bigint;
    result tuneplane.user_limits;
BEGIN
    PERFORM tuneplane.require_admin(p_actor_id, 'setting limits');
    SELECT id INTO target FROM tuneplane.users WHERE username = p_username;
    IF target IS NULL THEN
        RAISE EXCEPTION 'no user named %', p_username USING ERRCODE = 'TP404', COLUMN = 'username';
    END IF;
    INSERT INTO tuneplane.user_limits AS l (user_id, max_gpus_per_job, max_nodes_per_job)
    VALUES (target, p_max_gpus_per_job, p_max_nodes_per_job)
    ON CONFLICT (user_id) DO UPDATE
        SET max_gpus_per_job = EXCLUDED.max_gpus_per_job,
            max_nodes_per_job = EXCLUDED.max_nodes_per_job,
            updated_at = now()
    RETURNING * INTO result;
    RETURN result;
END;
$$;

-- effective_limits: the per-job limits that apply to a user (override, else default).
CREATE OR REPLACE FUNCTION tuneplane.effective_limits(p_user_id bigint)
RETURNS TABLE (max_gpus_per_job bigint, max_nodes_per_job bigint)
LANGUAGE sql STABLE AS $$
    SELECT coalesce(l.max_gpus_per_job::bigint, tuneplane.submission_setting('max_gpus_per_job')),
           coalesce(l.max_nodes_per_job::bigint, tuneplane.submission_setting('max_nodes_per_job'))
      FROM (SELECT p_user_id AS user_id) AS who
      LEFT JOIN tuneplane.user_limits l ON l.user_id = who.user_id;
$$;

-- record_source_archive: a validated, stored archive; the uploader may now name it in a JobSpec.
-- Idempotent: the same content uploaded again (by anyone) is the same row.
CREATE OR REPLACE FUNCTION tuneplane.record_source_archive(p_user_id bigint, p_sha256 text, p_size_bytes bigint,
                                                p_member_count integer, p_unpacked_bytes bigint)
RETURNS tuneplane.source_archives
LANGUAGE plpgsql AS $$
DECLARE
    result tuneplane.source_archives;
BEGIN
    IF NOT EXISTS (SELECT 1 FROM tuneplane.users WHERE id = p_user_id AND disabled_at IS NULL) THEN
        RAISE EXCEPTION 'no such active user' USING ERRCODE = 'TP401', COLUMN = 'user';
    END IF;
    -- An upload is a write (stored blobs, counted against nothing yet but kept): not under a read-only
    -- token (the console's /sources asks the same rule before it receives a byte).
    PERFORM tuneplane.require_token_write('uploading a source archive');
    IF p_sha256 IS NULL OR p_sha256 !~ '^[0-9a-f]{64}$' THEN
        RAISE EXCEPTION 'archive digest must be a sha256 hex digest' USING ERRCODE = 'TP400', COLUMN = 'sha256';
    END IF;
    INSERT INTO tuneplane.source_archives (sha256, size_bytes, member_count, unpacked_bytes)
    VALUES (p_sha256, p_size_bytes, p_member_count, p_unpacked_bytes)
    ON CONFLICT (sha256) DO NOTHING;
    INSERT INTO tuneplane.source_archive_uploads (sha256, user_id) VALUES (p_sha256, p_user_id)
    ON CONFLICT DO NOTHING;
    SELECT * INTO result FROM tuneplane.source_archives WHERE sha256 = p_sha256;
    RETURN result;
END;
$$;

-- fleet_fit: for every fleet, how many non-retired nodes could each hold one member of the given shape
-- by their reported capacity (whether they are free now is placement's business, not preview's).
CREATE OR REPLACE FUNCTION tuneplane.fleet_fit(p_gpus_per_node integer, p_cpus_per_node integer,
                                    p_memory_per_node bigint, p_needs_container_runtime boolean)
RETURNS TABLE (fleet_id bigint, fleet text, backend text, capable_nodes bigint, non_retired_nodes bigint,
               capable_but_unschedulable bigint, simulated_gpus boolean)
LANGUAGE sql STABLE AS $$
    SELECT f.id, f.name, f.backend,
           count(n.id) FILTER (WHERE n.fits),
           count(n.id) FILTER (WHERE n.scheduling_state <> 'retired'),
           count(n.id) FILTER (WHERE n.fits AND n.scheduling_state IN ('cordoned', 'draining')),
           coalesce(bool_or(n.any_simulated) FILTER (WHERE n.fits), false)
      FROM tuneplane.fleets f
      LEFT JOIN LATERAL (
          SELECT nd.id, nd.scheduling_state, g.any_simulated,
                 (nd.scheduling_state <> 'retired'
                  AND nd.cpus >= p_cpus_per_node
                  AND nd.memory_bytes >= p_memory_per_node
                  AND g.gpu_count >= p_gpus_per_node
                  AND (NOT p_needs_container_runtime OR cardinality(nd.container_runtimes) > 0)) AS fits
            FROM tuneplane.nodes nd
            CROSS JOIN LATERAL (
                SELECT count(*) AS gpu_count, coalesce(bool_or(ng.simulated), false) AS any_simulated
                  FROM tuneplane.node_gpus ng WHERE ng.node_id = nd.id
            ) g
           WHERE nd.fleet_id = f.id
      ) n ON true
     GROUP BY f.id, f.name, f.backend
     ORDER BY f.name;
$$;

-- resolve_artifact_ref: the artifact an input reference names, as the owner may see it.
--   "<job id>/<name>"          the artifact NAME of that job (latest attempt; the only member that has one)
--   "<job id>/<name>@<rank>"   … of that member
--   "sha256:<digest>" or the bare 64-hex digest: the newest complete artifact with that manifest digest
--                              among the owner's jobs (any job for an admin)
-- Refuses an unparsable reference (422), an unknown one (404) and an ambiguous name (409); p_field is
-- the field named in the refusal.
CREATE OR REPLACE FUNCTION tuneplane.resolve_artifact_ref(p_owner_id bigint, p_ref text, p_field text)
RETURNS tuneplane.artifacts
LANGUAGE plpgsql STABLE AS $$
DECLARE
    m text[];
    a tuneplane.artifacts;
    v_digest text;
    v_message text;
    v_state text;
BEGIN
    v_digest := lower(regexp_replace(coalesce(p_ref, ''), '^sha256:', '', 'i'));
    IF v_digest ~ '^[0-9a-f]{64}$' THEN
        SELECT ar.* INTO a FROM tuneplane.artifacts ar
          JOIN tuneplane.jobs j ON j.id = ar.job_id
          JOIN tuneplane.users u ON u.id = p_owner_id
          LEFT JOIN tuneplane.team_members tm ON tm.team_id = j.team_id AND tm.user_id = u.id
          CROSS JOIN tuneplane.request_token_scope() ts
         WHERE ar.manifest_digest = v_digest
           AND tuneplane.job_access_allowed(u, j, 'read', tm.role, ts.read_only, ts.teams)
         ORDER BY (ar.state = 'complete') DESC, ar.completed_at DESC NULLS LAST, ar.id DESC
         LIMIT 1;
        IF a.id IS NULL THEN
            RAISE EXCEPTION 'no artifact with manifest digest % among your jobs', v_digest
                USING ERRCODE = 'TP404', COLUMN = p_field;
        END IF;
        RETURN a;
    END IF;
    m := regexp_match(coalesce(p_ref, ''), '^([0-9]{1,18})/([A-Za-z0-9][A-Za-z0-9._-]{0,62})(@([0-9]{1,9}))?$');
    IF m IS NULL THEN
        RAISE EXCEPTION 'artifact reference % must be JOB/NAME, JOB/NAME@RANK or sha256:DIGEST',
                        to_json(coalesce(p_ref, ''))::text USING ERRCODE = 'TP422', COLUMN = p_field;
    END IF;
    BEGIN
        a := tuneplane.find_artifact(p_owner_id, m[1]::bigint, m[2], m[4]::integer, NULL);
    EXCEPTION WHEN SQLSTATE 'TP404' OR SQLSTATE 'TP409' THEN
        GET STACKED DIAGNOSTICS v_message = MESSAGE_TEXT, v_state = RETURNED_SQLSTATE;
        RAISE EXCEPTION '%', v_message USING ERRCODE = v_state, COLUMN = p_field;
    END;
    RETURN a;
END;
$$;

-- resolve_preemption: the JobSpec's priority and preemption settings as the preview pins them
-- (docs/preemption.md): {"priority": integer, "priority_class": name, "preemptible": boolean,
--  "preemption": {"grace_seconds", "signal", "max_preemptions"}}.
--   priority: a class name (priority_classes: scavenger, low, normal, high, urgent — an operator may
--             re-map their integers) or an integer (its class: the highest whose value is at most it);
--             absent: normal;
--   preemptible: as given, else the class's preemptible_by_default (normal and below); a scavenger job is
--             always preemptible;
--   preemption.grace_seconds: as given (capped when a preemption is requested), else the installation's
--             default; preemption.signal: SIGTERM unless given; max_preemptions: as given, else the default.
-- Refuses (422) an unknown class name (field priority, listing the names), an integer outside
-- -1000..1000, a non-preemptible scavenger job (field preemptible), a bad signal or negative numbers.
CREATE OR REPLACE FUNCTION tuneplane.resolve_preemption(p_spec jsonb)
RETURNS jsonb
LANGUAGE plpgsql STABLE AS $$
DECLARE
    v_raw    jsonb := p_spec -> 'priority';
    c        tuneplane.priority_classes;
    v_value  integer;
    v_pre    jsonb := coalesce(p_spec -> 'preemption', '{}'::jsonb);
    v_preemptible boolean;
    v_names  text;
    s        tuneplane.preemption_settings;
BEGIN
    SELECT * INTO s FROM tuneplane.preemption_settings;
    SELECT string_agg(format('%s (%s)', name, value), ', ' ORDER BY value) INTO v_names FROM tuneplane.priority_classes;
    IF v_raw IS NULL OR v_raw = 'null'::jsonb THEN
        v_raw := '"normal"'::jsonb;
    END IF;
    IF jsonb_typeof(v_raw) = 'string' THEN
        SELECT * INTO c FROM tuneplane.priority_classes WHERE name = v_raw ->> 0;
        IF c.name IS NULL THEN
            RAISE EXCEPTION 'priority: no class named %; the classes are %', v_raw ->> 0, v_names
                USING ERRCODE = 'TP422', COLUMN = 'priority';
        END IF;
        v_value := c.value;
    ELSIF jsonb_typeof(v_raw) = 'number' AND (v_raw::text)::numeric = trunc((v_raw::text)::numeric)
          AND (v_raw::text)::numeric BETWEEN -1000 AND 1000 THEN
        v_value := (v_raw::text)::integer;
        SELECT * INTO c FROM tuneplane.priority_classes WHERE value <= v_value ORDER BY value DESC LIMIT 1;
        IF c.name IS NULL THEN
            SELECT * INTO c FROM tuneplane.priority_classes ORDER BY value LIMIT 1;
        END IF;
    ELSE
        RAISE EXCEPTION 'priority must be a class name (%) or an integer from -1000 to 1000', v_names
            USING ERRCODE = 'TP422', COLUMN = 'priority';
    END IF;
    IF jsonb_typeof(p_spec -> 'preemptible') = 'boolean' THEN
        v_preemptible := (p_spec ->> 'preemptible')::boolean;
    ELSIF p_spec -> 'preemptible' IS NOT NULL AND p_spec -> 'preemptible' <> 'null'::jsonb THEN
        RAISE EXCEPTION 'preemptible must be true or false' USING ERRCODE = 'TP422', COLUMN = 'preemptible';
    ELSE
        v_preemptible := coalesce(c.preemptible_by_default, true);
    END IF;
    IF c.scavenger AND NOT v_preemptible THEN
        RAISE EXCEPTION 'a % job runs on idle capacity only and is always preemptible', c.name
            USING ERRCODE = 'TP422', COLUMN = 'preemptible';
    END IF;
    IF jsonb_typeof(v_pre) <> 'object' THEN
        RAISE EXCEPTION 'preemption must be an object' USING ERRCODE = 'TP422', COLUMN = 'preemption';
    END IF;
    IF coalesce(v_pre ->> 'signal', 'SIGTERM') NOT IN ('SIGTERM', 'SIGINT', 'SIGHUP', 'SIGUSR1', 'SIGUSR2') THEN
        RAISE EXCEPTION 'preemption.signal must be one of SIGTERM, SIGINT, SIGHUP, SIGUSR1, SIGUSR2'
            USING ERRCODE = 'TP422', COLUMN = 'preemption.signal';
    END IF;
    IF jsonb_typeof(v_pre -> 'grace_seconds') IS DISTINCT FROM 'number' AND v_pre ? 'grace_seconds'
       OR (v_pre ->> 'grace_seconds')::numeric < 0 THEN
        RAISE EXCEPTION 'preemption.grace_seconds must be a number of seconds, 0 or more'
            USING ERRCODE = 'TP422', COLUMN = 'preemption.grace_seconds';
    END IF;
    IF jsonb_typeof(v_pre -> 'max_preemptions') IS DISTINCT FROM 'number' AND v_pre ? 'max_preemptions'
       OR (v_pre ->> 'max_preemptions')::numeric < 0 THEN
        RAISE EXCEPTION 'preemption.max_preemptions must be 0 or more'
            USING ERRCODE = 'TP422', COLUMN = 'preemption.max_preemptions';
    END IF;
    RETURN jsonb_build_object(
        'priority', v_value, 'priority_class', c.name, 'preemptible', v_preemptible,
        'preemption', jsonb_build_object(
            'grace_seconds', coalesce(round((v_pre ->> 'grace_seconds')::numeric)::integer,
                                      round(extract(epoch FROM s.default_grace))::integer),
            'signal', coalesce(v_pre ->> 'signal', 'SIGTERM'),
            'max_preemptions', coalesce((v_pre ->> 'max_preemptions')::integer, s.max_preemptions)));
END;
$$;

-- resolve_resume: the JobSpec's `resume` as the preview pins it:
--   absent or "latest" → {"mode": "latest"}: every later attempt starts from the job's newest verified checkpoint;
--   "none"             → {"mode": "none"}: every attempt starts from scratch;
--   a reference        → {"mode": "pinned", …}: every attempt starts from that complete artifact (the forms
--                        of an input: JOB/NAME, JOB/NAME@RANK, sha256:DIGEST), pinned by id and digest.
-- Refuses (field `resume`) a value that is not a string, and an artifact that is not complete (422) or
-- not the owner's (404, from resolve_artifact_ref).
CREATE OR REPLACE FUNCTION tuneplane.resolve_resume(p_owner_id bigint, p_resume jsonb)
RETURNS jsonb
LANGUAGE plpgsql STABLE AS $$
DECLARE
    a tuneplane.artifacts;
BEGIN
    IF p_resume IS NULL OR p_resume = 'null'::jsonb OR p_resume = '"latest"'::jsonb THEN
        RETURN jsonb_build_object('mode', 'latest');
    END IF;
    IF jsonb_typeof(p_resume) <> 'string' OR p_resume ->> 0 = '' THEN
        RAISE EXCEPTION 'resume must be "latest", "none" or a checkpoint reference such as 12/checkpoint.3'
            USING ERRCODE = 'TP422', COLUMN = 'resume';
    END IF;
    IF p_resume = '"none"'::jsonb THEN
        RETURN jsonb_build_object('mode', 'none');
    END IF;
    a := tuneplane.resolve_artifact_ref(p_owner_id, p_resume ->> 0, 'resume');
    IF a.state <> 'complete' THEN
        RAISE EXCEPTION 'resume: artifact % of job % is %, not complete; only a verified checkpoint can be resumed from',
                        a.name, a.job_id, a.state USING ERRCODE = 'TP422', COLUMN = 'resume';
    END IF;
    RETURN jsonb_build_object('mode', 'pinned', 'artifact', p_resume ->> 0, 'artifact_id', a.id,
                              'job_id', a.job_id, 'artifact_name', a.name,
                              'manifest_digest', a.manifest_digest);
END;
$$;

-- resolve_inputs: each input pinned to a complete artifact by manifest digest, in spec order:
-- {name, path, artifact (the reference as written), artifact_id, job_id, artifact_name, rank, attempt,
--  manifest_digest, file_count, total_bytes, delivery}. Refuses (422, naming inputs.N.artifact) an
-- artifact that is not complete (with its state and reason) or whose latest verification failed, and
-- passes on 404/409 from resolve_artifact_ref. Input names must be unique.
CREATE OR REPLACE FUNCTION tuneplane.resolve_inputs(p_owner_id bigint, p_inputs jsonb) RETURNS jsonb
LANGUAGE plpgsql STABLE AS $$
DECLARE
    item jsonb;
    idx integer := 0;
    field text;
    a tuneplane.artifacts;
    v_attempt integer;
    v_last record;
    pinned jsonb := '[]'::jsonb;
BEGIN
    IF p_inputs IS NULL OR jsonb_typeof(p_inputs) <> 'array' THEN
        RETURN '[]'::jsonb;
    END IF;
    FOR item IN SELECT value FROM jsonb_array_elements(p_inputs) LOOP
        field := format('inputs.%s.artifact', idx);
        IF (SELECT count(*) FROM jsonb_array_elements(p_inputs) o WHERE o ->> 'name' = item ->> 'name') > 1 THEN
            RAISE EXCEPTION 'input name % is used twice', item ->> 'name'
                USING ERRCODE = 'TP422', COLUMN = format('inputs.%s.name', idx);
        END IF;
        a := tuneplane.resolve_artifact_ref(p_owner_id, item ->> 'artifact', field);
        IF a.state <> 'complete' THEN
            RAISE EXCEPTION 'input %: artifact % of job % is %, not complete (%); only complete artifacts can be inputs',
                            item ->> 'name', a.name, a.job_id, a.state, coalesce(nullif(a.reason, ''), 'no reason yet')
                USING ERRCODE = 'TP422', COLUMN = field;
        END IF;
        SELECT v.ok, v.at, v.problems INTO v_last FROM tuneplane.artifact_verifications v
         WHERE v.artifact_id = a.id ORDER BY v.id DESC LIMIT 1;
        IF v_last.ok IS FALSE THEN
            RAISE EXCEPTION 'input %: artifact % of job % failed its last verification at % (%); its stored bytes no longer match the manifest',
                            item ->> 'name', a.name, a.job_id, v_last.at, v_last.problems ->> 0
                USING ERRCODE = 'TP422', COLUMN = field;
        END IF;
        SELECT number INTO v_attempt FROM tuneplane.attempts WHERE id = a.attempt_id;
        pinned := pinned || jsonb_build_array(jsonb_strip_nulls(jsonb_build_object(
            'name', item ->> 'name', 'path', item ->> 'path', 'artifact', item ->> 'artifact',
            'artifact_id', a.id, 'job_id', a.job_id, 'artifact_name', a.name, 'rank', a.rank,
            'attempt', v_attempt, 'manifest_digest', a.manifest_digest, 'file_count', a.file_count,
            'total_bytes', a.total_bytes, 'delivery', a.delivery, 'shared_path', a.shared_path)));
        idx := idx + 1;
    END LOOP;
    RETURN pinned;
END;
$$;

-- preview_storage_refusal: NULL when fleet p_fleet_id can deliver the spec's outputs and fetch its
-- pinned inputs, else (field, message). Output delivery: "object" needs object_delivery, "shared" needs
-- a shared mount; unspecified needs one of the two. An input needs object delivery, or a shared mount
-- under which the input artifact already lies.
CREATE OR REPLACE FUNCTION tuneplane.preview_storage_refusal(p_fleet_id bigint, p_spec jsonb, p_inputs jsonb)
RETURNS TABLE (field text, message text)
LANGUAGE plpgsql STABLE AS $$
DECLARE
    f tuneplane.fleets;
    caps record;
    o jsonb;
    i jsonb;
    idx integer;
BEGIN
    SELECT * INTO f FROM tuneplane.fleets WHERE id = p_fleet_id;
    SELECT * INTO caps FROM tuneplane.fleet_storage_capabilities(f.capabilities);
    idx := 0;
    FOR o IN SELECT value FROM jsonb_array_elements(coalesce(p_spec -> 'outputs', '[]'::jsonb)) LOOP
        IF o ->> 'delivery' = 'shared' AND NOT caps.shared_mounts THEN
            RETURN QUERY SELECT format('outputs.%s.delivery', idx), format(
                'output %s asks for delivery on a shared mount, but fleet %s declares none '
                '(capabilities shared_mounts and shared_path); use delivery object or another fleet',
                o ->> 'name', f.name);
            RETURN;
        END IF;
        IF o ->> 'delivery' = 'object' AND NOT caps.object_delivery THEN
            RETURN QUERY SELECT format('outputs.%s.delivery', idx), format(
                'output %s asks for object delivery, but fleet %s declares object_delivery false; '
                'use delivery shared (its shared path is %s)', o ->> 'name', f.name,
                coalesce(caps.shared_path, 'not declared'));
            RETURN;
        END IF;
        IF NOT caps.object_delivery AND NOT caps.shared_mounts THEN
            RETURN QUERY SELECT format('outputs.%s', idx), format(
                'fleet %s declares neither object_delivery nor a shared mount, so output %s cannot be delivered',
                f.name, o ->> 'name');
            RETURN;
        END IF;
        idx := idx + 1;
    END LOOP;
    idx := 0;
    FOR i IN SELECT value FROM jsonb_array_elements(coalesce(p_inputs, '[]'::jsonb)) LOOP
        IF NOT caps.object_delivery AND NOT (caps.shared_mounts AND i ->> 'delivery' = 'shared'
                                             AND starts_with(i ->> 'shared_path', caps.shared_path || '/')) THEN
            RETURN QUERY SELECT format('inputs.%s.artifact', idx), format(
                'input %s cannot reach fleet %s: the fleet declares object_delivery false and the artifact is '
                'not on its shared mount (%s)', i ->> 'name', f.name, coalesce(caps.shared_path, 'none declared'));
            RETURN;
        END IF;
        idx := idx + 1;
    END LOOP;
END;
$$;

-- create_preview: resolves a validated JobSpec (p_spec) plus the pins Python computed (p_pins: input,
-- integration, runtime, warnings) into an immutable preview with a digest and an expiry.
-- Refuses (and stores nothing): inactive owner (401), bad resources (422), policy limits (403), an
-- archive the owner did not upload (404), unpinnable inputs (422), an unknown fleet (404), a named
-- fleet that cannot satisfy the request (422), no fleet or several fleets able to when none is named
-- (422, listing them). Never falls back to another fleet or backend. Creates no job, enqueues nothing.
CREATE OR REPLACE FUNCTION tuneplane.create_preview_resolve(p_owner_id bigint, p_spec jsonb, p_pins jsonb)
RETURNS tuneplane.previews
LANGUAGE plpgsql AS $$
DECLARE
    owner        tuneplane.users;
    res          jsonb := coalesce(p_spec -> 'resources', '{}'::jsonb);
    v_input      jsonb := p_pins -> 'input';
    v_kind       text  := p_pins -> 'input' ->> 'kind';
    v_nodes      integer;
    v_gpus       integer;
    v_cpus       integer;
    v_memory     bigint;
    v_limits     record;
    v_archive    tuneplane.source_archives;
    v_inputs     jsonb;
    v_needs_rt   boolean;
    v_fleet      record;
    v_fleet_name text := nullif(p_spec ->> 'fleet', '');
    v_choice     text;
    v_count      integer;
    v_listing    text;
    v_shape      text;
    v_warnings   jsonb := coalesce(p_pins -> 'warnings', '[]'::jsonb);
    v_resolved   jsonb;
    v_canonical  text;
    v_team       tuneplane.teams;
    result       tuneplane.previews;
BEGIN
    SELECT * INTO owner FROM tuneplane.users WHERE id = p_owner_id AND disabled_at IS NULL;
    IF owner.id IS NULL THEN
        RAISE EXCEPTION 'no such active user' USING ERRCODE = 'TP401', COLUMN = 'user';
    END IF;
    -- The team the job will belong to (teams.sql): the named one or the user's default; a role that may
    -- submit and a token that reaches it.
    v_team := tuneplane.require_team_submit(owner, nullif(p_spec ->> 'team', ''));
    IF v_kind IS NULL OR v_kind NOT IN ('recipe', 'source', 'image') THEN
        RAISE EXCEPTION 'input must be exactly one of recipe, source or image' USING ERRCODE = 'TP422', COLUMN = 'input';
    END IF;
    IF coalesce(p_pins -> 'integration' ->> 'sha256', '') !~ '^[0-9a-f]{64}$'
       OR coalesce(p_pins -> 'integration' ->> 'name', '') = '' THEN
        RAISE EXCEPTION 'the integration must be pinned by name and sha256' USING ERRCODE = 'TP400', COLUMN = 'integration';
    END IF;
    IF jsonb_typeof(p_pins -> 'runtime') IS DISTINCT FROM 'object' THEN
        RAISE EXCEPTION 'the runtime must be pinned' USING ERRCODE = 'TP400', COLUMN = 'runtime';
    END IF;

    -- Resources (pydantic checked them already; psql callers get the same rules).
    v_nodes  := coalesce((res ->> 'nodes')::integer, 1);
    v_gpus   := coalesce((res ->> 'gpus_per_node')::integer, 0);
    v_cpus   := coalesce((res ->> 'cpus_per_node')::integer, 1);
    v_memory := coalesce((res ->> 'memory_per_node')::bigint, 0);
    IF v_nodes < 1 THEN
        RAISE EXCEPTION 'nodes must be at least 1' USING ERRCODE = 'TP422', COLUMN = 'resources.nodes';
    END IF;
    IF v_gpus < 0 THEN
        RAISE EXCEPTION 'gpus_per_node must be 0 or more' USING ERRCODE = 'TP422', COLUMN = 'resources.gpus_per_node';
    END IF;
    IF v_cpus < 1 THEN
        RAISE EXCEPTION 'cpus_per_node must be at least 1' USING ERRCODE = 'TP422', COLUMN = 'resources.cpus_per_node';
    END IF;
    IF v_memory < 0 THEN
        RAISE EXCEPTION 'memory_per_node must be 0 or more' USING ERRCODE = 'TP422', COLUMN = 'resources.memory_per_node';
    END IF;

    -- Policy: per-job limits for this user.
    SELECT * INTO v_limits FROM tuneplane.effective_limits(owner.id);
    IF v_nodes::bigint * v_gpus > v_limits.max_gpus_per_job THEN
        RAISE EXCEPTION 'policy: this job requests % GPUs in total (% nodes × %); the limit for % is %',
            v_nodes * v_gpus, v_nodes, v_gpus, owner.username, v_limits.max_gpus_per_job
            USING ERRCODE = 'TP403', COLUMN = 'resources.gpus_per_node';
    END IF;
    IF v_nodes > v_limits.max_nodes_per_job THEN
        RAISE EXCEPTION 'policy: this job requests % nodes; the limit for % is %',
            v_nodes, owner.username, v_limits.max_nodes_per_job
            USING ERRCODE = 'TP403', COLUMN = 'resources.nodes';
    END IF;

    -- A source archive must be one this owner uploaded; the preview pins its facts.
    IF v_kind = 'source' THEN
        SELECT a.* INTO v_archive
          FROM tuneplane.source_archives a
          JOIN tuneplane.source_archive_uploads u ON u.sha256 = a.sha256 AND u.user_id = owner.id
         WHERE a.sha256 = v_input -> 'archive' ->> 'sha256';
        IF v_archive.sha256 IS NULL THEN
            RAISE EXCEPTION 'no source archive sha256:% uploaded by %; upload it first (POST /sources)',
                coalesce(v_input -> 'archive' ->> 'sha256', '?'), owner.username
                USING ERRCODE = 'TP404', COLUMN = 'source.archive';
        END IF;
        v_input := jsonb_set(v_input, '{archive}', jsonb_build_object(
            'sha256', v_archive.sha256, 'size_bytes', v_archive.size_bytes,
            'member_count', v_archive.member_count, 'unpacked_bytes', v_archive.unpacked_bytes));
    END IF;

    v_inputs := tuneplane.resolve_inputs(owner.id, coalesce(p_spec -> 'inputs', '[]'::jsonb));

    -- Fleet: the named one if it can hold every member, else the single fleet that can; never a fallback.
    v_needs_rt := v_kind = 'image';
    v_shape := format('%s node%s, each with at least %s GPU%s, %s CPU%s and %s memory%s',
                      v_nodes, CASE WHEN v_nodes = 1 THEN '' ELSE 's' END,
                      v_gpus, CASE WHEN v_gpus = 1 THEN '' ELSE 's' END,
                      v_cpus, CASE WHEN v_cpus = 1 THEN '' ELSE 's' END,
                      tuneplane.format_bytes(v_memory),
                      CASE WHEN v_needs_rt THEN ' and a container runtime' ELSE '' END);
    SELECT string_agg(format('%s (%s of %s nodes fit)', ff.fleet, ff.capable_nodes, ff.non_retired_nodes),
                      ', ' ORDER BY ff.fleet),
           count(*) FILTER (WHERE ff.capable_nodes >= v_nodes)
      INTO v_listing, v_count
      FROM tuneplane.fleet_fit(v_gpus, v_cpus, v_memory, v_needs_rt) ff;

    IF v_fleet_name IS NOT NULL THEN
        SELECT * INTO v_fleet FROM tuneplane.fleet_fit(v_gpus, v_cpus, v_memory, v_needs_rt) ff
         WHERE ff.fleet = v_fleet_name;
        IF v_fleet.fleet_id IS NULL THEN
            RAISE EXCEPTION 'no fleet named %; fleets: %', v_fleet_name, coalesce(v_listing, 'none')
                USING ERRCODE = 'TP404', COLUMN = 'fleet';
        END IF;
        IF v_fleet.capable_nodes < v_nodes THEN
            RAISE EXCEPTION 'fleet % cannot satisfy this request (%): % of its % nodes fit; fleets: %',
                v_fleet.fleet, v_shape, v_fleet.capable_nodes, v_fleet.non_retired_nodes, v_listing
                USING ERRCODE = 'TP422', COLUMN = 'fleet';
        END IF;
        v_choice := 'named';
    ELSE
        IF v_listing IS NULL THEN
            RAISE EXCEPTION 'there are no fleets yet; an operator must add one before jobs can be previewed'
                USING ERRCODE = 'TP422', COLUMN = 'fleet';
        END IF;
        IF v_count = 0 THEN
            RAISE EXCEPTION 'no fleet can satisfy this request (%); fleets: %', v_shape, v_listing
                USING ERRCODE = 'TP422', COLUMN = 'fleet';
        END IF;
        IF v_count > 1 THEN
            SELECT string_agg(ff.fleet, ', ' ORDER BY ff.fleet) INTO v_listing
              FROM tuneplane.fleet_fit(v_gpus, v_cpus, v_memory, v_needs_rt) ff
             WHERE ff.capable_nodes >= v_nodes;
            RAISE EXCEPTION 'several fleets can satisfy this request: %; name one with fleet', v_listing
                USING ERRCODE = 'TP422', COLUMN = 'fleet';
        END IF;
        SELECT * INTO v_fleet FROM tuneplane.fleet_fit(v_gpus, v_cpus, v_memory, v_needs_rt) ff
         WHERE ff.capable_nodes >= v_nodes;
        v_choice := 'automatic';
        v_warnings := v_warnings || to_jsonb(format(
            'no fleet named: chose %s (backend %s), the only fleet that can satisfy this request',
            v_fleet.fleet, v_fleet.backend));
    END IF;
    PERFORM tuneplane.require_fleet_for_team(v_fleet.fleet_id, v_team);
    IF v_fleet.backend = 'slurm' THEN
        -- What Slurm would accept and leave pending forever (slurm.sql).
        PERFORM tuneplane.slurm_preview_check(v_fleet.fleet_id, v_nodes, (res ->> 'time_limit_minutes')::integer);
    END IF;
    IF v_gpus > 0 AND v_fleet.simulated_gpus THEN
        v_warnings := v_warnings || to_jsonb(format(
            'fleet %s reports simulated GPUs: the job gets GPU indices but no real GPU', v_fleet.fleet));
    END IF;

    v_resolved := jsonb_build_object(
        'schema', 'tuneplane.preview/v1',
        'owner', owner.username,
        'team', jsonb_build_object('id', v_team.id, 'name', v_team.name),
        'input', v_input,
        'integration', p_pins -> 'integration',
        'runtime', p_pins -> 'runtime',
        'fleet', jsonb_build_object('id', v_fleet.fleet_id, 'name', v_fleet.fleet,
                                    'backend', v_fleet.backend, 'chosen', v_choice),
        'resources', jsonb_build_object('nodes', v_nodes, 'gpus_per_node', v_gpus, 'cpus_per_node', v_cpus,
                                        'memory_per_node', v_memory, 'total_gpus', v_nodes * v_gpus)
                     || CASE WHEN res ? 'time_limit_minutes'
                             THEN jsonb_build_object('time_limit_minutes', (res ->> 'time_limit_minutes')::integer)
                             ELSE '{}'::jsonb END,
        'env', coalesce(p_spec -> 'env', '{}'::jsonb),
        'max_attempts', coalesce((p_spec ->> 'max_attempts')::integer, 1),
        'inputs', v_inputs,
        'outputs', coalesce(p_spec -> 'outputs', '[]'::jsonb),
        'resume', tuneplane.resolve_resume(owner.id, p_spec -> 'resume'),
        'policy', jsonb_build_object('max_gpus_per_job', v_limits.max_gpus_per_job,
                                     'max_nodes_per_job', v_limits.max_nodes_per_job),
        'warnings', v_warnings)
        || tuneplane.resolve_preemption(p_spec)
        -- Only when set, so the digests of previews that do not use it stay as they were (docs/idle.md).
        || CASE WHEN p_spec ->> 'resume_when_idle_reclaimed' = 'true'
                THEN jsonb_build_object('resume_when_idle_reclaimed', true) ELSE '{}'::jsonb END;
    -- The priority class is the team's to use only up to its grant; the grace within the fleet's cap.
    PERFORM tuneplane.require_priority_grant(owner, v_team, v_fleet.fleet_id, v_resolved);
    v_canonical := tuneplane.canonical_json(v_resolved);

    INSERT INTO tuneplane.previews (owner_id, fleet_id, spec, resolved, canonical, digest, observed, expires_at,
                                    team_id)
    VALUES (owner.id, v_fleet.fleet_id, p_spec, v_resolved, v_canonical,
            encode(sha256(convert_to(v_canonical, 'UTF8')), 'hex'),
            jsonb_build_object('capable_nodes', v_fleet.capable_nodes,
                               'non_retired_nodes', v_fleet.non_retired_nodes,
                               'capable_but_unschedulable', v_fleet.capable_but_unschedulable),
            now() + make_interval(secs => tuneplane.submission_setting('preview_ttl_seconds')), v_team.id)
    RETURNING * INTO result;
    RETURN result;
END;
$$;

-- create_preview: create_preview_resolve (0011: policy, archives, inputs, fleet resolution), then the
-- storage check against the chosen fleet's declared capabilities (preview_storage_refusal). A storage
-- refusal is 422 naming the field and raised inside this call, so the preview row rolls back with it.
CREATE OR REPLACE FUNCTION tuneplane.create_preview(p_owner_id bigint, p_spec jsonb, p_pins jsonb)
RETURNS tuneplane.previews
LANGUAGE plpgsql AS $$
DECLARE
    result tuneplane.previews;
    refusal record;
BEGIN
    result := tuneplane.create_preview_resolve(p_owner_id, p_spec, p_pins);
    SELECT * INTO refusal FROM tuneplane.preview_storage_refusal(result.fleet_id, p_spec,
                                                                 result.resolved -> 'inputs');
    IF refusal.field IS NOT NULL THEN
        RAISE EXCEPTION '%', refusal.message USING ERRCODE = 'TP422', COLUMN = refusal.field;
    END IF;
    RETURN result;
END;
$$;

-- get_preview: a preview its owner (or an admin) may see; 404 for anyone else.
CREATE OR REPLACE FUNCTION tuneplane.get_preview(p_actor_id bigint, p_preview_id uuid)
RETURNS tuneplane.previews
LANGUAGE plpgsql STABLE AS $$
DECLARE
    result tuneplane.previews;
BEGIN
    SELECT p.* INTO result
      FROM tuneplane.previews p, tuneplane.users a
     WHERE p.id = p_preview_id AND a.id = p_actor_id AND (p.owner_id = a.id OR a.role = 'admin');
    IF result.id IS NULL THEN
        RAISE EXCEPTION 'no preview % of yours', p_preview_id USING ERRCODE = 'TP404', COLUMN = 'preview_id';
    END IF;
    RETURN result;
END;
$$;

-- v_jobs: one row per job with its owner, team, fleet, digest and the retry key that created it (operators).
CREATE OR REPLACE VIEW tuneplane.v_jobs AS
SELECT j.id,
       j.owner_id,
       u.username AS owner,
       j.preview_id,
       p.digest,
       c.retry_key,
       j.fleet_id,
       f.name AS fleet,
       f.backend,
       j.state,
       j.state_reason,
       j.priority,
       j.nodes,
       j.gpus_per_node,
       j.nodes * j.gpus_per_node AS total_gpus,
       j.cpus_per_node,
       j.memory_per_node,
       j.max_attempts,
       j.spec -> 'input' ->> 'kind' AS input_kind,
       CASE j.spec -> 'input' ->> 'kind'
           WHEN 'recipe' THEN 'recipe ' || (j.spec -> 'input' ->> 'name')
           WHEN 'source' THEN 'source ' || left(j.spec -> 'input' -> 'archive' ->> 'sha256', 12)
                              || ': ' || (j.spec -> 'input' ->> 'entrypoint')
           WHEN 'image' THEN (j.spec -> 'input' ->> 'image') || ': ' || (j.spec -> 'input' ->> 'command')
       END AS input_summary,
       j.spec,
       j.created_at,
       j.updated_at,
       t.name AS team  -- last: CREATE OR REPLACE VIEW only adds columns at the end
  FROM tuneplane.jobs j
  JOIN tuneplane.users u ON u.id = j.owner_id
  JOIN tuneplane.teams t ON t.id = j.team_id
  JOIN tuneplane.fleets f ON f.id = j.fleet_id
  JOIN tuneplane.previews p ON p.id = j.preview_id
  LEFT JOIN tuneplane.confirmations c ON c.job_id = j.id;

-- confirm_preview: preview (owned by the actor) + digest + retry key → a receipt.
-- From nothing to a job in `queued` (with an event saying it waits for resources); NOTIFY
-- tuneplane_job_queued wakes placement, which also polls.
-- Idempotent: the same key with the same preview, or with another preview of the same digest (the same
-- resolved content, e.g. `tuneplane submit` run twice), returns the first receipt (replayed = true),
-- even after the preview expired. The retry key is claimed by the confirmations primary key before the
-- job is written, so N concurrent identical confirmations make one job.
-- Refuses: a malformed key or digest (400), a preview that is not the actor's (404), a digest that does
-- not match (409), the key already used for a preview with other content (409), a preview already
-- confirmed under another key (409), an expired preview (410).
CREATE OR REPLACE FUNCTION tuneplane.confirm_preview(p_actor_id bigint, p_preview_id uuid, p_digest text, p_retry_key text)
RETURNS TABLE (job_id bigint, preview_id uuid, digest text, retry_key text, state text, state_reason text,
               created_at timestamptz, replayed boolean)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    v_preview tuneplane.previews;
    v_conf    tuneplane.confirmations;
    v_job_id  bigint;
    v_res     jsonb;
    v_other   record;
BEGIN
    IF p_retry_key IS NULL OR p_retry_key !~ '^[A-Za-z0-9._:-]{1,200}$' THEN
        RAISE EXCEPTION 'retry key must be 1-200 characters of A-Z a-z 0-9 . _ : -'
            USING ERRCODE = 'TP400', COLUMN = 'retry_key';
    END IF;
    IF p_digest IS NULL OR p_digest !~ '^[0-9a-f]{64}$' THEN
        RAISE EXCEPTION 'digest must be the preview''s 64-character sha256 hex digest'
            USING ERRCODE = 'TP400', COLUMN = 'digest';
    END IF;
    SELECT p.* INTO v_preview FROM tuneplane.previews p WHERE p.id = p_preview_id AND p.owner_id = p_actor_id;
    IF v_preview.id IS NULL THEN
        RAISE EXCEPTION 'no preview % of yours', p_preview_id USING ERRCODE = 'TP404', COLUMN = 'preview_id';
    END IF;
    IF v_preview.digest <> p_digest THEN
        RAISE EXCEPTION 'digest does not match preview %: what you confirm is not what was previewed', p_preview_id
            USING ERRCODE = 'TP409', COLUMN = 'digest';
    END IF;
    -- The team is checked again (teams.sql): the user may have lost their role since the preview, and a
    -- read-only token, or one that does not reach the team, confirms nothing (not even a replay).
    PERFORM tuneplane.require_team_submit(tuneplane.require_active_user(p_actor_id),
                                          (SELECT t.name FROM tuneplane.teams t WHERE t.id = v_preview.team_id));

    SELECT c.* INTO v_conf FROM tuneplane.confirmations c
     WHERE c.owner_id = p_actor_id AND c.retry_key = p_retry_key;
    IF v_conf.job_id IS NULL THEN
        IF v_preview.expires_at <= now() THEN
            RAISE EXCEPTION 'preview % expired at %; preview the job again', p_preview_id, v_preview.expires_at
                USING ERRCODE = 'TP410', COLUMN = 'preview_id';
        END IF;
        v_job_id := nextval(pg_get_serial_sequence('tuneplane.jobs', 'id'));
        -- Claim the key. A concurrent holder makes this wait for its commit, then do nothing.
        INSERT INTO tuneplane.confirmations (owner_id, retry_key, preview_id, digest, job_id)
        VALUES (p_actor_id, p_retry_key, p_preview_id, p_digest, v_job_id)
        ON CONFLICT ON CONSTRAINT confirmations_pkey DO NOTHING;
        IF FOUND THEN
            v_res := v_preview.resolved -> 'resources';
            INSERT INTO tuneplane.jobs (id, owner_id, preview_id, fleet_id, state, state_reason, priority,
                                        nodes, gpus_per_node, cpus_per_node, memory_per_node, max_attempts, spec,
                                        team_id, preemptible, priority_class)
            VALUES (v_job_id, p_actor_id, p_preview_id, v_preview.fleet_id, 'queued',
                    format('waiting for resources: %s × (%s GPU, %s CPU, %s) on fleet %s',
                           (v_res ->> 'nodes')::integer, (v_res ->> 'gpus_per_node')::integer,
                           (v_res ->> 'cpus_per_node')::integer,
                           tuneplane.format_bytes((v_res ->> 'memory_per_node')::bigint),
                           v_preview.resolved -> 'fleet' ->> 'name'),
                    (v_preview.resolved ->> 'priority')::integer,
                    (v_res ->> 'nodes')::integer, (v_res ->> 'gpus_per_node')::integer,
                    (v_res ->> 'cpus_per_node')::integer, (v_res ->> 'memory_per_node')::bigint,
                    (v_preview.resolved ->> 'max_attempts')::integer, v_preview.resolved,
                    v_preview.team_id,
                    -- Previews made before priority classes (0191) have neither: not preemptible, no class.
                    coalesce((v_preview.resolved ->> 'preemptible')::boolean, false),
                    v_preview.resolved ->> 'priority_class')
            ON CONFLICT (preview_id) DO NOTHING;
            IF NOT FOUND THEN
                SELECT j.id, c.retry_key INTO v_other
                  FROM tuneplane.jobs j JOIN tuneplane.confirmations c ON c.job_id = j.id
                 WHERE j.preview_id = p_preview_id;
                RAISE EXCEPTION 'preview % was already confirmed as job % with another retry key (%)',
                    p_preview_id, v_other.id, v_other.retry_key
                    USING ERRCODE = 'TP409', COLUMN = 'retry_key';
            END IF;
            PERFORM pg_notify('tuneplane_job_queued', v_job_id::text);
            RETURN QUERY
                SELECT j.id, j.preview_id, p_digest, p_retry_key, j.state, j.state_reason, j.created_at, false
                  FROM tuneplane.jobs j WHERE j.id = v_job_id;
            RETURN;
        END IF;
        -- Lost the race for this key: read the winner's committed row (a new statement, a new snapshot).
        SELECT c.* INTO v_conf FROM tuneplane.confirmations c
         WHERE c.owner_id = p_actor_id AND c.retry_key = p_retry_key;
    END IF;

    IF v_conf.preview_id <> p_preview_id AND v_conf.digest <> p_digest THEN
        RAISE EXCEPTION 'retry key % was already used to confirm preview % (job %); a different preview needs a new retry key',
            p_retry_key, v_conf.preview_id, v_conf.job_id
            USING ERRCODE = 'TP409', COLUMN = 'retry_key';
    END IF;
    RETURN QUERY
        SELECT j.id, j.preview_id, v_conf.digest, v_conf.retry_key, j.state, j.state_reason, j.created_at, true
          FROM tuneplane.jobs j WHERE j.id = v_conf.job_id;
END;
$$;

-- list_jobs: the actor's jobs (an admin's: everyone's), newest first, optionally by state, owner
-- (username), fleet (name) and team (name); at most 500, older than p_before_id (keyset paging). A filter naming an
-- owner, fleet or team that does not exist matches nothing (it is not an error: the list is just empty).
DROP FUNCTION IF EXISTS tuneplane.list_jobs(bigint, text, integer, bigint, text, text);
CREATE OR REPLACE FUNCTION tuneplane.list_jobs(p_actor_id bigint, p_state text DEFAULT NULL, p_limit integer DEFAULT 100,
                                    p_before_id bigint DEFAULT NULL, p_owner text DEFAULT NULL,
                                    p_fleet text DEFAULT NULL, p_team text DEFAULT NULL)
RETURNS SETOF tuneplane.v_jobs
LANGUAGE plpgsql STABLE AS $$
DECLARE
    actor tuneplane.users;
BEGIN
    SELECT * INTO actor FROM tuneplane.users WHERE id = p_actor_id AND disabled_at IS NULL;
    IF actor.id IS NULL THEN
        RAISE EXCEPTION 'no such active user' USING ERRCODE = 'TP401', COLUMN = 'user';
    END IF;
    IF p_state IS NOT NULL
       AND p_state NOT IN ('queued', 'reserved', 'preparing', 'running', 'succeeded', 'failed', 'cancelled') THEN
        RAISE EXCEPTION 'state must be one of queued, reserved, preparing, running, succeeded, failed, cancelled'
            USING ERRCODE = 'TP400', COLUMN = 'state';
    END IF;
    RETURN QUERY
        SELECT v.* FROM tuneplane.v_jobs v JOIN tuneplane.jobs j ON j.id = v.id
          LEFT JOIN tuneplane.team_members tm ON tm.team_id = j.team_id AND tm.user_id = actor.id
          CROSS JOIN tuneplane.request_token_scope() ts
         WHERE tuneplane.job_access_allowed(actor, j, 'read', tm.role, ts.read_only, ts.teams)
           AND (p_state IS NULL OR v.state = p_state)
           AND (p_owner IS NULL OR v.owner = p_owner)
           AND (p_fleet IS NULL OR v.fleet = p_fleet)
           AND (p_team IS NULL OR v.team = p_team)
           AND (p_before_id IS NULL OR v.id < p_before_id)
         ORDER BY v.id DESC
         LIMIT least(greatest(coalesce(p_limit, 100), 1), 500);
END;
$$;

-- job_owners_visible: the owners whose jobs the actor may see (the jobs list's owner filter), and the
-- actor themselves; nothing for a disabled or unknown actor.
CREATE OR REPLACE FUNCTION tuneplane.job_owners_visible(p_actor_id bigint)
RETURNS TABLE (owner text)
LANGUAGE sql STABLE AS $$
    SELECT u.username
      FROM tuneplane.users u
      JOIN tuneplane.users actor ON actor.id = p_actor_id AND actor.disabled_at IS NULL
     WHERE u.id = actor.id
        OR EXISTS (SELECT 1 FROM tuneplane.jobs j
                     LEFT JOIN tuneplane.team_members tm ON tm.team_id = j.team_id AND tm.user_id = actor.id
                     CROSS JOIN tuneplane.request_token_scope() ts
                    WHERE j.owner_id = u.id
                      AND tuneplane.job_access_allowed(actor, j, 'read', tm.role, ts.read_only, ts.teams))
     ORDER BY 1;
$$;

-- get_job: the v_jobs row of a job the user may read (require_job_access, access.sql); 404 otherwise.
CREATE OR REPLACE FUNCTION tuneplane.get_job(p_actor_id bigint, p_job_id bigint)
RETURNS SETOF tuneplane.v_jobs
LANGUAGE plpgsql STABLE AS $$
BEGIN
    PERFORM tuneplane.require_job_access(p_actor_id, p_job_id, 'read');
    RETURN QUERY SELECT v.* FROM tuneplane.v_jobs v WHERE v.id = p_job_id;
END;
$$;

-- job_events_of: a visible job's events, oldest first.
CREATE OR REPLACE FUNCTION tuneplane.job_events_of(p_actor_id bigint, p_job_id bigint)
RETURNS SETOF tuneplane.job_events
LANGUAGE plpgsql STABLE AS $$
BEGIN
    PERFORM tuneplane.require_job_access(p_actor_id, p_job_id, 'read');
    RETURN QUERY SELECT e.* FROM tuneplane.job_events e WHERE e.job_id = p_job_id ORDER BY e.id;
END;
$$;

-- job_transition: moves a job from p_from to p_to with a reason; the jobs trigger writes the event
-- (with p_detail). Refuses (409) when the job is not in p_from or would leave a terminal state.
-- For placement, launch and cancellation functions to build on; enqueues nothing itself.
CREATE OR REPLACE FUNCTION tuneplane.job_transition(p_job_id bigint, p_from text, p_to text, p_reason text,
                                         p_detail jsonb DEFAULT '{}'::jsonb)
RETURNS tuneplane.jobs
LANGUAGE plpgsql AS $$
DECLARE
    result tuneplane.jobs;
    v_now  text;
BEGIN
    IF coalesce(p_reason, '') = '' THEN
        RAISE EXCEPTION 'a transition needs a reason' USING ERRCODE = 'TP400', COLUMN = 'reason';
    END IF;
    PERFORM set_config('tuneplane.event_detail', coalesce(p_detail, '{}'::jsonb)::text, true);
    UPDATE tuneplane.jobs SET state = p_to, state_reason = p_reason
     WHERE id = p_job_id AND state = p_from
    RETURNING * INTO result;
    PERFORM set_config('tuneplane.event_detail', '', true);
    IF result.id IS NULL THEN
        SELECT state INTO v_now FROM tuneplane.jobs WHERE id = p_job_id;
        RAISE EXCEPTION 'job % is %, not %', p_job_id, coalesce(v_now, 'missing'), p_from
            USING ERRCODE = CASE WHEN v_now IS NULL THEN 'TP404' ELSE 'TP409' END, COLUMN = 'state';
    END IF;
    RETURN result;
END;
$$;

-- explain_job: a new reason for a job that stays in p_state (why it still waits); an event only when the
-- reason really changes. Returns false when the job is no longer in p_state.
CREATE OR REPLACE FUNCTION tuneplane.explain_job(p_job_id bigint, p_state text, p_reason text)
RETURNS boolean
LANGUAGE plpgsql AS $$
BEGIN
    IF coalesce(p_reason, '') = '' THEN
        RAISE EXCEPTION 'a reason cannot be empty' USING ERRCODE = 'TP400', COLUMN = 'reason';
    END IF;
    UPDATE tuneplane.jobs SET state_reason = p_reason
     WHERE id = p_job_id AND state = p_state AND state_reason IS DISTINCT FROM p_reason;
    RETURN FOUND OR EXISTS (SELECT 1 FROM tuneplane.jobs WHERE id = p_job_id AND state = p_state);
END;
$$;
