-- sql/functions/artifacts.sql — the current definition of every artifacts function, view and trigger.
-- Artifacts: outputs and inputs, uploads, manifests and their verification, operator functions.
--
-- Repeatable file (ADR 0012): `tuneplane db migrate` re-applies every file of sql/functions/ (in the order
-- of order.txt, one transaction) whenever one changes. Edit definitions here, never in a migration.
-- Tables, columns and data changes go in a new numbered migration. A changed signature or a view whose
-- columns change: add its DROP below (it runs before the new definition is created), e.g.
--   DROP FUNCTION IF EXISTS tuneplane.f(bigint, text);
--
-- Drops (signature changes):
DROP FUNCTION IF EXISTS tuneplane.record_artifact_chunk(text, bigint, integer, integer, integer, text);
DROP FUNCTION IF EXISTS tuneplane.artifact_file_chunks(text, bigint, integer);
DROP FUNCTION IF EXISTS tuneplane.job_artifacts(bigint, bigint);
-- register_artifact gained p_step (0220: the training step a checkpoint holds).
DROP FUNCTION IF EXISTS tuneplane.register_artifact(text, bigint, text, text, text, jsonb, text, text);
-- job_visible_to: replaced by require_job_access (access.sql), which also refuses a disabled user.
DROP FUNCTION IF EXISTS tuneplane.job_visible_to(bigint, bigint);
-- artifact_file_list gained object_key (0320: where an S3 fleet's file lives in its store).
DROP FUNCTION IF EXISTS tuneplane.artifact_file_list(bigint);
-- artifact_file_state gained path, size and sha256 (direct S3 delivery asks it at every step).
DROP FUNCTION IF EXISTS tuneplane.artifact_file_state(text, bigint, integer);

-- A complete artifact never changes: not its manifest, not its state, not its files.
CREATE OR REPLACE FUNCTION tuneplane.artifacts_guard_change() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'DELETE' THEN
        IF OLD.state IN ('complete', 'pruned') THEN
            RAISE EXCEPTION 'artifact % is %; its manifest is immutable', OLD.id, OLD.state USING ERRCODE = 'TP409';
        END IF;
        RETURN OLD;
    END IF;
    -- A complete checkpoint may only be pruned by retention (prune_checkpoints): state, reason and
    -- pruned_at change, the manifest and everything else stay.
    IF OLD.state = 'complete' AND NEW.state = 'pruned' AND OLD.kind = 'checkpoint'
       AND (to_jsonb(OLD) - ARRAY['state', 'reason', 'pruned_at', 'updated_at'])
           = (to_jsonb(NEW) - ARRAY['state', 'reason', 'pruned_at', 'updated_at']) THEN
        NEW.updated_at := now();
        RETURN NEW;
    END IF;
    IF OLD.state IN ('complete', 'pruned') THEN
        RAISE EXCEPTION 'artifact % is %; its manifest is immutable', OLD.id, OLD.state
            USING ERRCODE = 'TP409', COLUMN = 'manifest';
    END IF;
    IF NEW.state = 'complete' AND EXISTS (
        SELECT 1 FROM tuneplane.artifact_files f WHERE f.artifact_id = NEW.id AND f.verified_at IS NULL) THEN
        RAISE EXCEPTION 'artifact % cannot be complete while a file is unverified', NEW.id
            USING ERRCODE = 'TP409', COLUMN = 'state';
    END IF;
    NEW.updated_at := now();
    RETURN NEW;
END;
$$;

CREATE OR REPLACE TRIGGER artifacts_guard_change
    BEFORE UPDATE OR DELETE ON tuneplane.artifacts
    FOR EACH ROW EXECUTE FUNCTION tuneplane.artifacts_guard_change();

CREATE OR REPLACE FUNCTION tuneplane.artifact_files_guard_change() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    parent_state text;
BEGIN
    SELECT state INTO parent_state FROM tuneplane.artifacts WHERE id = OLD.artifact_id;
    IF parent_state IN ('complete', 'pruned') THEN
        RAISE EXCEPTION 'artifact % is complete; its files are immutable', OLD.artifact_id USING ERRCODE = 'TP409';
    END IF;
    RETURN CASE WHEN TG_OP = 'DELETE' THEN OLD ELSE NEW END;
END;
$$;

CREATE OR REPLACE TRIGGER artifact_files_guard_change
    BEFORE UPDATE OR DELETE ON tuneplane.artifact_files
    FOR EACH ROW EXECUTE FUNCTION tuneplane.artifact_files_guard_change();

CREATE OR REPLACE TRIGGER artifacts_no_truncate
    BEFORE TRUNCATE ON tuneplane.artifacts
    FOR EACH STATEMENT EXECUTE FUNCTION tuneplane.refuse_change();

CREATE OR REPLACE TRIGGER artifact_files_no_truncate
    BEFORE TRUNCATE ON tuneplane.artifact_files
    FOR EACH STATEMENT EXECUTE FUNCTION tuneplane.refuse_change();

-- artifact_manifest_canonical: the canonical JSON text of a (validated) manifest; see the header.
CREATE OR REPLACE FUNCTION tuneplane.artifact_manifest_canonical(p_manifest jsonb)
RETURNS text
LANGUAGE sql IMMUTABLE STRICT AS $$
    SELECT '{"files":[' || coalesce(string_agg(
               '{"path":' || to_json(f ->> 'path')::text
               || ',"sha256":"' || (f ->> 'sha256')
               || '","size":' || ((f ->> 'size')::numeric)::bigint::text || '}',
               ',' ORDER BY (f ->> 'path') COLLATE "C"), '')
           || '],"version":1}'
      FROM jsonb_array_elements(p_manifest -> 'files') AS f;
$$;

CREATE OR REPLACE FUNCTION tuneplane.artifact_manifest_digest(p_manifest jsonb)
RETURNS text
LANGUAGE sql IMMUTABLE STRICT AS $$
    SELECT encode(sha256(convert_to(tuneplane.artifact_manifest_canonical(p_manifest), 'UTF8')), 'hex');
$$;

-- artifact_manifest_problem: NULL for a well-formed manifest, else what is wrong (first problem found).
CREATE OR REPLACE FUNCTION tuneplane.artifact_manifest_problem(p_manifest jsonb)
RETURNS text
LANGUAGE plpgsql IMMUTABLE AS $$
DECLARE
    f jsonb;
    p text;
BEGIN
    IF p_manifest IS NULL OR jsonb_typeof(p_manifest) <> 'object' THEN
        RETURN 'manifest must be a JSON object';
    END IF;
    IF (SELECT array_agg(k ORDER BY k) FROM jsonb_object_keys(p_manifest) k) <> ARRAY['files', 'version'] THEN
        RETURN 'manifest must have exactly the keys files and version';
    END IF;
    IF p_manifest -> 'version' <> '1'::jsonb THEN
        RETURN 'manifest version must be 1';
    END IF;
    IF jsonb_typeof(p_manifest -> 'files') <> 'array' THEN
        RETURN 'manifest files must be a list';
    END IF;
    FOR f IN SELECT value FROM jsonb_array_elements(p_manifest -> 'files') LOOP
        IF jsonb_typeof(f) <> 'object'
           OR (SELECT array_agg(k ORDER BY k) FROM jsonb_object_keys(f) k) <> ARRAY['path', 'sha256', 'size'] THEN
            RETURN 'each manifest entry must have exactly path, sha256 and size';
        END IF;
        p := f ->> 'path';
        IF jsonb_typeof(f -> 'path') <> 'string' OR p = '' OR length(p) > 4096 OR p ~ '[\x01-\x1f\x7f]'
           OR left(p, 1) = '/' OR ('/' || p || '/') ~ '/(\.\.?)?/' THEN
            RETURN format('unsafe manifest path %s (relative POSIX paths without ., .. or empty parts)',
                          to_json(p)::text);
        END IF;
        IF jsonb_typeof(f -> 'sha256') <> 'string' OR (f ->> 'sha256') !~ '^[0-9a-f]{64}$' THEN
            RETURN format('%s: sha256 must be 64 lowercase hex characters', p);
        END IF;
        IF jsonb_typeof(f -> 'size') <> 'number' OR (f ->> 'size') !~ '^[0-9]+$' THEN
            RETURN format('%s: size must be a non-negative integer', p);
        END IF;
    END LOOP;
    IF (SELECT count(DISTINCT value ->> 'path') FROM jsonb_array_elements(p_manifest -> 'files'))
       <> jsonb_array_length(p_manifest -> 'files') THEN
        RETURN 'a manifest path is listed twice';
    END IF;
    RETURN NULL;
END;
$$;

-- fleet_storage_capabilities: what a fleet declares about artifact delivery. object_delivery defaults to
-- true (every node backend reaches the server's blob store through its control channel) unless the fleet
-- says false; shared_mounts defaults to false and needs an absolute shared_path.
CREATE OR REPLACE FUNCTION tuneplane.fleet_storage_capabilities(p_capabilities jsonb)
RETURNS TABLE (object_delivery boolean, shared_mounts boolean, shared_path text)
LANGUAGE sql IMMUTABLE AS $$
    SELECT coalesce((p_capabilities ->> 'object_delivery')::boolean, true),
           coalesce((p_capabilities ->> 'shared_mounts')::boolean, false)
               AND (p_capabilities ->> 'shared_path') LIKE '/%',
           CASE WHEN coalesce((p_capabilities ->> 'shared_mounts')::boolean, false)
                THEN nullif(rtrim(p_capabilities ->> 'shared_path', '/'), '') END;
$$;

-- artifact_node_member: the member p_member_id if the node behind the credential runs it. Refuses an
-- invalid credential (401, via authenticate_node_credential), a member of another node (403) and a member
-- whose node was fenced (lost: it no longer owns its outputs).
CREATE OR REPLACE FUNCTION tuneplane.artifact_node_member(p_credential_hash text, p_member_id bigint)
RETURNS tuneplane.members
LANGUAGE plpgsql AS $$
DECLARE
    v_node bigint;
    m tuneplane.members;
BEGIN
    SELECT a.node_id INTO v_node FROM tuneplane.authenticate_node_credential(p_credential_hash) a;
    SELECT * INTO m FROM tuneplane.members WHERE id = p_member_id;
    IF m.id IS NULL OR m.node_id <> v_node THEN
        RAISE EXCEPTION 'member % does not run on this node', p_member_id USING ERRCODE = 'TP403',
            COLUMN = 'member_id';
    END IF;
    IF m.state = 'lost' THEN
        RAISE EXCEPTION 'member % was fenced (lost); it can no longer deliver artifacts', p_member_id
            USING ERRCODE = 'TP409', COLUMN = 'member_id';
    END IF;
    RETURN m;
END;
$$;

-- artifact_for_node: the artifact p_artifact_id, locked, if the node behind the credential produced it.
CREATE OR REPLACE FUNCTION tuneplane.artifact_for_node(p_credential_hash text, p_artifact_id bigint)
RETURNS tuneplane.artifacts
LANGUAGE plpgsql AS $$
DECLARE
    a tuneplane.artifacts;
BEGIN
    SELECT * INTO a FROM tuneplane.artifacts WHERE id = p_artifact_id FOR UPDATE;
    IF a.id IS NULL THEN
        RAISE EXCEPTION 'no artifact %', p_artifact_id USING ERRCODE = 'TP404', COLUMN = 'artifact_id';
    END IF;
    PERFORM tuneplane.artifact_node_member(p_credential_hash, a.member_id);
    RETURN a;
END;
$$;

-- check_artifact_name_kind: refuses (400, naming the field) an artifact name or kind a node may not use.
CREATE OR REPLACE FUNCTION tuneplane.check_artifact_name_kind(p_name text, p_kind text)
RETURNS void
LANGUAGE plpgsql IMMUTABLE AS $$
BEGIN
    IF p_name IS NULL OR p_name !~ '^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$' THEN
        RAISE EXCEPTION 'artifact name must be 1-63 characters of letters, digits, . _ -' USING ERRCODE = 'TP400',
            COLUMN = 'name';
    END IF;
    IF coalesce(p_kind, '') NOT IN ('output', 'checkpoint', 'logs') THEN
        RAISE EXCEPTION 'artifact kind must be output, checkpoint or logs' USING ERRCODE = 'TP400', COLUMN = 'kind';
    END IF;
END;
$$;

-- checkpoint_label: how every text names a checkpoint: `ckpt.3 (step 1200)`, or `ckpt.3` when the workload
-- did not say its step (the preemption and resume words, the job page's attempts).
CREATE OR REPLACE FUNCTION tuneplane.checkpoint_label(p_artifact tuneplane.artifacts)
RETURNS text
LANGUAGE sql IMMUTABLE AS $$
    SELECT p_artifact.name || CASE WHEN p_artifact.step IS NULL THEN ''
                                   ELSE format(' (step %s)', p_artifact.step) END;
$$;

-- checkpoint_numbers: the highest number each checkpoint name has reached in the job for one rank, over every
-- attempt ({"checkpoint": 4, "ckpt": 2}): PREPARE passes it on so an attempt's agent numbers its checkpoints
-- on from there (checkpoint.5, …) and a name means one artifact of the job's rank (issue 35: each attempt
-- restarted at checkpoint.1).
CREATE OR REPLACE FUNCTION tuneplane.checkpoint_numbers(p_job_id bigint, p_rank integer)
RETURNS jsonb
LANGUAGE sql STABLE AS $$
    SELECT coalesce(jsonb_object_agg(x.base, x.n), '{}'::jsonb)
      FROM (SELECT substring(a.name FROM '^(.*)\.[0-9]{1,9}$') AS base,
                   max(substring(a.name FROM '\.([0-9]{1,9})$')::bigint) AS n
              FROM tuneplane.artifacts a
             WHERE a.job_id = p_job_id AND a.rank = p_rank AND a.kind = 'checkpoint'
             GROUP BY 1) x
     WHERE x.base IS NOT NULL;
$$;

-- artifact_complete_when_verified: uploading → complete when no file of the artifact is unverified (every
-- file re-hashed by the server; vacuously for a manifest without files), then checkpoint retention. Any
-- other artifact, or one with a file left to verify, is returned unchanged. The one place completion is
-- decided: record_artifact_file, finish_artifact and register_artifact call it.
CREATE OR REPLACE FUNCTION tuneplane.artifact_complete_when_verified(p_artifact tuneplane.artifacts)
RETURNS tuneplane.artifacts
LANGUAGE plpgsql AS $$
DECLARE
    a tuneplane.artifacts := p_artifact;
BEGIN
    IF a.state <> 'uploading' OR EXISTS (SELECT 1 FROM tuneplane.artifact_files af
                                          WHERE af.artifact_id = a.id AND af.verified_at IS NULL) THEN
        RETURN a;
    END IF;
    UPDATE tuneplane.artifacts SET state = 'complete', completed_at = now(),
           reason = format('server verified %s files (%s bytes) against manifest %s',
                           a.file_count, a.total_bytes, left(a.manifest_digest, 16))
     WHERE id = a.id RETURNING * INTO a;
    IF a.kind = 'checkpoint' THEN
        PERFORM tuneplane.prune_checkpoints(a.job_id);
    END IF;
    RETURN a;
END;
$$;

-- register_artifact: (none | failed | uploading) → uploading with this manifest. Registering the same
-- manifest again returns the row unchanged (an agent restarted mid-upload resumes on it); a different
-- manifest replaces an uploading or failed one and drops its progress; a complete artifact with the same
-- digest is returned as is, with another digest refused (409, immutable). Refuses a malformed manifest or
-- a digest that does not match it (400), a delivery the member's fleet does not declare (409), a shared
-- path outside the fleet's shared_path (400), and limits exceeded (413).
-- p_step: the training step a checkpoint holds (what the workload told sdk.checkpoint; NULL: not said),
-- shown with its name in the words of preemption and resume (checkpoint_label, preemption.sql). The same
-- manifest registered again keeps the step it was first registered with. Refuses a negative step or a
-- step on an artifact that is not a checkpoint (400, step).
CREATE OR REPLACE FUNCTION tuneplane.register_artifact(p_credential_hash text, p_member_id bigint, p_name text,
                                            p_kind text, p_delivery text, p_manifest jsonb,
                                            p_manifest_digest text, p_shared_path text DEFAULT NULL,
                                            p_step bigint DEFAULT NULL)
RETURNS tuneplane.artifacts
LANGUAGE plpgsql AS $$
DECLARE
    m tuneplane.members;
    caps record;
    s tuneplane.artifact_settings;
    a tuneplane.artifacts;
    problem text;
    digest text;
    n_files integer;
    n_bytes bigint;
    v_shared text;
BEGIN
    m := tuneplane.artifact_node_member(p_credential_hash, p_member_id);
    SELECT * INTO s FROM tuneplane.artifact_settings;
    PERFORM tuneplane.check_artifact_name_kind(p_name, p_kind);
    IF p_step < 0 THEN
        RAISE EXCEPTION 'step must be 0 or more, not %', p_step USING ERRCODE = 'TP400', COLUMN = 'step';
    END IF;
    IF p_step IS NOT NULL AND p_kind <> 'checkpoint' THEN
        RAISE EXCEPTION 'only a checkpoint has a step, not an artifact of kind %', p_kind
            USING ERRCODE = 'TP400', COLUMN = 'step';
    END IF;
    problem := tuneplane.artifact_manifest_problem(p_manifest);
    IF problem IS NOT NULL THEN
        RAISE EXCEPTION '%', problem USING ERRCODE = 'TP400', COLUMN = 'manifest';
    END IF;
    digest := tuneplane.artifact_manifest_digest(p_manifest);
    IF p_manifest_digest IS DISTINCT FROM digest THEN
        RAISE EXCEPTION 'manifest digest % does not match the manifest (its canonical digest is %)',
                        p_manifest_digest, digest USING ERRCODE = 'TP400', COLUMN = 'manifest_digest';
    END IF;
    SELECT count(*), coalesce(sum((f ->> 'size')::bigint), 0) INTO n_files, n_bytes
      FROM jsonb_array_elements(p_manifest -> 'files') f;
    IF n_files > s.max_files OR n_bytes > s.max_total_bytes THEN
        RAISE EXCEPTION 'artifact has % files and % bytes; the limits are % files and % bytes',
                        n_files, n_bytes, s.max_files, s.max_total_bytes USING ERRCODE = 'TP413',
            COLUMN = 'manifest';
    END IF;

    SELECT c.* INTO caps FROM tuneplane.fleets fl
      JOIN tuneplane.nodes n ON n.fleet_id = fl.id
     CROSS JOIN LATERAL tuneplane.fleet_storage_capabilities(fl.capabilities) c
     WHERE n.id = m.node_id;
    IF p_delivery = 'object' THEN
        IF NOT caps.object_delivery THEN
            RAISE EXCEPTION 'this fleet does not declare object_delivery; deliver on its shared mount'
                USING ERRCODE = 'TP409', COLUMN = 'delivery';
        END IF;
        IF p_shared_path IS NOT NULL THEN
            RAISE EXCEPTION 'a shared path is only for delivery shared' USING ERRCODE = 'TP400',
                COLUMN = 'shared_path';
        END IF;
    ELSIF p_delivery = 'shared' THEN
        IF NOT caps.shared_mounts THEN
            RAISE EXCEPTION 'this fleet declares no shared mount (capabilities shared_mounts/shared_path)'
                USING ERRCODE = 'TP409', COLUMN = 'delivery';
        END IF;
        v_shared := rtrim(p_shared_path, '/');
        IF v_shared IS NULL OR v_shared !~ '^/' OR (v_shared || '/') ~ '/(\.\.?)?/'
           OR v_shared = caps.shared_path OR NOT starts_with(v_shared, caps.shared_path || '/') THEN
            RAISE EXCEPTION 'shared path % must be a normalized directory under the fleet''s shared path %',
                            p_shared_path, caps.shared_path USING ERRCODE = 'TP400', COLUMN = 'shared_path';
        END IF;
    ELSE
        RAISE EXCEPTION 'delivery must be object or shared' USING ERRCODE = 'TP400', COLUMN = 'delivery';
    END IF;

    INSERT INTO tuneplane.artifacts (job_id, attempt_id, member_id, rank, name, kind, delivery, shared_path,
                                     manifest, manifest_digest, file_count, total_bytes, chunk_size,
                                     registered_by, step)
    VALUES (m.job_id, m.attempt_id, m.id, m.rank, p_name, p_kind, p_delivery, v_shared, p_manifest, digest,
            n_files, n_bytes, s.chunk_size, 'node:' || m.node_id, p_step)
    ON CONFLICT (member_id, name) DO NOTHING
    RETURNING * INTO a;
    IF a.id IS NULL THEN
        SELECT * INTO a FROM tuneplane.artifacts WHERE member_id = m.id AND name = p_name FOR UPDATE;
        IF a.manifest_digest = digest AND a.state <> 'failed' AND a.delivery = p_delivery
           AND a.shared_path IS NOT DISTINCT FROM v_shared THEN
            RETURN tuneplane.artifact_complete_when_verified(a);  -- the same registration again: resume
        END IF;
        IF a.state IN ('complete', 'pruned') THEN
            RAISE EXCEPTION 'artifact % of member % is complete with manifest %; a complete manifest is immutable',
                            p_name, m.rank, a.manifest_digest USING ERRCODE = 'TP409', COLUMN = 'manifest';
        END IF;
        DELETE FROM tuneplane.artifact_files WHERE artifact_id = a.id;
        UPDATE tuneplane.artifacts
           SET state = 'uploading', reason = 'registered again with ' ||
                   CASE WHEN a.manifest_digest = digest THEN 'the same manifest' ELSE 'a new manifest' END,
               kind = p_kind, delivery = p_delivery, shared_path = v_shared, manifest = p_manifest,
               manifest_digest = digest, file_count = n_files, total_bytes = n_bytes, chunk_size = s.chunk_size,
               step = p_step
         WHERE id = a.id
        RETURNING * INTO a;
    END IF;
    INSERT INTO tuneplane.artifact_files (artifact_id, file_index, path, size, sha256)
    SELECT a.id, (row_number() OVER (ORDER BY f ->> 'path' COLLATE "C")) - 1, f ->> 'path',
           (f ->> 'size')::bigint, f ->> 'sha256'
      FROM jsonb_array_elements(p_manifest -> 'files') f;
    -- A manifest without files (an empty output directory) has nothing left to verify: complete now.
    RETURN tuneplane.artifact_complete_when_verified(a);
END;
$$;

-- artifact_upload_status: where an upload stands, for resuming: per file whether it is verified, which
-- chunks the server holds and whether that is all of them (all_chunks: its assembly is due). Refuses a
-- node that did not produce the artifact.
CREATE OR REPLACE FUNCTION tuneplane.artifact_upload_status(p_credential_hash text, p_artifact_id bigint)
RETURNS jsonb
LANGUAGE plpgsql AS $$
DECLARE
    a tuneplane.artifacts;
BEGIN
    a := tuneplane.artifact_for_node(p_credential_hash, p_artifact_id);
    RETURN jsonb_build_object(
        'artifact_id', a.id, 'state', a.state, 'reason', a.reason, 'chunk_size', a.chunk_size,
        'delivery', a.delivery, 'manifest_digest', a.manifest_digest,
        -- The fleet's store (migration 0245): null for the server's own, else where the node uploads
        -- directly through presigned URLs (app/artifacts/s3_delivery.py). Never credentials.
        'storage', tuneplane.artifact_storage(a.id),
        'files', coalesce((
            SELECT jsonb_agg(jsonb_build_object(
                       'index', f.file_index, 'path', f.path, 'size', f.size, 'sha256', f.sha256,
                       'verified', f.verified_at IS NOT NULL,
                       'chunks', coalesce(held.chunks, '[]'::jsonb),
                       -- every chunk recorded but the file not verified: its assembly is due (a crash or
                       -- a failure of the server's disk interrupted it); finishing the upload retries it
                       'all_chunks', f.verified_at IS NULL AND f.size > 0
                                     AND coalesce(jsonb_array_length(held.chunks), 0)
                                         >= (f.size + a.chunk_size - 1) / a.chunk_size)
                   ORDER BY f.file_index)
              FROM tuneplane.artifact_files f
              LEFT JOIN LATERAL (SELECT jsonb_agg(c.chunk_index ORDER BY c.chunk_index) AS chunks
                                   FROM tuneplane.artifact_chunks c
                                  WHERE c.artifact_id = f.artifact_id AND c.file_index = f.file_index) held ON true
             WHERE f.artifact_id = a.id), '[]'::jsonb));
END;
$$;

-- artifact_file_state: the artifact's state and its file p_file_index (whether it is verified, its path,
-- size and sha256): what the receiver and each step of direct S3 delivery ask about one file
-- (artifact_upload_status answers for every file, too costly per file of an artifact with tens of
-- thousands). Refuses a node that did not produce the artifact, an unknown file (404).
CREATE OR REPLACE FUNCTION tuneplane.artifact_file_state(p_credential_hash text, p_artifact_id bigint,
                                                         p_file_index integer)
RETURNS TABLE (state text, verified boolean, path text, size bigint, sha256 text)
LANGUAGE plpgsql AS $$
DECLARE
    a tuneplane.artifacts;
BEGIN
    a := tuneplane.artifact_for_node(p_credential_hash, p_artifact_id);
    RETURN QUERY SELECT a.state, f.verified_at IS NOT NULL, f.path, f.size, f.sha256
                   FROM tuneplane.artifact_files f
                  WHERE f.artifact_id = a.id AND f.file_index = p_file_index;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'artifact % has no file %', a.id, p_file_index USING ERRCODE = 'TP404',
            COLUMN = 'file_index';
    END IF;
END;
$$;

-- artifact_storage_for_node: artifact_storage (where the artifact's bytes go: NULL for the server's own
-- store) for the node that produces it; refuses any other node (artifact_for_node) before it learns
-- anything. Direct S3 delivery asks it first at every step.
CREATE OR REPLACE FUNCTION tuneplane.artifact_storage_for_node(p_credential_hash text, p_artifact_id bigint)
RETURNS jsonb
LANGUAGE plpgsql AS $$
BEGIN
    RETURN tuneplane.artifact_storage((tuneplane.artifact_for_node(p_credential_hash, p_artifact_id)).id);
END;
$$;

-- artifact_upload_target: the file p_file_index of an uploading artifact, for a chunk about to be
-- stored. Refuses another node (403), an artifact that is not uploading (409), an unknown file (404) and
-- a chunk index past the file's end or a length other than the fixed chunk size (the last one: the rest).
CREATE OR REPLACE FUNCTION tuneplane.artifact_upload_target(p_credential_hash text, p_artifact_id bigint,
                                                 p_file_index integer, p_chunk_index integer, p_size bigint)
RETURNS TABLE (artifact_id bigint, manifest_digest text, chunk_size integer, file_index integer, path text,
               size bigint, sha256 text, verified boolean, chunk_count integer)
LANGUAGE plpgsql AS $$
DECLARE
    a tuneplane.artifacts;
    f tuneplane.artifact_files;
    n_chunks integer;
    expected bigint;
BEGIN
    a := tuneplane.artifact_for_node(p_credential_hash, p_artifact_id);
    IF a.state <> 'uploading' THEN
        RAISE EXCEPTION 'artifact % is %, not uploading', a.id, a.state USING ERRCODE = 'TP409', COLUMN = 'state';
    END IF;
    IF a.delivery <> 'object' THEN
        RAISE EXCEPTION 'artifact % is delivered on the shared mount; it takes no uploads', a.id
            USING ERRCODE = 'TP409', COLUMN = 'delivery';
    END IF;
    SELECT * INTO f FROM tuneplane.artifact_files af WHERE af.artifact_id = a.id AND af.file_index = p_file_index;
    IF f.artifact_id IS NULL THEN
        RAISE EXCEPTION 'artifact % has no file %', a.id, p_file_index USING ERRCODE = 'TP404',
            COLUMN = 'file_index';
    END IF;
    n_chunks := ((f.size + a.chunk_size - 1) / a.chunk_size)::integer;
    IF p_chunk_index IS NULL OR p_chunk_index < 0 OR p_chunk_index >= n_chunks THEN
        RAISE EXCEPTION '%: chunk % is outside the file (% chunks of % bytes)', f.path, p_chunk_index, n_chunks,
                        a.chunk_size USING ERRCODE = 'TP400', COLUMN = 'chunk_index';
    END IF;
    expected := least(a.chunk_size::bigint, f.size - p_chunk_index::bigint * a.chunk_size);
    IF p_size IS DISTINCT FROM expected THEN
        RAISE EXCEPTION '%: chunk % must be % bytes, got %', f.path, p_chunk_index, expected, p_size
            USING ERRCODE = 'TP400', COLUMN = 'chunk';
    END IF;
    RETURN QUERY SELECT a.id, a.manifest_digest, a.chunk_size, f.file_index, f.path, f.size, f.sha256,
                        f.verified_at IS NOT NULL, n_chunks;
END;
$$;

-- record_artifact_chunk: the server stored chunk p_chunk_index of a file after checking its digest, which
-- it records: crc32c (current agents) or sha256 (older ones), at least one (400 otherwise). Idempotent (a
-- chunk sent twice replaces the first record). Returns whether the file now has all its chunks (the
-- server then assembles and verifies it). A chunk for an already verified file is ignored.
CREATE OR REPLACE FUNCTION tuneplane.record_artifact_chunk(p_credential_hash text, p_artifact_id bigint,
                                                p_file_index integer, p_chunk_index integer, p_size integer,
                                                p_sha256 text, p_crc32c bigint)
RETURNS TABLE (file_verified boolean, all_chunks boolean)
LANGUAGE plpgsql AS $$
DECLARE
    t record;
    held integer;
BEGIN
    IF p_sha256 IS NULL AND p_crc32c IS NULL THEN
        RAISE EXCEPTION 'a chunk needs its sha256 or its crc32c' USING ERRCODE = 'TP400', COLUMN = 'chunk';
    END IF;
    SELECT * INTO t FROM tuneplane.artifact_upload_target(p_credential_hash, p_artifact_id, p_file_index,
                                                           p_chunk_index, p_size);
    IF t.verified THEN
        RETURN QUERY SELECT true, true;
        RETURN;
    END IF;
    INSERT INTO tuneplane.artifact_chunks (artifact_id, file_index, chunk_index, size, sha256, crc32c)
    VALUES (p_artifact_id, p_file_index, p_chunk_index, p_size, p_sha256, p_crc32c)
    ON CONFLICT (artifact_id, file_index, chunk_index)
    DO UPDATE SET sha256 = EXCLUDED.sha256, crc32c = EXCLUDED.crc32c, size = EXCLUDED.size, recorded_at = now();
    SELECT count(*) INTO held FROM tuneplane.artifact_chunks c
     WHERE c.artifact_id = p_artifact_id AND c.file_index = p_file_index;
    RETURN QUERY SELECT false, held >= t.chunk_count;
END;
$$;

-- artifact_file_chunks: the recorded chunks of one file in order, each with the digest it arrived with
-- (what the server checks while it hashes the assembled file).
CREATE OR REPLACE FUNCTION tuneplane.artifact_file_chunks(p_credential_hash text, p_artifact_id bigint,
                                                          p_file_index integer)
RETURNS TABLE (chunk_index integer, size integer, sha256 text, crc32c bigint)
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM tuneplane.artifact_for_node(p_credential_hash, p_artifact_id);
    RETURN QUERY SELECT c.chunk_index, c.size, c.sha256, c.crc32c FROM tuneplane.artifact_chunks c
                  WHERE c.artifact_id = p_artifact_id AND c.file_index = p_file_index ORDER BY c.chunk_index;
END;
$$;

-- discard_artifact_chunks: drop chunk records the server found unusable (a staged chunk missing or
-- damaged, or an assembled file that does not match the manifest), so the uploader sends them again.
-- p_chunks NULL drops every chunk of the file. The state stays uploading; the reason says what happened.
CREATE OR REPLACE FUNCTION tuneplane.discard_artifact_chunks(p_credential_hash text, p_artifact_id bigint,
                                                  p_file_index integer, p_chunks integer[], p_reason text)
RETURNS integer
LANGUAGE plpgsql AS $$
DECLARE
    a tuneplane.artifacts;
    dropped integer;
BEGIN
    a := tuneplane.artifact_for_node(p_credential_hash, p_artifact_id);
    IF a.state <> 'uploading' THEN
        RETURN 0;
    END IF;
    DELETE FROM tuneplane.artifact_chunks c
     WHERE c.artifact_id = a.id AND c.file_index = p_file_index
       AND (p_chunks IS NULL OR c.chunk_index = ANY (p_chunks));
    GET DIAGNOSTICS dropped = ROW_COUNT;
    UPDATE tuneplane.artifacts SET reason = left(coalesce(p_reason, ''), 2000) WHERE id = a.id;
    RETURN dropped;
END;
$$;

-- prune_checkpoints: retention. Keeps the newest artifact_settings.keep_checkpoints complete checkpoints of
-- the job (by completion) and moves older ones complete → pruned, except one pinned as an input or as
-- the resume checkpoint by a job that has not ended, or one a live attempt resumes from (its bytes are
-- still needed). Returns how many it pruned. Called when a checkpoint
-- completes; an operator may call it after lowering the setting.
CREATE OR REPLACE FUNCTION tuneplane.prune_checkpoints(p_job_id bigint)
RETURNS integer
LANGUAGE plpgsql AS $$
DECLARE
    v_keep integer;
    pruned integer;
BEGIN
    SELECT keep_checkpoints INTO v_keep FROM tuneplane.artifact_settings;
    WITH ranked AS (
        SELECT a.id, row_number() OVER (ORDER BY a.completed_at DESC, a.id DESC) AS n
          FROM tuneplane.artifacts a
         WHERE a.job_id = p_job_id AND a.kind = 'checkpoint' AND a.state = 'complete'
    )
    UPDATE tuneplane.artifacts a
       SET state = 'pruned', pruned_at = now(),
           reason = format('pruned by retention: the job keeps its newest %s checkpoints', v_keep)
      FROM ranked r
     WHERE a.id = r.id AND r.n > v_keep
       AND NOT EXISTS (SELECT 1 FROM tuneplane.jobs j
                        WHERE j.state NOT IN ('succeeded', 'failed', 'cancelled')
                          AND (j.spec -> 'inputs' @> jsonb_build_array(
                                   jsonb_build_object('manifest_digest', a.manifest_digest))
                               OR (j.spec -> 'resume' ->> 'artifact_id')::bigint = a.id))
       AND NOT EXISTS (SELECT 1 FROM tuneplane.attempts t
                        WHERE t.resume_artifact_id = a.id
                          AND t.state IN ('reserved', 'preparing', 'running', 'stopping'));
    GET DIAGNOSTICS pruned = ROW_COUNT;
    RETURN pruned;
END;
$$;

-- needed_artifact_files: the files whose stored bytes something still needs, and why: the files of
-- artifacts that are uploading or complete (object delivery), and the files of any other artifact a job that
-- has not ended pinned as an input. The one rule both stores' garbage collections keep (blob_references,
-- artifact_object_references). object_key: the column (NULL for the content address).
CREATE OR REPLACE FUNCTION tuneplane.needed_artifact_files()
RETURNS TABLE (artifact_id bigint, file_index integer, sha256 text, object_key text, why text)
LANGUAGE sql STABLE AS $$
    SELECT f.artifact_id, f.file_index, f.sha256, f.object_key, 'artifact ' || a.id
      FROM tuneplane.artifact_files f
      JOIN tuneplane.artifacts a ON a.id = f.artifact_id
     WHERE a.delivery = 'object'
       AND (a.state IN ('uploading', 'complete')
            OR EXISTS (SELECT 1 FROM tuneplane.jobs j
                        WHERE j.state NOT IN ('succeeded', 'failed', 'cancelled')
                          AND j.spec -> 'inputs' @> jsonb_build_array(
                                  jsonb_build_object('manifest_digest', a.manifest_digest))))
$$;

-- blob_references: every blob in the server's blob store that something still needs, and why: the needed
-- artifact files (needed_artifact_files), every source archive and every attempt's capsule. Blob garbage
-- collection (app/artifacts/gc.py, `tuneplane blobs gc`; app/artifacts/s3_gc.py for `sha256/` in an S3
-- store) removes only blobs outside this set.
CREATE OR REPLACE FUNCTION tuneplane.blob_references()
RETURNS TABLE (sha256 text, why text)
LANGUAGE sql STABLE AS $$
    SELECT n.sha256, min(n.why) FROM tuneplane.needed_artifact_files() n GROUP BY n.sha256
    UNION ALL
    SELECT s.sha256, 'source archive' FROM tuneplane.source_archives s
    UNION ALL
    SELECT DISTINCT at.capsule_digest, 'capsule' FROM tuneplane.attempts at WHERE at.capsule_digest IS NOT NULL
$$;

-- artifact_object_references: every per-artifact object of an S3 store (`artifacts/<id>/<index>`, 0320)
-- that a needed artifact file names, and why. S3 garbage collection (app/artifacts/s3_gc.py) removes an
-- object under `artifacts/` only outside this set (and only when no uploading artifact owns it): an object
-- another artifact reuses (reuse_artifact_objects) stays while that artifact needs it, whatever became of
-- the artifact that uploaded it.
CREATE OR REPLACE FUNCTION tuneplane.artifact_object_references()
RETURNS TABLE (object_key text, why text)
LANGUAGE sql STABLE AS $$
    SELECT n.object_key, min(n.why) FROM tuneplane.needed_artifact_files() n
     WHERE n.object_key IS NOT NULL GROUP BY n.object_key
$$;

-- artifact_object_key: THE answer to "where do this file's bytes live", as a name under its store's root
-- (an S3 store's prefix, the server's blob directory): the per-artifact object recorded when it was
-- verified in place (0320, record_artifact_object / reuse_artifact_objects), else its content address
-- `sha256/ab/abcdef…` (the server's own store; S3 files recorded before 0320). Readers get it through
-- artifact_file_list.
CREATE OR REPLACE FUNCTION tuneplane.artifact_object_key(p_file tuneplane.artifact_files)
RETURNS text
LANGUAGE sql IMMUTABLE AS $$
    SELECT coalesce(p_file.object_key, 'sha256/' || left(p_file.sha256, 2) || '/' || p_file.sha256)
$$;

-- reuse_artifact_objects: dedup in an S3 store without an upload. Each unverified, non-empty file of the
-- uploading artifact p_artifact_id (of a fleet with an S3 store) whose bytes (sha256 and size) a verified
-- file of a complete, uncorrupted artifact in the same store already has is recorded verified at that
-- file's object (object_key), as the filesystem store records a file whose blob it holds: the bytes were
-- verified by the server side when that object was (ADR 0245). The source artifacts are locked FOR SHARE
-- until this transaction ends, so retention cannot prune one (and garbage collection cannot see it
-- unreferenced) before the reference recorded here is visible. Lock order: this artifact (FOR UPDATE,
-- artifact_for_node), then the source artifacts (FOR SHARE, by id). Returns the artifact (complete when
-- every file now is).
CREATE OR REPLACE FUNCTION tuneplane.reuse_artifact_objects(p_credential_hash text, p_artifact_id bigint)
RETURNS tuneplane.artifacts
LANGUAGE plpgsql AS $$
DECLARE
    a tuneplane.artifacts;
    v_storage jsonb;
BEGIN
    a := tuneplane.artifact_for_node(p_credential_hash, p_artifact_id);
    v_storage := tuneplane.artifact_storage(a.id);
    IF a.state <> 'uploading' OR a.delivery <> 'object' OR v_storage IS NULL THEN
        RETURN a;
    END IF;
    PERFORM 1 FROM tuneplane.artifacts s
     WHERE s.id IN (SELECT src.artifact_id FROM tuneplane.artifact_files f
                      JOIN tuneplane.artifact_files src ON src.sha256 = f.sha256 AND src.size = f.size
                     WHERE f.artifact_id = a.id AND f.verified_at IS NULL AND f.size > 0
                       AND src.verified_at IS NOT NULL AND src.object_key IS NOT NULL)
       AND s.state = 'complete'
     ORDER BY s.id FOR SHARE;
    UPDATE tuneplane.artifact_files f
       SET verified_at = now(), object_key = src.object_key
      FROM (SELECT DISTINCT ON (t.file_index) t.file_index, o.object_key
              FROM tuneplane.artifact_files t
              JOIN tuneplane.artifact_files o ON o.sha256 = t.sha256 AND o.size = t.size
              JOIN tuneplane.artifacts s ON s.id = o.artifact_id
             WHERE t.artifact_id = a.id AND t.verified_at IS NULL AND t.size > 0
               AND o.verified_at IS NOT NULL AND o.object_key IS NOT NULL
               AND s.state = 'complete' AND s.delivery = 'object'
               AND NOT EXISTS (SELECT 1 FROM tuneplane.artifact_corruptions c WHERE c.artifact_id = s.id)
               AND tuneplane.artifact_storage(s.id) = v_storage
             ORDER BY t.file_index, s.id DESC) src
     WHERE f.artifact_id = a.id AND f.file_index = src.file_index;
    DELETE FROM tuneplane.artifact_chunks c
     WHERE c.artifact_id = a.id
       AND c.file_index IN (SELECT file_index FROM tuneplane.artifact_files
                             WHERE artifact_id = a.id AND verified_at IS NOT NULL);
    RETURN tuneplane.artifact_complete_when_verified(a);
END;
$$;

-- record_artifact_file: the server re-hashed file p_file_index from bytes it holds (object delivery: the
-- blob it stored; shared delivery: the file on the shared path) and got p_sha256 / p_size. A match marks
-- the file verified and drops its chunk records; when every file is verified the artifact becomes
-- complete (uploading → complete). A mismatch is refused (409) and changes nothing. Idempotent.
CREATE OR REPLACE FUNCTION tuneplane.record_artifact_file(p_credential_hash text, p_artifact_id bigint,
                                               p_file_index integer, p_sha256 text, p_size bigint)
RETURNS tuneplane.artifacts
LANGUAGE plpgsql AS $$
DECLARE
    a tuneplane.artifacts;
    f tuneplane.artifact_files;
BEGIN
    a := tuneplane.artifact_for_node(p_credential_hash, p_artifact_id);
    IF a.state = 'complete' THEN
        RETURN a;
    END IF;
    IF a.state <> 'uploading' THEN
        RAISE EXCEPTION 'artifact % is %, not uploading', a.id, a.state USING ERRCODE = 'TP409', COLUMN = 'state';
    END IF;
    SELECT * INTO f FROM tuneplane.artifact_files af WHERE af.artifact_id = a.id AND af.file_index = p_file_index;
    IF f.artifact_id IS NULL THEN
        RAISE EXCEPTION 'artifact % has no file %', a.id, p_file_index USING ERRCODE = 'TP404', COLUMN = 'file_index';
    END IF;
    IF f.sha256 <> p_sha256 OR f.size <> p_size THEN
        RAISE EXCEPTION '%: the server holds % bytes with sha256 %, the manifest says % bytes with sha256 %',
                        f.path, p_size, p_sha256, f.size, f.sha256 USING ERRCODE = 'TP409', COLUMN = 'file';
    END IF;
    IF f.verified_at IS NULL THEN
        UPDATE tuneplane.artifact_files SET verified_at = now()
         WHERE artifact_id = a.id AND file_index = p_file_index;
        DELETE FROM tuneplane.artifact_chunks c WHERE c.artifact_id = a.id AND c.file_index = p_file_index;
    END IF;
    RETURN tuneplane.artifact_complete_when_verified(a);
END;
$$;

-- record_artifact_object: record_artifact_file for a file of an S3 store verified in place: the server
-- streamed the object p_object_key (its name under the store's prefix, `artifacts/<id>/<index>`) and it
-- hashed to p_sha256 / p_size. Records where the file lives (0320, artifact_object_key) with the file, in
-- one transaction; a file verified before keeps the object it was recorded with. Same refusals.
CREATE OR REPLACE FUNCTION tuneplane.record_artifact_object(p_credential_hash text, p_artifact_id bigint,
                                                 p_file_index integer, p_sha256 text, p_size bigint,
                                                 p_object_key text)
RETURNS tuneplane.artifacts
LANGUAGE plpgsql AS $$
DECLARE
    a tuneplane.artifacts;
BEGIN
    a := tuneplane.artifact_for_node(p_credential_hash, p_artifact_id);
    IF a.state = 'uploading' THEN
        UPDATE tuneplane.artifact_files SET object_key = p_object_key
         WHERE artifact_id = a.id AND file_index = p_file_index AND verified_at IS NULL;
    END IF;
    RETURN tuneplane.record_artifact_file(p_credential_hash, p_artifact_id, p_file_index, p_sha256, p_size);
END;
$$;

-- finish_artifact: the uploader says it has sent everything. Returns the artifact: complete when every
-- file is verified (uploading → complete, artifact_complete_when_verified), otherwise still uploading with
-- a reason naming the unverified files.
CREATE OR REPLACE FUNCTION tuneplane.finish_artifact(p_credential_hash text, p_artifact_id bigint)
RETURNS tuneplane.artifacts
LANGUAGE plpgsql AS $$
DECLARE
    a tuneplane.artifacts;
    pending text;
BEGIN
    a := tuneplane.artifact_complete_when_verified(tuneplane.artifact_for_node(p_credential_hash, p_artifact_id));
    IF a.state <> 'uploading' THEN
        RETURN a;
    END IF;
    SELECT count(*) || ' file(s) not verified yet: ' || string_agg(path, ', ' ORDER BY file_index)
      INTO pending
      FROM (SELECT path, file_index FROM tuneplane.artifact_files
             WHERE artifact_id = a.id AND verified_at IS NULL ORDER BY file_index LIMIT 20) p;
    UPDATE tuneplane.artifacts SET reason = pending WHERE id = a.id RETURNING * INTO a;
    RETURN a;
END;
$$;

-- fail_artifact: uploading → failed with a reason (the agent gave up, the shared files did not verify).
-- Refuses a complete artifact (409); failing a failed one again just updates the reason.
CREATE OR REPLACE FUNCTION tuneplane.fail_artifact(p_credential_hash text, p_artifact_id bigint, p_reason text)
RETURNS tuneplane.artifacts
LANGUAGE plpgsql AS $$
DECLARE
    a tuneplane.artifacts;
BEGIN
    a := tuneplane.artifact_for_node(p_credential_hash, p_artifact_id);
    IF a.state = 'complete' THEN
        RAISE EXCEPTION 'artifact % is complete and cannot fail', a.id USING ERRCODE = 'TP409', COLUMN = 'state';
    END IF;
    IF coalesce(p_reason, '') = '' THEN
        RAISE EXCEPTION 'a failed artifact needs a reason' USING ERRCODE = 'TP400', COLUMN = 'reason';
    END IF;
    DELETE FROM tuneplane.artifact_chunks WHERE artifact_id = a.id;
    UPDATE tuneplane.artifacts SET state = 'failed', reason = left(p_reason, 2000) WHERE id = a.id
    RETURNING * INTO a;
    RETURN a;
END;
$$;

-- refuse_artifact: an output the agent cannot deliver before it could register it (its directory holds a
-- file no manifest can describe: a name with a control character or not valid UTF-8, a link out of it, a
-- FIFO; or its delivery gave up before any registration): (none | uploading | failed) → failed with the
-- reason, so the user sees it among the job's artifacts instead of finding nothing. A new row gets the
-- empty manifest. Refuses a complete or pruned artifact (409), a bad name or kind and an empty reason (400).
CREATE OR REPLACE FUNCTION tuneplane.refuse_artifact(p_credential_hash text, p_member_id bigint, p_name text,
                                                     p_kind text, p_reason text)
RETURNS tuneplane.artifacts
LANGUAGE plpgsql AS $$
DECLARE
    m tuneplane.members;
    a tuneplane.artifacts;
    v_empty constant jsonb := '{"files": [], "version": 1}';
BEGIN
    m := tuneplane.artifact_node_member(p_credential_hash, p_member_id);
    PERFORM tuneplane.check_artifact_name_kind(p_name, p_kind);
    IF coalesce(p_reason, '') = '' THEN
        RAISE EXCEPTION 'a refused artifact needs a reason' USING ERRCODE = 'TP400', COLUMN = 'reason';
    END IF;
    INSERT INTO tuneplane.artifacts (job_id, attempt_id, member_id, rank, name, kind, state, reason, delivery,
                                     manifest, manifest_digest, file_count, total_bytes, chunk_size,
                                     registered_by)
    SELECT m.job_id, m.attempt_id, m.id, m.rank, p_name, p_kind, 'failed', left(p_reason, 2000), 'object',
           v_empty, tuneplane.artifact_manifest_digest(v_empty), 0, 0, s.chunk_size, 'node:' || m.node_id
      FROM tuneplane.artifact_settings s
    ON CONFLICT (member_id, name) DO NOTHING
    RETURNING * INTO a;
    IF a.id IS NOT NULL THEN
        RETURN a;
    END IF;
    -- Registered before: failed like any other (fail_artifact refuses a complete or pruned one, 409).
    SELECT * INTO a FROM tuneplane.artifacts WHERE member_id = m.id AND name = p_name;
    RETURN tuneplane.fail_artifact(p_credential_hash, a.id, p_reason);
END;
$$;

-- artifacts_of_lost_member: a member that becomes lost (its node fenced or retired) can no longer deliver
-- (artifact_node_member refuses it), so its uploading artifacts move uploading → failed with the reason and
-- their chunk records are dropped; before, they stayed uploading for ever, their bytes kept from garbage
-- collection and an upload progress bar on the job page that never moved again.
CREATE OR REPLACE FUNCTION tuneplane.artifacts_of_lost_member() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    DELETE FROM tuneplane.artifact_chunks c USING tuneplane.artifacts a
     WHERE c.artifact_id = a.id AND a.member_id = NEW.id AND a.state = 'uploading';
    UPDATE tuneplane.artifacts
       SET state = 'failed',
           reason = left(format('its member (rank %s) was lost while it was uploading (%s); it can no longer be '
                                'delivered', NEW.rank, coalesce(nullif(NEW.reason, ''), 'node fenced')), 2000)
     WHERE member_id = NEW.id AND state = 'uploading';
    RETURN NULL;
END;
$$;

CREATE OR REPLACE TRIGGER artifacts_of_lost_member
    AFTER UPDATE OF state ON tuneplane.members
    FOR EACH ROW WHEN (NEW.state = 'lost' AND OLD.state IS DISTINCT FROM 'lost')
    EXECUTE FUNCTION tuneplane.artifacts_of_lost_member();

-- ---------------------------------------------------------------------------------------------------
-- Users: who may see a job's artifacts is require_job_access's answer (access.sql); a job the user may
-- not see is reported as unknown (404), so job ids cannot be probed.
-- job_artifacts: every artifact of a job (all attempts), newest attempt first, with the last
-- verification and, while uploading, how many of its bytes the server holds (uploaded_bytes), and a
-- checkpoint's training step (NULL when not said). Refuses a job the user cannot see (404).
CREATE OR REPLACE FUNCTION tuneplane.job_artifacts(p_user_id bigint, p_job_id bigint)
RETURNS TABLE (id bigint, job_id bigint, attempt integer, rank integer, name text, kind text, state text,
               reason text, delivery text, shared_path text, manifest_digest text, file_count integer,
               total_bytes bigint, created_at timestamptz, completed_at timestamptz,
               last_verified_at timestamptz, last_verify_ok boolean, last_verify_problems jsonb,
               uploaded_bytes bigint, step bigint)
LANGUAGE plpgsql STABLE AS $$
BEGIN
    PERFORM tuneplane.require_job_access(p_user_id, p_job_id, 'read');
    RETURN QUERY
        SELECT a.id, a.job_id, at.number, a.rank, a.name, a.kind, a.state, a.reason, a.delivery, a.shared_path,
               a.manifest_digest, a.file_count, a.total_bytes, a.created_at, a.completed_at,
               v.at, v.ok, v.problems,
               -- progress of an upload: bytes of verified files plus the chunks the server holds of the rest
               CASE WHEN a.state = 'uploading' THEN
                   (SELECT coalesce(sum(f.size), 0) FROM tuneplane.artifact_files f
                     WHERE f.artifact_id = a.id AND f.verified_at IS NOT NULL)
                   + (SELECT coalesce(sum(c.size), 0) FROM tuneplane.artifact_chunks c WHERE c.artifact_id = a.id)
               ELSE a.total_bytes END::bigint,
               a.step
          FROM tuneplane.artifacts a
          JOIN tuneplane.attempts at ON at.id = a.attempt_id
          LEFT JOIN LATERAL (SELECT * FROM tuneplane.artifact_verifications av WHERE av.artifact_id = a.id
                              ORDER BY av.id DESC LIMIT 1) v ON true
         WHERE a.job_id = p_job_id
         ORDER BY at.number DESC, a.name, a.rank;
END;
$$;

-- find_artifact: the artifact NAME of a job: in attempt p_attempt (default: the latest attempt that has
-- one by that name), of member p_rank (default: the only member that has one). Refuses an unknown job or
-- artifact (404) and an ambiguous name (409, listing NAME@RANK choices).
CREATE OR REPLACE FUNCTION tuneplane.find_artifact(p_user_id bigint, p_job_id bigint, p_name text,
                                        p_rank integer DEFAULT NULL, p_attempt integer DEFAULT NULL)
RETURNS tuneplane.artifacts
LANGUAGE plpgsql STABLE AS $$
DECLARE
    v_attempt integer;
    n integer;
    choices text;
    a tuneplane.artifacts;
BEGIN
    PERFORM tuneplane.require_job_access(p_user_id, p_job_id, 'read');
    SELECT coalesce(p_attempt, max(at.number)) INTO v_attempt
      FROM tuneplane.artifacts ar JOIN tuneplane.attempts at ON at.id = ar.attempt_id
     WHERE ar.job_id = p_job_id AND ar.name = p_name AND (p_rank IS NULL OR ar.rank = p_rank);
    SELECT count(*), string_agg(ar.name || '@' || ar.rank, ', ' ORDER BY ar.rank) INTO n, choices
      FROM tuneplane.artifacts ar JOIN tuneplane.attempts at ON at.id = ar.attempt_id
     WHERE ar.job_id = p_job_id AND ar.name = p_name AND at.number = v_attempt
       AND (p_rank IS NULL OR ar.rank = p_rank);
    IF n = 0 THEN
        RAISE EXCEPTION '%', format('job %s has no artifact named %s', p_job_id, p_name)
                        || CASE WHEN p_rank IS NOT NULL THEN ' from rank ' || p_rank ELSE '' END
                        || CASE WHEN p_attempt IS NOT NULL THEN ' in attempt ' || p_attempt ELSE '' END
            USING ERRCODE = 'TP404', COLUMN = 'name';
    END IF;
    IF n > 1 THEN
        RAISE EXCEPTION 'several members of job % produced %: name one of %', p_job_id, p_name, choices
            USING ERRCODE = 'TP409', COLUMN = 'name';
    END IF;
    SELECT ar.* INTO a FROM tuneplane.artifacts ar JOIN tuneplane.attempts at ON at.id = ar.attempt_id
     WHERE ar.job_id = p_job_id AND ar.name = p_name AND at.number = v_attempt
       AND (p_rank IS NULL OR ar.rank = p_rank);
    RETURN a;
END;
$$;

-- request_checkpoint: a user asks the running members of a job (all, or the one of rank p_rank) for a
-- checkpoint now: a `checkpoint` command to each member's node (the agent tells the workload through the
-- file the SDK reads; workers/agent/checkpoints.py). Moves no state. Refuses a job the user cannot see
-- (404), a job with no running member (409, with the job's state) and an unknown rank (404).
CREATE OR REPLACE FUNCTION tuneplane.request_checkpoint(p_user_id bigint, p_job_id bigint, p_rank integer DEFAULT NULL)
RETURNS TABLE (member_id bigint, rank integer, node_id bigint, command_id bigint)
LANGUAGE plpgsql AS $$
DECLARE
    j tuneplane.jobs;
    m record;
    v_request text := gen_random_uuid()::text;
    cmd tuneplane.node_commands;
BEGIN
    j := tuneplane.require_job_access(p_user_id, p_job_id, 'act');
    IF p_rank IS NOT NULL AND NOT EXISTS (SELECT 1 FROM tuneplane.members mm
                                          WHERE mm.job_id = j.id AND mm.rank = p_rank) THEN
        RAISE EXCEPTION 'job % has no member of rank %', j.id, p_rank USING ERRCODE = 'TP404', COLUMN = 'rank';
    END IF;
    FOR m IN SELECT mm.id, mm.rank, mm.node_id FROM tuneplane.members mm
              WHERE mm.job_id = j.id AND mm.state = 'running' AND (p_rank IS NULL OR mm.rank = p_rank)
              ORDER BY mm.rank LOOP
        cmd := tuneplane.enqueue_node_command(m.node_id, 'checkpoint',
                   jsonb_build_object('member_id', m.id, 'request_id', v_request), 'user:' || p_user_id);
        member_id := m.id; rank := m.rank; node_id := m.node_id; command_id := cmd.id;
        RETURN NEXT;
    END LOOP;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'job % has no running member% to ask for a checkpoint (the job is %)', j.id,
                        CASE WHEN p_rank IS NULL THEN '' ELSE ' of rank ' || p_rank END, j.state
            USING ERRCODE = 'TP409', COLUMN = 'job';
    END IF;
END;
$$;

-- complete_artifacts_of: the complete artifacts of the user's own jobs, newest first (at most p_limit):
-- what the submission dialog offers as inputs. `ref` is the reference an input takes (JOB/NAME@RANK).
CREATE OR REPLACE FUNCTION tuneplane.complete_artifacts_of(p_user_id bigint, p_limit integer DEFAULT 200)
RETURNS TABLE (id bigint, job_id bigint, attempt integer, rank integer, name text, kind text,
               manifest_digest text, file_count integer, total_bytes bigint, completed_at timestamptz, ref text)
LANGUAGE sql STABLE AS $$
    SELECT a.id, a.job_id, at.number, a.rank, a.name, a.kind, a.manifest_digest, a.file_count, a.total_bytes,
           a.completed_at, a.job_id || '/' || a.name || '@' || a.rank
      FROM tuneplane.artifacts a
      JOIN tuneplane.jobs j ON j.id = a.job_id
      JOIN tuneplane.attempts at ON at.id = a.attempt_id
     WHERE a.state = 'complete' AND j.owner_id = p_user_id
     ORDER BY a.completed_at DESC, a.id DESC
     LIMIT greatest(1, least(coalesce(p_limit, 200), 1000))
$$;

-- artifact_for_user: one artifact by id, if the user may see its job (404 otherwise).
CREATE OR REPLACE FUNCTION tuneplane.artifact_for_user(p_user_id bigint, p_artifact_id bigint)
RETURNS tuneplane.artifacts
LANGUAGE plpgsql STABLE AS $$
DECLARE
    a tuneplane.artifacts;
BEGIN
    SELECT * INTO a FROM tuneplane.artifacts WHERE id = p_artifact_id;
    IF a.id IS NULL THEN
        RAISE EXCEPTION 'no artifact %', p_artifact_id USING ERRCODE = 'TP404', COLUMN = 'artifact';
    END IF;
    BEGIN
        PERFORM tuneplane.require_job_access(p_user_id, a.job_id, 'read');
    EXCEPTION WHEN SQLSTATE 'TP404' THEN
        RAISE EXCEPTION 'no artifact %', p_artifact_id USING ERRCODE = 'TP404', COLUMN = 'artifact';
    END;
    RETURN a;
END;
$$;

-- artifact_to_verify: the artifact p_artifact_id if the user may see it (404) and it is complete: only a
-- complete artifact has stored bytes to check against its manifest. An uploading or failed one never had
-- them all, a pruned one may have lost them to garbage collection by design; checking those would report
-- "missing" files as if bytes had been lost (409, naming the state and its reason).
CREATE OR REPLACE FUNCTION tuneplane.artifact_to_verify(p_user_id bigint, p_artifact_id bigint)
RETURNS tuneplane.artifacts
LANGUAGE plpgsql STABLE AS $$
DECLARE
    a tuneplane.artifacts;
BEGIN
    a := tuneplane.artifact_for_user(p_user_id, p_artifact_id);
    IF a.state <> 'complete' THEN
        RAISE EXCEPTION 'artifact % (%) is %: %; only a complete artifact can be verified', a.id, a.name, a.state,
                        coalesce(nullif(a.reason, ''), 'no reason recorded')
            USING ERRCODE = 'TP409', COLUMN = 'state';
    END IF;
    RETURN a;
END;
$$;

-- artifact_storage: where an artifact's bytes live — its attempt's fleet's store (fleets.storage, migration
-- 0245): NULL for the server's own store, else the S3 location (never credentials). Readers (verify,
-- downloads) ask it after the access check of artifact_to_verify / artifact_for_user.
CREATE OR REPLACE FUNCTION tuneplane.artifact_storage(p_artifact_id bigint)
RETURNS jsonb
LANGUAGE sql STABLE AS $$
    SELECT f.storage FROM tuneplane.artifacts a
      JOIN tuneplane.attempts t ON t.id = a.attempt_id
      JOIN tuneplane.fleets f ON f.id = t.fleet_id
     WHERE a.id = p_artifact_id AND f.storage ->> 'kind' = 's3';
$$;

-- record_artifact_verification: the result of a verification the user asked for (the server recomputed
-- every file). Changes no state: a complete artifact stays complete and immutable; the console and the
-- input resolution read the latest result. Refuses an artifact that is not complete (artifact_to_verify).
CREATE OR REPLACE FUNCTION tuneplane.record_artifact_verification(p_user_id bigint, p_artifact_id bigint, p_ok boolean,
                                                       p_checked integer, p_problems jsonb)
RETURNS tuneplane.artifact_verifications
LANGUAGE plpgsql AS $$
DECLARE
    a tuneplane.artifacts;
    v tuneplane.artifact_verifications;
BEGIN
    a := tuneplane.artifact_to_verify(p_user_id, p_artifact_id);
    INSERT INTO tuneplane.artifact_verifications (artifact_id, ok, checked, problems, requested_by)
    VALUES (a.id, p_ok, coalesce(p_checked, 0), coalesce(p_problems, '[]'::jsonb),
            coalesce((SELECT 'user:' || username FROM tuneplane.users WHERE id = p_user_id), 'user:?'))
    RETURNING * INTO v;
    IF NOT p_ok THEN
        PERFORM tuneplane.mark_artifact_corrupt(a.id,
            coalesce(nullif(p_problems ->> 0, ''), 'its stored files do not match the manifest'),
            'a verification by ' || v.requested_by);
    END IF;
    RETURN v;
END;
$$;

-- mark_artifact_corrupt: the one place an artifact is found corrupt (its stored bytes no longer match its
-- manifest: the node gateway met it serving the files to a node, a verification found it — `tuneplane
-- artifacts verify`, a store's own verifier). Marks it once (artifact_corruptions, 0280) and says so in
-- its job's timeline, naming it (with its step); resume never picks a marked checkpoint again
-- (resume_checkpoint_of). The artifact row itself is not changed (complete stays immutable). True when it
-- was marked now, false when it already was. Locks nothing but the new row (any caller's locks are fine).
-- p_found_by: who found it, as the timeline says it (`the node gateway serving it to node gpu-3`).
CREATE OR REPLACE FUNCTION tuneplane.mark_artifact_corrupt(p_artifact_id bigint, p_reason text, p_found_by text)
RETURNS boolean
LANGUAGE plpgsql AS $$
DECLARE
    a tuneplane.artifacts;
    v_attempt integer;
    v_reason  text := left(coalesce(nullif(p_reason, ''), 'its stored files do not match the manifest'), 500);
    v_by      text := left(coalesce(nullif(p_found_by, ''), 'unknown'), 200);
BEGIN
    SELECT * INTO a FROM tuneplane.artifacts WHERE id = p_artifact_id;
    IF a.id IS NULL THEN
        RAISE EXCEPTION 'artifact % does not exist', p_artifact_id USING ERRCODE = 'TP404', COLUMN = 'artifact_id';
    END IF;
    INSERT INTO tuneplane.artifact_corruptions (artifact_id, reason, found_by) VALUES (a.id, v_reason, v_by)
    ON CONFLICT (artifact_id) DO NOTHING;
    IF NOT FOUND THEN
        RETURN false;
    END IF;
    SELECT number INTO v_attempt FROM tuneplane.attempts WHERE id = a.attempt_id;
    INSERT INTO tuneplane.job_events (job_id, from_state, to_state, reason, detail)
    SELECT j.id, j.state, j.state,
           format('%s %s of attempt %s is corrupt (found by %s: %s)%s', a.kind, tuneplane.checkpoint_label(a),
                  v_attempt, v_by, v_reason,
                  CASE WHEN a.kind = 'checkpoint' THEN '; it is never resumed from again' ELSE '' END),
           jsonb_build_object('kind', 'artifact_corrupt', 'artifact_id', a.id, 'name', a.name, 'step', a.step)
      FROM tuneplane.jobs j WHERE j.id = a.job_id;
    RETURN true;
END;
$$;

-- artifact_is_corrupt: whether mark_artifact_corrupt marked it.
CREATE OR REPLACE FUNCTION tuneplane.artifact_is_corrupt(p_artifact_id bigint)
RETURNS boolean
LANGUAGE sql STABLE AS $$
    SELECT EXISTS (SELECT 1 FROM tuneplane.artifact_corruptions c WHERE c.artifact_id = p_artifact_id);
$$;

-- Operators: every artifact with its job, member and progress.
CREATE OR REPLACE VIEW tuneplane.v_artifacts AS
SELECT a.id, a.job_id, at.number AS attempt, a.rank, a.name, a.kind, a.state, a.reason, a.delivery,
       a.shared_path, a.manifest_digest, a.file_count, a.total_bytes,
       (SELECT count(*) FROM tuneplane.artifact_files f WHERE f.artifact_id = a.id AND f.verified_at IS NOT NULL)
           AS files_verified,
       (SELECT count(*) FROM tuneplane.artifact_chunks c WHERE c.artifact_id = a.id) AS chunks_held,
       a.created_at, a.updated_at, a.completed_at
  FROM tuneplane.artifacts a JOIN tuneplane.attempts at ON at.id = a.attempt_id;

-- artifact_input_for_node: a complete artifact the node behind the credential may read because a job
-- with a member on that node (resources still held) pinned it as an input by manifest digest, or that
-- member's attempt resumes from it (attempts.resume_artifact_id). Refuses
-- anything else as unknown (404), so a node cannot read other jobs' outputs.
CREATE OR REPLACE FUNCTION tuneplane.artifact_input_for_node(p_credential_hash text, p_artifact_id bigint)
RETURNS tuneplane.artifacts
LANGUAGE plpgsql AS $$
DECLARE
    v_node bigint;
    a tuneplane.artifacts;
BEGIN
    SELECT n.node_id INTO v_node FROM tuneplane.authenticate_node_credential(p_credential_hash) n;
    SELECT ar.* INTO a FROM tuneplane.artifacts ar
     WHERE ar.id = p_artifact_id AND ar.state = 'complete'
       AND EXISTS (SELECT 1 FROM tuneplane.members m JOIN tuneplane.jobs j ON j.id = m.job_id
                    JOIN tuneplane.attempts t ON t.id = m.attempt_id
                    WHERE m.node_id = v_node AND m.released_at IS NULL
                      AND (t.resume_artifact_id = ar.id
                           OR j.spec -> 'inputs' @> jsonb_build_array(
                                  jsonb_build_object('manifest_digest', ar.manifest_digest))));
    IF a.id IS NULL THEN
        RAISE EXCEPTION 'no input artifact % for this node', p_artifact_id USING ERRCODE = 'TP404',
            COLUMN = 'artifact_id';
    END IF;
    RETURN a;
END;
$$;

-- artifact_file_list: the files of an artifact in manifest order (for downloads and verification), with
-- where each one's bytes live (artifact_object_key).
CREATE OR REPLACE FUNCTION tuneplane.artifact_file_list(p_artifact_id bigint)
RETURNS TABLE (file_index integer, path text, size bigint, sha256 text, verified boolean, object_key text)
LANGUAGE sql STABLE AS $$
    SELECT f.file_index, f.path, f.size, f.sha256, f.verified_at IS NOT NULL, tuneplane.artifact_object_key(f)
      FROM tuneplane.artifact_files f WHERE f.artifact_id = p_artifact_id ORDER BY f.file_index;
$$;

-- operator_fail_artifact: uploading | failed → failed with the operator's reason, chunk records dropped.
-- Refuses an unknown artifact (404), a complete one (409: immutable) and an empty reason (400).
CREATE OR REPLACE FUNCTION tuneplane.operator_fail_artifact(p_artifact_id bigint, p_reason text)
RETURNS tuneplane.artifacts
LANGUAGE plpgsql AS $$
DECLARE
    a tuneplane.artifacts;
BEGIN
    SELECT * INTO a FROM tuneplane.artifacts WHERE id = p_artifact_id FOR UPDATE;
    IF a.id IS NULL THEN
        RAISE EXCEPTION 'no artifact %', p_artifact_id USING ERRCODE = 'TP404', COLUMN = 'artifact_id';
    END IF;
    IF a.state = 'complete' THEN
        RAISE EXCEPTION 'artifact % is complete and cannot fail', a.id USING ERRCODE = 'TP409', COLUMN = 'state';
    END IF;
    IF coalesce(p_reason, '') = '' THEN
        RAISE EXCEPTION 'a failed artifact needs a reason' USING ERRCODE = 'TP400', COLUMN = 'reason';
    END IF;
    DELETE FROM tuneplane.artifact_chunks WHERE artifact_id = a.id;
    UPDATE tuneplane.artifacts SET state = 'failed', reason = left('operator: ' || p_reason, 2000)
     WHERE id = a.id RETURNING * INTO a;
    RETURN a;
END;
$$;
