-- 0011 preview: resolving a JobSpec into a frozen, digested preview. Python validates the JobSpec
-- (pydantic), pins what only it can see (the integration files' sha256, the Python environment, the
-- normalised image reference) and calls create_preview; every rule that decides *whether* and *where*
-- lives here: policy limits, archive ownership, input pinning, fleet resolution, expiry.

-- canonical_json: the one text form a digest is computed over. Object keys sorted by code point, no
-- whitespace, strings escaped as jsonb escapes them, numbers in PostgreSQL's numeric text form.
-- app/submission/canonical.py writes the same text from Python.
CREATE FUNCTION tuneplane.canonical_json(p_value jsonb) RETURNS text
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
CREATE FUNCTION tuneplane.format_bytes(p_bytes bigint) RETURNS text
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
CREATE FUNCTION tuneplane.submission_setting(p_name text) RETURNS bigint
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
CREATE FUNCTION tuneplane.set_submission_setting(p_actor_id bigint, p_name text, p_value bigint)
RETURNS tuneplane.submission_settings
LANGUAGE plpgsql AS $$
DECLARE
    result tuneplane.submission_settings;
BEGIN
    IF NOT EXISTS (SELECT 1 FROM tuneplane.users WHERE id = p_actor_id AND role = 'admin' AND disabled_at IS NULL) THEN
        RAISE EXCEPTION 'changing submission settings needs the admin role' USING ERRCODE = 'TP403', COLUMN = 'user';
    END IF;
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
CREATE FUNCTION tuneplane.set_user_limits(p_actor_id bigint, p_username text,
                                          p_max_gpus_per_job integer, p_max_nodes_per_job integer)
RETURNS tuneplane.user_limits
LANGUAGE plpgsql AS $$
DECLARE
    target bigint;
    result tuneplane.user_limits;
BEGIN
    IF NOT EXISTS (SELECT 1 FROM tuneplane.users WHERE id = p_actor_id AND role = 'admin' AND disabled_at IS NULL) THEN
        RAISE EXCEPTION 'setting limits needs the admin role' USING ERRCODE = 'TP403', COLUMN = 'user';
    END IF;
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
CREATE FUNCTION tuneplane.effective_limits(p_user_id bigint)
RETURNS TABLE (max_gpus_per_job bigint, max_nodes_per_job bigint)
LANGUAGE sql STABLE AS $$
    SELECT coalesce(l.max_gpus_per_job::bigint, tuneplane.submission_setting('max_gpus_per_job')),
           coalesce(l.max_nodes_per_job::bigint, tuneplane.submission_setting('max_nodes_per_job'))
      FROM (SELECT p_user_id AS user_id) AS who
      LEFT JOIN tuneplane.user_limits l ON l.user_id = who.user_id;
$$;

-- record_source_archive: a validated, stored archive; the uploader may now name it in a JobSpec.
-- Idempotent: the same content uploaded again (by anyone) is the same row.
CREATE FUNCTION tuneplane.record_source_archive(p_user_id bigint, p_sha256 text, p_size_bytes bigint,
                                                p_member_count integer, p_unpacked_bytes bigint)
RETURNS tuneplane.source_archives
LANGUAGE plpgsql AS $$
DECLARE
    result tuneplane.source_archives;
BEGIN
    IF NOT EXISTS (SELECT 1 FROM tuneplane.users WHERE id = p_user_id AND disabled_at IS NULL) THEN
        RAISE EXCEPTION 'no such active user' USING ERRCODE = 'TP401', COLUMN = 'user';
    END IF;
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

-- resolve_inputs: pins each input to a completed artifact by manifest digest. The artifacts issue
-- replaces this function (CREATE OR REPLACE in its own migration). Until then an input is refused,
-- never silently dropped.
CREATE FUNCTION tuneplane.resolve_inputs(p_owner_id bigint, p_inputs jsonb) RETURNS jsonb
LANGUAGE plpgsql STABLE AS $$
BEGIN
    IF p_inputs IS NOT NULL AND jsonb_typeof(p_inputs) = 'array' AND jsonb_array_length(p_inputs) > 0 THEN
        RAISE EXCEPTION 'input artifacts cannot be pinned yet (no artifact store in this installation); remove inputs'
            USING ERRCODE = 'TP422', COLUMN = 'inputs';
    END IF;
    RETURN '[]'::jsonb;
END;
$$;

-- fleet_fit: for every fleet, how many non-retired nodes could each hold one member of the given shape
-- by their reported capacity (whether they are free now is placement's business, not preview's).
CREATE FUNCTION tuneplane.fleet_fit(p_gpus_per_node integer, p_cpus_per_node integer,
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

-- create_preview: resolves a validated JobSpec (p_spec) plus the pins Python computed (p_pins: input,
-- integration, runtime, warnings) into an immutable preview with a digest and an expiry.
-- Refuses (and stores nothing): inactive owner (401), bad resources (422), policy limits (403), an
-- archive the owner did not upload (404), unpinnable inputs (422), an unknown fleet (404), a named
-- fleet that cannot satisfy the request (422), no fleet or several fleets able to when none is named
-- (422, listing them). Never falls back to another fleet or backend. Creates no job, enqueues nothing.
CREATE FUNCTION tuneplane.create_preview(p_owner_id bigint, p_spec jsonb, p_pins jsonb)
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
    result       tuneplane.previews;
BEGIN
    SELECT * INTO owner FROM tuneplane.users WHERE id = p_owner_id AND disabled_at IS NULL;
    IF owner.id IS NULL THEN
        RAISE EXCEPTION 'no such active user' USING ERRCODE = 'TP401', COLUMN = 'user';
    END IF;
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
    IF v_gpus > 0 AND v_fleet.simulated_gpus THEN
        v_warnings := v_warnings || to_jsonb(format(
            'fleet %s reports simulated GPUs: the job gets GPU indices but no real GPU', v_fleet.fleet));
    END IF;

    v_resolved := jsonb_build_object(
        'schema', 'tuneplane.preview/v1',
        'owner', owner.username,
        'input', v_input,
        'integration', p_pins -> 'integration',
        'runtime', p_pins -> 'runtime',
        'fleet', jsonb_build_object('id', v_fleet.fleet_id, 'name', v_fleet.fleet,
                                    'backend', v_fleet.backend, 'chosen', v_choice),
        'resources', jsonb_build_object('nodes', v_nodes, 'gpus_per_node', v_gpus, 'cpus_per_node', v_cpus,
                                        'memory_per_node', v_memory, 'total_gpus', v_nodes * v_gpus),
        'env', coalesce(p_spec -> 'env', '{}'::jsonb),
        'max_attempts', coalesce((p_spec ->> 'max_attempts')::integer, 1),
        'priority', coalesce((p_spec ->> 'priority')::integer, 0),
        'inputs', v_inputs,
        'outputs', coalesce(p_spec -> 'outputs', '[]'::jsonb),
        'policy', jsonb_build_object('max_gpus_per_job', v_limits.max_gpus_per_job,
                                     'max_nodes_per_job', v_limits.max_nodes_per_job),
        'warnings', v_warnings);
    v_canonical := tuneplane.canonical_json(v_resolved);

    INSERT INTO tuneplane.previews (owner_id, fleet_id, spec, resolved, canonical, digest, observed, expires_at)
    VALUES (owner.id, v_fleet.fleet_id, p_spec, v_resolved, v_canonical,
            encode(sha256(convert_to(v_canonical, 'UTF8')), 'hex'),
            jsonb_build_object('capable_nodes', v_fleet.capable_nodes,
                               'non_retired_nodes', v_fleet.non_retired_nodes,
                               'capable_but_unschedulable', v_fleet.capable_but_unschedulable),
            now() + make_interval(secs => tuneplane.submission_setting('preview_ttl_seconds')))
    RETURNING * INTO result;
    RETURN result;
END;
$$;

-- get_preview: a preview its owner (or an admin) may see; 404 for anyone else.
CREATE FUNCTION tuneplane.get_preview(p_actor_id bigint, p_preview_id uuid)
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
