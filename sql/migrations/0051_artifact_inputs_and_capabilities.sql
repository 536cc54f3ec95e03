-- 0051 artifacts at preview: input pinning and storage capabilities.
--
-- resolve_inputs (0011 left a placeholder that refused every input) now pins each JobSpec input to a
-- complete artifact by manifest digest. create_preview is wrapped: the 0011 function keeps its body
-- under the name create_preview_resolve, and the new create_preview calls it and then checks what only
-- the chosen fleet can answer: whether the spec's outputs and inputs can be delivered there (object
-- delivery, shared mounts). A refusal raised here aborts the whole call, so a refused preview still
-- stores nothing.

-- resolve_artifact_ref: the artifact an input reference names, as the owner may see it.
--   "<job id>/<name>"          the artifact NAME of that job (latest attempt; the only member that has one)
--   "<job id>/<name>@<rank>"   … of that member
--   "sha256:<digest>" or the bare 64-hex digest: the newest complete artifact with that manifest digest
--                              among the owner's jobs (any job for an admin)
-- Refuses an unparsable reference (422), an unknown one (404) and an ambiguous name (409); p_field is
-- the field named in the refusal.
CREATE FUNCTION tuneplane.resolve_artifact_ref(p_owner_id bigint, p_ref text, p_field text)
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
         WHERE ar.manifest_digest = v_digest AND (j.owner_id = u.id OR u.role = 'admin')
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
CREATE FUNCTION tuneplane.preview_storage_refusal(p_fleet_id bigint, p_spec jsonb, p_inputs jsonb)
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

ALTER FUNCTION tuneplane.create_preview(bigint, jsonb, jsonb) RENAME TO create_preview_resolve;

-- create_preview: create_preview_resolve (0011: policy, archives, inputs, fleet resolution), then the
-- storage check against the chosen fleet's declared capabilities (preview_storage_refusal). A storage
-- refusal is 422 naming the field and raised inside this call, so the preview row rolls back with it.
CREATE FUNCTION tuneplane.create_preview(p_owner_id bigint, p_spec jsonb, p_pins jsonb)
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
