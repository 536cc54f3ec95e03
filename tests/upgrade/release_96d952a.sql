-- Made by build_release_dump.py from 96d952a; facts: {"running": 1, "queued": 2, "cancelled": 3, "tokens": {"alice": "tpu_upgrade_alice_token", "bob": "tpu_upgrade_bob_token", "root": "tpu_upgrade_root_token"}}
--
-- PostgreSQL database dump
--

\restrict nKeTYwoxRoosMTQ34vuCkiySiIItRwmq4aegMvazn7GPkWnQ4FFUGFGj2uEig15

-- Dumped from database version 18.4
-- Dumped by pg_dump version 18.4

SET statement_timeout = 0;
SET lock_timeout = 0;
SET idle_in_transaction_session_timeout = 0;
SET transaction_timeout = 0;
SET client_encoding = 'UTF8';
SET standard_conforming_strings = on;
SELECT pg_catalog.set_config('search_path', '', false);
SET check_function_bodies = false;
SET xmloption = content;
SET client_min_messages = warning;
SET row_security = off;

--
-- Name: tuneplane; Type: SCHEMA; Schema: -; Owner: -
--

CREATE SCHEMA tuneplane;


--
-- Name: pgqueuer_status; Type: TYPE; Schema: public; Owner: -
--

CREATE TYPE public.pgqueuer_status AS ENUM (
    'queued',
    'picked',
    'successful',
    'exception',
    'canceled',
    'deleted',
    'failed'
);


--
-- Name: fn_pgqueuer_changed(); Type: FUNCTION; Schema: public; Owner: -
--

CREATE FUNCTION public.fn_pgqueuer_changed() RETURNS trigger
    LANGUAGE plpgsql
    AS $$
DECLARE
    to_emit BOOLEAN := false;  -- Flag to decide whether to emit a notification
BEGIN
    -- Check operation type and set the emit flag accordingly
    IF TG_OP = 'UPDATE' AND OLD IS DISTINCT FROM NEW THEN
        to_emit := true;
    ELSIF TG_OP = 'DELETE' THEN
        to_emit := true;
    ELSIF TG_OP = 'INSERT' THEN
        to_emit := true;
    ELSIF TG_OP = 'TRUNCATE' THEN
        to_emit := true;
    END IF;

    -- Perform notification if the emit flag is set
    IF to_emit THEN
        PERFORM pg_notify(
            'ch_pgqueuer',
            json_build_object(
                'channel', 'ch_pgqueuer',
                'operation', lower(TG_OP),
                'sent_at', NOW(),
                'table', TG_TABLE_NAME,
                'type', 'table_changed_event'
            )::text
        );
    END IF;

    -- Return appropriate value based on the operation
    IF TG_OP IN ('INSERT', 'UPDATE') THEN
        RETURN NEW;
    ELSIF TG_OP = 'DELETE' THEN
        RETURN OLD;
    ELSE
        RETURN NULL; -- For TRUNCATE and other non-row-specific contexts
    END IF;

END;
$$;


--
-- Name: abort_launch(bigint, bigint, text); Type: FUNCTION; Schema: tuneplane; Owner: -
--

CREATE FUNCTION tuneplane.abort_launch(p_attempt_id bigint, p_epoch bigint, p_reason text) RETURNS boolean
    LANGUAGE plpgsql
    AS $$
BEGIN
    PERFORM tuneplane.require_launch_epoch(p_attempt_id, p_epoch);
    RETURN tuneplane.decide_abort(p_attempt_id,
        'the capsule could not be built: ' || coalesce(nullif(p_reason, ''), 'no reason given'));
END;
$$;


SET default_tablespace = '';

SET default_table_access_method = heap;

--
-- Name: node_commands; Type: TABLE; Schema: tuneplane; Owner: -
--

CREATE TABLE tuneplane.node_commands (
    id bigint NOT NULL,
    node_id bigint NOT NULL,
    kind text NOT NULL,
    payload jsonb DEFAULT '{}'::jsonb NOT NULL,
    created_at timestamp with time zone DEFAULT clock_timestamp() NOT NULL,
    created_by text NOT NULL,
    claimed_epoch bigint,
    delivered_at timestamp with time zone,
    delivery_count integer DEFAULT 0 NOT NULL,
    acked_at timestamp with time zone,
    result jsonb,
    error text,
    CONSTRAINT node_commands_kind_check CHECK ((kind ~ '^[a-z][a-z0-9_.-]{0,62}$'::text))
);


--
-- Name: ack_node_command(bigint, bigint, bigint, jsonb, text); Type: FUNCTION; Schema: tuneplane; Owner: -
--

CREATE FUNCTION tuneplane.ack_node_command(p_node_id bigint, p_epoch bigint, p_command_id bigint, p_result jsonb DEFAULT NULL::jsonb, p_error text DEFAULT NULL::text) RETURNS tuneplane.node_commands
    LANGUAGE plpgsql
    AS $$
DECLARE
    v_cmd tuneplane.node_commands;
    v_first boolean;
BEGIN
    PERFORM tuneplane.require_node_session(p_node_id, p_epoch);
    SELECT acked_at IS NULL INTO v_first FROM tuneplane.node_commands
     WHERE id = p_command_id AND node_id = p_node_id;
    UPDATE tuneplane.node_commands
       SET acked_at = coalesce(acked_at, clock_timestamp()),
           result = CASE WHEN node_commands.acked_at IS NULL THEN p_result ELSE node_commands.result END,
           error = CASE WHEN node_commands.acked_at IS NULL THEN p_error ELSE node_commands.error END
     WHERE id = p_command_id AND node_id = p_node_id
    RETURNING * INTO v_cmd;
    IF v_cmd.id IS NULL THEN
        RAISE EXCEPTION 'node % has no command %', p_node_id, p_command_id USING ERRCODE = 'TP404',
            COLUMN = 'command';
    END IF;
    IF v_first THEN
        PERFORM tuneplane.launch_command_acked(v_cmd);
    END IF;
    RETURN v_cmd;
END;
$$;


--
-- Name: artifacts; Type: TABLE; Schema: tuneplane; Owner: -
--

CREATE TABLE tuneplane.artifacts (
    id bigint NOT NULL,
    job_id bigint NOT NULL,
    attempt_id bigint NOT NULL,
    member_id bigint NOT NULL,
    rank integer NOT NULL,
    name text NOT NULL,
    kind text DEFAULT 'output'::text NOT NULL,
    state text DEFAULT 'uploading'::text NOT NULL,
    reason text DEFAULT ''::text NOT NULL,
    delivery text NOT NULL,
    shared_path text,
    manifest jsonb NOT NULL,
    manifest_digest text NOT NULL,
    file_count integer NOT NULL,
    total_bytes bigint NOT NULL,
    chunk_size integer NOT NULL,
    registered_by text NOT NULL,
    created_at timestamp with time zone DEFAULT now() NOT NULL,
    updated_at timestamp with time zone DEFAULT now() NOT NULL,
    completed_at timestamp with time zone,
    pruned_at timestamp with time zone,
    CONSTRAINT artifacts_check CHECK (((delivery = 'shared'::text) = (shared_path IS NOT NULL))),
    CONSTRAINT artifacts_chunk_size_check CHECK ((chunk_size > 0)),
    CONSTRAINT artifacts_completed_at CHECK (((state = ANY (ARRAY['complete'::text, 'pruned'::text])) = (completed_at IS NOT NULL))),
    CONSTRAINT artifacts_delivery_check CHECK ((delivery = ANY (ARRAY['object'::text, 'shared'::text]))),
    CONSTRAINT artifacts_file_count_check CHECK ((file_count >= 0)),
    CONSTRAINT artifacts_kind_check CHECK ((kind = ANY (ARRAY['output'::text, 'checkpoint'::text, 'logs'::text]))),
    CONSTRAINT artifacts_manifest_digest_check CHECK ((manifest_digest ~ '^[0-9a-f]{64}$'::text)),
    CONSTRAINT artifacts_name_check CHECK ((name ~ '^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$'::text)),
    CONSTRAINT artifacts_pruned_at CHECK (((state = 'pruned'::text) = (pruned_at IS NOT NULL))),
    CONSTRAINT artifacts_pruned_kind CHECK (((state <> 'pruned'::text) OR (kind = 'checkpoint'::text))),
    CONSTRAINT artifacts_state_check CHECK ((state = ANY (ARRAY['uploading'::text, 'complete'::text, 'failed'::text, 'pruned'::text]))),
    CONSTRAINT artifacts_total_bytes_check CHECK ((total_bytes >= 0))
);


--
-- Name: artifact_complete_when_verified(tuneplane.artifacts); Type: FUNCTION; Schema: tuneplane; Owner: -
--

CREATE FUNCTION tuneplane.artifact_complete_when_verified(p_artifact tuneplane.artifacts) RETURNS tuneplane.artifacts
    LANGUAGE plpgsql
    AS $$
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


--
-- Name: artifact_file_chunks(text, bigint, integer); Type: FUNCTION; Schema: tuneplane; Owner: -
--

CREATE FUNCTION tuneplane.artifact_file_chunks(p_credential_hash text, p_artifact_id bigint, p_file_index integer) RETURNS TABLE(chunk_index integer, size integer, sha256 text, crc32c bigint)
    LANGUAGE plpgsql
    AS $$
BEGIN
    PERFORM tuneplane.artifact_for_node(p_credential_hash, p_artifact_id);
    RETURN QUERY SELECT c.chunk_index, c.size, c.sha256, c.crc32c FROM tuneplane.artifact_chunks c
                  WHERE c.artifact_id = p_artifact_id AND c.file_index = p_file_index ORDER BY c.chunk_index;
END;
$$;


--
-- Name: artifact_file_list(bigint); Type: FUNCTION; Schema: tuneplane; Owner: -
--

CREATE FUNCTION tuneplane.artifact_file_list(p_artifact_id bigint) RETURNS TABLE(file_index integer, path text, size bigint, sha256 text, verified boolean)
    LANGUAGE sql STABLE
    AS $$
    SELECT f.file_index, f.path, f.size, f.sha256, f.verified_at IS NOT NULL
      FROM tuneplane.artifact_files f WHERE f.artifact_id = p_artifact_id ORDER BY f.file_index;
$$;


--
-- Name: artifact_file_state(text, bigint, integer); Type: FUNCTION; Schema: tuneplane; Owner: -
--

CREATE FUNCTION tuneplane.artifact_file_state(p_credential_hash text, p_artifact_id bigint, p_file_index integer) RETURNS TABLE(state text, verified boolean)
    LANGUAGE plpgsql
    AS $$
DECLARE
    a tuneplane.artifacts;
BEGIN
    a := tuneplane.artifact_for_node(p_credential_hash, p_artifact_id);
    RETURN QUERY SELECT a.state, f.verified_at IS NOT NULL FROM tuneplane.artifact_files f
                  WHERE f.artifact_id = a.id AND f.file_index = p_file_index;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'artifact % has no file %', a.id, p_file_index USING ERRCODE = 'TP404',
            COLUMN = 'file_index';
    END IF;
END;
$$;


--
-- Name: artifact_files_guard_change(); Type: FUNCTION; Schema: tuneplane; Owner: -
--

CREATE FUNCTION tuneplane.artifact_files_guard_change() RETURNS trigger
    LANGUAGE plpgsql
    AS $$
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


--
-- Name: artifact_for_node(text, bigint); Type: FUNCTION; Schema: tuneplane; Owner: -
--

CREATE FUNCTION tuneplane.artifact_for_node(p_credential_hash text, p_artifact_id bigint) RETURNS tuneplane.artifacts
    LANGUAGE plpgsql
    AS $$
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


--
-- Name: artifact_for_user(bigint, bigint); Type: FUNCTION; Schema: tuneplane; Owner: -
--

CREATE FUNCTION tuneplane.artifact_for_user(p_user_id bigint, p_artifact_id bigint) RETURNS tuneplane.artifacts
    LANGUAGE plpgsql STABLE
    AS $$
DECLARE
    a tuneplane.artifacts;
BEGIN
    SELECT * INTO a FROM tuneplane.artifacts WHERE id = p_artifact_id;
    IF a.id IS NULL THEN
        RAISE EXCEPTION 'no artifact %', p_artifact_id USING ERRCODE = 'TP404', COLUMN = 'artifact';
    END IF;
    BEGIN
        PERFORM tuneplane.job_visible_to(p_user_id, a.job_id);
    EXCEPTION WHEN SQLSTATE 'TP404' THEN
        RAISE EXCEPTION 'no artifact %', p_artifact_id USING ERRCODE = 'TP404', COLUMN = 'artifact';
    END;
    RETURN a;
END;
$$;


--
-- Name: artifact_input_for_node(text, bigint); Type: FUNCTION; Schema: tuneplane; Owner: -
--

CREATE FUNCTION tuneplane.artifact_input_for_node(p_credential_hash text, p_artifact_id bigint) RETURNS tuneplane.artifacts
    LANGUAGE plpgsql
    AS $$
DECLARE
    v_node bigint;
    a tuneplane.artifacts;
BEGIN
    SELECT n.node_id INTO v_node FROM tuneplane.authenticate_node_credential(p_credential_hash) n;
    SELECT ar.* INTO a FROM tuneplane.artifacts ar
     WHERE ar.id = p_artifact_id AND ar.state = 'complete'
       AND EXISTS (SELECT 1 FROM tuneplane.members m JOIN tuneplane.jobs j ON j.id = m.job_id
                    WHERE m.node_id = v_node AND m.released_at IS NULL
                      AND j.spec -> 'inputs' @> jsonb_build_array(
                              jsonb_build_object('manifest_digest', ar.manifest_digest)));
    IF a.id IS NULL THEN
        RAISE EXCEPTION 'no input artifact % for this node', p_artifact_id USING ERRCODE = 'TP404',
            COLUMN = 'artifact_id';
    END IF;
    RETURN a;
END;
$$;


--
-- Name: artifact_manifest_canonical(jsonb); Type: FUNCTION; Schema: tuneplane; Owner: -
--

CREATE FUNCTION tuneplane.artifact_manifest_canonical(p_manifest jsonb) RETURNS text
    LANGUAGE sql IMMUTABLE STRICT
    AS $$
    SELECT '{"files":[' || coalesce(string_agg(
               '{"path":' || to_json(f ->> 'path')::text
               || ',"sha256":"' || (f ->> 'sha256')
               || '","size":' || ((f ->> 'size')::numeric)::bigint::text || '}',
               ',' ORDER BY (f ->> 'path') COLLATE "C"), '')
           || '],"version":1}'
      FROM jsonb_array_elements(p_manifest -> 'files') AS f;
$$;


--
-- Name: artifact_manifest_digest(jsonb); Type: FUNCTION; Schema: tuneplane; Owner: -
--

CREATE FUNCTION tuneplane.artifact_manifest_digest(p_manifest jsonb) RETURNS text
    LANGUAGE sql IMMUTABLE STRICT
    AS $$
    SELECT encode(sha256(convert_to(tuneplane.artifact_manifest_canonical(p_manifest), 'UTF8')), 'hex');
$$;


--
-- Name: artifact_manifest_problem(jsonb); Type: FUNCTION; Schema: tuneplane; Owner: -
--

CREATE FUNCTION tuneplane.artifact_manifest_problem(p_manifest jsonb) RETURNS text
    LANGUAGE plpgsql IMMUTABLE
    AS $_$
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
$_$;


--
-- Name: members; Type: TABLE; Schema: tuneplane; Owner: -
--

CREATE TABLE tuneplane.members (
    id bigint NOT NULL,
    attempt_id bigint NOT NULL,
    job_id bigint NOT NULL,
    rank integer NOT NULL,
    node_id bigint NOT NULL,
    gpu_indices integer[] DEFAULT '{}'::integer[] NOT NULL,
    cpus integer NOT NULL,
    memory_bytes bigint NOT NULL,
    state text DEFAULT 'reserved'::text NOT NULL,
    reason text DEFAULT ''::text NOT NULL,
    exit_code integer,
    pid integer,
    updated_at timestamp with time zone DEFAULT now() NOT NULL,
    started_at timestamp with time zone,
    ended_at timestamp with time zone,
    released_at timestamp with time zone,
    contact_lost_at timestamp with time zone,
    started_epoch bigint,
    kill_requested_at timestamp with time zone,
    CONSTRAINT members_cpus_check CHECK ((cpus >= 0)),
    CONSTRAINT members_memory_bytes_check CHECK ((memory_bytes >= 0)),
    CONSTRAINT members_rank_check CHECK ((rank >= 0)),
    CONSTRAINT members_state_check CHECK ((state = ANY (ARRAY['reserved'::text, 'preparing'::text, 'prepared'::text, 'starting'::text, 'running'::text, 'stopping'::text, 'exited'::text, 'failed'::text, 'aborted'::text, 'cancelled'::text, 'lost'::text])))
);


--
-- Name: artifact_node_member(text, bigint); Type: FUNCTION; Schema: tuneplane; Owner: -
--

CREATE FUNCTION tuneplane.artifact_node_member(p_credential_hash text, p_member_id bigint) RETURNS tuneplane.members
    LANGUAGE plpgsql
    AS $$
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


--
-- Name: artifact_to_verify(bigint, bigint); Type: FUNCTION; Schema: tuneplane; Owner: -
--

CREATE FUNCTION tuneplane.artifact_to_verify(p_user_id bigint, p_artifact_id bigint) RETURNS tuneplane.artifacts
    LANGUAGE plpgsql STABLE
    AS $$
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


--
-- Name: artifact_upload_status(text, bigint); Type: FUNCTION; Schema: tuneplane; Owner: -
--

CREATE FUNCTION tuneplane.artifact_upload_status(p_credential_hash text, p_artifact_id bigint) RETURNS jsonb
    LANGUAGE plpgsql
    AS $$
DECLARE
    a tuneplane.artifacts;
BEGIN
    a := tuneplane.artifact_for_node(p_credential_hash, p_artifact_id);
    RETURN jsonb_build_object(
        'artifact_id', a.id, 'state', a.state, 'reason', a.reason, 'chunk_size', a.chunk_size,
        'delivery', a.delivery, 'manifest_digest', a.manifest_digest,
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


--
-- Name: artifact_upload_target(text, bigint, integer, integer, bigint); Type: FUNCTION; Schema: tuneplane; Owner: -
--

CREATE FUNCTION tuneplane.artifact_upload_target(p_credential_hash text, p_artifact_id bigint, p_file_index integer, p_chunk_index integer, p_size bigint) RETURNS TABLE(artifact_id bigint, manifest_digest text, chunk_size integer, file_index integer, path text, size bigint, sha256 text, verified boolean, chunk_count integer)
    LANGUAGE plpgsql
    AS $$
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


--
-- Name: artifacts_guard_change(); Type: FUNCTION; Schema: tuneplane; Owner: -
--

CREATE FUNCTION tuneplane.artifacts_guard_change() RETURNS trigger
    LANGUAGE plpgsql
    AS $$
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


--
-- Name: artifacts_of_lost_member(); Type: FUNCTION; Schema: tuneplane; Owner: -
--

CREATE FUNCTION tuneplane.artifacts_of_lost_member() RETURNS trigger
    LANGUAGE plpgsql
    AS $$
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


--
-- Name: authenticate_api_token(text, text); Type: FUNCTION; Schema: tuneplane; Owner: -
--

CREATE FUNCTION tuneplane.authenticate_api_token(p_token_hash text, p_scope text DEFAULT 'api'::text) RETURNS TABLE(user_id bigint, username text, role text, token_id bigint)
    LANGUAGE plpgsql
    AS $$
DECLARE
    tok tuneplane.api_tokens;
BEGIN
    SELECT * INTO tok FROM tuneplane.api_tokens t WHERE t.token_hash = p_token_hash;
    IF tok.id IS NULL OR tok.revoked_at IS NOT NULL OR (tok.expires_at IS NOT NULL AND tok.expires_at <= now()) THEN
        RAISE EXCEPTION 'invalid, expired or revoked API token' USING ERRCODE = 'TP401', COLUMN = 'token';
    END IF;
    IF NOT p_scope = ANY (tok.scopes) THEN
        RAISE EXCEPTION 'token lacks scope %', p_scope USING ERRCODE = 'TP403', COLUMN = 'token';
    END IF;
    -- Touch last_used_at at most once a minute: a hot token must not turn every request into a write.
    UPDATE tuneplane.api_tokens SET last_used_at = now()
     WHERE id = tok.id AND (last_used_at IS NULL OR last_used_at < now() - interval '1 minute');
    RETURN QUERY
        SELECT u.id, u.username, u.role, tok.id
          FROM tuneplane.users u
         WHERE u.id = tok.user_id AND u.disabled_at IS NULL;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'user of this token is disabled' USING ERRCODE = 'TP401', COLUMN = 'token';
    END IF;
END;
$$;


--
-- Name: authenticate_node_credential(text); Type: FUNCTION; Schema: tuneplane; Owner: -
--

CREATE FUNCTION tuneplane.authenticate_node_credential(p_credential_hash text) RETURNS TABLE(node_id bigint, fleet_id bigint, fleet text, node text, credential_id bigint, rotate_due_at timestamp with time zone, scheduling_state text)
    LANGUAGE plpgsql
    AS $$
DECLARE
    cred tuneplane.node_credentials;
    n tuneplane.nodes;
    s tuneplane.node_settings;
BEGIN
    SELECT * INTO s FROM tuneplane.node_settings;
    SELECT * INTO cred FROM tuneplane.node_credentials c WHERE c.credential_hash = p_credential_hash;
    IF cred.id IS NULL THEN
        RAISE EXCEPTION 'unknown node credential' USING ERRCODE = 'TP401', COLUMN = 'credential';
    END IF;
    IF cred.revoked_at IS NOT NULL THEN
        RAISE EXCEPTION 'node credential was revoked at % (%)', cred.revoked_at, cred.revoked_reason
            USING ERRCODE = 'TP401', COLUMN = 'credential';
    END IF;
    IF cred.grace_until IS NOT NULL AND cred.grace_until <= now() THEN
        RAISE EXCEPTION 'node credential was rotated out at % and its grace period ended at %',
                        cred.superseded_at, cred.grace_until
            USING ERRCODE = 'TP401', COLUMN = 'credential';
    END IF;
    SELECT * INTO n FROM tuneplane.nodes WHERE id = cred.node_id;
    IF n.scheduling_state = 'retired' THEN
        RAISE EXCEPTION 'node % is retired', n.name USING ERRCODE = 'TP403', COLUMN = 'credential';
    END IF;
    IF cred.first_used_at IS NULL THEN
        UPDATE tuneplane.node_credentials SET first_used_at = now() WHERE id = cred.id;
    END IF;
    UPDATE tuneplane.node_credentials
       SET superseded_at = now(), grace_until = now() + s.credential_grace
     WHERE node_credentials.node_id = n.id AND id < cred.id AND grace_until IS NULL AND revoked_at IS NULL;
    RETURN QUERY
        SELECT n.id, n.fleet_id, f.name, n.name, cred.id,
               cred.issued_at + s.credential_rotate_after, n.scheduling_state
          FROM tuneplane.fleets f WHERE f.id = n.fleet_id;
END;
$$;


--
-- Name: authenticate_telemetry_token(text); Type: FUNCTION; Schema: tuneplane; Owner: -
--

CREATE FUNCTION tuneplane.authenticate_telemetry_token(p_token_hash text) RETURNS TABLE(token_id bigint, job_id bigint, attempt integer, member_rank integer, expires_at timestamp with time zone)
    LANGUAGE plpgsql STABLE
    AS $$
DECLARE
    tok tuneplane.telemetry_tokens;
BEGIN
    SELECT * INTO tok FROM tuneplane.telemetry_tokens t WHERE t.token_hash = p_token_hash;
    IF tok.id IS NULL THEN
        RAISE EXCEPTION 'not a telemetry token' USING ERRCODE = 'TP401', COLUMN = 'token';
    END IF;
    IF tok.revoked_at <= now() THEN  -- a future revoked_at is the drain grace after the member ended
        RAISE EXCEPTION 'telemetry token revoked' USING ERRCODE = 'TP401', COLUMN = 'token';
    END IF;
    IF tok.expires_at <= now() THEN
        RAISE EXCEPTION 'telemetry token expired' USING ERRCODE = 'TP401', COLUMN = 'token';
    END IF;
    RETURN QUERY SELECT tok.id, tok.job_id, tok.attempt, tok.member_rank, tok.expires_at;
END;
$$;


--
-- Name: begin_prepare(bigint, bigint, text); Type: FUNCTION; Schema: tuneplane; Owner: -
--

CREATE FUNCTION tuneplane.begin_prepare(p_attempt_id bigint, p_epoch bigint, p_capsule_digest text) RETURNS text
    LANGUAGE plpgsql
    AS $$
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
    UPDATE tuneplane.attempts SET capsule_digest = p_capsule_digest, prepare_deadline = now() + v_timeout
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
            'deadline', extract(epoch FROM now() + v_timeout),
            'shared_path', (SELECT f.capabilities ->> 'shared_path' FROM tuneplane.fleets f WHERE f.id = a.fleet_id)));
    END LOOP;
    PERFORM tuneplane.set_job_state(j.id, 'preparing',
        format('attempt %s: preparing %s member(s); commit once every member is prepared (deadline %s)',
               a.number, j.nodes, to_char(now() + v_timeout, 'YYYY-MM-DD HH24:MI:SS TZ')));
    RETURN 'preparing';
END;
$$;


--
-- Name: blob_references(); Type: FUNCTION; Schema: tuneplane; Owner: -
--

CREATE FUNCTION tuneplane.blob_references() RETURNS TABLE(sha256 text, why text)
    LANGUAGE sql STABLE
    AS $$
    SELECT f.sha256, min('artifact ' || a.id) FROM tuneplane.artifact_files f
      JOIN tuneplane.artifacts a ON a.id = f.artifact_id
     WHERE a.delivery = 'object'
       AND (a.state IN ('uploading', 'complete')
            OR EXISTS (SELECT 1 FROM tuneplane.jobs j
                        WHERE j.state NOT IN ('succeeded', 'failed', 'cancelled')
                          AND j.spec -> 'inputs' @> jsonb_build_array(
                                  jsonb_build_object('manifest_digest', a.manifest_digest))))
     GROUP BY f.sha256
    UNION ALL
    SELECT s.sha256, 'source archive' FROM tuneplane.source_archives s
    UNION ALL
    SELECT DISTINCT at.capsule_digest, 'capsule' FROM tuneplane.attempts at WHERE at.capsule_digest IS NOT NULL
$$;


--
-- Name: jobs; Type: TABLE; Schema: tuneplane; Owner: -
--

CREATE TABLE tuneplane.jobs (
    id bigint NOT NULL,
    owner_id bigint NOT NULL,
    preview_id uuid NOT NULL,
    fleet_id bigint NOT NULL,
    state text DEFAULT 'queued'::text NOT NULL,
    state_reason text NOT NULL,
    priority integer DEFAULT 0 NOT NULL,
    nodes integer NOT NULL,
    gpus_per_node integer NOT NULL,
    cpus_per_node integer NOT NULL,
    memory_per_node bigint NOT NULL,
    max_attempts integer NOT NULL,
    spec jsonb NOT NULL,
    created_at timestamp with time zone DEFAULT now() NOT NULL,
    updated_at timestamp with time zone DEFAULT now() NOT NULL,
    free_relaunches_used integer DEFAULT 0 NOT NULL,
    CONSTRAINT jobs_cpus_per_node_check CHECK ((cpus_per_node >= 1)),
    CONSTRAINT jobs_free_relaunches_used_check CHECK ((free_relaunches_used >= 0)),
    CONSTRAINT jobs_gpus_per_node_check CHECK ((gpus_per_node >= 0)),
    CONSTRAINT jobs_max_attempts_check CHECK ((max_attempts >= 1)),
    CONSTRAINT jobs_memory_per_node_check CHECK ((memory_per_node >= 0)),
    CONSTRAINT jobs_nodes_check CHECK ((nodes >= 1)),
    CONSTRAINT jobs_state_check CHECK ((state = ANY (ARRAY['queued'::text, 'reserved'::text, 'preparing'::text, 'running'::text, 'succeeded'::text, 'failed'::text, 'cancelled'::text]))),
    CONSTRAINT jobs_state_reason_check CHECK ((state_reason <> ''::text))
);


--
-- Name: cancel_job(bigint, bigint, text); Type: FUNCTION; Schema: tuneplane; Owner: -
--

CREATE FUNCTION tuneplane.cancel_job(p_job_id bigint, p_actor_id bigint, p_reason text DEFAULT NULL::text) RETURNS tuneplane.jobs
    LANGUAGE plpgsql
    AS $$
DECLARE
    j tuneplane.jobs;
    a tuneplane.attempts;
    actor tuneplane.users;
    v_why text;
BEGIN
    SELECT * INTO actor FROM tuneplane.users WHERE id = p_actor_id AND disabled_at IS NULL;
    SELECT * INTO j FROM tuneplane.jobs WHERE id = p_job_id FOR UPDATE;
    IF j.id IS NULL OR actor.id IS NULL OR (j.owner_id <> actor.id AND actor.role <> 'admin') THEN
        RAISE EXCEPTION 'no job % of yours', p_job_id USING ERRCODE = 'TP404', COLUMN = 'job';
    END IF;
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


--
-- Name: canonical_json(jsonb); Type: FUNCTION; Schema: tuneplane; Owner: -
--

CREATE FUNCTION tuneplane.canonical_json(p_value jsonb) RETURNS text
    LANGUAGE plpgsql IMMUTABLE STRICT
    AS $$
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


--
-- Name: change_node_scheduling(text, text, text, text); Type: FUNCTION; Schema: tuneplane; Owner: -
--

CREATE FUNCTION tuneplane.change_node_scheduling(p_node text, p_action text, p_reason text DEFAULT NULL::text, p_actor text DEFAULT NULL::text) RETURNS TABLE(node_id bigint, fleet text, node text, scheduling_state text, changed boolean)
    LANGUAGE plpgsql
    AS $$
DECLARE
    v_id bigint := tuneplane.resolve_node(p_node);
    n tuneplane.nodes;
    target text;
    actor text := coalesce(nullif(p_actor, ''), 'db:' || session_user);
BEGIN
    target := CASE p_action WHEN 'cordon' THEN 'cordoned' WHEN 'drain' THEN 'draining'
                            WHEN 'uncordon' THEN 'active' WHEN 'retire' THEN 'retired' END;
    IF target IS NULL THEN
        RAISE EXCEPTION 'unknown scheduling action %; use cordon, drain, uncordon or retire', p_action
            USING ERRCODE = 'TP400', COLUMN = 'action';
    END IF;
    SELECT * INTO n FROM tuneplane.nodes WHERE id = v_id FOR UPDATE;
    IF n.scheduling_state = 'retired' AND target <> 'retired' THEN
        RAISE EXCEPTION 'node % is retired; a retired node does not come back (enroll the machine again)',
                        n.name USING ERRCODE = 'TP409', COLUMN = 'node';
    END IF;
    IF n.scheduling_state <> target THEN
        IF target = 'retired' THEN
            -- A retired node never reconnects (its credentials are revoked below): what it held is lost
            -- and released now, so its jobs can still be cancelled and retried (lose_node_members).
            PERFORM tuneplane.lose_node_members(n.id, format('node %s retired by %s%s', n.name, actor,
                CASE WHEN coalesce(p_reason, '') = '' THEN '' ELSE ': ' || p_reason END));
        END IF;
        UPDATE tuneplane.nodes SET scheduling_state = target WHERE id = n.id;
        IF target = 'retired' THEN
            UPDATE tuneplane.node_credentials SET revoked_at = now(), revoked_reason = 'node retired'
             WHERE node_credentials.node_id = n.id AND revoked_at IS NULL;
        END IF;
        PERFORM tuneplane.log_node_event(n.fleet_id, n.id, p_action, actor,
                                         coalesce(nullif(p_reason, ''), '(no reason given)'),
                                         jsonb_build_object('from', n.scheduling_state, 'to', target));
    END IF;
    RETURN QUERY SELECT n.id, f.name, n.name, target, n.scheduling_state <> target
                   FROM tuneplane.fleets f WHERE f.id = n.fleet_id;
END;
$$;


--
-- Name: check_artifact_name_kind(text, text); Type: FUNCTION; Schema: tuneplane; Owner: -
--

CREATE FUNCTION tuneplane.check_artifact_name_kind(p_name text, p_kind text) RETURNS void
    LANGUAGE plpgsql IMMUTABLE
    AS $_$
BEGIN
    IF p_name IS NULL OR p_name !~ '^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$' THEN
        RAISE EXCEPTION 'artifact name must be 1-63 characters of letters, digits, . _ -' USING ERRCODE = 'TP400',
            COLUMN = 'name';
    END IF;
    IF coalesce(p_kind, '') NOT IN ('output', 'checkpoint', 'logs') THEN
        RAISE EXCEPTION 'artifact kind must be output, checkpoint or logs' USING ERRCODE = 'TP400', COLUMN = 'kind';
    END IF;
END;
$_$;


--
-- Name: claim_launch(bigint, text); Type: FUNCTION; Schema: tuneplane; Owner: -
--

CREATE FUNCTION tuneplane.claim_launch(p_attempt_id bigint, p_owner text) RETURNS TABLE(attempt_id bigint, epoch bigint, state text, job_id bigint, attempt_number integer)
    LANGUAGE plpgsql
    AS $$
BEGIN
    RETURN QUERY
    UPDATE tuneplane.attempts a
       SET launch_epoch = a.launch_epoch + 1, launch_owner = p_owner
     WHERE a.id = p_attempt_id AND a.state IN ('reserved', 'preparing')
    RETURNING a.id, a.launch_epoch, a.state, a.job_id, a.number;
END;
$$;


--
-- Name: claim_node_commands(bigint, bigint, integer); Type: FUNCTION; Schema: tuneplane; Owner: -
--

CREATE FUNCTION tuneplane.claim_node_commands(p_node_id bigint, p_epoch bigint, p_limit integer DEFAULT 100) RETURNS SETOF tuneplane.node_commands
    LANGUAGE plpgsql
    AS $$
DECLARE
    n tuneplane.nodes;
BEGIN
    n := tuneplane.require_node_session(p_node_id, p_epoch);
    IF n.session_reconciled_epoch <> p_epoch THEN
        RETURN;
    END IF;
    RETURN QUERY
        WITH c AS (
            SELECT id FROM tuneplane.node_commands
             WHERE node_id = p_node_id AND acked_at IS NULL AND claimed_epoch IS DISTINCT FROM p_epoch
             ORDER BY id
             LIMIT p_limit
               FOR UPDATE SKIP LOCKED
        )
        UPDATE tuneplane.node_commands nc
           SET claimed_epoch = p_epoch, delivered_at = clock_timestamp(), delivery_count = nc.delivery_count + 1
          FROM c WHERE nc.id = c.id
        RETURNING nc.*;
END;
$$;


--
-- Name: complete_artifacts_of(bigint, integer); Type: FUNCTION; Schema: tuneplane; Owner: -
--

CREATE FUNCTION tuneplane.complete_artifacts_of(p_user_id bigint, p_limit integer DEFAULT 200) RETURNS TABLE(id bigint, job_id bigint, attempt integer, rank integer, name text, kind text, manifest_digest text, file_count integer, total_bytes bigint, completed_at timestamp with time zone, ref text)
    LANGUAGE sql STABLE
    AS $$
    SELECT a.id, a.job_id, at.number, a.rank, a.name, a.kind, a.manifest_digest, a.file_count, a.total_bytes,
           a.completed_at, a.job_id || '/' || a.name || '@' || a.rank
      FROM tuneplane.artifacts a
      JOIN tuneplane.jobs j ON j.id = a.job_id
      JOIN tuneplane.attempts at ON at.id = a.attempt_id
     WHERE a.state = 'complete' AND j.owner_id = p_user_id
     ORDER BY a.completed_at DESC, a.id DESC
     LIMIT greatest(1, least(coalesce(p_limit, 200), 1000))
$$;


--
-- Name: node_settings; Type: TABLE; Schema: tuneplane; Owner: -
--

CREATE TABLE tuneplane.node_settings (
    singleton boolean DEFAULT true NOT NULL,
    heartbeat_interval interval DEFAULT '00:00:10'::interval NOT NULL,
    stale_after interval DEFAULT '00:00:30'::interval NOT NULL,
    lost_after interval DEFAULT '00:01:30'::interval NOT NULL,
    credential_rotate_after interval DEFAULT '24:00:00'::interval NOT NULL,
    credential_grace interval DEFAULT '00:10:00'::interval NOT NULL,
    enrollment_token_max_ttl interval DEFAULT '30 days'::interval NOT NULL,
    CONSTRAINT node_settings_check CHECK ((stale_after > heartbeat_interval)),
    CONSTRAINT node_settings_check1 CHECK ((lost_after > stale_after)),
    CONSTRAINT node_settings_credential_grace_check CHECK ((credential_grace > '00:00:00'::interval)),
    CONSTRAINT node_settings_credential_rotate_after_check CHECK ((credential_rotate_after > '00:00:00'::interval)),
    CONSTRAINT node_settings_heartbeat_interval_check CHECK ((heartbeat_interval > '00:00:00'::interval)),
    CONSTRAINT node_settings_singleton_check CHECK (singleton)
);


--
-- Name: configure_node_settings(interval, interval, interval, interval, interval); Type: FUNCTION; Schema: tuneplane; Owner: -
--

CREATE FUNCTION tuneplane.configure_node_settings(p_heartbeat_interval interval DEFAULT NULL::interval, p_stale_after interval DEFAULT NULL::interval, p_lost_after interval DEFAULT NULL::interval, p_credential_rotate_after interval DEFAULT NULL::interval, p_credential_grace interval DEFAULT NULL::interval) RETURNS tuneplane.node_settings
    LANGUAGE plpgsql
    AS $$
DECLARE
    result tuneplane.node_settings;
BEGIN
    UPDATE tuneplane.node_settings SET
        heartbeat_interval = coalesce(p_heartbeat_interval, heartbeat_interval),
        stale_after = coalesce(p_stale_after, stale_after),
        lost_after = coalesce(p_lost_after, lost_after),
        credential_rotate_after = coalesce(p_credential_rotate_after, credential_rotate_after),
        credential_grace = coalesce(p_credential_grace, credential_grace)
    RETURNING * INTO result;
    RETURN result;
EXCEPTION WHEN check_violation THEN
    RAISE EXCEPTION 'node settings must satisfy 0 < heartbeat_interval < stale_after < lost_after'
        USING ERRCODE = 'TP400', COLUMN = 'stale_after';
END;
$$;


--
-- Name: confirm_node_credential(bigint, bigint); Type: FUNCTION; Schema: tuneplane; Owner: -
--

CREATE FUNCTION tuneplane.confirm_node_credential(p_node_id bigint, p_credential_id bigint) RETURNS timestamp with time zone
    LANGUAGE plpgsql
    AS $$
DECLARE
    s tuneplane.node_settings;
    superseded integer;
BEGIN
    SELECT * INTO s FROM tuneplane.node_settings;
    UPDATE tuneplane.node_credentials SET first_used_at = coalesce(first_used_at, now())
     WHERE id = p_credential_id AND node_id = p_node_id AND revoked_at IS NULL;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'credential % is not a live credential of node %', p_credential_id, p_node_id
            USING ERRCODE = 'TP409', COLUMN = 'credential';
    END IF;
    UPDATE tuneplane.node_credentials
       SET superseded_at = now(), grace_until = now() + s.credential_grace
     WHERE node_id = p_node_id AND id < p_credential_id AND grace_until IS NULL AND revoked_at IS NULL;
    GET DIAGNOSTICS superseded = ROW_COUNT;
    IF superseded > 0 THEN
        PERFORM tuneplane.log_node_event(NULL, p_node_id, 'credential_rotated', 'gateway',
                                         'scheduled rotation; previous credential valid for ' || s.credential_grace,
                                         jsonb_build_object('credential_id', p_credential_id));
    END IF;
    RETURN now() + s.credential_grace;
END;
$$;


--
-- Name: confirm_preview(bigint, uuid, text, text); Type: FUNCTION; Schema: tuneplane; Owner: -
--

CREATE FUNCTION tuneplane.confirm_preview(p_actor_id bigint, p_preview_id uuid, p_digest text, p_retry_key text) RETURNS TABLE(job_id bigint, preview_id uuid, digest text, retry_key text, state text, state_reason text, created_at timestamp with time zone, replayed boolean)
    LANGUAGE plpgsql
    AS $_$
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
                                        nodes, gpus_per_node, cpus_per_node, memory_per_node, max_attempts, spec)
            VALUES (v_job_id, p_actor_id, p_preview_id, v_preview.fleet_id, 'queued',
                    format('waiting for resources: %s × (%s GPU, %s CPU, %s) on fleet %s',
                           (v_res ->> 'nodes')::integer, (v_res ->> 'gpus_per_node')::integer,
                           (v_res ->> 'cpus_per_node')::integer,
                           tuneplane.format_bytes((v_res ->> 'memory_per_node')::bigint),
                           v_preview.resolved -> 'fleet' ->> 'name'),
                    (v_preview.resolved ->> 'priority')::integer,
                    (v_res ->> 'nodes')::integer, (v_res ->> 'gpus_per_node')::integer,
                    (v_res ->> 'cpus_per_node')::integer, (v_res ->> 'memory_per_node')::bigint,
                    (v_preview.resolved ->> 'max_attempts')::integer, v_preview.resolved)
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
$_$;


--
-- Name: cordon_node(text, text, text); Type: FUNCTION; Schema: tuneplane; Owner: -
--

CREATE FUNCTION tuneplane.cordon_node(p_node text, p_reason text DEFAULT NULL::text, p_actor text DEFAULT NULL::text) RETURNS TABLE(node_id bigint, fleet text, node text, scheduling_state text, changed boolean)
    LANGUAGE sql
    AS $$ SELECT * FROM tuneplane.change_node_scheduling(p_node, 'cordon', p_reason, p_actor) $$;


--
-- Name: create_enrollment_token(text, text, interval, text); Type: FUNCTION; Schema: tuneplane; Owner: -
--

CREATE FUNCTION tuneplane.create_enrollment_token(p_fleet text, p_token_hash text, p_ttl interval, p_created_by text DEFAULT NULL::text) RETURNS TABLE(token_id bigint, fleet text, expires_at timestamp with time zone)
    LANGUAGE plpgsql
    AS $_$
DECLARE
    f tuneplane.fleets;
    max_ttl interval;
    tok tuneplane.enrollment_tokens;
BEGIN
    SELECT * INTO f FROM tuneplane.fleets WHERE name = p_fleet;
    IF f.id IS NULL THEN
        RAISE EXCEPTION 'no fleet named %', p_fleet USING ERRCODE = 'TP404', COLUMN = 'fleet';
    END IF;
    IF f.backend <> 'node' THEN
        RAISE EXCEPTION 'fleet % uses backend %; only node fleets enroll agents', p_fleet, f.backend
            USING ERRCODE = 'TP409', COLUMN = 'fleet';
    END IF;
    SELECT enrollment_token_max_ttl INTO max_ttl FROM tuneplane.node_settings;
    IF p_ttl IS NULL OR p_ttl <= interval '0' OR p_ttl > max_ttl THEN
        RAISE EXCEPTION 'ttl must be positive and at most %', max_ttl USING ERRCODE = 'TP400', COLUMN = 'ttl';
    END IF;
    IF p_token_hash IS NULL OR p_token_hash !~ '^[0-9a-f]{64}$' THEN
        RAISE EXCEPTION 'token hash must be a sha256 hex digest' USING ERRCODE = 'TP400', COLUMN = 'token';
    END IF;
    INSERT INTO tuneplane.enrollment_tokens (fleet_id, token_hash, created_by, expires_at)
    VALUES (f.id, p_token_hash, coalesce(nullif(p_created_by, ''), 'db:' || session_user), now() + p_ttl)
    RETURNING * INTO tok;
    PERFORM tuneplane.log_node_event(f.id, NULL, 'enrollment_token_created', p_created_by,
                                     'expires ' || tok.expires_at::text, jsonb_build_object('token_id', tok.id));
    RETURN QUERY SELECT tok.id, f.name, tok.expires_at;
END;
$_$;


--
-- Name: users; Type: TABLE; Schema: tuneplane; Owner: -
--

CREATE TABLE tuneplane.users (
    id bigint NOT NULL,
    username text NOT NULL,
    password_hash text,
    role text NOT NULL,
    created_at timestamp with time zone DEFAULT now() NOT NULL,
    disabled_at timestamp with time zone,
    CONSTRAINT users_role_check CHECK ((role = ANY (ARRAY['admin'::text, 'user'::text])))
);


--
-- Name: create_first_admin(text, text); Type: FUNCTION; Schema: tuneplane; Owner: -
--

CREATE FUNCTION tuneplane.create_first_admin(p_username text, p_password_hash text) RETURNS tuneplane.users
    LANGUAGE plpgsql
    AS $$
BEGIN
    PERFORM pg_advisory_xact_lock(hashtext('tuneplane.create_first_admin'));
    IF EXISTS (SELECT 1 FROM tuneplane.users WHERE role = 'admin') THEN
        RETURN NULL;
    END IF;
    RETURN tuneplane.create_user(p_username, p_password_hash, 'admin');
END;
$$;


--
-- Name: fleets; Type: TABLE; Schema: tuneplane; Owner: -
--

CREATE TABLE tuneplane.fleets (
    id bigint NOT NULL,
    name text NOT NULL,
    backend text NOT NULL,
    capabilities jsonb DEFAULT '{}'::jsonb NOT NULL,
    created_at timestamp with time zone DEFAULT now() NOT NULL,
    created_by bigint,
    CONSTRAINT fleets_name_check CHECK ((name ~ '^[a-z0-9][a-z0-9-]{0,62}$'::text))
);


--
-- Name: create_fleet(text, text, jsonb, bigint); Type: FUNCTION; Schema: tuneplane; Owner: -
--

CREATE FUNCTION tuneplane.create_fleet(p_name text, p_backend text, p_capabilities jsonb DEFAULT '{}'::jsonb, p_created_by bigint DEFAULT NULL::bigint) RETURNS tuneplane.fleets
    LANGUAGE plpgsql
    AS $_$
DECLARE
    result tuneplane.fleets;
BEGIN
    IF p_name IS NULL OR p_name !~ '^[a-z0-9][a-z0-9-]{0,62}$' THEN
        RAISE EXCEPTION 'fleet name must be 1-63 characters of a-z, 0-9 and -, starting with a letter or digit'
            USING ERRCODE = 'TP400', COLUMN = 'name';
    END IF;
    IF p_backend IS NULL OR p_backend !~ '^[a-z][a-z0-9_-]{0,62}$' THEN
        RAISE EXCEPTION 'backend must be a backend plugin name such as node' USING ERRCODE = 'TP400',
            COLUMN = 'backend';
    END IF;
    IF jsonb_typeof(coalesce(p_capabilities, '{}'::jsonb)) <> 'object' THEN
        RAISE EXCEPTION 'capabilities must be a JSON object' USING ERRCODE = 'TP400', COLUMN = 'capabilities';
    END IF;
    INSERT INTO tuneplane.fleets (name, backend, capabilities, created_by)
    VALUES (p_name, p_backend, coalesce(p_capabilities, '{}'::jsonb), p_created_by)
    ON CONFLICT (name) DO NOTHING
    RETURNING * INTO result;
    IF result.id IS NULL THEN
        RAISE EXCEPTION 'fleet % already exists', p_name USING ERRCODE = 'TP409', COLUMN = 'name';
    END IF;
    PERFORM tuneplane.log_node_event(result.id, NULL, 'fleet_created', NULL, 'backend ' || p_backend);
    RETURN result;
END;
$_$;


--
-- Name: previews; Type: TABLE; Schema: tuneplane; Owner: -
--

CREATE TABLE tuneplane.previews (
    id uuid DEFAULT gen_random_uuid() NOT NULL,
    owner_id bigint NOT NULL,
    fleet_id bigint NOT NULL,
    spec jsonb NOT NULL,
    resolved jsonb NOT NULL,
    canonical text NOT NULL,
    digest text NOT NULL,
    observed jsonb DEFAULT '{}'::jsonb NOT NULL,
    created_at timestamp with time zone DEFAULT now() NOT NULL,
    expires_at timestamp with time zone NOT NULL,
    CONSTRAINT previews_check CHECK ((expires_at >= created_at)),
    CONSTRAINT previews_digest_check CHECK ((digest ~ '^[0-9a-f]{64}$'::text))
);


--
-- Name: create_preview(bigint, jsonb, jsonb); Type: FUNCTION; Schema: tuneplane; Owner: -
--

CREATE FUNCTION tuneplane.create_preview(p_owner_id bigint, p_spec jsonb, p_pins jsonb) RETURNS tuneplane.previews
    LANGUAGE plpgsql
    AS $$
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


--
-- Name: create_preview_resolve(bigint, jsonb, jsonb); Type: FUNCTION; Schema: tuneplane; Owner: -
--

CREATE FUNCTION tuneplane.create_preview_resolve(p_owner_id bigint, p_spec jsonb, p_pins jsonb) RETURNS tuneplane.previews
    LANGUAGE plpgsql
    AS $_$
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
$_$;


--
-- Name: create_slurm_fleet(text, text, text, jsonb, text, text); Type: FUNCTION; Schema: tuneplane; Owner: -
--

CREATE FUNCTION tuneplane.create_slurm_fleet(p_name text, p_partition text, p_slurm_conf text, p_capabilities jsonb, p_account text DEFAULT NULL::text, p_qos text DEFAULT NULL::text) RETURNS tuneplane.fleets
    LANGUAGE plpgsql
    AS $$
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


--
-- Name: create_user(text, text, text); Type: FUNCTION; Schema: tuneplane; Owner: -
--

CREATE FUNCTION tuneplane.create_user(p_username text, p_password_hash text, p_role text) RETURNS tuneplane.users
    LANGUAGE plpgsql
    AS $_$
DECLARE
    result tuneplane.users;
BEGIN
    IF p_username IS NULL OR p_username !~ '^[a-z0-9][a-z0-9_.-]{1,62}$' THEN
        RAISE EXCEPTION 'username must be 2-63 characters of a-z, 0-9, _ . - starting with a letter or digit'
            USING ERRCODE = 'TP400', COLUMN = 'username';
    END IF;
    IF p_role NOT IN ('admin', 'user') THEN
        RAISE EXCEPTION 'role must be admin or user' USING ERRCODE = 'TP400', COLUMN = 'role';
    END IF;
    INSERT INTO tuneplane.users (username, password_hash, role)
    VALUES (p_username, p_password_hash, p_role)
    ON CONFLICT (username) DO NOTHING
    RETURNING * INTO result;
    IF result.id IS NULL THEN
        RAISE EXCEPTION 'user % already exists', p_username USING ERRCODE = 'TP409', COLUMN = 'username';
    END IF;
    RETURN result;
END;
$_$;


--
-- Name: decide_abort(bigint, text); Type: FUNCTION; Schema: tuneplane; Owner: -
--

CREATE FUNCTION tuneplane.decide_abort(p_attempt_id bigint, p_reason text) RETURNS boolean
    LANGUAGE plpgsql
    AS $$
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
    FOR m IN SELECT * FROM tuneplane.members WHERE attempt_id = p_attempt_id AND tuneplane.member_is_live(state)
              ORDER BY id FOR UPDATE LOOP
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


--
-- Name: describe_request(tuneplane.jobs); Type: FUNCTION; Schema: tuneplane; Owner: -
--

CREATE FUNCTION tuneplane.describe_request(p_job tuneplane.jobs) RETURNS text
    LANGUAGE sql IMMUTABLE
    AS $$
    SELECT format('%s node%s × %s GPU%s, %s CPU%s, %s memory',
                  p_job.nodes, CASE WHEN p_job.nodes = 1 THEN '' ELSE 's' END,
                  p_job.gpus_per_node, CASE WHEN p_job.gpus_per_node = 1 THEN '' ELSE 's' END,
                  p_job.cpus_per_node, CASE WHEN p_job.cpus_per_node = 1 THEN '' ELSE 's' END,
                  pg_size_pretty(p_job.memory_per_node));
$$;


--
-- Name: discard_artifact_chunks(text, bigint, integer, integer[], text); Type: FUNCTION; Schema: tuneplane; Owner: -
--

CREATE FUNCTION tuneplane.discard_artifact_chunks(p_credential_hash text, p_artifact_id bigint, p_file_index integer, p_chunks integer[], p_reason text) RETURNS integer
    LANGUAGE plpgsql
    AS $$
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


--
-- Name: drain_node(text, text, text); Type: FUNCTION; Schema: tuneplane; Owner: -
--

CREATE FUNCTION tuneplane.drain_node(p_node text, p_reason text DEFAULT NULL::text, p_actor text DEFAULT NULL::text) RETURNS TABLE(node_id bigint, fleet text, node text, scheduling_state text, changed boolean)
    LANGUAGE sql
    AS $$ SELECT * FROM tuneplane.change_node_scheduling(p_node, 'drain', p_reason, p_actor) $$;


--
-- Name: effective_limits(bigint); Type: FUNCTION; Schema: tuneplane; Owner: -
--

CREATE FUNCTION tuneplane.effective_limits(p_user_id bigint) RETURNS TABLE(max_gpus_per_job bigint, max_nodes_per_job bigint)
    LANGUAGE sql STABLE
    AS $$
    SELECT coalesce(l.max_gpus_per_job::bigint, tuneplane.submission_setting('max_gpus_per_job')),
           coalesce(l.max_nodes_per_job::bigint, tuneplane.submission_setting('max_nodes_per_job'))
      FROM (SELECT p_user_id AS user_id) AS who
      LEFT JOIN tuneplane.user_limits l ON l.user_id = who.user_id;
$$;


--
-- Name: enqueue_node_command(bigint, text, jsonb, text); Type: FUNCTION; Schema: tuneplane; Owner: -
--

CREATE FUNCTION tuneplane.enqueue_node_command(p_node_id bigint, p_kind text, p_payload jsonb DEFAULT '{}'::jsonb, p_created_by text DEFAULT NULL::text) RETURNS tuneplane.node_commands
    LANGUAGE plpgsql
    AS $_$
DECLARE
    n tuneplane.nodes;
    v_cmd tuneplane.node_commands;
BEGIN
    SELECT * INTO n FROM tuneplane.nodes WHERE id = p_node_id;
    IF n.id IS NULL THEN
        RAISE EXCEPTION 'no node %', p_node_id USING ERRCODE = 'TP404', COLUMN = 'node';
    END IF;
    IF n.scheduling_state = 'retired' THEN
        RAISE EXCEPTION 'node % is retired', n.name USING ERRCODE = 'TP409', COLUMN = 'node';
    END IF;
    IF p_kind IS NULL OR p_kind !~ '^[a-z][a-z0-9_.-]{0,62}$' THEN
        RAISE EXCEPTION 'command kind must be a lowercase word' USING ERRCODE = 'TP400', COLUMN = 'kind';
    END IF;
    INSERT INTO tuneplane.node_commands (node_id, kind, payload, created_by)
    VALUES (p_node_id, p_kind, coalesce(p_payload, '{}'::jsonb), coalesce(nullif(p_created_by, ''), 'db:' || session_user))
    RETURNING * INTO v_cmd;
    PERFORM pg_notify('tuneplane_node_commands', p_node_id::text);
    RETURN v_cmd;
END;
$_$;


--
-- Name: enroll_node(text, text, text, text); Type: FUNCTION; Schema: tuneplane; Owner: -
--

CREATE FUNCTION tuneplane.enroll_node(p_token_hash text, p_node_name text, p_credential_hash text, p_address text DEFAULT NULL::text) RETURNS TABLE(node_id bigint, fleet_id bigint, fleet text, node text)
    LANGUAGE plpgsql
    AS $_$
DECLARE
    tok tuneplane.enrollment_tokens;
    f tuneplane.fleets;
    n tuneplane.nodes;
BEGIN
    SELECT * INTO tok FROM tuneplane.enrollment_tokens t WHERE t.token_hash = p_token_hash FOR UPDATE;
    IF tok.id IS NULL THEN
        RAISE EXCEPTION 'unknown enrollment token' USING ERRCODE = 'TP401', COLUMN = 'enroll_token';
    END IF;
    IF tok.used_at IS NOT NULL THEN
        RAISE EXCEPTION 'enrollment token was already used at % (tokens are one-time; create a new one with '
                        '`tuneplane fleet enroll-token`)', tok.used_at
            USING ERRCODE = 'TP401', COLUMN = 'enroll_token';
    END IF;
    IF tok.expires_at <= now() THEN
        RAISE EXCEPTION 'enrollment token expired at % (create a new one with `tuneplane fleet enroll-token`)',
                        tok.expires_at
            USING ERRCODE = 'TP401', COLUMN = 'enroll_token';
    END IF;
    IF p_node_name IS NULL OR p_node_name !~ '^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$' THEN
        RAISE EXCEPTION 'node name must be 1-63 characters of letters, digits, _ . -'
            USING ERRCODE = 'TP400', COLUMN = 'name';
    END IF;
    IF p_credential_hash IS NULL OR p_credential_hash !~ '^[0-9a-f]{64}$' THEN
        RAISE EXCEPTION 'credential hash must be a sha256 hex digest' USING ERRCODE = 'TP400',
            COLUMN = 'credential';
    END IF;
    SELECT * INTO f FROM tuneplane.fleets WHERE id = tok.fleet_id;
    INSERT INTO tuneplane.nodes (fleet_id, name, address)
    VALUES (f.id, p_node_name, p_address)
    ON CONFLICT ON CONSTRAINT nodes_fleet_id_name_key DO NOTHING
    RETURNING * INTO n;
    IF n.id IS NULL THEN
        RAISE EXCEPTION 'a node named % is already enrolled in fleet % (pick another --name)', p_node_name, f.name
            USING ERRCODE = 'TP409', COLUMN = 'name';
    END IF;
    UPDATE tuneplane.enrollment_tokens SET used_at = now(), used_by_node = n.id WHERE id = tok.id;
    INSERT INTO tuneplane.node_credentials (node_id, credential_hash) VALUES (n.id, p_credential_hash);
    PERFORM tuneplane.log_node_event(f.id, n.id, 'enrolled', 'node:' || n.name, 'enrollment token ' || tok.id,
                                     jsonb_build_object('address', p_address));
    RETURN QUERY SELECT n.id, f.id, f.name, n.name;
END;
$_$;


--
-- Name: expire_member_deadlines(); Type: FUNCTION; Schema: tuneplane; Owner: -
--

CREATE FUNCTION tuneplane.expire_member_deadlines() RETURNS integer
    LANGUAGE plpgsql
    AS $$
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


--
-- Name: expire_prepare_deadlines(); Type: FUNCTION; Schema: tuneplane; Owner: -
--

CREATE FUNCTION tuneplane.expire_prepare_deadlines() RETURNS integer
    LANGUAGE plpgsql
    AS $$
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


--
-- Name: explain_job(bigint, text, text); Type: FUNCTION; Schema: tuneplane; Owner: -
--

CREATE FUNCTION tuneplane.explain_job(p_job_id bigint, p_state text, p_reason text) RETURNS boolean
    LANGUAGE plpgsql
    AS $$
BEGIN
    IF coalesce(p_reason, '') = '' THEN
        RAISE EXCEPTION 'a reason cannot be empty' USING ERRCODE = 'TP400', COLUMN = 'reason';
    END IF;
    UPDATE tuneplane.jobs SET state_reason = p_reason
     WHERE id = p_job_id AND state = p_state AND state_reason IS DISTINCT FROM p_reason;
    RETURN FOUND OR EXISTS (SELECT 1 FROM tuneplane.jobs WHERE id = p_job_id AND state = p_state);
END;
$$;


--
-- Name: fail_artifact(text, bigint, text); Type: FUNCTION; Schema: tuneplane; Owner: -
--

CREATE FUNCTION tuneplane.fail_artifact(p_credential_hash text, p_artifact_id bigint, p_reason text) RETURNS tuneplane.artifacts
    LANGUAGE plpgsql
    AS $$
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


--
-- Name: fence_node(text, text, text); Type: FUNCTION; Schema: tuneplane; Owner: -
--

CREATE FUNCTION tuneplane.fence_node(p_node text, p_reason text DEFAULT NULL::text, p_actor text DEFAULT NULL::text) RETURNS TABLE(node_id bigint, node text, members_lost integer)
    LANGUAGE plpgsql
    AS $$
DECLARE
    v_id bigint := tuneplane.resolve_node(p_node);
    v_node tuneplane.nodes;
    v_why text;
BEGIN
    PERFORM pg_advisory_xact_lock(hashtext('tuneplane.placement'),
                                  (SELECT fleet_id FROM tuneplane.nodes WHERE id = v_id)::integer);
    SELECT * INTO v_node FROM tuneplane.nodes WHERE id = v_id FOR UPDATE;
    v_why := format('node %s fenced by %s%s', v_node.name, coalesce(nullif(p_actor, ''), 'db:' || session_user),
                    CASE WHEN coalesce(p_reason, '') = '' THEN '' ELSE ': ' || p_reason END);
    UPDATE tuneplane.nodes SET fenced_at = coalesce(fenced_at, clock_timestamp()),
                               fenced_reason = coalesce(p_reason, fenced_reason)
     WHERE id = v_node.id;
    PERFORM tuneplane.log_node_event(v_node.fleet_id, v_node.id, 'fenced', p_actor, coalesce(p_reason, ''));
    node_id := v_node.id; node := v_node.name;
    members_lost := tuneplane.lose_node_members(v_node.id, v_why);
    RETURN NEXT;
END;
$$;


--
-- Name: find_artifact(bigint, bigint, text, integer, integer); Type: FUNCTION; Schema: tuneplane; Owner: -
--

CREATE FUNCTION tuneplane.find_artifact(p_user_id bigint, p_job_id bigint, p_name text, p_rank integer DEFAULT NULL::integer, p_attempt integer DEFAULT NULL::integer) RETURNS tuneplane.artifacts
    LANGUAGE plpgsql STABLE
    AS $$
DECLARE
    v_attempt integer;
    n integer;
    choices text;
    a tuneplane.artifacts;
BEGIN
    PERFORM tuneplane.job_visible_to(p_user_id, p_job_id);
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


--
-- Name: finish_artifact(text, bigint); Type: FUNCTION; Schema: tuneplane; Owner: -
--

CREATE FUNCTION tuneplane.finish_artifact(p_credential_hash text, p_artifact_id bigint) RETURNS tuneplane.artifacts
    LANGUAGE plpgsql
    AS $$
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


--
-- Name: finish_attempt_if_done(bigint); Type: FUNCTION; Schema: tuneplane; Owner: -
--

CREATE FUNCTION tuneplane.finish_attempt_if_done(p_attempt_id bigint) RETURNS text
    LANGUAGE plpgsql
    AS $$
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
    IF a.state IN ('succeeded', 'failed', 'aborted', 'cancelled') THEN
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

    SELECT * INTO j FROM tuneplane.jobs WHERE id = a.job_id;
    SELECT free_relaunches INTO v_free FROM tuneplane.launch_settings;
    v_counted := a.number - j.free_relaunches_used;
    IF v_state = 'succeeded' THEN
        PERFORM tuneplane.set_job_state(j.id, 'succeeded', format('attempt %s: %s', a.number, v_reason));
    ELSIF v_state = 'cancelled' THEN
        PERFORM tuneplane.set_job_state(j.id, 'cancelled',
            format('cancelled; every member of attempt %s stopped and its resources were released', a.number));
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
            format('attempt %s of %s failed (%s); queued for attempt %s', v_counted, j.max_attempts, v_reason,
                   v_counted + 1));
        PERFORM pg_notify('tuneplane_placement', j.fleet_id::text);
    ELSE
        PERFORM tuneplane.set_job_state(j.id, 'failed',
            format('attempt %s of %s failed: %s', v_counted, j.max_attempts, v_reason));
    END IF;
    RETURN v_state;
END;
$$;


--
-- Name: fleet_fit(integer, integer, bigint, boolean); Type: FUNCTION; Schema: tuneplane; Owner: -
--

CREATE FUNCTION tuneplane.fleet_fit(p_gpus_per_node integer, p_cpus_per_node integer, p_memory_per_node bigint, p_needs_container_runtime boolean) RETURNS TABLE(fleet_id bigint, fleet text, backend text, capable_nodes bigint, non_retired_nodes bigint, capable_but_unschedulable bigint, simulated_gpus boolean)
    LANGUAGE sql STABLE
    AS $$
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


--
-- Name: fleet_free_capacity(bigint); Type: FUNCTION; Schema: tuneplane; Owner: -
--

CREATE FUNCTION tuneplane.fleet_free_capacity(p_fleet_id bigint) RETURNS TABLE(node_id bigint, node_name text, address text, total_gpus integer, free_gpus integer, free_cpus integer, free_memory bigint, cpus integer, memory_bytes bigint)
    LANGUAGE sql STABLE
    AS $$
    SELECT n.id, n.name, n.address, u.total_gpus, u.total_gpus - u.used_gpus,
           n.cpus - u.used_cpus, n.memory_bytes - u.used_memory, n.cpus, n.memory_bytes
      FROM tuneplane.nodes n
      JOIN tuneplane.node_usage u ON u.node_id = n.id
     WHERE n.fleet_id = p_fleet_id
       AND n.scheduling_state = 'active'
       AND n.fenced_at IS NULL
       AND tuneplane.node_connectivity(n.last_heartbeat_at) = 'connected';
$$;


--
-- Name: fleet_storage_capabilities(jsonb); Type: FUNCTION; Schema: tuneplane; Owner: -
--

CREATE FUNCTION tuneplane.fleet_storage_capabilities(p_capabilities jsonb) RETURNS TABLE(object_delivery boolean, shared_mounts boolean, shared_path text)
    LANGUAGE sql IMMUTABLE
    AS $$
    SELECT coalesce((p_capabilities ->> 'object_delivery')::boolean, true),
           coalesce((p_capabilities ->> 'shared_mounts')::boolean, false)
               AND (p_capabilities ->> 'shared_path') LIKE '/%',
           CASE WHEN coalesce((p_capabilities ->> 'shared_mounts')::boolean, false)
                THEN nullif(rtrim(p_capabilities ->> 'shared_path', '/'), '') END;
$$;


--
-- Name: format_bytes(bigint); Type: FUNCTION; Schema: tuneplane; Owner: -
--

CREATE FUNCTION tuneplane.format_bytes(p_bytes bigint) RETURNS text
    LANGUAGE sql IMMUTABLE STRICT
    AS $$
    SELECT CASE
        WHEN p_bytes >= 1024::numeric ^ 4 THEN trim_scale(round(p_bytes / 1024::numeric ^ 4, 1)) || ' TiB'
        WHEN p_bytes >= 1024::numeric ^ 3 THEN trim_scale(round(p_bytes / 1024::numeric ^ 3, 1)) || ' GiB'
        WHEN p_bytes >= 1024::numeric ^ 2 THEN trim_scale(round(p_bytes / 1024::numeric ^ 2, 1)) || ' MiB'
        WHEN p_bytes >= 1024 THEN trim_scale(round(p_bytes / 1024::numeric, 1)) || ' KiB'
        ELSE p_bytes || ' B'
    END;
$$;


--
-- Name: confirmations; Type: TABLE; Schema: tuneplane; Owner: -
--

CREATE TABLE tuneplane.confirmations (
    owner_id bigint NOT NULL,
    retry_key text NOT NULL,
    preview_id uuid NOT NULL,
    digest text NOT NULL,
    job_id bigint NOT NULL,
    created_at timestamp with time zone DEFAULT now() NOT NULL,
    CONSTRAINT confirmations_retry_key_check CHECK ((retry_key ~ '^[A-Za-z0-9._:-]{1,200}$'::text))
);


--
-- Name: v_jobs; Type: VIEW; Schema: tuneplane; Owner: -
--

CREATE VIEW tuneplane.v_jobs AS
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
    (j.nodes * j.gpus_per_node) AS total_gpus,
    j.cpus_per_node,
    j.memory_per_node,
    j.max_attempts,
    ((j.spec -> 'input'::text) ->> 'kind'::text) AS input_kind,
        CASE ((j.spec -> 'input'::text) ->> 'kind'::text)
            WHEN 'recipe'::text THEN ('recipe '::text || ((j.spec -> 'input'::text) ->> 'name'::text))
            WHEN 'source'::text THEN ((('source '::text || "left"((((j.spec -> 'input'::text) -> 'archive'::text) ->> 'sha256'::text), 12)) || ': '::text) || ((j.spec -> 'input'::text) ->> 'entrypoint'::text))
            WHEN 'image'::text THEN ((((j.spec -> 'input'::text) ->> 'image'::text) || ': '::text) || ((j.spec -> 'input'::text) ->> 'command'::text))
            ELSE NULL::text
        END AS input_summary,
    j.spec,
    j.created_at,
    j.updated_at
   FROM ((((tuneplane.jobs j
     JOIN tuneplane.users u ON ((u.id = j.owner_id)))
     JOIN tuneplane.fleets f ON ((f.id = j.fleet_id)))
     JOIN tuneplane.previews p ON ((p.id = j.preview_id)))
     LEFT JOIN tuneplane.confirmations c ON ((c.job_id = j.id)));


--
-- Name: get_job(bigint, bigint); Type: FUNCTION; Schema: tuneplane; Owner: -
--

CREATE FUNCTION tuneplane.get_job(p_actor_id bigint, p_job_id bigint) RETURNS SETOF tuneplane.v_jobs
    LANGUAGE plpgsql STABLE
    AS $$
BEGIN
    RETURN QUERY
        SELECT v.* FROM tuneplane.v_jobs v, tuneplane.users a
         WHERE v.id = p_job_id AND a.id = p_actor_id AND a.disabled_at IS NULL
           AND (a.role = 'admin' OR v.owner_id = a.id);
    IF NOT FOUND THEN
        RAISE EXCEPTION 'no job % of yours', p_job_id USING ERRCODE = 'TP404', COLUMN = 'job_id';
    END IF;
END;
$$;


--
-- Name: get_preview(bigint, uuid); Type: FUNCTION; Schema: tuneplane; Owner: -
--

CREATE FUNCTION tuneplane.get_preview(p_actor_id bigint, p_preview_id uuid) RETURNS tuneplane.previews
    LANGUAGE plpgsql STABLE
    AS $$
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


--
-- Name: guard_state_transition(); Type: FUNCTION; Schema: tuneplane; Owner: -
--

CREATE FUNCTION tuneplane.guard_state_transition() RETURNS trigger
    LANGUAGE plpgsql
    AS $$
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


--
-- Name: api_tokens; Type: TABLE; Schema: tuneplane; Owner: -
--

CREATE TABLE tuneplane.api_tokens (
    id bigint NOT NULL,
    user_id bigint NOT NULL,
    name text NOT NULL,
    token_hash text NOT NULL,
    scopes text[] DEFAULT ARRAY['api'::text] NOT NULL,
    created_at timestamp with time zone DEFAULT now() NOT NULL,
    expires_at timestamp with time zone,
    revoked_at timestamp with time zone,
    last_used_at timestamp with time zone
);


--
-- Name: issue_api_token(bigint, text, text, interval); Type: FUNCTION; Schema: tuneplane; Owner: -
--

CREATE FUNCTION tuneplane.issue_api_token(p_user_id bigint, p_name text, p_token_hash text, p_ttl interval DEFAULT NULL::interval) RETURNS tuneplane.api_tokens
    LANGUAGE plpgsql
    AS $_$
DECLARE
    result tuneplane.api_tokens;
BEGIN
    IF NOT EXISTS (SELECT 1 FROM tuneplane.users WHERE id = p_user_id AND disabled_at IS NULL) THEN
        RAISE EXCEPTION 'no such active user' USING ERRCODE = 'TP404', COLUMN = 'user';
    END IF;
    IF p_token_hash !~ '^[0-9a-f]{64}$' THEN
        RAISE EXCEPTION 'token hash must be a sha256 hex digest' USING ERRCODE = 'TP400', COLUMN = 'token';
    END IF;
    INSERT INTO tuneplane.api_tokens (user_id, name, token_hash, expires_at)
    VALUES (p_user_id, coalesce(nullif(p_name, ''), 'api'), p_token_hash, now() + p_ttl)
    RETURNING * INTO result;
    RETURN result;
END;
$_$;


--
-- Name: issue_member_telemetry_token(bigint, bigint, jsonb); Type: FUNCTION; Schema: tuneplane; Owner: -
--

CREATE FUNCTION tuneplane.issue_member_telemetry_token(p_node_id bigint, p_epoch bigint, p_payload jsonb) RETURNS jsonb
    LANGUAGE plpgsql
    AS $$
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


--
-- Name: telemetry_tokens; Type: TABLE; Schema: tuneplane; Owner: -
--

CREATE TABLE tuneplane.telemetry_tokens (
    id bigint NOT NULL,
    token_hash text NOT NULL,
    job_id bigint NOT NULL,
    attempt integer NOT NULL,
    member_rank integer NOT NULL,
    created_at timestamp with time zone DEFAULT now() NOT NULL,
    expires_at timestamp with time zone NOT NULL,
    revoked_at timestamp with time zone,
    CONSTRAINT telemetry_tokens_attempt_check CHECK ((attempt >= 1)),
    CONSTRAINT telemetry_tokens_member_rank_check CHECK ((member_rank >= 0)),
    CONSTRAINT telemetry_tokens_token_hash_check CHECK ((token_hash ~ '^[0-9a-f]{64}$'::text))
);


--
-- Name: COLUMN telemetry_tokens.revoked_at; Type: COMMENT; Schema: tuneplane; Owner: -
--

COMMENT ON COLUMN tuneplane.telemetry_tokens.revoked_at IS 'refused from this time on (may be in the future)';


--
-- Name: issue_telemetry_token(bigint, integer, integer, text, interval); Type: FUNCTION; Schema: tuneplane; Owner: -
--

CREATE FUNCTION tuneplane.issue_telemetry_token(p_job_id bigint, p_attempt integer, p_member_rank integer, p_token_hash text, p_ttl interval DEFAULT NULL::interval) RETURNS tuneplane.telemetry_tokens
    LANGUAGE plpgsql
    AS $_$
DECLARE
    result tuneplane.telemetry_tokens;
    job_exists boolean;
BEGIN
    IF p_token_hash IS NULL OR p_token_hash !~ '^[0-9a-f]{64}$' THEN
        RAISE EXCEPTION 'token hash must be a sha256 hex digest' USING ERRCODE = 'TP400', COLUMN = 'token';
    END IF;
    IF p_attempt IS NULL OR p_attempt < 1 THEN
        RAISE EXCEPTION 'attempt must be 1 or more' USING ERRCODE = 'TP400', COLUMN = 'attempt';
    END IF;
    IF p_member_rank IS NULL OR p_member_rank < 0 THEN
        RAISE EXCEPTION 'member rank must be 0 or more' USING ERRCODE = 'TP400', COLUMN = 'member_rank';
    END IF;
    IF p_ttl IS NOT NULL AND p_ttl <= interval '0' THEN
        RAISE EXCEPTION 'token lifetime must be positive' USING ERRCODE = 'TP400', COLUMN = 'ttl';
    END IF;
    -- Dynamic on purpose: this migration does not depend on the jobs table's migration order.
    IF to_regclass('tuneplane.jobs') IS NOT NULL THEN
        EXECUTE 'SELECT EXISTS (SELECT 1 FROM tuneplane.jobs WHERE id = $1)' INTO job_exists USING p_job_id;
        IF NOT job_exists THEN
            RAISE EXCEPTION 'no such job %', p_job_id USING ERRCODE = 'TP404', COLUMN = 'job_id';
        END IF;
    END IF;
    INSERT INTO tuneplane.telemetry_tokens (token_hash, job_id, attempt, member_rank, expires_at)
    SELECT p_token_hash, p_job_id, p_attempt, p_member_rank, now() + coalesce(p_ttl, s.token_ttl)
      FROM tuneplane.telemetry_settings s
    RETURNING * INTO result;
    -- The member's metrics are now being collected (a second token for the same member changes nothing).
    INSERT INTO tuneplane.telemetry_members (job_id, attempt, member_rank)
    VALUES (p_job_id, p_attempt, p_member_rank) ON CONFLICT DO NOTHING;
    RETURN result;
END;
$_$;


--
-- Name: job_artifacts(bigint, bigint); Type: FUNCTION; Schema: tuneplane; Owner: -
--

CREATE FUNCTION tuneplane.job_artifacts(p_user_id bigint, p_job_id bigint) RETURNS TABLE(id bigint, job_id bigint, attempt integer, rank integer, name text, kind text, state text, reason text, delivery text, shared_path text, manifest_digest text, file_count integer, total_bytes bigint, created_at timestamp with time zone, completed_at timestamp with time zone, last_verified_at timestamp with time zone, last_verify_ok boolean, last_verify_problems jsonb, uploaded_bytes bigint)
    LANGUAGE plpgsql STABLE
    AS $$
BEGIN
    PERFORM tuneplane.job_visible_to(p_user_id, p_job_id);
    RETURN QUERY
        SELECT a.id, a.job_id, at.number, a.rank, a.name, a.kind, a.state, a.reason, a.delivery, a.shared_path,
               a.manifest_digest, a.file_count, a.total_bytes, a.created_at, a.completed_at,
               v.at, v.ok, v.problems,
               -- progress of an upload: bytes of verified files plus the chunks the server holds of the rest
               CASE WHEN a.state = 'uploading' THEN
                   (SELECT coalesce(sum(f.size), 0) FROM tuneplane.artifact_files f
                     WHERE f.artifact_id = a.id AND f.verified_at IS NOT NULL)
                   + (SELECT coalesce(sum(c.size), 0) FROM tuneplane.artifact_chunks c WHERE c.artifact_id = a.id)
               ELSE a.total_bytes END::bigint
          FROM tuneplane.artifacts a
          JOIN tuneplane.attempts at ON at.id = a.attempt_id
          LEFT JOIN LATERAL (SELECT * FROM tuneplane.artifact_verifications av WHERE av.artifact_id = a.id
                              ORDER BY av.id DESC LIMIT 1) v ON true
         WHERE a.job_id = p_job_id
         ORDER BY at.number DESC, a.name, a.rank;
END;
$$;


--
-- Name: job_attempts_of(bigint, bigint); Type: FUNCTION; Schema: tuneplane; Owner: -
--

CREATE FUNCTION tuneplane.job_attempts_of(p_actor_id bigint, p_job_id bigint) RETURNS TABLE(number integer, state text, reason text, decision text, decision_reason text, decided_at timestamp with time zone, created_at timestamp with time zone, committed_at timestamp with time zone, running_at timestamp with time zone, ended_at timestamp with time zone, prepare_deadline timestamp with time zone, cancel_requested_at timestamp with time zone, capsule_digest text, master_addr text, master_port integer)
    LANGUAGE plpgsql STABLE
    AS $$
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


--
-- Name: job_events; Type: TABLE; Schema: tuneplane; Owner: -
--

CREATE TABLE tuneplane.job_events (
    id bigint NOT NULL,
    job_id bigint NOT NULL,
    at timestamp with time zone DEFAULT clock_timestamp() NOT NULL,
    from_state text,
    to_state text NOT NULL,
    reason text NOT NULL,
    detail jsonb DEFAULT '{}'::jsonb NOT NULL
);


--
-- Name: job_events_of(bigint, bigint); Type: FUNCTION; Schema: tuneplane; Owner: -
--

CREATE FUNCTION tuneplane.job_events_of(p_actor_id bigint, p_job_id bigint) RETURNS SETOF tuneplane.job_events
    LANGUAGE plpgsql STABLE
    AS $$
BEGIN
    PERFORM 1 FROM tuneplane.get_job(p_actor_id, p_job_id);
    RETURN QUERY SELECT e.* FROM tuneplane.job_events e WHERE e.job_id = p_job_id ORDER BY e.id;
END;
$$;


--
-- Name: job_member_log(bigint, bigint, integer, text, bigint, integer, integer, bigint); Type: FUNCTION; Schema: tuneplane; Owner: -
--

CREATE FUNCTION tuneplane.job_member_log(p_actor_id bigint, p_job_id bigint, p_rank integer, p_stream text, p_after bigint DEFAULT 0, p_limit integer DEFAULT 65536, p_attempt integer DEFAULT NULL::integer, p_tail bigint DEFAULT NULL::bigint) RETURNS json
    LANGUAGE plpgsql STABLE
    AS $$
DECLARE
    j          tuneplane.v_jobs;
    v_settings tuneplane.member_log_settings;
    m          record;
    s          tuneplane.member_log_streams;
    v_after    bigint := coalesce(p_after, 0);
    v_from     bigint;
    v_chunks   json;
    v_bytes    bigint;
    v_next     bigint;
    v_more     boolean;
BEGIN
    SELECT * INTO j FROM tuneplane.get_job(p_actor_id, p_job_id);
    SELECT * INTO v_settings FROM tuneplane.member_log_settings;
    IF p_stream IS NULL OR p_stream NOT IN ('stdout', 'stderr') THEN
        RAISE EXCEPTION 'stream must be stdout or stderr' USING ERRCODE = 'TP400', COLUMN = 'stream';
    END IF;
    IF v_after < 0 THEN
        RAISE EXCEPTION 'after must be a byte offset, 0 or more' USING ERRCODE = 'TP400', COLUMN = 'after';
    END IF;
    IF p_tail IS NOT NULL AND p_tail < 0 THEN
        RAISE EXCEPTION 'tail must be a byte count, 0 or more' USING ERRCODE = 'TP400', COLUMN = 'tail';
    END IF;
    IF p_limit IS NULL OR p_limit < 1 OR p_limit > v_settings.max_read_bytes THEN
        RAISE EXCEPTION 'limit must be between 1 and % bytes', v_settings.max_read_bytes
            USING ERRCODE = 'TP400', COLUMN = 'limit';
    END IF;
    IF p_rank IS NULL OR p_rank < 0 OR p_rank >= j.nodes THEN
        RAISE EXCEPTION 'job % has no member rank % (ranks 0 to %)', p_job_id, p_rank, j.nodes - 1
            USING ERRCODE = 'TP404', COLUMN = 'member';
    END IF;
    IF p_attempt IS NOT NULL
       AND NOT EXISTS (SELECT 1 FROM tuneplane.attempts a WHERE a.job_id = p_job_id AND a.number = p_attempt) THEN
        RAISE EXCEPTION 'job % has no attempt %', p_job_id, p_attempt USING ERRCODE = 'TP404', COLUMN = 'attempt';
    END IF;

    SELECT mm.id, mm.rank, mm.state, mm.exit_code, a.number AS attempt, n.name AS node,
           tuneplane.member_is_live(mm.state) AS live
      INTO m
      FROM tuneplane.members mm
      JOIN tuneplane.attempts a ON a.id = mm.attempt_id
      JOIN tuneplane.nodes n ON n.id = mm.node_id
     WHERE mm.job_id = p_job_id AND mm.rank = p_rank AND (p_attempt IS NULL OR a.number = p_attempt)
     ORDER BY a.number DESC
     LIMIT 1;
    IF m.id IS NULL THEN
        RETURN json_build_object('job_id', p_job_id, 'job_state', j.state, 'rank', p_rank, 'stream', p_stream,
                                 'attempt', NULL, 'member_id', NULL, 'after', v_after, 'next', v_after,
                                 'chunks', '[]'::json, 'bytes', 0, 'more', false,
                                 'complete', false, 'stored_to', 0, 'dropped_bytes', 0);
    END IF;

    SELECT * INTO s FROM tuneplane.member_log_streams WHERE member_id = m.id AND stream = p_stream;
    IF p_tail IS NOT NULL AND s.member_id IS NOT NULL THEN
        v_after := greatest(v_after, s.next_offset - p_tail);
    END IF;
    -- Start at the chunk that holds v_after (an index probe on the primary key, backwards).
    SELECT coalesce(max(ch.start_offset), 0) INTO v_from FROM (
        SELECT mc.start_offset FROM tuneplane.member_log_chunks mc
         WHERE mc.member_id = m.id AND mc.stream = p_stream AND mc.start_offset <= v_after
         ORDER BY mc.start_offset DESC LIMIT 1) ch;
    -- One set-based read (appending to a jsonb value in a loop copied it every time: O(n²) in chunks), built
    -- as json text (jsonb_agg of 16,384 small objects took 4x as long).
    -- Chunks are taken in offset order while their running byte total stays within p_limit (the first
    -- one, whose running total is its own length, always); every chunk is at least one byte, so p_limit + 1 chunks always reach past the limit and
    -- the scan never reads more than that.
    SELECT coalesce(json_agg(json_build_object('offset', t.start_offset, 'end', t.end_offset, 'text', t.text)
                             ORDER BY t.start_offset) FILTER (WHERE t.taken), '[]'::json),
           coalesce(sum(t.end_offset - t.start_offset) FILTER (WHERE t.taken), 0),
           coalesce(max(t.end_offset) FILTER (WHERE t.taken), v_after),
           coalesce(bool_or(NOT t.taken), false)
      INTO v_chunks, v_bytes, v_next, v_more
      FROM (SELECT w.*, w.upto = w.end_offset - w.start_offset OR w.upto <= p_limit AS taken
              FROM (SELECT l.*, sum(l.end_offset - l.start_offset) OVER (ORDER BY l.start_offset) AS upto
                      FROM (SELECT mc.start_offset, mc.end_offset, mc.text FROM tuneplane.member_log_chunks mc
                             WHERE mc.member_id = m.id AND mc.stream = p_stream AND mc.start_offset >= v_from
                               AND mc.end_offset > v_after
                             ORDER BY mc.start_offset
                             LIMIT p_limit::bigint + 1) l) w) t;
    RETURN json_build_object(
        'job_id', p_job_id, 'job_state', j.state, 'rank', m.rank, 'attempt', m.attempt, 'member_id', m.id,
        'node', m.node, 'member_state', m.state, 'exit_code', m.exit_code, 'stream', p_stream,
        'after', v_after, 'next', v_next, 'chunks', v_chunks, 'bytes', v_bytes, 'more', v_more,
        -- Nothing more will come: the member ended (its node drains the logs before reporting the end)
        -- and this read reached everything stored.
        'complete', NOT m.live AND NOT v_more,
        'stored_to', coalesce(s.next_offset, 0), 'dropped_bytes', coalesce(s.dropped_bytes, 0));
END;
$$;


--
-- Name: job_members_of(bigint, bigint); Type: FUNCTION; Schema: tuneplane; Owner: -
--

CREATE FUNCTION tuneplane.job_members_of(p_actor_id bigint, p_job_id bigint) RETURNS TABLE(attempt integer, rank integer, member_id bigint, node text, gpu_indices integer[], cpus integer, memory_bytes bigint, state text, reason text, exit_code integer, started_at timestamp with time zone, ended_at timestamp with time zone, updated_at timestamp with time zone, resources_held boolean, contact_lost_at timestamp with time zone)
    LANGUAGE plpgsql STABLE
    AS $$
BEGIN
    PERFORM 1 FROM tuneplane.get_job(p_actor_id, p_job_id);
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


--
-- Name: job_owners_visible(bigint); Type: FUNCTION; Schema: tuneplane; Owner: -
--

CREATE FUNCTION tuneplane.job_owners_visible(p_actor_id bigint) RETURNS TABLE(owner text)
    LANGUAGE sql STABLE
    AS $$
    SELECT DISTINCT u.username
      FROM tuneplane.users u
      JOIN tuneplane.users actor ON actor.id = p_actor_id AND actor.disabled_at IS NULL
     WHERE (actor.role = 'admin' AND EXISTS (SELECT 1 FROM tuneplane.jobs j WHERE j.owner_id = u.id))
        OR u.id = actor.id
     ORDER BY 1;
$$;


--
-- Name: job_queue_position(bigint, bigint); Type: FUNCTION; Schema: tuneplane; Owner: -
--

CREATE FUNCTION tuneplane.job_queue_position(p_actor_id bigint, p_job_id bigint) RETURNS TABLE(job_id bigint, fleet text, queue_position bigint, queued_in_fleet bigint, head_job_id bigint, waiting interval, state_reason text)
    LANGUAGE plpgsql STABLE
    AS $$
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


--
-- Name: job_transition(bigint, text, text, text, jsonb); Type: FUNCTION; Schema: tuneplane; Owner: -
--

CREATE FUNCTION tuneplane.job_transition(p_job_id bigint, p_from text, p_to text, p_reason text, p_detail jsonb DEFAULT '{}'::jsonb) RETURNS tuneplane.jobs
    LANGUAGE plpgsql
    AS $$
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


--
-- Name: job_visible_to(bigint, bigint); Type: FUNCTION; Schema: tuneplane; Owner: -
--

CREATE FUNCTION tuneplane.job_visible_to(p_user_id bigint, p_job_id bigint) RETURNS tuneplane.jobs
    LANGUAGE plpgsql STABLE
    AS $$
DECLARE
    j tuneplane.jobs;
BEGIN
    SELECT jb.* INTO j FROM tuneplane.jobs jb JOIN tuneplane.users u ON u.id = p_user_id
     WHERE jb.id = p_job_id AND (jb.owner_id = u.id OR u.role = 'admin');
    IF j.id IS NULL THEN
        RAISE EXCEPTION 'no job %', p_job_id USING ERRCODE = 'TP404', COLUMN = 'job';
    END IF;
    RETURN j;
END;
$$;


--
-- Name: jobs_guard_change(); Type: FUNCTION; Schema: tuneplane; Owner: -
--

CREATE FUNCTION tuneplane.jobs_guard_change() RETURNS trigger
    LANGUAGE plpgsql
    AS $$
BEGIN
    IF OLD.state IN ('succeeded', 'failed', 'cancelled') AND NEW.state IS DISTINCT FROM OLD.state THEN
        RAISE EXCEPTION 'job % is % and cannot become %', OLD.id, OLD.state, NEW.state
            USING ERRCODE = 'TP409', COLUMN = 'state';
    END IF;
    NEW.updated_at := now();
    RETURN NEW;
END;
$$;


--
-- Name: jobs_record_event(); Type: FUNCTION; Schema: tuneplane; Owner: -
--

CREATE FUNCTION tuneplane.jobs_record_event() RETURNS trigger
    LANGUAGE plpgsql
    AS $$
DECLARE
    detail jsonb := coalesce(nullif(current_setting('tuneplane.event_detail', true), '')::jsonb, '{}'::jsonb);
BEGIN
    INSERT INTO tuneplane.job_events (job_id, from_state, to_state, reason, detail)
    VALUES (NEW.id, CASE WHEN TG_OP = 'UPDATE' THEN OLD.state END, NEW.state, NEW.state_reason, detail);
    RETURN NULL;
END;
$$;


--
-- Name: launch_command_acked(tuneplane.node_commands); Type: FUNCTION; Schema: tuneplane; Owner: -
--

CREATE FUNCTION tuneplane.launch_command_acked(p_cmd tuneplane.node_commands) RETURNS void
    LANGUAGE plpgsql
    AS $$
DECLARE
    m tuneplane.members;
    v_id bigint;
BEGIN
    IF p_cmd.kind = 'start' AND p_cmd.error IS NOT NULL THEN
        SELECT * INTO m FROM tuneplane.members
         WHERE id = (p_cmd.payload ->> 'member_id')::bigint AND node_id = p_cmd.node_id;
        IF m.id IS NOT NULL AND m.state = 'starting' AND m.started_at IS NULL THEN
            PERFORM tuneplane.lock_attempt(m.attempt_id);
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
            PERFORM tuneplane.lock_attempt(m.attempt_id);
            PERFORM tuneplane.record_member_exit(m, -9,
                'killed by the control plane: ' || coalesce(p_cmd.payload ->> 'reason', ''));
        END LOOP;
    END IF;
END;
$$;


--
-- Name: list_jobs(bigint, text, integer, bigint, text, text); Type: FUNCTION; Schema: tuneplane; Owner: -
--

CREATE FUNCTION tuneplane.list_jobs(p_actor_id bigint, p_state text DEFAULT NULL::text, p_limit integer DEFAULT 100, p_before_id bigint DEFAULT NULL::bigint, p_owner text DEFAULT NULL::text, p_fleet text DEFAULT NULL::text) RETURNS SETOF tuneplane.v_jobs
    LANGUAGE plpgsql STABLE
    AS $$
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
        SELECT v.* FROM tuneplane.v_jobs v
         WHERE (actor.role = 'admin' OR v.owner_id = actor.id)
           AND (p_state IS NULL OR v.state = p_state)
           AND (p_owner IS NULL OR v.owner = p_owner)
           AND (p_fleet IS NULL OR v.fleet = p_fleet)
           AND (p_before_id IS NULL OR v.id < p_before_id)
         ORDER BY v.id DESC
         LIMIT least(greatest(coalesce(p_limit, 100), 1), 500);
END;
$$;


--
-- Name: attempts; Type: TABLE; Schema: tuneplane; Owner: -
--

CREATE TABLE tuneplane.attempts (
    id bigint NOT NULL,
    job_id bigint NOT NULL,
    number integer NOT NULL,
    fleet_id bigint NOT NULL,
    state text DEFAULT 'reserved'::text NOT NULL,
    reason text DEFAULT ''::text NOT NULL,
    launch_epoch bigint DEFAULT 0 NOT NULL,
    launch_owner text,
    capsule_digest text,
    master_addr text,
    master_port integer,
    prepare_deadline timestamp with time zone,
    cancel_requested_at timestamp with time zone,
    created_at timestamp with time zone DEFAULT now() NOT NULL,
    committed_at timestamp with time zone,
    running_at timestamp with time zone,
    ended_at timestamp with time zone,
    CONSTRAINT attempts_capsule_digest_check CHECK ((capsule_digest ~ '^[0-9a-f]{64}$'::text)),
    CONSTRAINT attempts_number_check CHECK ((number >= 1)),
    CONSTRAINT attempts_state_check CHECK ((state = ANY (ARRAY['reserved'::text, 'preparing'::text, 'running'::text, 'stopping'::text, 'succeeded'::text, 'failed'::text, 'aborted'::text, 'cancelled'::text])))
);


--
-- Name: lock_attempt(bigint); Type: FUNCTION; Schema: tuneplane; Owner: -
--

CREATE FUNCTION tuneplane.lock_attempt(p_attempt_id bigint) RETURNS tuneplane.attempts
    LANGUAGE plpgsql
    AS $$
DECLARE
    a tuneplane.attempts;
BEGIN
    PERFORM 1 FROM tuneplane.jobs WHERE id = (SELECT job_id FROM tuneplane.attempts WHERE id = p_attempt_id)
        FOR UPDATE;
    SELECT * INTO a FROM tuneplane.attempts WHERE id = p_attempt_id FOR UPDATE;
    RETURN a;
END;
$$;


--
-- Name: lock_jobs_of_node(bigint); Type: FUNCTION; Schema: tuneplane; Owner: -
--

CREATE FUNCTION tuneplane.lock_jobs_of_node(p_node_id bigint) RETURNS void
    LANGUAGE sql
    AS $$
    SELECT 1 FROM tuneplane.jobs
     WHERE id IN (SELECT job_id FROM tuneplane.members WHERE node_id = p_node_id AND released_at IS NULL)
     ORDER BY id FOR UPDATE;
$$;


--
-- Name: log_node_event(bigint, bigint, text, text, text, jsonb); Type: FUNCTION; Schema: tuneplane; Owner: -
--

CREATE FUNCTION tuneplane.log_node_event(p_fleet_id bigint, p_node_id bigint, p_kind text, p_actor text, p_reason text DEFAULT ''::text, p_details jsonb DEFAULT '{}'::jsonb) RETURNS bigint
    LANGUAGE sql
    AS $$
    INSERT INTO tuneplane.node_events (fleet_id, node_id, kind, actor, reason, details)
    VALUES (coalesce(p_fleet_id, (SELECT fleet_id FROM tuneplane.nodes WHERE id = p_node_id)),
            p_node_id, p_kind, coalesce(nullif(p_actor, ''), 'db:' || session_user),
            coalesce(p_reason, ''), coalesce(p_details, '{}'::jsonb))
    RETURNING id;
$$;


--
-- Name: lose_node_members(bigint, text); Type: FUNCTION; Schema: tuneplane; Owner: -
--

CREATE FUNCTION tuneplane.lose_node_members(p_node_id bigint, p_why text) RETURNS integer
    LANGUAGE plpgsql
    AS $$
DECLARE
    m tuneplane.members;
    v_lost bigint[] := '{}';
    v_attempts bigint[] := '{}';
    v_attempt bigint;
BEGIN
    PERFORM tuneplane.lock_jobs_of_node(p_node_id);
    FOR m IN SELECT * FROM tuneplane.members WHERE node_id = p_node_id AND released_at IS NULL
              ORDER BY id FOR UPDATE LOOP
        IF tuneplane.member_is_live(m.state) THEN
            PERFORM tuneplane.set_member_state(m.id, 'lost', p_why);
        END IF;
        PERFORM tuneplane.release_member(m.id);
        v_lost := v_lost || m.id;
        v_attempts := v_attempts || m.attempt_id;
    END LOOP;
    PERFORM tuneplane.send_kill(p_node_id, v_lost, p_why);
    FOR v_attempt IN SELECT DISTINCT unnest(v_attempts) ORDER BY 1 LOOP
        IF NOT tuneplane.decide_abort(v_attempt, p_why) THEN
            PERFORM tuneplane.stop_attempt(v_attempt, p_why || '; stopping the other members');
        END IF;
        PERFORM tuneplane.finish_attempt_if_done(v_attempt);
    END LOOP;
    RETURN cardinality(v_lost);
END;
$$;


--
-- Name: member_exited(bigint, bigint, jsonb); Type: FUNCTION; Schema: tuneplane; Owner: -
--

CREATE FUNCTION tuneplane.member_exited(p_node_id bigint, p_epoch bigint, p_payload jsonb) RETURNS jsonb
    LANGUAGE plpgsql
    AS $$
DECLARE
    m tuneplane.members;
BEGIN
    PERFORM tuneplane.require_node_session(p_node_id, p_epoch);
    m := tuneplane.member_of_node(p_node_id, (p_payload ->> 'member_id')::bigint);
    PERFORM tuneplane.record_member_exit(m, (p_payload ->> 'exit_code')::integer, p_payload ->> 'reason');
    RETURN jsonb_build_object('state', (SELECT state FROM tuneplane.members WHERE id = m.id));
END;
$$;


--
-- Name: member_is_live(text); Type: FUNCTION; Schema: tuneplane; Owner: -
--

CREATE FUNCTION tuneplane.member_is_live(p_state text) RETURNS boolean
    LANGUAGE sql IMMUTABLE
    AS $$
    SELECT p_state IN ('reserved', 'preparing', 'prepared', 'starting', 'running', 'stopping');
$$;


--
-- Name: member_log(bigint, bigint, jsonb); Type: FUNCTION; Schema: tuneplane; Owner: -
--

CREATE FUNCTION tuneplane.member_log(p_node_id bigint, p_epoch bigint, p_payload jsonb) RETURNS jsonb
    LANGUAGE plpgsql
    AS $$
BEGIN
    PERFORM tuneplane.require_node_session(p_node_id, p_epoch);
    RETURN tuneplane.member_log_store(p_node_id, p_payload);
END;
$$;


--
-- Name: member_log_store(bigint, jsonb); Type: FUNCTION; Schema: tuneplane; Owner: -
--

CREATE FUNCTION tuneplane.member_log_store(p_node_id bigint, p_payload jsonb) RETURNS jsonb
    LANGUAGE plpgsql
    AS $_$
DECLARE
    v_settings tuneplane.member_log_settings;
    v_member   bigint;
    v_stream   text;
    v_offset   bigint;
    v_length   bigint;
    v_text     text;
    s          tuneplane.member_log_streams;
BEGIN
    SELECT * INTO v_settings FROM tuneplane.member_log_settings;
    IF jsonb_typeof(p_payload) IS DISTINCT FROM 'object' THEN
        RAISE EXCEPTION 'a member_log report is a JSON object' USING ERRCODE = 'TP400', COLUMN = 'payload';
    END IF;
    IF coalesce(p_payload ->> 'member_id', '') !~ '^[0-9]{1,18}$' THEN
        RAISE EXCEPTION 'member_id must be a member id' USING ERRCODE = 'TP400', COLUMN = 'member_id';
    END IF;
    v_stream := p_payload ->> 'stream';
    IF v_stream IS NULL OR v_stream NOT IN ('stdout', 'stderr') THEN
        RAISE EXCEPTION 'stream must be stdout or stderr' USING ERRCODE = 'TP400', COLUMN = 'stream';
    END IF;
    IF jsonb_typeof(p_payload -> 'offset') IS DISTINCT FROM 'number'
       OR p_payload ->> 'offset' !~ '^[0-9]{1,18}$' THEN
        RAISE EXCEPTION 'offset must be a byte offset (an integer, 0 or more)' USING ERRCODE = 'TP400',
            COLUMN = 'offset';
    END IF;
    IF jsonb_typeof(p_payload -> 'text') IS DISTINCT FROM 'string' THEN
        RAISE EXCEPTION 'text must be a string' USING ERRCODE = 'TP400', COLUMN = 'text';
    END IF;
    v_offset := (p_payload ->> 'offset')::bigint;
    v_text := p_payload ->> 'text';
    IF p_payload ? 'length' THEN
        IF jsonb_typeof(p_payload -> 'length') IS DISTINCT FROM 'number'
           OR p_payload ->> 'length' !~ '^[0-9]{1,18}$' THEN
            RAISE EXCEPTION 'length must be a byte count (an integer)' USING ERRCODE = 'TP400', COLUMN = 'length';
        END IF;
        v_length := (p_payload ->> 'length')::bigint;
    ELSE
        v_length := octet_length(v_text);
    END IF;
    IF v_length < 1 THEN
        RAISE EXCEPTION 'length must be at least 1 byte' USING ERRCODE = 'TP400', COLUMN = 'length';
    END IF;
    IF v_length > v_settings.max_chunk_bytes THEN
        RAISE EXCEPTION 'a log chunk may carry at most % bytes, not %', v_settings.max_chunk_bytes, v_length
            USING ERRCODE = 'TP413', COLUMN = 'length';
    END IF;
    -- Replacement characters may make the text up to three times the file's bytes; never more.
    IF octet_length(v_text) > 3 * v_length THEN
        RAISE EXCEPTION 'text is % bytes, more than the % bytes of the file it says it holds',
            octet_length(v_text), v_length USING ERRCODE = 'TP413', COLUMN = 'text';
    END IF;

    -- No row lock on members: log traffic must not queue behind (or block) lifecycle reports.
    SELECT m.id INTO v_member FROM tuneplane.members m
     WHERE m.id = (p_payload ->> 'member_id')::bigint AND m.node_id = p_node_id;
    IF v_member IS NULL THEN
        RAISE EXCEPTION 'member % is not placed on this node', p_payload ->> 'member_id'
            USING ERRCODE = 'TP404', COLUMN = 'member_id';
    END IF;

    INSERT INTO tuneplane.member_log_streams (member_id, stream) VALUES (v_member, v_stream)
    ON CONFLICT DO NOTHING;
    SELECT * INTO s FROM tuneplane.member_log_streams
     WHERE member_id = v_member AND stream = v_stream FOR UPDATE;
    IF v_offset <> s.next_offset THEN
        RETURN jsonb_build_object('stored', false, 'next_offset', s.next_offset,
                                  'why', CASE WHEN v_offset < s.next_offset THEN 'duplicate' ELSE 'gap' END);
    END IF;
    IF s.stored_bytes + v_length > v_settings.max_stream_bytes THEN
        UPDATE tuneplane.member_log_streams
           SET next_offset = next_offset + v_length, dropped_bytes = dropped_bytes + v_length,
               updated_at = clock_timestamp()
         WHERE member_id = v_member AND stream = v_stream;
        RETURN jsonb_build_object('stored', false, 'next_offset', v_offset + v_length, 'why', 'over the limit');
    END IF;
    INSERT INTO tuneplane.member_log_chunks (member_id, stream, start_offset, end_offset, text)
    VALUES (v_member, v_stream, v_offset, v_offset + v_length, v_text);
    UPDATE tuneplane.member_log_streams
       SET next_offset = next_offset + v_length, stored_bytes = stored_bytes + v_length, chunks = chunks + 1,
           updated_at = clock_timestamp()
     WHERE member_id = v_member AND stream = v_stream;
    RETURN jsonb_build_object('stored', true, 'next_offset', v_offset + v_length);
END;
$_$;


--
-- Name: member_of_node(bigint, bigint); Type: FUNCTION; Schema: tuneplane; Owner: -
--

CREATE FUNCTION tuneplane.member_of_node(p_node_id bigint, p_member_id bigint) RETURNS tuneplane.members
    LANGUAGE plpgsql
    AS $$
DECLARE
    m tuneplane.members;
BEGIN
    SELECT * INTO m FROM tuneplane.members WHERE id = p_member_id AND node_id = p_node_id;
    IF m.id IS NULL THEN
        RAISE EXCEPTION 'member % is not placed on this node', p_member_id USING ERRCODE = 'TP404',
            COLUMN = 'member_id';
    END IF;
    PERFORM tuneplane.lock_attempt(m.attempt_id);
    SELECT * INTO m FROM tuneplane.members WHERE id = p_member_id FOR UPDATE;
    RETURN m;
END;
$$;


--
-- Name: member_prepare_failed(bigint, bigint, jsonb); Type: FUNCTION; Schema: tuneplane; Owner: -
--

CREATE FUNCTION tuneplane.member_prepare_failed(p_node_id bigint, p_epoch bigint, p_payload jsonb) RETURNS jsonb
    LANGUAGE plpgsql
    AS $$
DECLARE
    m tuneplane.members;
    v_node text;
BEGIN
    PERFORM tuneplane.require_node_session(p_node_id, p_epoch);
    -- The node row before the job (lock order).
    UPDATE tuneplane.nodes SET last_peer_check = coalesce(p_payload -> 'peer_check', last_peer_check),
                               last_storage_check = coalesce(p_payload -> 'storage_check', last_storage_check)
     WHERE id = p_node_id
    RETURNING name INTO v_node;
    m := tuneplane.member_of_node(p_node_id, (p_payload ->> 'member_id')::bigint);
    IF m.state NOT IN ('reserved', 'preparing', 'prepared') THEN
        RETURN jsonb_build_object('ignored', true, 'state', m.state);
    END IF;
    RETURN jsonb_build_object('aborted', tuneplane.decide_abort(m.attempt_id,
        format('rank %s on %s failed to prepare: %s', m.rank, v_node,
               coalesce(nullif(p_payload ->> 'reason', ''), 'no reason given'))));
END;
$$;


--
-- Name: member_prepare_progress(bigint, bigint, jsonb); Type: FUNCTION; Schema: tuneplane; Owner: -
--

CREATE FUNCTION tuneplane.member_prepare_progress(p_node_id bigint, p_epoch bigint, p_payload jsonb) RETURNS jsonb
    LANGUAGE plpgsql
    AS $$
DECLARE
    m tuneplane.members;
    j tuneplane.jobs;
    v_node text;
    v_seq text := left(coalesce(p_payload ->> 'seq', ''), 80);
    v_message text := left(coalesce(nullif(p_payload ->> 'message', ''), p_payload ->> 'step', 'preparing'), 500);
BEGIN
    PERFORM tuneplane.require_node_session(p_node_id, p_epoch);
    IF jsonb_typeof(p_payload -> 'member_id') IS DISTINCT FROM 'number' OR v_seq = '' THEN
        RAISE EXCEPTION 'a progress report needs member_id and seq' USING ERRCODE = 'TP400', COLUMN = 'member_id';
    END IF;
    m := tuneplane.member_of_node(p_node_id, (p_payload ->> 'member_id')::bigint);
    IF m.state NOT IN ('reserved', 'preparing', 'prepared') THEN
        RETURN jsonb_build_object('ignored', true, 'state', m.state);
    END IF;
    SELECT * INTO j FROM tuneplane.jobs WHERE id = (SELECT job_id FROM tuneplane.attempts WHERE id = m.attempt_id);
    IF EXISTS (SELECT 1 FROM tuneplane.job_events
                WHERE job_id = j.id AND detail ->> 'kind' = 'prepare'
                  AND detail ->> 'member_id' = m.id::text AND detail ->> 'seq' = v_seq) THEN
        RETURN jsonb_build_object('duplicate', true);
    END IF;
    SELECT name INTO v_node FROM tuneplane.nodes WHERE id = p_node_id;
    INSERT INTO tuneplane.job_events (job_id, from_state, to_state, reason, detail)
    VALUES (j.id, j.state, j.state, format('rank %s on %s: %s', m.rank, v_node, v_message),
            (p_payload - 'member_id' - 'seq' - 'message')
              || jsonb_build_object('kind', 'prepare', 'member_id', m.id::text, 'rank', m.rank, 'seq', v_seq));
    RETURN jsonb_build_object('recorded', true);
END;
$$;


--
-- Name: member_prepared(bigint, bigint, jsonb); Type: FUNCTION; Schema: tuneplane; Owner: -
--

CREATE FUNCTION tuneplane.member_prepared(p_node_id bigint, p_epoch bigint, p_payload jsonb) RETURNS jsonb
    LANGUAGE plpgsql
    AS $$
DECLARE
    n        tuneplane.nodes;
    m        tuneplane.members;
    a        tuneplane.attempts;
    v_left   integer;
    v_member tuneplane.members;
BEGIN
    n := tuneplane.require_node_session(p_node_id, p_epoch);
    -- The node row before the job (lock order).
    UPDATE tuneplane.nodes SET last_peer_check = coalesce(p_payload -> 'peer_check', last_peer_check),
                               last_storage_check = coalesce(p_payload -> 'storage_check', last_storage_check)
     WHERE id = p_node_id;
    m := tuneplane.member_of_node(p_node_id, (p_payload ->> 'member_id')::bigint);
    SELECT * INTO a FROM tuneplane.attempts WHERE id = m.attempt_id;
    IF m.state <> 'preparing' OR n.fenced_at IS NOT NULL
       OR EXISTS (SELECT 1 FROM tuneplane.launch_decisions WHERE attempt_id = a.id) THEN
        RETURN jsonb_build_object('ignored', true, 'state', m.state);
    END IF;
    PERFORM tuneplane.set_member_state(m.id, 'prepared', 'prepared; waiting for the commit decision');
    SELECT count(*) INTO v_left FROM tuneplane.members WHERE attempt_id = a.id AND state <> 'prepared';
    IF v_left > 0 THEN
        RETURN jsonb_build_object('committed', false, 'waiting_for', v_left);
    END IF;
    INSERT INTO tuneplane.launch_decisions (attempt_id, decision, reason)
    VALUES (a.id, 'commit', format('all %s member(s) prepared',
                                   (SELECT count(*) FROM tuneplane.members WHERE attempt_id = a.id)))
    ON CONFLICT (attempt_id) DO NOTHING;
    IF NOT FOUND THEN
        RETURN jsonb_build_object('ignored', true, 'state', 'decided');
    END IF;
    PERFORM tuneplane.set_attempt_state(a.id, 'running', 'committed');
    FOR v_member IN SELECT * FROM tuneplane.members WHERE attempt_id = a.id ORDER BY id FOR UPDATE LOOP
        PERFORM tuneplane.set_member_state(v_member.id, 'starting', 'commit recorded; starting');
        PERFORM tuneplane.enqueue_node_command(v_member.node_id, 'start',
            jsonb_build_object('member_id', v_member.id, 'attempt_id', a.id));
    END LOOP;
    PERFORM tuneplane.set_job_state(a.job_id, 'running',
        format('attempt %s: commit recorded; starting %s member(s)', a.number,
               (SELECT count(*) FROM tuneplane.members WHERE attempt_id = a.id)));
    RETURN jsonb_build_object('committed', true);
END;
$$;


--
-- Name: member_started(bigint, bigint, jsonb); Type: FUNCTION; Schema: tuneplane; Owner: -
--

CREATE FUNCTION tuneplane.member_started(p_node_id bigint, p_epoch bigint, p_payload jsonb) RETURNS jsonb
    LANGUAGE plpgsql
    AS $$
DECLARE
    n tuneplane.nodes;
    m tuneplane.members;
    a tuneplane.attempts;
    v_total integer;
    v_running integer;
BEGIN
    n := tuneplane.require_node_session(p_node_id, p_epoch);
    m := tuneplane.member_of_node(p_node_id, (p_payload ->> 'member_id')::bigint);
    IF m.state <> 'starting' OR n.fenced_at IS NOT NULL THEN
        IF m.state IN ('running', 'stopping') THEN
            UPDATE tuneplane.members SET started_epoch = p_epoch, contact_lost_at = NULL WHERE id = m.id;
        END IF;
        RETURN jsonb_build_object('ignored', true, 'state', m.state);
    END IF;
    UPDATE tuneplane.members SET pid = (p_payload ->> 'pid')::integer, started_at = clock_timestamp(),
                                 started_epoch = p_epoch, contact_lost_at = NULL
     WHERE id = m.id;
    PERFORM tuneplane.set_member_state(m.id, 'running', 'running');
    SELECT * INTO a FROM tuneplane.attempts WHERE id = m.attempt_id;
    SELECT count(*), count(*) FILTER (WHERE state = 'running') INTO v_total, v_running
      FROM tuneplane.members WHERE attempt_id = a.id;
    IF v_total = v_running AND a.state = 'running' THEN
        UPDATE tuneplane.attempts SET running_at = coalesce(running_at, clock_timestamp()) WHERE id = a.id;
        PERFORM tuneplane.set_job_state(a.job_id, 'running',
            format('attempt %s: all %s member(s) running', a.number, v_total));
    END IF;
    RETURN jsonb_build_object('running', v_running, 'of', v_total);
END;
$$;


--
-- Name: node_allocation(bigint); Type: FUNCTION; Schema: tuneplane; Owner: -
--

CREATE FUNCTION tuneplane.node_allocation(p_node_id bigint) RETURNS TABLE(gpus integer, cpus integer, memory_bytes bigint)
    LANGUAGE sql STABLE
    AS $$
    SELECT coalesce(u.used_gpus, 0), coalesce(u.used_cpus, 0), coalesce(u.used_memory, 0::bigint)
      FROM (SELECT p_node_id AS id) n LEFT JOIN tuneplane.node_usage u ON u.node_id = n.id;
$$;


--
-- Name: node_connectivity(timestamp with time zone); Type: FUNCTION; Schema: tuneplane; Owner: -
--

CREATE FUNCTION tuneplane.node_connectivity(p_last_heartbeat_at timestamp with time zone) RETURNS text
    LANGUAGE sql STABLE
    AS $$
    SELECT CASE
        WHEN p_last_heartbeat_at IS NULL THEN 'lost'
        WHEN now() - p_last_heartbeat_at < s.stale_after THEN 'connected'
        WHEN now() - p_last_heartbeat_at < s.lost_after THEN 'stale'
        ELSE 'lost'
    END
    FROM tuneplane.node_settings s;
$$;


--
-- Name: node_heartbeats(jsonb); Type: FUNCTION; Schema: tuneplane; Owner: -
--

CREATE FUNCTION tuneplane.node_heartbeats(p_batch jsonb) RETURNS integer
    LANGUAGE sql
    AS $$
    WITH b AS (
        SELECT DISTINCT ON (node_id) node_id, epoch, running
          FROM jsonb_to_recordset(p_batch) AS x(node_id bigint, epoch bigint, running jsonb)
         ORDER BY node_id
    ), touched AS (
        UPDATE tuneplane.nodes n
           SET last_heartbeat_at = now(), reported_running = coalesce(b.running, n.reported_running)
          FROM b
         WHERE n.id = b.node_id AND n.session_epoch = b.epoch
        RETURNING n.id
    )
    SELECT count(*)::integer FROM touched;
$$;


--
-- Name: node_may_read_capsule(bigint, text); Type: FUNCTION; Schema: tuneplane; Owner: -
--

CREATE FUNCTION tuneplane.node_may_read_capsule(p_node_id bigint, p_digest text) RETURNS boolean
    LANGUAGE sql STABLE
    AS $$
    SELECT EXISTS (SELECT 1 FROM tuneplane.members m JOIN tuneplane.attempts a ON a.id = m.attempt_id
                    WHERE m.node_id = p_node_id AND m.released_at IS NULL AND a.capsule_digest = p_digest);
$$;


--
-- Name: node_session_closed(bigint, bigint, text); Type: FUNCTION; Schema: tuneplane; Owner: -
--

CREATE FUNCTION tuneplane.node_session_closed(p_node_id bigint, p_epoch bigint, p_reason text) RETURNS boolean
    LANGUAGE plpgsql
    AS $$
DECLARE
    n tuneplane.nodes;
BEGIN
    UPDATE tuneplane.nodes SET session_closed_at = now()
     WHERE id = p_node_id AND session_epoch = p_epoch AND session_closed_at IS NULL
    RETURNING * INTO n;
    IF n.id IS NULL THEN
        RETURN false;
    END IF;
    PERFORM tuneplane.log_node_event(n.fleet_id, n.id, 'session_closed', 'gateway', coalesce(p_reason, ''),
                                     jsonb_build_object('epoch', p_epoch));
    RETURN true;
END;
$$;


--
-- Name: node_session_opened(bigint, text, text); Type: FUNCTION; Schema: tuneplane; Owner: -
--

CREATE FUNCTION tuneplane.node_session_opened(p_node_id bigint, p_address text, p_gateway text) RETURNS TABLE(epoch bigint, heartbeat_interval_s double precision)
    LANGUAGE plpgsql
    AS $$
DECLARE
    n tuneplane.nodes;
BEGIN
    PERFORM pg_advisory_xact_lock(hashtext('tuneplane.node_session'), p_node_id::integer);
    UPDATE tuneplane.nodes
       SET session_epoch = session_epoch + 1, session_opened_at = now(), session_closed_at = NULL,
           last_heartbeat_at = now(), address = coalesce(p_address, address)
     WHERE id = p_node_id
    RETURNING * INTO n;
    IF n.id IS NULL THEN
        RAISE EXCEPTION 'no node %', p_node_id USING ERRCODE = 'TP404', COLUMN = 'node';
    END IF;
    PERFORM tuneplane.log_node_event(n.fleet_id, n.id, 'session_opened', 'node:' || n.name,
                                     'control connection via ' || p_gateway,
                                     jsonb_build_object('epoch', n.session_epoch, 'address', p_address));
    RETURN QUERY SELECT n.session_epoch, extract(epoch FROM s.heartbeat_interval)::double precision
                   FROM tuneplane.node_settings s;
END;
$$;


--
-- Name: node_takes_commands(bigint); Type: FUNCTION; Schema: tuneplane; Owner: -
--

CREATE FUNCTION tuneplane.node_takes_commands(p_node_id bigint) RETURNS boolean
    LANGUAGE sql STABLE
    AS $$
    SELECT n.scheduling_state <> 'retired' AND f.backend = 'node'
      FROM tuneplane.nodes n JOIN tuneplane.fleets f ON f.id = n.fleet_id
     WHERE n.id = p_node_id;
$$;


--
-- Name: node_usage_follow_gpus(); Type: FUNCTION; Schema: tuneplane; Owner: -
--

CREATE FUNCTION tuneplane.node_usage_follow_gpus() RETURNS trigger
    LANGUAGE plpgsql
    AS $$
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


--
-- Name: node_usage_follow_nodes(); Type: FUNCTION; Schema: tuneplane; Owner: -
--

CREATE FUNCTION tuneplane.node_usage_follow_nodes() RETURNS trigger
    LANGUAGE plpgsql
    AS $$
BEGIN
    INSERT INTO tuneplane.node_usage (node_id, fleet_id) VALUES (NEW.id, NEW.fleet_id) ON CONFLICT DO NOTHING;
    RETURN NULL;
END;
$$;


--
-- Name: nodes_with_pending_commands(bigint[]); Type: FUNCTION; Schema: tuneplane; Owner: -
--

CREATE FUNCTION tuneplane.nodes_with_pending_commands(p_node_ids bigint[]) RETURNS TABLE(node_id bigint)
    LANGUAGE sql STABLE
    AS $$
    SELECT DISTINCT c.node_id
      FROM tuneplane.node_commands c JOIN tuneplane.nodes n ON n.id = c.node_id
     WHERE c.node_id = ANY (p_node_ids) AND c.acked_at IS NULL
       AND n.session_reconciled_epoch = n.session_epoch
       AND c.claimed_epoch IS DISTINCT FROM n.session_epoch;
$$;


--
-- Name: note_connectivity_changes(); Type: FUNCTION; Schema: tuneplane; Owner: -
--

CREATE FUNCTION tuneplane.note_connectivity_changes() RETURNS integer
    LANGUAGE plpgsql
    AS $$
DECLARE
    changed integer;
    s tuneplane.node_settings;
    stale_before timestamptz;
    lost_before timestamptz;
BEGIN
    SELECT * INTO s FROM tuneplane.node_settings;
    stale_before := now() - s.stale_after;
    lost_before := now() - s.lost_after;
    WITH computed AS (
        SELECT n.id, n.fleet_id, n.connectivity_noted AS was, n.last_heartbeat_at,
               CASE WHEN n.last_heartbeat_at IS NULL OR n.last_heartbeat_at <= lost_before THEN 'lost'
                    WHEN n.last_heartbeat_at <= stale_before THEN 'stale'
                    ELSE 'connected' END AS now_is
          FROM tuneplane.nodes n
         WHERE n.scheduling_state <> 'retired'
    ), candidates AS (
        SELECT c.* FROM computed c JOIN tuneplane.nodes n ON n.id = c.id
         WHERE c.was <> c.now_is
           -- NO KEY UPDATE (what the UPDATE below takes anyway): it does not conflict with the KEY SHARE
           -- lock a placement pass holds on the nodes it picks, so neither skips the other.
           FOR NO KEY UPDATE OF n SKIP LOCKED
    ), upd AS (
        UPDATE tuneplane.nodes n SET connectivity_noted = c.now_is FROM candidates c WHERE n.id = c.id
        RETURNING c.*
    ), ev AS (
        INSERT INTO tuneplane.node_events (fleet_id, node_id, kind, actor, reason, details)
        SELECT u.fleet_id, u.id, 'connectivity', 'heartbeat-age', u.was || ' -> ' || u.now_is,
               jsonb_build_object('from', u.was, 'to', u.now_is, 'last_heartbeat_at', u.last_heartbeat_at)
          FROM upd u
        RETURNING 1
    )
    SELECT count(*) INTO changed FROM ev;
    RETURN changed;
END;
$$;


--
-- Name: operator_fail_artifact(bigint, text); Type: FUNCTION; Schema: tuneplane; Owner: -
--

CREATE FUNCTION tuneplane.operator_fail_artifact(p_artifact_id bigint, p_reason text) RETURNS tuneplane.artifacts
    LANGUAGE plpgsql
    AS $$
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


--
-- Name: placement_fit_now(bigint); Type: FUNCTION; Schema: tuneplane; Owner: -
--

CREATE FUNCTION tuneplane.placement_fit_now(p_job_id bigint) RETURNS text
    LANGUAGE sql STABLE
    AS $$
    WITH j AS (SELECT * FROM tuneplane.jobs WHERE id = p_job_id),
    eligible AS (
        SELECT u.node_id, n.name, u.free_gpus, n.cpus - u.used_cpus AS free_cpus,
               n.memory_bytes - u.used_memory AS free_memory
          FROM j JOIN tuneplane.node_usage u ON u.fleet_id = j.fleet_id
          JOIN tuneplane.nodes n ON n.id = u.node_id
         WHERE n.scheduling_state = 'active' AND n.fenced_at IS NULL
           AND tuneplane.node_connectivity(n.last_heartbeat_at) = 'connected'
    )
    SELECT format('best fit now: %s node%s can take a member (%s)', fit, CASE WHEN fit = 1 THEN '' ELSE 's' END,
                  coalesce((SELECT format('largest free: %s GPUs, %s CPUs on %s', e.free_gpus, e.free_cpus, e.name)
                              FROM eligible e ORDER BY e.free_gpus DESC, e.free_cpus DESC, e.node_id LIMIT 1),
                           'no schedulable connected node in the fleet'))
      FROM (SELECT count(*) AS fit FROM eligible e, j
             WHERE e.free_gpus >= j.gpus_per_node AND e.free_cpus >= j.cpus_per_node
               AND e.free_memory >= j.memory_per_node) c;
$$;


--
-- Name: placement_fleets(text); Type: FUNCTION; Schema: tuneplane; Owner: -
--

CREATE FUNCTION tuneplane.placement_fleets(p_backend text) RETURNS TABLE(fleet_id bigint, queued integer)
    LANGUAGE sql STABLE
    AS $$
    SELECT j.fleet_id, count(*)::integer
      FROM tuneplane.jobs j JOIN tuneplane.fleets f ON f.id = j.fleet_id
     WHERE j.state = 'queued' AND f.backend = p_backend
     GROUP BY j.fleet_id
     ORDER BY j.fleet_id;
$$;


--
-- Name: preview_storage_refusal(bigint, jsonb, jsonb); Type: FUNCTION; Schema: tuneplane; Owner: -
--

CREATE FUNCTION tuneplane.preview_storage_refusal(p_fleet_id bigint, p_spec jsonb, p_inputs jsonb) RETURNS TABLE(field text, message text)
    LANGUAGE plpgsql STABLE
    AS $$
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


--
-- Name: prune_checkpoints(bigint); Type: FUNCTION; Schema: tuneplane; Owner: -
--

CREATE FUNCTION tuneplane.prune_checkpoints(p_job_id bigint) RETURNS integer
    LANGUAGE plpgsql
    AS $$
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
                          AND j.spec -> 'inputs' @> jsonb_build_array(
                                  jsonb_build_object('manifest_digest', a.manifest_digest)));
    GET DIAGNOSTICS pruned = ROW_COUNT;
    RETURN pruned;
END;
$$;


--
-- Name: prune_node_commands(interval); Type: FUNCTION; Schema: tuneplane; Owner: -
--

CREATE FUNCTION tuneplane.prune_node_commands(p_older_than interval DEFAULT '7 days'::interval) RETURNS integer
    LANGUAGE sql
    AS $$
    WITH d AS (DELETE FROM tuneplane.node_commands WHERE acked_at < now() - p_older_than RETURNING 1)
    SELECT count(*)::integer FROM d;
$$;


--
-- Name: reconcile_node(bigint, bigint, jsonb); Type: FUNCTION; Schema: tuneplane; Owner: -
--

CREATE FUNCTION tuneplane.reconcile_node(p_node_id bigint, p_epoch bigint, p_payload jsonb) RETURNS jsonb
    LANGUAGE plpgsql
    AS $$
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
    n := tuneplane.require_node_session(p_node_id, p_epoch);
    PERFORM tuneplane.lock_jobs_of_node(p_node_id);
    SELECT coalesce(array_agg((e ->> 'member_id')::bigint), '{}') INTO v_running
      FROM jsonb_array_elements(coalesce(p_payload -> 'running', '[]'::jsonb)) e;
    v_exited := coalesce(p_payload -> 'exited', '[]'::jsonb);

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
              ORDER BY id FOR UPDATE LOOP
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


--
-- Name: record_artifact_chunk(text, bigint, integer, integer, integer, text, bigint); Type: FUNCTION; Schema: tuneplane; Owner: -
--

CREATE FUNCTION tuneplane.record_artifact_chunk(p_credential_hash text, p_artifact_id bigint, p_file_index integer, p_chunk_index integer, p_size integer, p_sha256 text, p_crc32c bigint) RETURNS TABLE(file_verified boolean, all_chunks boolean)
    LANGUAGE plpgsql
    AS $$
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


--
-- Name: record_artifact_file(text, bigint, integer, text, bigint); Type: FUNCTION; Schema: tuneplane; Owner: -
--

CREATE FUNCTION tuneplane.record_artifact_file(p_credential_hash text, p_artifact_id bigint, p_file_index integer, p_sha256 text, p_size bigint) RETURNS tuneplane.artifacts
    LANGUAGE plpgsql
    AS $$
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


--
-- Name: artifact_verifications; Type: TABLE; Schema: tuneplane; Owner: -
--

CREATE TABLE tuneplane.artifact_verifications (
    id bigint NOT NULL,
    artifact_id bigint NOT NULL,
    at timestamp with time zone DEFAULT clock_timestamp() NOT NULL,
    ok boolean NOT NULL,
    checked integer DEFAULT 0 NOT NULL,
    problems jsonb DEFAULT '[]'::jsonb NOT NULL,
    requested_by text NOT NULL
);


--
-- Name: record_artifact_verification(bigint, bigint, boolean, integer, jsonb); Type: FUNCTION; Schema: tuneplane; Owner: -
--

CREATE FUNCTION tuneplane.record_artifact_verification(p_user_id bigint, p_artifact_id bigint, p_ok boolean, p_checked integer, p_problems jsonb) RETURNS tuneplane.artifact_verifications
    LANGUAGE plpgsql
    AS $$
DECLARE
    a tuneplane.artifacts;
    v tuneplane.artifact_verifications;
BEGIN
    a := tuneplane.artifact_to_verify(p_user_id, p_artifact_id);
    INSERT INTO tuneplane.artifact_verifications (artifact_id, ok, checked, problems, requested_by)
    VALUES (a.id, p_ok, coalesce(p_checked, 0), coalesce(p_problems, '[]'::jsonb),
            coalesce((SELECT 'user:' || username FROM tuneplane.users WHERE id = p_user_id), 'user:?'))
    RETURNING * INTO v;
    RETURN v;
END;
$$;


--
-- Name: record_member_exit(tuneplane.members, integer, text); Type: FUNCTION; Schema: tuneplane; Owner: -
--

CREATE FUNCTION tuneplane.record_member_exit(p_member tuneplane.members, p_exit_code integer, p_reason text) RETURNS void
    LANGUAGE plpgsql
    AS $$
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


--
-- Name: record_node_note(bigint, bigint, jsonb); Type: FUNCTION; Schema: tuneplane; Owner: -
--

CREATE FUNCTION tuneplane.record_node_note(p_node_id bigint, p_epoch bigint, p_payload jsonb) RETURNS jsonb
    LANGUAGE plpgsql
    AS $$
DECLARE
    n tuneplane.nodes;
    event_id bigint;
BEGIN
    n := tuneplane.require_node_session(p_node_id, p_epoch);
    event_id := tuneplane.log_node_event(n.fleet_id, n.id, 'note', 'node:' || n.name,
                                         left(coalesce(p_payload ->> 'message', ''), 500), p_payload);
    RETURN jsonb_build_object('event_id', event_id);
END;
$$;


--
-- Name: record_node_refusal(text, text, text, text, jsonb); Type: FUNCTION; Schema: tuneplane; Owner: -
--

CREATE FUNCTION tuneplane.record_node_refusal(p_action text, p_secret_hash text, p_message text, p_address text DEFAULT NULL::text, p_details jsonb DEFAULT '{}'::jsonb) RETURNS bigint
    LANGUAGE plpgsql
    AS $$
DECLARE
    v_fleet bigint;
    v_node bigint;
BEGIN
    IF p_action = 'enroll' THEN
        SELECT t.fleet_id INTO v_fleet FROM tuneplane.enrollment_tokens t WHERE t.token_hash = p_secret_hash;
    ELSE
        SELECT c.node_id, n.fleet_id INTO v_node, v_fleet
          FROM tuneplane.node_credentials c JOIN tuneplane.nodes n ON n.id = c.node_id
         WHERE c.credential_hash = p_secret_hash;
    END IF;
    RETURN tuneplane.log_node_event(v_fleet, v_node, 'refused', 'gateway', p_action || ': ' || p_message,
                                    coalesce(p_details, '{}'::jsonb) || jsonb_build_object('address', p_address));
END;
$$;


--
-- Name: source_archives; Type: TABLE; Schema: tuneplane; Owner: -
--

CREATE TABLE tuneplane.source_archives (
    sha256 text NOT NULL,
    size_bytes bigint NOT NULL,
    member_count integer NOT NULL,
    unpacked_bytes bigint NOT NULL,
    created_at timestamp with time zone DEFAULT now() NOT NULL,
    CONSTRAINT source_archives_member_count_check CHECK ((member_count >= 0)),
    CONSTRAINT source_archives_sha256_check CHECK ((sha256 ~ '^[0-9a-f]{64}$'::text)),
    CONSTRAINT source_archives_size_bytes_check CHECK ((size_bytes > 0)),
    CONSTRAINT source_archives_unpacked_bytes_check CHECK ((unpacked_bytes >= 0))
);


--
-- Name: record_source_archive(bigint, text, bigint, integer, bigint); Type: FUNCTION; Schema: tuneplane; Owner: -
--

CREATE FUNCTION tuneplane.record_source_archive(p_user_id bigint, p_sha256 text, p_size_bytes bigint, p_member_count integer, p_unpacked_bytes bigint) RETURNS tuneplane.source_archives
    LANGUAGE plpgsql
    AS $_$
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
$_$;


--
-- Name: refuse_artifact(text, bigint, text, text, text); Type: FUNCTION; Schema: tuneplane; Owner: -
--

CREATE FUNCTION tuneplane.refuse_artifact(p_credential_hash text, p_member_id bigint, p_name text, p_kind text, p_reason text) RETURNS tuneplane.artifacts
    LANGUAGE plpgsql
    AS $$
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


--
-- Name: refuse_change(); Type: FUNCTION; Schema: tuneplane; Owner: -
--

CREATE FUNCTION tuneplane.refuse_change() RETURNS trigger
    LANGUAGE plpgsql
    AS $$
BEGIN
    RAISE EXCEPTION '% rows are immutable', TG_TABLE_NAME USING ERRCODE = 'TP409';
END;
$$;


--
-- Name: register_artifact(text, bigint, text, text, text, jsonb, text, text); Type: FUNCTION; Schema: tuneplane; Owner: -
--

CREATE FUNCTION tuneplane.register_artifact(p_credential_hash text, p_member_id bigint, p_name text, p_kind text, p_delivery text, p_manifest jsonb, p_manifest_digest text, p_shared_path text DEFAULT NULL::text) RETURNS tuneplane.artifacts
    LANGUAGE plpgsql
    AS $$
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
                                     registered_by)
    VALUES (m.job_id, m.attempt_id, m.id, m.rank, p_name, p_kind, p_delivery, v_shared, p_manifest, digest,
            n_files, n_bytes, s.chunk_size, 'node:' || m.node_id)
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
               manifest_digest = digest, file_count = n_files, total_bytes = n_bytes, chunk_size = s.chunk_size
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


--
-- Name: release_member(bigint); Type: FUNCTION; Schema: tuneplane; Owner: -
--

CREATE FUNCTION tuneplane.release_member(p_member_id bigint) RETURNS boolean
    LANGUAGE plpgsql
    AS $$
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


--
-- Name: report_node_caches(bigint, bigint, jsonb); Type: FUNCTION; Schema: tuneplane; Owner: -
--

CREATE FUNCTION tuneplane.report_node_caches(p_node_id bigint, p_epoch bigint, p_payload jsonb) RETURNS jsonb
    LANGUAGE plpgsql
    AS $$
DECLARE
    v_cache text;
BEGIN
    PERFORM tuneplane.require_node_session(p_node_id, p_epoch);
    FOREACH v_cache IN ARRAY ARRAY['environments', 'capsules'] LOOP
        IF jsonb_typeof(p_payload -> v_cache -> 'count') IS DISTINCT FROM 'number'
           OR jsonb_typeof(p_payload -> v_cache -> 'bytes') IS DISTINCT FROM 'number' THEN
            RAISE EXCEPTION 'a caches report needs %.count and %.bytes as numbers', v_cache, v_cache
                USING ERRCODE = 'TP400', COLUMN = v_cache;
        END IF;
    END LOOP;
    UPDATE tuneplane.nodes
       SET caches = jsonb_build_object(
               'environments', jsonb_build_object('count', (p_payload -> 'environments' ->> 'count')::bigint,
                                                  'bytes', (p_payload -> 'environments' ->> 'bytes')::bigint),
               'capsules', jsonb_build_object('count', (p_payload -> 'capsules' ->> 'count')::bigint,
                                              'bytes', (p_payload -> 'capsules' ->> 'bytes')::bigint)),
           caches_reported_at = now()
     WHERE id = p_node_id;
    RETURN jsonb_build_object('recorded', true);
END;
$$;


--
-- Name: report_node_capacity(bigint, bigint, jsonb); Type: FUNCTION; Schema: tuneplane; Owner: -
--

CREATE FUNCTION tuneplane.report_node_capacity(p_node_id bigint, p_epoch bigint, p_payload jsonb) RETURNS jsonb
    LANGUAGE plpgsql
    AS $$
DECLARE
    n tuneplane.nodes;
    before jsonb;
    after jsonb;
    gpus jsonb := coalesce(p_payload -> 'gpus', '[]'::jsonb);
BEGIN
    n := tuneplane.require_node_session(p_node_id, p_epoch);
    IF jsonb_typeof(p_payload) <> 'object' OR jsonb_typeof(p_payload -> 'cpus') <> 'number'
       OR jsonb_typeof(p_payload -> 'memory_bytes') <> 'number' OR jsonb_typeof(gpus) <> 'array'
       OR jsonb_typeof(coalesce(p_payload -> 'container_runtimes', '[]'::jsonb)) <> 'array' THEN
        RAISE EXCEPTION 'capacity report needs numbers cpus and memory_bytes and arrays gpus and container_runtimes'
            USING ERRCODE = 'TP400', COLUMN = 'capacity';
    END IF;
    IF EXISTS (SELECT 1 FROM jsonb_array_elements(gpus) g
                WHERE jsonb_typeof(g -> 'index') <> 'number' OR jsonb_typeof(g -> 'model') <> 'string') THEN
        RAISE EXCEPTION 'each GPU needs an index and a model' USING ERRCODE = 'TP400', COLUMN = 'gpus';
    END IF;
    SELECT jsonb_build_object('cpus', n.cpus, 'memory_bytes', n.memory_bytes, 'agent_version', n.agent_version,
                              'container_runtimes', to_jsonb(n.container_runtimes),
                              'gpus', coalesce((SELECT jsonb_agg(jsonb_build_array(gpu_index, model, memory_bytes, simulated)
                                                         ORDER BY gpu_index)
                                                  FROM tuneplane.node_gpus WHERE node_id = n.id), '[]'::jsonb))
      INTO before;
    UPDATE tuneplane.nodes
       SET cpus = (p_payload ->> 'cpus')::integer,
           memory_bytes = (p_payload ->> 'memory_bytes')::bigint,
           agent_version = p_payload ->> 'agent_version',
           container_runtimes = ARRAY(SELECT jsonb_array_elements_text(coalesce(p_payload -> 'container_runtimes',
                                                                                '[]'::jsonb))),
           hostname = coalesce(p_payload ->> 'hostname', hostname),
           last_heartbeat_at = now()
     WHERE id = n.id;
    DELETE FROM tuneplane.node_gpus g
     WHERE g.node_id = n.id
       AND g.gpu_index NOT IN (SELECT (x ->> 'index')::integer FROM jsonb_array_elements(gpus) x);
    INSERT INTO tuneplane.node_gpus (node_id, gpu_index, model, memory_bytes, simulated)
    SELECT n.id, (x ->> 'index')::integer, x ->> 'model', coalesce((x ->> 'memory_bytes')::bigint, 0),
           coalesce((x ->> 'simulated')::boolean, false)
      FROM jsonb_array_elements(gpus) x
    ON CONFLICT (node_id, gpu_index) DO UPDATE
       SET model = EXCLUDED.model, memory_bytes = EXCLUDED.memory_bytes, simulated = EXCLUDED.simulated;
    SELECT jsonb_build_object('cpus', nn.cpus, 'memory_bytes', nn.memory_bytes, 'agent_version', nn.agent_version,
                              'container_runtimes', to_jsonb(nn.container_runtimes),
                              'gpus', coalesce((SELECT jsonb_agg(jsonb_build_array(gpu_index, model, memory_bytes, simulated)
                                                         ORDER BY gpu_index)
                                                  FROM tuneplane.node_gpus WHERE node_id = nn.id), '[]'::jsonb))
      INTO after FROM tuneplane.nodes nn WHERE nn.id = n.id;
    IF after IS DISTINCT FROM before THEN
        PERFORM tuneplane.log_node_event(n.fleet_id, n.id, 'capacity', 'node:' || n.name, 'capacity reported',
                                         after);
    END IF;
    RETURN jsonb_build_object('changed', after IS DISTINCT FROM before);
END;
$$;


--
-- Name: report_node_probe(bigint, bigint, jsonb); Type: FUNCTION; Schema: tuneplane; Owner: -
--

CREATE FUNCTION tuneplane.report_node_probe(p_node_id bigint, p_epoch bigint, p_payload jsonb) RETURNS jsonb
    LANGUAGE plpgsql
    AS $$
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


--
-- Name: request_checkpoint(bigint, bigint, integer); Type: FUNCTION; Schema: tuneplane; Owner: -
--

CREATE FUNCTION tuneplane.request_checkpoint(p_user_id bigint, p_job_id bigint, p_rank integer DEFAULT NULL::integer) RETURNS TABLE(member_id bigint, rank integer, node_id bigint, command_id bigint)
    LANGUAGE plpgsql
    AS $$
DECLARE
    j tuneplane.jobs;
    m record;
    v_request text := gen_random_uuid()::text;
    cmd tuneplane.node_commands;
BEGIN
    j := tuneplane.job_visible_to(p_user_id, p_job_id);
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


--
-- Name: requeue_stalled_launches(interval); Type: FUNCTION; Schema: tuneplane; Owner: -
--

CREATE FUNCTION tuneplane.requeue_stalled_launches(p_older_than interval DEFAULT '00:00:10'::interval) RETURNS integer
    LANGUAGE plpgsql
    AS $$
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


--
-- Name: require_launch_epoch(bigint, bigint); Type: FUNCTION; Schema: tuneplane; Owner: -
--

CREATE FUNCTION tuneplane.require_launch_epoch(p_attempt_id bigint, p_epoch bigint) RETURNS tuneplane.attempts
    LANGUAGE plpgsql
    AS $$
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


--
-- Name: nodes; Type: TABLE; Schema: tuneplane; Owner: -
--

CREATE TABLE tuneplane.nodes (
    id bigint NOT NULL,
    fleet_id bigint NOT NULL,
    name text NOT NULL,
    scheduling_state text DEFAULT 'active'::text NOT NULL,
    last_heartbeat_at timestamp with time zone,
    cpus integer DEFAULT 0 NOT NULL,
    memory_bytes bigint DEFAULT 0 NOT NULL,
    agent_version text,
    container_runtimes text[] DEFAULT '{}'::text[] NOT NULL,
    address text,
    enrolled_at timestamp with time zone DEFAULT now() NOT NULL,
    session_epoch bigint DEFAULT 0 NOT NULL,
    session_opened_at timestamp with time zone,
    session_closed_at timestamp with time zone,
    hostname text,
    reported_running jsonb DEFAULT '[]'::jsonb NOT NULL,
    connectivity_noted text DEFAULT 'lost'::text NOT NULL,
    fenced_at timestamp with time zone,
    fenced_reason text,
    last_peer_check jsonb,
    last_storage_check jsonb,
    probe_port integer,
    session_reconciled_epoch bigint DEFAULT 0 NOT NULL,
    caches jsonb DEFAULT '{}'::jsonb NOT NULL,
    caches_reported_at timestamp with time zone,
    CONSTRAINT nodes_cpus_check CHECK ((cpus >= 0)),
    CONSTRAINT nodes_memory_bytes_check CHECK ((memory_bytes >= 0)),
    CONSTRAINT nodes_probe_port_check CHECK (((probe_port >= 1) AND (probe_port <= 65535))),
    CONSTRAINT nodes_scheduling_state_check CHECK ((scheduling_state = ANY (ARRAY['active'::text, 'cordoned'::text, 'draining'::text, 'retired'::text])))
);


--
-- Name: require_node_session(bigint, bigint); Type: FUNCTION; Schema: tuneplane; Owner: -
--

CREATE FUNCTION tuneplane.require_node_session(p_node_id bigint, p_epoch bigint) RETURNS tuneplane.nodes
    LANGUAGE plpgsql
    AS $$
DECLARE
    n tuneplane.nodes;
BEGIN
    PERFORM pg_advisory_xact_lock_shared(hashtext('tuneplane.node_session'), p_node_id::integer);
    SELECT * INTO n FROM tuneplane.nodes WHERE id = p_node_id;
    IF n.id IS NULL THEN
        RAISE EXCEPTION 'no node %', p_node_id USING ERRCODE = 'TP404', COLUMN = 'node';
    END IF;
    IF n.session_epoch <> p_epoch THEN
        RAISE EXCEPTION 'control session % of node % was replaced by session %', p_epoch, n.name, n.session_epoch
            USING ERRCODE = 'TP409', COLUMN = 'epoch';
    END IF;
    RETURN n;
END;
$$;


--
-- Name: reserve_next(bigint, integer); Type: FUNCTION; Schema: tuneplane; Owner: -
--

CREATE FUNCTION tuneplane.reserve_next(p_fleet_id bigint, p_max_jobs integer DEFAULT 1000) RETURNS TABLE(job_id bigint, attempt_id bigint)
    LANGUAGE plpgsql
    SET plan_cache_mode TO 'force_generic_plan'
    AS $$
DECLARE
    v_job       tuneplane.jobs;
    v_nodes     bigint[];
    v_names     text[];
    v_addr      text;
    v_head_id   bigint;
    v_head      tuneplane.jobs;
    v_claim     bigint[] := '{}';
    v_fresh     timestamptz;
    v_settings  tuneplane.launch_settings;
    v_failed    text[] := '{}';
    v_shape     text;
    v_number    integer;
    v_port      integer;
    v_tries     integer;
    v_reason    text;
    v_short     integer;
    -- This pass's placements (index i), written set-based after the walk.
    p_job       bigint[] := '{}';
    p_number    integer[] := '{}';
    p_addr      text[] := '{}';
    p_port      integer[] := '{}';
    p_prio      integer[] := '{}';
    p_reason    text[] := '{}';
    p_detail    jsonb[] := '{}';
    p_rdv       text[] := '{}';
    -- Their members, in placement order.
    m_job       bigint[] := '{}';
    m_rank      integer[] := '{}';
    m_node      bigint[] := '{}';
    m_gpus      integer[] := '{}';
    m_cpus      integer[] := '{}';
    m_memory    bigint[] := '{}';
    v_attempts  bigint[];
BEGIN
    PERFORM pg_advisory_xact_lock(hashtext('tuneplane.placement'), p_fleet_id::integer);
    SELECT * INTO v_settings FROM tuneplane.launch_settings;
    -- Connected = heartbeat younger than stale_after (the same rule as node_connectivity()).
    SELECT now() - s.stale_after INTO v_fresh FROM tuneplane.node_settings s;

    FOR v_job IN
        SELECT * FROM tuneplane.jobs j
         WHERE j.fleet_id = p_fleet_id AND j.state = 'queued'
         ORDER BY j.priority DESC, j.created_at, j.id
    LOOP
        EXIT WHEN p_max_jobs IS NOT NULL AND cardinality(p_job) >= p_max_jobs;
        v_shape := format('%s/%s/%s/%s', v_job.nodes, v_job.gpus_per_node, v_job.cpus_per_node,
                          v_job.memory_per_node);
        v_nodes := '{}';
        IF NOT v_shape = ANY (v_failed) THEN
            -- Best fit (fewest free GPUs first), an index range scan on node_usage_fit that sees this pass's
            -- own allocations; the picked node rows are locked and re-checked (see above).
            SELECT coalesce(array_agg(c.node_id ORDER BY c.free_gpus, c.node_id), '{}'),
                   coalesce(array_agg(c.name ORDER BY c.free_gpus, c.node_id), '{}'),
                   (array_agg(c.address ORDER BY c.free_gpus, c.node_id))[1]
              INTO v_nodes, v_names, v_addr
              FROM (SELECT u.node_id, u.free_gpus, n.name, n.address
                      FROM tuneplane.node_usage u
                      JOIN tuneplane.nodes n ON n.id = u.node_id
                     WHERE u.fleet_id = p_fleet_id
                       AND u.free_gpus >= v_job.gpus_per_node
                       AND n.cpus - u.used_cpus >= v_job.cpus_per_node
                       AND n.memory_bytes - u.used_memory >= v_job.memory_per_node
                       AND n.scheduling_state = 'active' AND n.fenced_at IS NULL AND n.last_heartbeat_at > v_fresh
                       AND (v_head_id IS NULL
                            OR NOT u.node_id = ANY (v_claim)
                            OR (u.free_gpus - v_job.gpus_per_node >= v_head.gpus_per_node
                                AND n.cpus - u.used_cpus - v_job.cpus_per_node >= v_head.cpus_per_node
                                AND n.memory_bytes - u.used_memory - v_job.memory_per_node >= v_head.memory_per_node))
                     ORDER BY u.free_gpus, u.node_id
                     LIMIT v_job.nodes
                       FOR KEY SHARE OF n SKIP LOCKED) c;
        END IF;

        IF cardinality(v_nodes) = v_job.nodes THEN
            -- It fits: lock the job (a concurrent cancel holds it: skip it) and number the attempt.
            SELECT (SELECT coalesce(max(a.number), 0) + 1 FROM tuneplane.attempts a WHERE a.job_id = j.id)
              INTO v_number
              FROM tuneplane.jobs j
             WHERE j.id = v_job.id AND j.state = 'queued'
               FOR UPDATE OF j SKIP LOCKED;
            CONTINUE WHEN NOT FOUND;
            -- A rendezvous port no live attempt uses at rank 0's address (normally the preferred one).
            v_port := v_settings.rendezvous_port_base
                      + ((v_job.id * 31 + v_number) % v_settings.rendezvous_port_span)::integer;
            v_tries := 0;
            WHILE v_addr IS NOT NULL
                  AND ((v_addr || ':' || v_port) = ANY (p_rdv)
                       OR EXISTS (SELECT 1 FROM tuneplane.attempts a
                                   WHERE a.master_addr = v_addr AND a.master_port = v_port
                                     AND a.state IN ('reserved', 'preparing', 'running', 'stopping'))) LOOP
                v_tries := v_tries + 1;
                IF v_tries >= v_settings.rendezvous_port_span THEN
                    v_port := NULL;
                    EXIT;
                END IF;
                v_port := v_settings.rendezvous_port_base
                          + ((v_port - v_settings.rendezvous_port_base + 1) % v_settings.rendezvous_port_span);
            END LOOP;
            IF v_port IS NULL THEN
                -- Not placed this pass (nothing was taken yet); the operator widens the port range.
                v_reason := format('waiting for a rendezvous port: every port of %s..%s is in use at %s '
                                   '(launch_settings.rendezvous_port_span)', v_settings.rendezvous_port_base,
                                   v_settings.rendezvous_port_base + v_settings.rendezvous_port_span - 1, v_addr);
                IF v_job.state_reason IS DISTINCT FROM v_reason THEN
                    PERFORM tuneplane.set_job_state(v_job.id, 'queued', v_reason);
                END IF;
                CONTINUE;
            END IF;
            UPDATE tuneplane.node_usage
               SET used_gpus = used_gpus + v_job.gpus_per_node,
                   used_cpus = used_cpus + v_job.cpus_per_node,
                   used_memory = used_memory + v_job.memory_per_node
             WHERE node_id = ANY (v_nodes);
            p_job := p_job || v_job.id;
            p_number := p_number || v_number;
            p_addr := p_addr || v_addr;
            p_port := p_port || v_port;
            p_rdv := p_rdv || (v_addr || ':' || v_port);
            p_prio := p_prio || greatest(least(v_job.priority, 1000), -1000);
            p_reason := p_reason || format('reserved %s on %s (attempt %s); waiting for a worker to prepare it',
                                           tuneplane.describe_request(v_job), array_to_string(v_names, ', '),
                                           v_number);
            p_detail := p_detail || jsonb_build_object('attempt', v_number, 'nodes', to_jsonb(v_nodes));
            FOR i IN 1 .. v_job.nodes LOOP
                m_job := m_job || v_job.id;
                m_rank := m_rank || (i - 1);
                m_node := m_node || v_nodes[i];
                m_gpus := m_gpus || v_job.gpus_per_node;
                m_cpus := m_cpus || v_job.cpus_per_node;
                m_memory := m_memory || v_job.memory_per_node;
            END LOOP;
            CONTINUE;
        END IF;

        v_failed := v_failed || v_shape;
        v_reason := format('waiting for resources: needs %s', tuneplane.describe_request(v_job));
        IF v_head_id IS NULL THEN
            v_head_id := v_job.id;
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
            v_short := cardinality(v_claim);
            IF v_short = 0 THEN
                v_reason := v_reason || '; at the head of the queue; no schedulable connected node in the fleet '
                                     || 'can hold a member';
            ELSIF v_short < v_job.nodes THEN
                v_reason := v_reason || format('; at the head of the queue; only %s schedulable node(s) could '
                                               'ever hold a member', v_short);
            ELSE
                v_reason := v_reason || '; at the head of the queue, waiting for capacity to free up';
            END IF;
        ELSE
            v_reason := v_reason || format('; behind job %s at the head of the queue', v_head_id);
        END IF;
        -- Only a changed reason is written (the cursor's row is the job as this pass found it).
        IF v_job.state_reason IS DISTINCT FROM v_reason THEN
            PERFORM tuneplane.set_job_state(v_job.id, 'queued', v_reason);
        END IF;
    END LOOP;

    IF cardinality(p_job) = 0 THEN
        RETURN;
    END IF;

    WITH added AS (
        INSERT INTO tuneplane.attempts (job_id, number, fleet_id, reason, master_addr, master_port)
        SELECT p.job_id, p.number, p_fleet_id, 'reserved', p.addr, p.port
          FROM unnest(p_job, p_number, p_addr, p_port) WITH ORDINALITY AS p (job_id, number, addr, port, i)
         ORDER BY p.i
        RETURNING id, attempts.job_id
    )
    SELECT array_agg(added.id ORDER BY p.i) INTO v_attempts
      FROM added JOIN unnest(p_job) WITH ORDINALITY AS p (job_id, i) ON p.job_id = added.job_id;

    -- Members in rank order, each with the lowest free GPU indices of its node: members of this pass on
    -- one node take consecutive slices of that node's free indices, in placement order.
    WITH m AS (
        SELECT x.*, a.attempt_id, sum(x.gpus) OVER (PARTITION BY x.node_id ORDER BY x.i) - x.gpus AS before
          FROM unnest(m_job, m_rank, m_node, m_gpus, m_cpus, m_memory)
               WITH ORDINALITY AS x (job_id, rank, node_id, gpus, cpus, memory, i)
          JOIN unnest(p_job, v_attempts) AS a (job_id, attempt_id) ON a.job_id = x.job_id
    ), free AS (
        SELECT ng.node_id, ng.gpu_index, row_number() OVER (PARTITION BY ng.node_id ORDER BY ng.gpu_index) AS k
          FROM tuneplane.node_gpus ng
         WHERE ng.node_id IN (SELECT DISTINCT m.node_id FROM m)
           AND NOT EXISTS (SELECT 1 FROM tuneplane.gpu_allocations a
                            WHERE a.node_id = ng.node_id AND a.gpu_index = ng.gpu_index AND a.released_at IS NULL)
    ), picks AS (
        SELECT m.i, m.attempt_id, m.job_id, m.rank, m.node_id, m.gpus, m.cpus, m.memory,
               coalesce(array_agg(f.gpu_index ORDER BY f.gpu_index) FILTER (WHERE f.gpu_index IS NOT NULL),
                        '{}') AS gpu_indices
          FROM m LEFT JOIN free f ON f.node_id = m.node_id AND f.k > m.before AND f.k <= m.before + m.gpus
         GROUP BY m.i, m.attempt_id, m.job_id, m.rank, m.node_id, m.gpus, m.cpus, m.memory
    ), short AS (
        SELECT count(*) AS n FROM picks WHERE cardinality(picks.gpu_indices) < picks.gpus
    ), added AS (
        INSERT INTO tuneplane.members (attempt_id, job_id, rank, node_id, gpu_indices, cpus, memory_bytes)
        SELECT picks.attempt_id, picks.job_id, picks.rank, picks.node_id,
               picks.gpu_indices, picks.cpus, picks.memory
          FROM picks
         ORDER BY picks.i
        RETURNING id, node_id, gpu_indices
    ), allocated AS (
        INSERT INTO tuneplane.gpu_allocations (member_id, node_id, gpu_index)
        SELECT added.id, added.node_id, unnest(added.gpu_indices) FROM added
    )
    SELECT short.n INTO v_short FROM short;  -- the INSERTs above run to completion either way
    IF v_short > 0 THEN
        RAISE EXCEPTION 'a node has fewer free GPUs than its usage row says' USING ERRCODE = 'TP500';
    END IF;

    -- The one writer of job state (each change is a job_events row with its detail).
    PERFORM tuneplane.set_job_state(r.job_id, 'reserved', r.reason, r.detail)
       FROM unnest(p_job, p_reason, p_detail) AS r (job_id, reason, detail);

    -- Same transaction as the reservations (GUIDE-postgres rule 6); the dedupe key makes each one once;
    -- one statement, so pgqueuer's statement-level NOTIFY trigger fires once per pass.
    INSERT INTO public.pgqueuer (priority, status, entrypoint, payload, dedupe_key)
    SELECT q.prio, 'queued', 'launch', convert_to(jsonb_build_object('attempt_id', q.attempt)::text, 'UTF8'),
           'launch:' || q.attempt
      FROM unnest(v_attempts, p_prio) AS q (attempt, prio)
    ON CONFLICT DO NOTHING;

    RETURN QUERY SELECT r.job_id, r.attempt_id FROM unnest(p_job, v_attempts) AS r (job_id, attempt_id);
END;
$$;


--
-- Name: resolve_artifact_ref(bigint, text, text); Type: FUNCTION; Schema: tuneplane; Owner: -
--

CREATE FUNCTION tuneplane.resolve_artifact_ref(p_owner_id bigint, p_ref text, p_field text) RETURNS tuneplane.artifacts
    LANGUAGE plpgsql STABLE
    AS $_$
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
$_$;


--
-- Name: resolve_inputs(bigint, jsonb); Type: FUNCTION; Schema: tuneplane; Owner: -
--

CREATE FUNCTION tuneplane.resolve_inputs(p_owner_id bigint, p_inputs jsonb) RETURNS jsonb
    LANGUAGE plpgsql STABLE
    AS $$
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


--
-- Name: resolve_node(text); Type: FUNCTION; Schema: tuneplane; Owner: -
--

CREATE FUNCTION tuneplane.resolve_node(p_ref text) RETURNS bigint
    LANGUAGE plpgsql STABLE
    AS $_$
DECLARE
    ids bigint[];
BEGIN
    IF p_ref ~ '^[0-9]+$' THEN
        SELECT array_agg(id) INTO ids FROM tuneplane.nodes WHERE id = p_ref::bigint;
    ELSIF position('/' IN p_ref) > 0 THEN
        SELECT array_agg(n.id) INTO ids FROM tuneplane.nodes n JOIN tuneplane.fleets f ON f.id = n.fleet_id
         WHERE f.name = split_part(p_ref, '/', 1) AND n.name = substr(p_ref, position('/' IN p_ref) + 1);
    ELSE
        SELECT array_agg(id) INTO ids FROM tuneplane.nodes WHERE name = p_ref;
    END IF;
    IF ids IS NULL THEN
        RAISE EXCEPTION 'no node %', p_ref USING ERRCODE = 'TP404', COLUMN = 'node';
    END IF;
    IF cardinality(ids) > 1 THEN
        RAISE EXCEPTION 'node name % is used in several fleets; write FLEET/%', p_ref, p_ref
            USING ERRCODE = 'TP409', COLUMN = 'node';
    END IF;
    RETURN ids[1];
END;
$_$;


--
-- Name: retire_node(text, text, text); Type: FUNCTION; Schema: tuneplane; Owner: -
--

CREATE FUNCTION tuneplane.retire_node(p_node text, p_reason text DEFAULT NULL::text, p_actor text DEFAULT NULL::text) RETURNS TABLE(node_id bigint, fleet text, node text, scheduling_state text, changed boolean)
    LANGUAGE sql
    AS $$ SELECT * FROM tuneplane.change_node_scheduling(p_node, 'retire', p_reason, p_actor) $$;


--
-- Name: revoke_api_token(bigint, bigint); Type: FUNCTION; Schema: tuneplane; Owner: -
--

CREATE FUNCTION tuneplane.revoke_api_token(p_actor_id bigint, p_token_id bigint) RETURNS boolean
    LANGUAGE plpgsql
    AS $$
DECLARE
    actor tuneplane.users;
BEGIN
    SELECT * INTO actor FROM tuneplane.users WHERE id = p_actor_id;
    UPDATE tuneplane.api_tokens t SET revoked_at = coalesce(t.revoked_at, now())
     WHERE t.id = p_token_id AND (t.user_id = p_actor_id OR actor.role = 'admin');
    IF NOT FOUND THEN
        RAISE EXCEPTION 'no such token of yours' USING ERRCODE = 'TP404', COLUMN = 'token_id';
    END IF;
    RETURN true;
END;
$$;


--
-- Name: revoke_telemetry_tokens(bigint, integer); Type: FUNCTION; Schema: tuneplane; Owner: -
--

CREATE FUNCTION tuneplane.revoke_telemetry_tokens(p_job_id bigint, p_attempt integer DEFAULT NULL::integer) RETURNS bigint
    LANGUAGE plpgsql
    AS $$
DECLARE
    changed bigint;
BEGIN
    UPDATE tuneplane.telemetry_tokens t SET revoked_at = now()
     WHERE t.job_id = p_job_id AND (p_attempt IS NULL OR t.attempt = p_attempt)
       AND (t.revoked_at IS NULL OR t.revoked_at > now());
    GET DIAGNOSTICS changed = ROW_COUNT;
    RETURN changed;
END;
$$;


--
-- Name: rotate_node_credential(bigint, bigint, text); Type: FUNCTION; Schema: tuneplane; Owner: -
--

CREATE FUNCTION tuneplane.rotate_node_credential(p_node_id bigint, p_current_credential_id bigint, p_new_credential_hash text) RETURNS bigint
    LANGUAGE plpgsql
    AS $$
DECLARE
    cred tuneplane.node_credentials;
    newer bigint;
    new_id bigint;
BEGIN
    SELECT * INTO cred FROM tuneplane.node_credentials
     WHERE id = p_current_credential_id AND node_id = p_node_id AND revoked_at IS NULL
       AND (grace_until IS NULL OR grace_until > now())
       FOR UPDATE;
    IF cred.id IS NULL THEN
        RAISE EXCEPTION 'credential % is not a live credential of node %', p_current_credential_id, p_node_id
            USING ERRCODE = 'TP409', COLUMN = 'credential';
    END IF;
    SELECT max(c.id) INTO newer FROM tuneplane.node_credentials c
     WHERE c.node_id = p_node_id AND c.id > cred.id AND c.first_used_at IS NOT NULL AND c.revoked_at IS NULL;
    IF cred.grace_until IS NOT NULL OR newer IS NOT NULL THEN
        RAISE EXCEPTION 'credential % of node % was rotated out (credential % replaced it); only the newest '
                        'confirmed credential may rotate', cred.id, p_node_id, coalesce(newer::text, 'a newer one')
            USING ERRCODE = 'TP409', COLUMN = 'credential';
    END IF;
    IF cred.first_used_at IS NULL THEN
        RAISE EXCEPTION 'credential % of node % was never confirmed; only the newest confirmed credential may '
                        'rotate', cred.id, p_node_id
            USING ERRCODE = 'TP409', COLUMN = 'credential';
    END IF;
    UPDATE tuneplane.node_credentials SET revoked_at = now(), revoked_reason = 'replaced before confirmation'
     WHERE node_id = p_node_id AND id > p_current_credential_id AND first_used_at IS NULL AND revoked_at IS NULL;
    INSERT INTO tuneplane.node_credentials (node_id, credential_hash) VALUES (p_node_id, p_new_credential_hash)
    RETURNING id INTO new_id;
    RETURN new_id;
END;
$$;


--
-- Name: send_kill(bigint, bigint[], text); Type: FUNCTION; Schema: tuneplane; Owner: -
--

CREATE FUNCTION tuneplane.send_kill(p_node_id bigint, p_member_ids bigint[], p_reason text) RETURNS void
    LANGUAGE plpgsql
    AS $$
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


--
-- Name: send_stop(tuneplane.members, text); Type: FUNCTION; Schema: tuneplane; Owner: -
--

CREATE FUNCTION tuneplane.send_stop(p_member tuneplane.members, p_reason text) RETURNS void
    LANGUAGE plpgsql
    AS $$
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


--
-- Name: server_secret(text, text); Type: FUNCTION; Schema: tuneplane; Owner: -
--

CREATE FUNCTION tuneplane.server_secret(p_name text, p_candidate text) RETURNS text
    LANGUAGE sql
    AS $$
    WITH ins AS (
        INSERT INTO tuneplane.server_secrets (name, value) VALUES (p_name, p_candidate)
        ON CONFLICT (name) DO NOTHING
        RETURNING value
    )
    SELECT value FROM ins
    UNION ALL
    SELECT value FROM tuneplane.server_secrets WHERE name = p_name
    LIMIT 1;
$$;


--
-- Name: set_attempt_state(bigint, text, text); Type: FUNCTION; Schema: tuneplane; Owner: -
--

CREATE FUNCTION tuneplane.set_attempt_state(p_attempt_id bigint, p_state text, p_reason text) RETURNS void
    LANGUAGE sql
    AS $$
    UPDATE tuneplane.attempts
       SET state = p_state, reason = coalesce(p_reason, reason),
           ended_at = CASE WHEN p_state IN ('succeeded', 'failed', 'aborted', 'cancelled')
                           THEN clock_timestamp() ELSE ended_at END,
           committed_at = CASE WHEN p_state = 'running' THEN coalesce(committed_at, clock_timestamp())
                               ELSE committed_at END
     WHERE id = p_attempt_id;
$$;


--
-- Name: set_job_state(bigint, text, text, jsonb); Type: FUNCTION; Schema: tuneplane; Owner: -
--

CREATE FUNCTION tuneplane.set_job_state(p_job_id bigint, p_state text, p_reason text, p_detail jsonb DEFAULT NULL::jsonb) RETURNS void
    LANGUAGE plpgsql
    AS $$
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


--
-- Name: set_member_state(bigint, text, text, integer); Type: FUNCTION; Schema: tuneplane; Owner: -
--

CREATE FUNCTION tuneplane.set_member_state(p_member_id bigint, p_state text, p_reason text, p_exit_code integer DEFAULT NULL::integer) RETURNS void
    LANGUAGE sql
    AS $$
    UPDATE tuneplane.members
       SET state = p_state, reason = coalesce(p_reason, reason), updated_at = clock_timestamp(),
           exit_code = coalesce(p_exit_code, exit_code),
           ended_at = CASE WHEN tuneplane.member_is_live(p_state) THEN ended_at ELSE clock_timestamp() END
     WHERE id = p_member_id;
$$;


--
-- Name: submission_settings; Type: TABLE; Schema: tuneplane; Owner: -
--

CREATE TABLE tuneplane.submission_settings (
    name text NOT NULL,
    value bigint NOT NULL,
    description text NOT NULL,
    CONSTRAINT submission_settings_value_check CHECK ((value >= 0))
);


--
-- Name: set_submission_setting(bigint, text, bigint); Type: FUNCTION; Schema: tuneplane; Owner: -
--

CREATE FUNCTION tuneplane.set_submission_setting(p_actor_id bigint, p_name text, p_value bigint) RETURNS tuneplane.submission_settings
    LANGUAGE plpgsql
    AS $$
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


--
-- Name: telemetry_settings; Type: TABLE; Schema: tuneplane; Owner: -
--

CREATE TABLE tuneplane.telemetry_settings (
    singleton boolean DEFAULT true NOT NULL,
    retention interval DEFAULT '180 days'::interval NOT NULL,
    token_ttl interval DEFAULT '30 days'::interval NOT NULL,
    max_batch_points integer DEFAULT 200000 NOT NULL,
    drain_grace interval DEFAULT '00:02:00'::interval NOT NULL,
    max_series_per_member integer DEFAULT 2000 NOT NULL,
    CONSTRAINT telemetry_settings_drain_grace_check CHECK ((drain_grace >= '00:00:00'::interval)),
    CONSTRAINT telemetry_settings_max_batch_points_check CHECK ((max_batch_points > 0)),
    CONSTRAINT telemetry_settings_max_series_per_member_check CHECK ((max_series_per_member > 0)),
    CONSTRAINT telemetry_settings_retention_check CHECK ((retention > '00:00:00'::interval)),
    CONSTRAINT telemetry_settings_singleton_check CHECK (singleton),
    CONSTRAINT telemetry_settings_token_ttl_check CHECK ((token_ttl > '00:00:00'::interval))
);


--
-- Name: set_telemetry_settings(bigint, interval, interval, integer); Type: FUNCTION; Schema: tuneplane; Owner: -
--

CREATE FUNCTION tuneplane.set_telemetry_settings(p_actor_id bigint, p_retention interval DEFAULT NULL::interval, p_token_ttl interval DEFAULT NULL::interval, p_max_batch_points integer DEFAULT NULL::integer) RETURNS tuneplane.telemetry_settings
    LANGUAGE plpgsql
    AS $$
DECLARE
    result tuneplane.telemetry_settings;
BEGIN
    IF NOT EXISTS (SELECT 1 FROM tuneplane.users WHERE id = p_actor_id AND role = 'admin' AND disabled_at IS NULL) THEN
        RAISE EXCEPTION 'changing telemetry settings needs the admin role' USING ERRCODE = 'TP403', COLUMN = 'actor';
    END IF;
    IF p_retention IS NOT NULL AND p_retention <= interval '0' THEN
        RAISE EXCEPTION 'retention must be positive' USING ERRCODE = 'TP400', COLUMN = 'retention';
    END IF;
    IF p_token_ttl IS NOT NULL AND p_token_ttl <= interval '0' THEN
        RAISE EXCEPTION 'token lifetime must be positive' USING ERRCODE = 'TP400', COLUMN = 'token_ttl';
    END IF;
    IF p_max_batch_points IS NOT NULL AND p_max_batch_points <= 0 THEN
        RAISE EXCEPTION 'max batch points must be positive' USING ERRCODE = 'TP400', COLUMN = 'max_batch_points';
    END IF;
    UPDATE tuneplane.telemetry_settings
       SET retention = coalesce(p_retention, retention),
           token_ttl = coalesce(p_token_ttl, token_ttl),
           max_batch_points = coalesce(p_max_batch_points, max_batch_points)
    RETURNING * INTO result;
    RETURN result;
END;
$$;


--
-- Name: user_limits; Type: TABLE; Schema: tuneplane; Owner: -
--

CREATE TABLE tuneplane.user_limits (
    user_id bigint NOT NULL,
    max_gpus_per_job integer,
    max_nodes_per_job integer,
    updated_at timestamp with time zone DEFAULT now() NOT NULL,
    CONSTRAINT user_limits_max_gpus_per_job_check CHECK ((max_gpus_per_job >= 0)),
    CONSTRAINT user_limits_max_nodes_per_job_check CHECK ((max_nodes_per_job >= 1))
);


--
-- Name: set_user_limits(bigint, text, integer, integer); Type: FUNCTION; Schema: tuneplane; Owner: -
--

CREATE FUNCTION tuneplane.set_user_limits(p_actor_id bigint, p_username text, p_max_gpus_per_job integer, p_max_nodes_per_job integer) RETURNS tuneplane.user_limits
    LANGUAGE plpgsql
    AS $$
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


--
-- Name: slurm_allocation_started(bigint, text[], integer, text); Type: FUNCTION; Schema: tuneplane; Owner: -
--

CREATE FUNCTION tuneplane.slurm_allocation_started(p_attempt_id bigint, p_nodes text[], p_master_port integer, p_capsule_digest text) RETURNS TABLE(member_id bigint, rank integer, node text, address text)
    LANGUAGE plpgsql
    AS $$
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
        UPDATE tuneplane.node_usage u
           SET used_cpus = used_cpus + j.cpus_per_node, used_memory = used_memory + j.memory_per_node
         WHERE u.node_id = ANY (v_ids);
        UPDATE tuneplane.attempts
           SET master_addr = (SELECT coalesce(n.address, n.name) FROM tuneplane.nodes n WHERE n.id = v_ids[1]),
               master_port = p_master_port, capsule_digest = p_capsule_digest,
               prepare_deadline = clock_timestamp()
                   + (SELECT prepare_timeout FROM tuneplane.launch_settings)
         WHERE id = a.id;
        UPDATE tuneplane.slurm_jobs SET started_at = clock_timestamp(), node_list = p_nodes, slurm_state = 'RUNNING',
                                        slurm_reason = NULL, jobs_ahead = NULL
         WHERE attempt_id = a.id;
        PERFORM tuneplane.set_attempt_state(a.id, 'preparing', 'Slurm allocation started; preparing');
        PERFORM tuneplane.set_job_state(j.id, 'preparing',
            format('attempt %s: Slurm allocated %s; preparing %s member(s)', a.number,
                   array_to_string(p_nodes, ','), j.nodes));
    END IF;
    RETURN QUERY SELECT m.id, m.rank, n.name, coalesce(n.address, n.name)
                   FROM tuneplane.members m JOIN tuneplane.nodes n ON n.id = m.node_id
                  WHERE m.attempt_id = p_attempt_id ORDER BY m.rank;
END;
$$;


--
-- Name: slurm_controller_unreachable(bigint, text); Type: FUNCTION; Schema: tuneplane; Owner: -
--

CREATE FUNCTION tuneplane.slurm_controller_unreachable(p_fleet_id bigint, p_error text) RETURNS integer
    LANGUAGE plpgsql
    AS $$
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


--
-- Name: slurm_end_words(text, text); Type: FUNCTION; Schema: tuneplane; Owner: -
--

CREATE FUNCTION tuneplane.slurm_end_words(p_state text, p_detail text DEFAULT NULL::text) RETURNS text
    LANGUAGE sql IMMUTABLE
    AS $$
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


--
-- Name: slurm_followed(bigint); Type: FUNCTION; Schema: tuneplane; Owner: -
--

CREATE FUNCTION tuneplane.slurm_followed(p_fleet_id bigint) RETURNS TABLE(attempt_id bigint, job_id bigint, attempt_number integer, slurm_job_id bigint, attempt_state text, committed boolean, nodes integer, scancel_at timestamp with time zone, submitted_at timestamp with time zone, created_at timestamp with time zone, age_s double precision)
    LANGUAGE sql STABLE
    AS $$
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


--
-- Name: slurm_job_ended(bigint, text, text); Type: FUNCTION; Schema: tuneplane; Owner: -
--

CREATE FUNCTION tuneplane.slurm_job_ended(p_attempt_id bigint, p_slurm_state text, p_detail text) RETURNS text
    LANGUAGE plpgsql
    AS $$
DECLARE
    a tuneplane.attempts;
    m tuneplane.members;
    v_why text := tuneplane.slurm_end_words(coalesce(p_slurm_state, 'UNKNOWN'), p_detail);
BEGIN
    a := tuneplane.lock_attempt(p_attempt_id);
    UPDATE tuneplane.slurm_jobs SET slurm_state = p_slurm_state, gone_at = coalesce(gone_at, clock_timestamp())
     WHERE attempt_id = p_attempt_id;
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


--
-- Name: slurm_member(bigint, integer); Type: FUNCTION; Schema: tuneplane; Owner: -
--

CREATE FUNCTION tuneplane.slurm_member(p_attempt_id bigint, p_rank integer) RETURNS tuneplane.members
    LANGUAGE plpgsql
    AS $$
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


--
-- Name: slurm_member_exited(bigint, integer, integer, text, boolean, text); Type: FUNCTION; Schema: tuneplane; Owner: -
--

CREATE FUNCTION tuneplane.slurm_member_exited(p_attempt_id bigint, p_rank integer, p_exit_code integer, p_reason text, p_signalled boolean, p_slurm_state text DEFAULT NULL::text) RETURNS text
    LANGUAGE plpgsql
    AS $$
DECLARE
    m tuneplane.members;
    a tuneplane.attempts;
    v_code integer := p_exit_code;
    v_reason text := p_reason;
BEGIN
    m := tuneplane.slurm_member(p_attempt_id, p_rank);
    SELECT * INTO a FROM tuneplane.attempts WHERE id = p_attempt_id;
    -- A member stopping because another one failed was still ended by Slurm's signal when Slurm says why
    -- (preemption, node failure, time or memory limit): that is its reason, not TunePlane's stop.
    IF p_signalled AND a.cancel_requested_at IS NULL
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


--
-- Name: slurm_member_log(bigint, integer, jsonb); Type: FUNCTION; Schema: tuneplane; Owner: -
--

CREATE FUNCTION tuneplane.slurm_member_log(p_attempt_id bigint, p_rank integer, p_payload jsonb) RETURNS jsonb
    LANGUAGE plpgsql
    AS $$
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


--
-- Name: slurm_member_prepare_failed(bigint, integer, text); Type: FUNCTION; Schema: tuneplane; Owner: -
--

CREATE FUNCTION tuneplane.slurm_member_prepare_failed(p_attempt_id bigint, p_rank integer, p_reason text) RETURNS text
    LANGUAGE plpgsql
    AS $$
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


--
-- Name: slurm_member_prepared(bigint, integer); Type: FUNCTION; Schema: tuneplane; Owner: -
--

CREATE FUNCTION tuneplane.slurm_member_prepared(p_attempt_id bigint, p_rank integer) RETURNS text
    LANGUAGE plpgsql
    AS $$
DECLARE
    m tuneplane.members;
    a tuneplane.attempts;
BEGIN
    m := tuneplane.slurm_member(p_attempt_id, p_rank);
    SELECT * INTO a FROM tuneplane.attempts WHERE id = p_attempt_id;
    IF m.state = 'preparing' THEN
        PERFORM tuneplane.set_member_state(m.id, 'prepared', 'prepared inside the Slurm allocation');
    END IF;
    IF a.state = 'preparing'
       AND NOT EXISTS (SELECT 1 FROM tuneplane.members WHERE attempt_id = a.id AND state <> 'prepared')
       AND NOT EXISTS (SELECT 1 FROM tuneplane.launch_decisions WHERE attempt_id = a.id) THEN
        INSERT INTO tuneplane.launch_decisions (attempt_id, decision, reason)
        VALUES (a.id, 'commit', 'every member prepared inside the Slurm allocation');
        UPDATE tuneplane.attempts SET committed_at = clock_timestamp() WHERE id = a.id;
        PERFORM tuneplane.set_member_state(x.id, 'starting', 'COMMIT recorded; the workload step starts')
           FROM tuneplane.members x WHERE x.attempt_id = a.id ORDER BY x.id;
        PERFORM tuneplane.set_attempt_state(a.id, 'running', 'COMMIT: every member prepared');
        PERFORM tuneplane.set_job_state(a.job_id, 'running',
            format('attempt %s committed: every member prepared; the workload step starts', a.number));
    END IF;
    RETURN (SELECT decision FROM tuneplane.launch_decisions WHERE attempt_id = a.id);
END;
$$;


--
-- Name: slurm_member_started(bigint, integer, integer); Type: FUNCTION; Schema: tuneplane; Owner: -
--

CREATE FUNCTION tuneplane.slurm_member_started(p_attempt_id bigint, p_rank integer, p_pid integer) RETURNS text
    LANGUAGE plpgsql
    AS $$
DECLARE
    m tuneplane.members;
BEGIN
    m := tuneplane.slurm_member(p_attempt_id, p_rank);
    IF m.state = 'starting' THEN
        UPDATE tuneplane.members SET pid = p_pid, started_at = clock_timestamp() WHERE id = m.id;
        PERFORM tuneplane.set_member_state(m.id, 'running', 'running in its Slurm step');
        UPDATE tuneplane.attempts SET running_at = coalesce(running_at, clock_timestamp()) WHERE id = p_attempt_id;
    END IF;
    RETURN (SELECT state FROM tuneplane.members WHERE id = m.id);
END;
$$;


--
-- Name: slurm_node_credential(bigint, text); Type: FUNCTION; Schema: tuneplane; Owner: -
--

CREATE FUNCTION tuneplane.slurm_node_credential(p_node_id bigint, p_credential_hash text) RETURNS void
    LANGUAGE plpgsql
    AS $$
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


--
-- Name: slurm_pending(bigint, text, integer); Type: FUNCTION; Schema: tuneplane; Owner: -
--

CREATE FUNCTION tuneplane.slurm_pending(p_attempt_id bigint, p_code text, p_jobs_ahead integer) RETURNS text
    LANGUAGE plpgsql
    AS $$
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
                       tuneplane.slurm_reason_words(p_code), s.slurm_job_id, coalesce(p_code, 'None'),
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


--
-- Name: slurm_preview_check(bigint, integer, integer); Type: FUNCTION; Schema: tuneplane; Owner: -
--

CREATE FUNCTION tuneplane.slurm_preview_check(p_fleet_id bigint, p_nodes integer, p_minutes integer) RETURNS void
    LANGUAGE plpgsql
    AS $$
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


--
-- Name: slurm_reason_words(text); Type: FUNCTION; Schema: tuneplane; Owner: -
--

CREATE FUNCTION tuneplane.slurm_reason_words(p_code text) RETURNS text
    LANGUAGE sql IMMUTABLE
    AS $$
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


--
-- Name: slurm_scancel_due(bigint); Type: FUNCTION; Schema: tuneplane; Owner: -
--

CREATE FUNCTION tuneplane.slurm_scancel_due(p_fleet_id bigint) RETURNS TABLE(attempt_id bigint, slurm_job_id bigint, why text)
    LANGUAGE sql
    AS $$
    UPDATE tuneplane.slurm_jobs s SET scancel_at = clock_timestamp()
      FROM tuneplane.attempts a
     WHERE a.id = s.attempt_id AND s.fleet_id = p_fleet_id AND s.gone_at IS NULL AND s.scancel_at IS NULL
       AND s.slurm_job_id IS NOT NULL
       AND (a.state IN ('stopping', 'aborted', 'cancelled', 'failed') OR a.cancel_requested_at IS NOT NULL)
    RETURNING s.attempt_id, s.slurm_job_id, a.reason;
$$;


--
-- Name: slurm_submissions_due(bigint); Type: FUNCTION; Schema: tuneplane; Owner: -
--

CREATE FUNCTION tuneplane.slurm_submissions_due(p_fleet_id bigint) RETURNS TABLE(attempt_id bigint, job_id bigint, attempt_number integer, nodes integer, gpus_per_node integer, cpus_per_node integer, memory_per_node bigint, spec jsonb)
    LANGUAGE plpgsql
    AS $$
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
        RETURN NEXT;
    END LOOP;
END;
$$;


--
-- Name: slurm_submitted(bigint, bigint); Type: FUNCTION; Schema: tuneplane; Owner: -
--

CREATE FUNCTION tuneplane.slurm_submitted(p_attempt_id bigint, p_slurm_job_id bigint) RETURNS void
    LANGUAGE plpgsql
    AS $$
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


--
-- Name: slurm_sync_fleet(bigint, jsonb); Type: FUNCTION; Schema: tuneplane; Owner: -
--

CREATE FUNCTION tuneplane.slurm_sync_fleet(p_fleet_id bigint, p_status jsonb) RETURNS integer
    LANGUAGE plpgsql
    AS $$
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


--
-- Name: stop_attempt(bigint, text); Type: FUNCTION; Schema: tuneplane; Owner: -
--

CREATE FUNCTION tuneplane.stop_attempt(p_attempt_id bigint, p_reason text) RETURNS void
    LANGUAGE plpgsql
    AS $$
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


--
-- Name: submission_setting(text); Type: FUNCTION; Schema: tuneplane; Owner: -
--

CREATE FUNCTION tuneplane.submission_setting(p_name text) RETURNS bigint
    LANGUAGE plpgsql STABLE
    AS $$
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


--
-- Name: sweep_lost_nodes(); Type: FUNCTION; Schema: tuneplane; Owner: -
--

CREATE FUNCTION tuneplane.sweep_lost_nodes() RETURNS integer
    LANGUAGE plpgsql
    AS $$
DECLARE
    m record;
    v_count integer := 0;
BEGIN
    FOR m IN SELECT mm.id, mm.job_id, mm.rank, n.name AS node_name, n.last_heartbeat_at
               FROM tuneplane.nodes n
               JOIN tuneplane.members mm ON mm.node_id = n.id AND mm.released_at IS NULL
              WHERE n.fenced_at IS NULL AND n.scheduling_state <> 'retired'
                -- node_connectivity(…) = 'lost', with the threshold read once rather than per node
                AND (n.last_heartbeat_at IS NULL
                     OR n.last_heartbeat_at <= now() - (SELECT s.lost_after FROM tuneplane.node_settings s))
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


--
-- Name: telemetry_begin_batch(text, text, bigint, text, integer, jsonb, text[], text[]); Type: FUNCTION; Schema: tuneplane; Owner: -
--

CREATE FUNCTION tuneplane.telemetry_begin_batch(p_token_hash text, p_collector text, p_seq bigint, p_digest text, p_points integer, p_scope jsonb, p_sources text[], p_names text[]) RETURNS TABLE(duplicate boolean, series_ids bigint[], refused text[], job_id bigint, attempt integer, member_rank integer)
    LANGUAGE plpgsql
    AS $$
DECLARE
    tok record;
    inserted boolean;
    known_digest text;
    ids bigint[];
    why text[];
    cfg tuneplane.telemetry_settings;
    have integer;
    wanted integer;
BEGIN
    SELECT * INTO tok FROM tuneplane.telemetry_check_write(p_token_hash, p_scope);
    SELECT * INTO cfg FROM tuneplane.telemetry_settings s;
    IF p_points > cfg.max_batch_points THEN
        RAISE EXCEPTION 'batch holds % points; the limit is %', p_points, cfg.max_batch_points
            USING ERRCODE = 'TP413', COLUMN = 'points';
    END IF;
    IF coalesce(array_length(p_sources, 1), 0) <> coalesce(array_length(p_names, 1), 0) THEN
        RAISE EXCEPTION 'sources and names differ in length' USING ERRCODE = 'TP400', COLUMN = 'series';
    END IF;

    INSERT INTO tuneplane.telemetry_batches (job_id, attempt, member_rank, collector_id, seq, token_id, digest,
                                             points)
    VALUES (tok.job_id, tok.attempt, tok.member_rank, p_collector, p_seq, tok.token_id, p_digest, p_points)
    ON CONFLICT ON CONSTRAINT telemetry_batches_pkey DO NOTHING
    RETURNING true INTO inserted;

    IF inserted IS NULL THEN
        SELECT b.digest INTO known_digest FROM tuneplane.telemetry_batches b
         WHERE b.job_id = tok.job_id AND b.attempt = tok.attempt AND b.member_rank = tok.member_rank
           AND b.collector_id = p_collector AND b.seq = p_seq;
        IF known_digest IS DISTINCT FROM p_digest THEN
            RAISE EXCEPTION 'batch % of collector % was already stored with other content', p_seq, p_collector
                USING ERRCODE = 'TP409', COLUMN = 'seq';
        END IF;
        UPDATE tuneplane.telemetry_collectors c SET duplicates = c.duplicates + 1, last_batch_at = now()
         WHERE c.job_id = tok.job_id AND c.attempt = tok.attempt AND c.member_rank = tok.member_rank
           AND c.collector_id = p_collector;
        RETURN QUERY SELECT true, NULL::bigint[], NULL::text[], tok.job_id, tok.attempt, tok.member_rank;
        RETURN;
    END IF;

    -- New series, in order of first appearance, only while the member is under its cap. The member's row
    -- is locked only when a series is new (rare), so parallel batches of known series never queue here.
    IF EXISTS (SELECT 1 FROM unnest(p_sources, p_names) AS u(src, nm)
                WHERE NOT EXISTS (SELECT 1 FROM tuneplane.telemetry_series s
                                   WHERE s.job_id = tok.job_id AND s.attempt = tok.attempt
                                     AND s.member_rank = tok.member_rank AND s.source = u.src AND s.name = u.nm)) THEN
        INSERT INTO tuneplane.telemetry_members (job_id, attempt, member_rank)
        VALUES (tok.job_id, tok.attempt, tok.member_rank) ON CONFLICT DO NOTHING;
        SELECT m.series INTO have FROM tuneplane.telemetry_members m
         WHERE m.job_id = tok.job_id AND m.attempt = tok.attempt AND m.member_rank = tok.member_rank FOR UPDATE;
        WITH fresh AS (
            SELECT u.src, u.nm, min(u.ord) AS ord
              FROM unnest(p_sources, p_names) WITH ORDINALITY AS u(src, nm, ord)
             WHERE length(u.src) BETWEEN 1 AND 512 AND length(u.nm) BETWEEN 1 AND 512
               AND NOT EXISTS (SELECT 1 FROM tuneplane.telemetry_series s
                                WHERE s.job_id = tok.job_id AND s.attempt = tok.attempt
                                  AND s.member_rank = tok.member_rank AND s.source = u.src AND s.name = u.nm)
             GROUP BY u.src, u.nm
             ORDER BY min(u.ord)
             LIMIT greatest(cfg.max_series_per_member - have, 0)),
        made AS (
            INSERT INTO tuneplane.telemetry_series (job_id, attempt, member_rank, source, name, canonical)
            SELECT tok.job_id, tok.attempt, tok.member_rank, f.src, f.nm, tuneplane.telemetry_canonical(f.nm)
              FROM fresh f
            ON CONFLICT ON CONSTRAINT telemetry_series_job_id_attempt_member_rank_source_name_key DO NOTHING
            RETURNING 1)
        SELECT count(*) INTO wanted FROM made;
        UPDATE tuneplane.telemetry_members m SET series = m.series + wanted, updated_at = now()
         WHERE m.job_id = tok.job_id AND m.attempt = tok.attempt AND m.member_rank = tok.member_rank;
    END IF;

    SELECT array_agg(s.id ORDER BY u.ord),
           array_agg(CASE WHEN s.id IS NOT NULL THEN NULL
                          WHEN length(u.src) NOT BETWEEN 1 AND 512 OR length(u.nm) NOT BETWEEN 1 AND 512
                          THEN 'source and name must be 1-512 characters'
                          ELSE format('the member has reached its limit of %s series', cfg.max_series_per_member)
                     END ORDER BY u.ord)
      INTO ids, why
      FROM unnest(p_sources, p_names) WITH ORDINALITY AS u(src, nm, ord)
      LEFT JOIN tuneplane.telemetry_series s
        ON s.job_id = tok.job_id AND s.attempt = tok.attempt AND s.member_rank = tok.member_rank
       AND s.source = u.src AND s.name = u.nm;
    RETURN QUERY SELECT false, coalesce(ids, ARRAY[]::bigint[]), coalesce(why, ARRAY[]::text[]), tok.job_id,
                        tok.attempt, tok.member_rank;
END;
$$;


--
-- Name: telemetry_buckets(bigint, bigint, integer, bigint, bigint); Type: FUNCTION; Schema: tuneplane; Owner: -
--

CREATE FUNCTION tuneplane.telemetry_buckets(p_actor_id bigint, p_series_id bigint, p_max_buckets integer, p_step_from bigint DEFAULT NULL::bigint, p_step_to bigint DEFAULT NULL::bigint) RETURNS TABLE(bucket_start bigint, bucket_end bigint, n bigint, min double precision, max double precision, mean double precision, last_step bigint, last_value double precision, last_wall double precision)
    LANGUAGE plpgsql STABLE
    AS $$
BEGIN
    PERFORM tuneplane.telemetry_require_series(p_actor_id, p_series_id);
    RETURN QUERY SELECT * FROM tuneplane.telemetry_series_buckets(p_series_id, p_max_buckets, p_step_from, p_step_to);
END;
$$;


--
-- Name: telemetry_can_read(bigint, bigint); Type: FUNCTION; Schema: tuneplane; Owner: -
--

CREATE FUNCTION tuneplane.telemetry_can_read(p_actor_id bigint, p_job_id bigint) RETURNS boolean
    LANGUAGE plpgsql STABLE
    AS $_$
DECLARE
    actor_role text;
    owner bigint;
BEGIN
    SELECT u.role INTO actor_role FROM tuneplane.users u WHERE u.id = p_actor_id AND u.disabled_at IS NULL;
    IF actor_role IS NULL THEN
        RETURN false;
    END IF;
    IF actor_role = 'admin' THEN
        RETURN true;
    END IF;
    IF to_regclass('tuneplane.jobs') IS NULL THEN
        RETURN false;
    END IF;
    EXECUTE 'SELECT owner_id FROM tuneplane.jobs WHERE id = $1' INTO owner USING p_job_id;
    RETURN owner IS NOT DISTINCT FROM p_actor_id AND owner IS NOT NULL;
END;
$_$;


--
-- Name: telemetry_canonical(text); Type: FUNCTION; Schema: tuneplane; Owner: -
--

CREATE FUNCTION tuneplane.telemetry_canonical(p_name text) RETURNS text
    LANGUAGE sql STABLE
    AS $$
    SELECT r.canonical FROM tuneplane.telemetry_canonical_rules r
     WHERE lower(p_name) ~ r.pattern
     ORDER BY r.priority
     LIMIT 1;
$$;


--
-- Name: telemetry_check_write(text, jsonb); Type: FUNCTION; Schema: tuneplane; Owner: -
--

CREATE FUNCTION tuneplane.telemetry_check_write(p_token_hash text, p_scope jsonb) RETURNS TABLE(token_id bigint, job_id bigint, attempt integer, member_rank integer)
    LANGUAGE plpgsql STABLE
    AS $$
DECLARE
    tok record;
BEGIN
    SELECT * INTO tok FROM tuneplane.authenticate_telemetry_token(p_token_hash);
    IF p_scope IS NOT NULL AND p_scope <> 'null'::jsonb AND (
           (p_scope ? 'job_id' AND (p_scope ->> 'job_id')::bigint IS DISTINCT FROM tok.job_id)
        OR (p_scope ? 'attempt' AND (p_scope ->> 'attempt')::integer IS DISTINCT FROM tok.attempt)
        OR (p_scope ? 'member' AND (p_scope ->> 'member')::integer IS DISTINCT FROM tok.member_rank)) THEN
        RAISE EXCEPTION 'this token may write only job % attempt % member %', tok.job_id, tok.attempt,
            tok.member_rank USING ERRCODE = 'TP403', COLUMN = 'scope';
    END IF;
    RETURN QUERY SELECT tok.token_id, tok.job_id, tok.attempt, tok.member_rank;
END;
$$;


--
-- Name: telemetry_job_members(bigint, bigint); Type: FUNCTION; Schema: tuneplane; Owner: -
--

CREATE FUNCTION tuneplane.telemetry_job_members(p_actor_id bigint, p_job_id bigint) RETURNS TABLE(attempt integer, member_rank integer, state text, reason text, refused_points bigint, damaged_regions bigint, series integer, member_ended_at timestamp with time zone, finished_at timestamp with time zone)
    LANGUAGE plpgsql STABLE
    AS $$
BEGIN
    PERFORM tuneplane.telemetry_require_read(p_actor_id, p_job_id);
    RETURN QUERY
        SELECT m.attempt, m.member_rank,
               CASE WHEN m.state = 'collecting' AND grace.until <= now() THEN 'incomplete' ELSE m.state END,
               CASE WHEN m.state = 'collecting' AND grace.until <= now()
                    THEN 'the collector did not finish within the drain grace after the member ended'
                    ELSE m.reason END,
               m.refused_points, m.damaged_regions, m.series, m.member_ended_at, m.finished_at
          FROM tuneplane.telemetry_members m
          LEFT JOIN LATERAL (SELECT max(t.revoked_at) AS until FROM tuneplane.telemetry_tokens t
                              WHERE t.job_id = m.job_id AND t.attempt = m.attempt
                                AND t.member_rank = m.member_rank) grace ON m.member_ended_at IS NOT NULL
         WHERE m.job_id = p_job_id
         ORDER BY m.attempt, m.member_rank;
END;
$$;


--
-- Name: telemetry_job_problems(bigint, bigint, integer); Type: FUNCTION; Schema: tuneplane; Owner: -
--

CREATE FUNCTION tuneplane.telemetry_job_problems(p_actor_id bigint, p_job_id bigint, p_limit integer DEFAULT 200) RETURNS TABLE(kind text, attempt integer, member_rank integer, source text, what text, reason text, count bigint, file_offset bigint, bytes bigint, at timestamp with time zone)
    LANGUAGE plpgsql STABLE
    AS $$
BEGIN
    PERFORM tuneplane.telemetry_require_read(p_actor_id, p_job_id);
    RETURN QUERY
        SELECT * FROM (
            SELECT 'damaged'::text, d.attempt, d.member_rank, d.source, d.file, d.reason, 1::bigint,
                   d.file_offset, d.bytes, d.recorded_at
              FROM tuneplane.telemetry_damage d WHERE d.job_id = p_job_id
            UNION ALL
            SELECT 'refused'::text, f.attempt, f.member_rank, f.source, f.name, f.reason, f.count,
                   NULL::bigint, NULL::bigint, f.last_at
              FROM tuneplane.telemetry_refusals f WHERE f.job_id = p_job_id) x
         ORDER BY 1, 2, 3, 4, 8 NULLS LAST, 5
         LIMIT least(greatest(coalesce(p_limit, 200), 1), 1000);
END;
$$;


--
-- Name: telemetry_series; Type: TABLE; Schema: tuneplane; Owner: -
--

CREATE TABLE tuneplane.telemetry_series (
    id bigint NOT NULL,
    job_id bigint NOT NULL,
    attempt integer NOT NULL,
    member_rank integer NOT NULL,
    source text NOT NULL,
    name text NOT NULL,
    canonical text,
    point_count bigint DEFAULT 0 NOT NULL,
    min_step bigint,
    max_step bigint,
    last_step bigint,
    last_value double precision,
    created_at timestamp with time zone DEFAULT now() NOT NULL,
    last_at timestamp with time zone
);


--
-- Name: telemetry_job_series(bigint, bigint, text, integer, integer, text); Type: FUNCTION; Schema: tuneplane; Owner: -
--

CREATE FUNCTION tuneplane.telemetry_job_series(p_actor_id bigint, p_job_id bigint, p_name text DEFAULT NULL::text, p_attempt integer DEFAULT NULL::integer, p_member integer DEFAULT NULL::integer, p_source text DEFAULT NULL::text) RETURNS SETOF tuneplane.telemetry_series
    LANGUAGE plpgsql STABLE
    AS $$
BEGIN
    PERFORM tuneplane.telemetry_require_read(p_actor_id, p_job_id);
    RETURN QUERY
        SELECT s.* FROM tuneplane.telemetry_series s
         WHERE s.job_id = p_job_id
           AND (p_name IS NULL OR s.name = p_name OR s.canonical = p_name)
           AND (p_attempt IS NULL OR s.attempt = p_attempt)
           AND (p_member IS NULL OR s.member_rank = p_member)
           AND (p_source IS NULL OR s.source = p_source)
         ORDER BY s.canonical NULLS LAST, s.name, s.source, s.attempt, s.member_rank;
END;
$$;


--
-- Name: telemetry_member_ended(); Type: FUNCTION; Schema: tuneplane; Owner: -
--

CREATE FUNCTION tuneplane.telemetry_member_ended() RETURNS trigger
    LANGUAGE plpgsql
    AS $$
DECLARE
    v_attempt integer;
    v_until timestamptz;
BEGIN
    IF tuneplane.member_is_live(NEW.state) OR NOT tuneplane.member_is_live(OLD.state) THEN
        RETURN NEW;
    END IF;
    SELECT a.number INTO v_attempt FROM tuneplane.attempts a WHERE a.id = NEW.attempt_id;
    SELECT now() + CASE WHEN NEW.state = 'lost' THEN interval '0' ELSE s.drain_grace END INTO v_until
      FROM tuneplane.telemetry_settings s;
    UPDATE tuneplane.telemetry_tokens t SET revoked_at = v_until
     WHERE t.job_id = NEW.job_id AND t.attempt = v_attempt AND t.member_rank = NEW.rank
       AND (t.revoked_at IS NULL OR t.revoked_at > v_until);
    UPDATE tuneplane.telemetry_members m SET member_ended_at = coalesce(m.member_ended_at, now()), updated_at = now()
     WHERE m.job_id = NEW.job_id AND m.attempt = v_attempt AND m.member_rank = NEW.rank;
    RETURN NEW;
END;
$$;


--
-- Name: telemetry_merge_batch(text, text, bigint, bigint[], integer[], bigint[], bigint[], double precision[], double precision[], double precision[], bigint[], bigint[], double precision[], double precision[], bigint[], bigint[], bigint[], bigint[], bigint[], double precision[], integer, jsonb, text[], text[], text[], bigint[], text[], text[], bigint[], bigint[], text[], boolean); Type: FUNCTION; Schema: tuneplane; Owner: -
--

CREATE FUNCTION tuneplane.telemetry_merge_batch(p_token_hash text, p_collector text, p_seq bigint, r_series bigint[], r_width integer[], r_bucket bigint[], r_n bigint[], r_sum double precision[], r_min double precision[], r_max double precision[], r_first bigint[], r_last bigint[], r_last_value double precision[], r_last_wall double precision[], s_series bigint[], s_count bigint[], s_min_step bigint[], s_max_step bigint[], s_last_step bigint[], s_last_value double precision[], p_points integer, p_health jsonb, f_source text[], f_name text[], f_reason text[], f_count bigint[], d_source text[], d_file text[], d_offset bigint[], d_bytes bigint[], d_reason text[], p_final boolean DEFAULT false) RETURNS void
    LANGUAGE plpgsql
    AS $$
DECLARE
    tok record;
    refused_n bigint := coalesce((SELECT sum(c) FROM unnest(f_count) AS c), 0);
    damaged_n bigint;
    rejected integer;
BEGIN
    SELECT * INTO tok FROM tuneplane.authenticate_telemetry_token(p_token_hash);
    IF NOT EXISTS (SELECT 1 FROM tuneplane.telemetry_batches b
                    WHERE b.job_id = tok.job_id AND b.attempt = tok.attempt AND b.member_rank = tok.member_rank
                      AND b.collector_id = p_collector AND b.seq = p_seq AND b.token_id = tok.token_id) THEN
        RAISE EXCEPTION 'batch % of collector % was not begun with this token', p_seq, p_collector
            USING ERRCODE = 'TP409', COLUMN = 'seq';
    END IF;
    IF EXISTS (SELECT 1 FROM unnest(s_series) AS u(id)
                LEFT JOIN tuneplane.telemetry_series s ON s.id = u.id
               WHERE s.id IS NULL OR s.job_id <> tok.job_id OR s.attempt <> tok.attempt
                  OR s.member_rank <> tok.member_rank) THEN
        RAISE EXCEPTION 'a series of this batch is not this member''s' USING ERRCODE = 'TP403', COLUMN = 'series';
    END IF;

    INSERT INTO tuneplane.telemetry_rollups AS r
           (series_id, width, bucket, n, sum, min, max, first_step, last_step, last_value, last_wall)
    SELECT * FROM unnest(r_series, r_width, r_bucket, r_n, r_sum, r_min, r_max, r_first, r_last, r_last_value,
                         r_last_wall)
    ON CONFLICT (series_id, width, bucket) DO UPDATE SET
        last_wall = CASE WHEN EXCLUDED.last_step >= r.last_step THEN EXCLUDED.last_wall ELSE r.last_wall END,
        n = r.n + EXCLUDED.n,
        sum = r.sum + EXCLUDED.sum,
        -- NaN sorts above every number in PostgreSQL: it must not win a max or stick in a min.
        min = CASE WHEN r.min IS NULL OR r.min = 'NaN' THEN EXCLUDED.min
                   WHEN EXCLUDED.min IS NULL OR EXCLUDED.min = 'NaN' THEN r.min
                   ELSE least(r.min, EXCLUDED.min) END,
        max = CASE WHEN r.max IS NULL OR r.max = 'NaN' THEN EXCLUDED.max
                   WHEN EXCLUDED.max IS NULL OR EXCLUDED.max = 'NaN' THEN r.max
                   ELSE greatest(r.max, EXCLUDED.max) END,
        first_step = least(r.first_step, EXCLUDED.first_step),
        last_step = greatest(r.last_step, EXCLUDED.last_step),
        last_value = CASE WHEN EXCLUDED.last_step >= r.last_step THEN EXCLUDED.last_value ELSE r.last_value END;

    UPDATE tuneplane.telemetry_series s SET
        point_count = s.point_count + u.cnt,
        min_step = least(s.min_step, u.min_step),
        max_step = greatest(s.max_step, u.max_step),
        last_value = CASE WHEN s.last_step IS NULL OR u.last_step >= s.last_step THEN u.last_value
                          ELSE s.last_value END,
        last_step = greatest(s.last_step, u.last_step),
        last_at = now()
      FROM unnest(s_series, s_count, s_min_step, s_max_step, s_last_step, s_last_value)
           AS u(id, cnt, min_step, max_step, last_step, last_value)
     WHERE s.id = u.id;

    IF refused_n > 0 THEN
        INSERT INTO tuneplane.telemetry_refusals AS f (job_id, attempt, member_rank, source, name, reason, count)
        SELECT tok.job_id, tok.attempt, tok.member_rank, u.src, u.nm, u.why, sum(u.n)
          FROM unnest(f_source, f_name, f_reason, f_count) AS u(src, nm, why, n)
         GROUP BY u.src, u.nm, u.why
        ON CONFLICT (job_id, attempt, member_rank, source, name, reason) DO UPDATE
            SET count = f.count + EXCLUDED.count, last_at = now();
    END IF;
    WITH added AS (
        INSERT INTO tuneplane.telemetry_damage (job_id, attempt, member_rank, source, file, file_offset, bytes, reason)
        SELECT tok.job_id, tok.attempt, tok.member_rank, u.src, u.fl, u.off, u.n, u.why
          FROM unnest(d_source, d_file, d_offset, d_bytes, d_reason) AS u(src, fl, off, n, why)
        ON CONFLICT (job_id, attempt, member_rank, file, file_offset) DO NOTHING
        RETURNING 1)
    SELECT count(*) INTO damaged_n FROM added;
    IF refused_n > 0 OR damaged_n > 0 OR p_final THEN
        rejected := CASE WHEN jsonb_typeof(p_health -> 'rejected_batches') = 'number'
                         THEN (p_health ->> 'rejected_batches')::integer ELSE 0 END;
        INSERT INTO tuneplane.telemetry_members (job_id, attempt, member_rank)
        VALUES (tok.job_id, tok.attempt, tok.member_rank) ON CONFLICT DO NOTHING;
        UPDATE tuneplane.telemetry_members m
           SET refused_points = m.refused_points + refused_n,
               damaged_regions = m.damaged_regions + damaged_n,
               state = CASE WHEN NOT p_final THEN m.state WHEN rejected > 0 THEN 'incomplete' ELSE 'complete' END,
               reason = CASE WHEN NOT p_final THEN m.reason
                             WHEN rejected > 0 THEN format('%s batch(es) refused by the gateway', rejected)
                             ELSE '' END,
               finished_at = CASE WHEN p_final THEN now() ELSE m.finished_at END,
               updated_at = now()
         WHERE m.job_id = tok.job_id AND m.attempt = tok.attempt AND m.member_rank = tok.member_rank;
    END IF;
    IF p_final THEN
        -- The member is gone and its collector has read everything: nothing may write for it any more.
        UPDATE tuneplane.telemetry_tokens t SET revoked_at = now()
         WHERE t.job_id = tok.job_id AND t.attempt = tok.attempt AND t.member_rank = tok.member_rank
           AND (t.revoked_at IS NULL OR t.revoked_at > now());
    END IF;

    INSERT INTO tuneplane.telemetry_collectors AS c (collector_id, job_id, attempt, member_rank, batches,
                                                    points, health, last_batch_at)
    VALUES (p_collector, tok.job_id, tok.attempt, tok.member_rank, 1, p_points, coalesce(p_health, '{}'::jsonb),
            now())
    ON CONFLICT ON CONSTRAINT telemetry_collectors_pkey DO UPDATE
        SET batches = c.batches + 1, points = c.points + EXCLUDED.points,
            health = CASE WHEN EXCLUDED.health = '{}'::jsonb THEN c.health ELSE EXCLUDED.health END,
            last_batch_at = now();
END;
$$;


--
-- Name: telemetry_node_fenced(); Type: FUNCTION; Schema: tuneplane; Owner: -
--

CREATE FUNCTION tuneplane.telemetry_node_fenced() RETURNS trigger
    LANGUAGE plpgsql
    AS $$
BEGIN
    IF NEW.fenced_at IS NULL OR OLD.fenced_at IS NOT NULL THEN
        RETURN NEW;
    END IF;
    UPDATE tuneplane.telemetry_tokens t SET revoked_at = now()
      FROM tuneplane.members m JOIN tuneplane.attempts a ON a.id = m.attempt_id
     WHERE m.node_id = NEW.id AND t.job_id = m.job_id AND t.attempt = a.number AND t.member_rank = m.rank
       AND (t.revoked_at IS NULL OR t.revoked_at > now());
    RETURN NEW;
END;
$$;


--
-- Name: telemetry_prune(timestamp with time zone); Type: FUNCTION; Schema: tuneplane; Owner: -
--

CREATE FUNCTION tuneplane.telemetry_prune(p_now timestamp with time zone DEFAULT now()) RETURNS TABLE(series bigint, points bigint, batches bigint)
    LANGUAGE plpgsql
    AS $$
DECLARE
    cutoff timestamptz;
    doomed bigint[];
    n_points bigint;
    n_batches bigint;
BEGIN
    SELECT p_now - s.retention INTO cutoff FROM tuneplane.telemetry_settings s;
    SELECT coalesce(array_agg(s.id), ARRAY[]::bigint[]) INTO doomed
      FROM tuneplane.telemetry_series s WHERE coalesce(s.last_at, s.created_at) < cutoff;
    DELETE FROM tuneplane.telemetry_points p WHERE p.series_id = ANY (doomed);
    GET DIAGNOSTICS n_points = ROW_COUNT;
    DELETE FROM tuneplane.telemetry_rollups r WHERE r.series_id = ANY (doomed);
    DELETE FROM tuneplane.telemetry_series s WHERE s.id = ANY (doomed);
    DELETE FROM tuneplane.telemetry_batches b WHERE b.received_at < cutoff;
    GET DIAGNOSTICS n_batches = ROW_COUNT;
    DELETE FROM tuneplane.telemetry_refusals f WHERE f.last_at < cutoff;
    DELETE FROM tuneplane.telemetry_damage d WHERE d.recorded_at < cutoff;
    DELETE FROM tuneplane.telemetry_members m WHERE m.updated_at < cutoff;
    RETURN QUERY SELECT coalesce(array_length(doomed, 1), 0)::bigint, n_points, n_batches;
END;
$$;


--
-- Name: telemetry_raw_points(bigint, bigint, bigint, bigint, integer, integer); Type: FUNCTION; Schema: tuneplane; Owner: -
--

CREATE FUNCTION tuneplane.telemetry_raw_points(p_actor_id bigint, p_series_id bigint, p_step_from bigint DEFAULT NULL::bigint, p_step_to bigint DEFAULT NULL::bigint, p_limit integer DEFAULT 500, p_skip integer DEFAULT 0) RETURNS TABLE(step bigint, value double precision, wall_time double precision)
    LANGUAGE plpgsql STABLE
    AS $$
BEGIN
    PERFORM tuneplane.telemetry_require_series(p_actor_id, p_series_id);
    IF p_limit IS NULL OR p_limit < 1 OR p_limit > 2000 THEN
        RAISE EXCEPTION 'limit must be between 1 and 2000' USING ERRCODE = 'TP400', COLUMN = 'limit';
    END IF;
    RETURN QUERY
        SELECT p.step, p.value, p.wall_time FROM tuneplane.telemetry_points p
         WHERE p.series_id = p_series_id
           AND p.step >= coalesce(p_step_from, -9223372036854775808)
           AND p.step <= coalesce(p_step_to, 9223372036854775807)
         ORDER BY p.step, p.wall_time, p.value
         OFFSET greatest(coalesce(p_skip, 0), 0) LIMIT p_limit;
END;
$$;


--
-- Name: telemetry_recanonicalize(); Type: FUNCTION; Schema: tuneplane; Owner: -
--

CREATE FUNCTION tuneplane.telemetry_recanonicalize() RETURNS bigint
    LANGUAGE plpgsql
    AS $$
DECLARE
    changed bigint;
BEGIN
    UPDATE tuneplane.telemetry_series s SET canonical = tuneplane.telemetry_canonical(s.name)
     WHERE s.canonical IS DISTINCT FROM tuneplane.telemetry_canonical(s.name);
    GET DIAGNOSTICS changed = ROW_COUNT;
    RETURN changed;
END;
$$;


--
-- Name: telemetry_require_read(bigint, bigint); Type: FUNCTION; Schema: tuneplane; Owner: -
--

CREATE FUNCTION tuneplane.telemetry_require_read(p_actor_id bigint, p_job_id bigint) RETURNS void
    LANGUAGE plpgsql STABLE
    AS $$
BEGIN
    IF NOT tuneplane.telemetry_can_read(p_actor_id, p_job_id) THEN
        RAISE EXCEPTION 'no such job of yours: %', p_job_id USING ERRCODE = 'TP404', COLUMN = 'job_id';
    END IF;
END;
$$;


--
-- Name: telemetry_require_series(bigint, bigint); Type: FUNCTION; Schema: tuneplane; Owner: -
--

CREATE FUNCTION tuneplane.telemetry_require_series(p_actor_id bigint, p_series_id bigint) RETURNS void
    LANGUAGE plpgsql STABLE
    AS $$
DECLARE
    job bigint;
BEGIN
    SELECT s.job_id INTO job FROM tuneplane.telemetry_series s WHERE s.id = p_series_id;
    IF job IS NULL OR NOT tuneplane.telemetry_can_read(p_actor_id, job) THEN
        RAISE EXCEPTION 'no such series of yours: %', p_series_id USING ERRCODE = 'TP404', COLUMN = 'series';
    END IF;
END;
$$;


--
-- Name: telemetry_series_buckets(bigint, integer, bigint, bigint, boolean); Type: FUNCTION; Schema: tuneplane; Owner: -
--

CREATE FUNCTION tuneplane.telemetry_series_buckets(p_series_id bigint, p_max_buckets integer, p_step_from bigint DEFAULT NULL::bigint, p_step_to bigint DEFAULT NULL::bigint, p_use_rollups boolean DEFAULT true) RETURNS TABLE(bucket_start bigint, bucket_end bigint, n bigint, min double precision, max double precision, mean double precision, last_step bigint, last_value double precision, last_wall double precision)
    LANGUAGE plpgsql STABLE
    AS $$
DECLARE
    s tuneplane.telemetry_series;
    lo bigint;
    hi bigint;
    want bigint;
    level integer := 0;
    w bigint;
    lo_aligned bigint;
    occupied bigint;
    npoints bigint;
    fine integer;
    wide boolean;
BEGIN
    IF p_max_buckets IS NULL OR p_max_buckets < 1 OR p_max_buckets > 1000 THEN
        RAISE EXCEPTION 'max buckets must be between 1 and 1000' USING ERRCODE = 'TP400', COLUMN = 'max_points';
    END IF;
    SELECT * INTO s FROM tuneplane.telemetry_series WHERE id = p_series_id;
    IF s.id IS NULL OR s.min_step IS NULL THEN
        RETURN;
    END IF;
    lo := greatest(coalesce(p_step_from, s.min_step), s.min_step);
    hi := least(coalesce(p_step_to, s.max_step), s.max_step);
    IF hi < lo THEN
        RETURN;
    END IF;
    -- Ingest keeps steps within ±(2^53-1); older data may span the whole int64 range, where step - lo
    -- overflows: then (only then) the arithmetic is numeric.
    wide := hi::numeric - lo >= 4611686018427387904;
    want := greatest(1, ceil((hi::numeric - lo + 1) / p_max_buckets))::bigint;
    IF p_use_rollups THEN
        SELECT max(lv) INTO level FROM unnest(ARRAY[64, 512, 4096, 32768]) AS lv WHERE lv <= want;
    END IF;
    IF coalesce(level, 0) > 0 THEN
        w := ceil(want::numeric / level)::bigint * level;
        lo_aligned := lo - (((lo % level) + level) % level);
        SELECT count(DISTINCT floor((c.bucket::numeric * level - lo_aligned) / w)) INTO occupied
          FROM (SELECT r.bucket FROM tuneplane.telemetry_rollups r
                 WHERE r.series_id = p_series_id AND r.width = level
                   AND r.bucket BETWEEN floor(lo::numeric / level)::bigint AND floor(hi::numeric / level)::bigint
                 LIMIT 64000) c;
        IF occupied * 4 >= least(p_max_buckets, ceil((hi::numeric - lo_aligned + 1) / w)) THEN
            -- Dense: equal-width buckets, whole multiples of the rollup width, aligned to its grid.
            RETURN QUERY
                SELECT least(lo_aligned + g.b * w, 9223372036854775807)::bigint,
                       least(lo_aligned + g.b * w + w - 1, 9223372036854775807)::bigint, g.cnt, g.mn, g.mx,
                       CASE WHEN g.cnt > 0 THEN g.total / g.cnt END, g.ls, g.lv, g.lw
                  FROM (SELECT floor((r.bucket::numeric * level - lo_aligned) / w) AS b,
                               sum(r.n)::bigint AS cnt, sum(r.sum) AS total,
                               min(r.min) FILTER (WHERE r.min <> 'NaN') AS mn,
                               max(r.max) FILTER (WHERE r.max <> 'NaN') AS mx,
                               max(r.last_step) AS ls,
                               (array_agg(r.last_value ORDER BY r.last_step DESC))[1] AS lv,
                               (array_agg(r.last_wall ORDER BY r.last_step DESC))[1] AS lw
                          FROM tuneplane.telemetry_rollups r
                         WHERE r.series_id = p_series_id AND r.width = level
                           AND r.bucket BETWEEN floor(lo::numeric / level)::bigint
                                            AND floor(hi::numeric / level)::bigint
                         GROUP BY 1) g
                 ORDER BY g.b;
            RETURN;
        END IF;
    END IF;
    -- Raw points: equal-width buckets, or equal shares of the points when most buckets would be empty.
    w := want;
    SELECT count(DISTINCT floor((p.step::numeric - lo) / w)), count(*) INTO occupied, npoints
      FROM (SELECT p.step FROM tuneplane.telemetry_points p
             WHERE p.series_id = p_series_id AND p.step BETWEEN lo AND hi LIMIT 64001) p;
    IF npoints <= 64000 AND occupied * 4 < least(npoints, p_max_buckets) THEN
        RETURN QUERY
            SELECT min(g.step), max(g.step),
                   count(*) FILTER (WHERE g.value NOT IN ('NaN', 'Infinity', '-Infinity')),
                   min(g.value) FILTER (WHERE g.value NOT IN ('NaN', 'Infinity', '-Infinity')),
                   max(g.value) FILTER (WHERE g.value NOT IN ('NaN', 'Infinity', '-Infinity')),
                   avg(g.value) FILTER (WHERE g.value NOT IN ('NaN', 'Infinity', '-Infinity')),
                   max(g.step), (array_agg(g.value ORDER BY g.step DESC))[1],
                   (array_agg(g.wall_time ORDER BY g.step DESC))[1]
              FROM (SELECT p.step, p.value, p.wall_time,
                           ntile(least(p_max_buckets, npoints)::integer) OVER (ORDER BY p.step, p.wall_time) AS b
                      FROM tuneplane.telemetry_points p
                     WHERE p.series_id = p_series_id AND p.step BETWEEN lo AND hi) g
             GROUP BY g.b ORDER BY g.b;
        RETURN;
    END IF;
    IF coalesce(level, 0) > 0 THEN
        -- Too many raw points: equal shares of the finest rollup cells that number at most 16 per bucket.
        SELECT min(lv) INTO fine FROM unnest(ARRAY[64, 512, 4096, 32768]) AS lv
         WHERE (SELECT count(*) FROM (SELECT 1 FROM tuneplane.telemetry_rollups r
                                       WHERE r.series_id = p_series_id AND r.width = lv
                                         AND r.bucket BETWEEN floor(lo::numeric / lv)::bigint
                                                          AND floor(hi::numeric / lv)::bigint
                                       LIMIT 16 * p_max_buckets + 1) x) <= 16 * p_max_buckets;
        fine := coalesce(fine, 32768);
        RETURN QUERY
            SELECT greatest(min(g.bucket) * fine, lo), least(max(g.bucket)::numeric * fine + fine - 1, hi)::bigint,
                   sum(g.n)::bigint,
                   min(g.min) FILTER (WHERE g.min <> 'NaN'), max(g.max) FILTER (WHERE g.max <> 'NaN'),
                   CASE WHEN sum(g.n) > 0 THEN sum(g.sum) / sum(g.n) END,
                   max(g.last_step), (array_agg(g.last_value ORDER BY g.last_step DESC))[1],
                   (array_agg(g.last_wall ORDER BY g.last_step DESC))[1]
              FROM (SELECT r.*, ntile(p_max_buckets) OVER (ORDER BY r.bucket) AS b
                      FROM tuneplane.telemetry_rollups r
                     WHERE r.series_id = p_series_id AND r.width = fine
                       AND r.bucket BETWEEN floor(lo::numeric / fine)::bigint
                                        AND floor(hi::numeric / fine)::bigint) g
             GROUP BY g.b ORDER BY g.b;
        RETURN;
    END IF;
    RETURN QUERY
        SELECT least(lo + g.b * w, 9223372036854775807)::bigint,
               least(lo + g.b * w + w - 1, 9223372036854775807)::bigint, g.cnt, g.mn, g.mx, g.mean, g.ls, g.lv,
               g.lw
          FROM (SELECT CASE WHEN wide THEN floor((p.step::numeric - lo) / w) ELSE (p.step - lo) / w END AS b,
                       count(*) FILTER (WHERE p.value NOT IN ('NaN', 'Infinity', '-Infinity')) AS cnt,
                       min(p.value) FILTER (WHERE p.value NOT IN ('NaN', 'Infinity', '-Infinity')) AS mn,
                       max(p.value) FILTER (WHERE p.value NOT IN ('NaN', 'Infinity', '-Infinity')) AS mx,
                       avg(p.value) FILTER (WHERE p.value NOT IN ('NaN', 'Infinity', '-Infinity')) AS mean,
                       max(p.step) AS ls,
                       (array_agg(p.value ORDER BY p.step DESC))[1] AS lv,
                       (array_agg(p.wall_time ORDER BY p.step DESC))[1] AS lw
                  FROM tuneplane.telemetry_points p
                 WHERE p.series_id = p_series_id AND p.step BETWEEN lo AND hi
                 GROUP BY 1) g
         ORDER BY g.b;
END;
$$;


--
-- Name: telemetry_series_smoothed(bigint, bigint, bigint[]); Type: FUNCTION; Schema: tuneplane; Owner: -
--

CREATE FUNCTION tuneplane.telemetry_series_smoothed(p_series_id bigint, p_window bigint, p_steps bigint[]) RETURNS TABLE(step bigint, value double precision)
    LANGUAGE plpgsql STABLE
    AS $$
DECLARE
    cell integer;
BEGIN
    IF p_window IS NULL OR p_window < 1 OR p_window > 4611686018427387904 THEN
        RAISE EXCEPTION 'smoothing window must be 1 step or more' USING ERRCODE = 'TP400', COLUMN = 'smooth';
    END IF;
    IF coalesce(array_length(p_steps, 1), 0) > 1000 THEN
        RAISE EXCEPTION 'at most 1000 steps per call' USING ERRCODE = 'TP400', COLUMN = 'steps';
    END IF;
    SELECT max(lv) INTO cell FROM unnest(ARRAY[64, 512, 4096, 32768]) AS lv WHERE lv * 16 <= p_window;
    IF cell IS NULL THEN
        RETURN QUERY
            SELECT t.t, (SELECT avg(p.value) FROM tuneplane.telemetry_points p
                          WHERE p.series_id = p_series_id AND p.step > t.t - p_window AND p.step <= t.t
                            AND p.value NOT IN ('NaN', 'Infinity', '-Infinity'))
              FROM unnest(p_steps) AS t(t);
        RETURN;
    END IF;
    RETURN QUERY
        SELECT t.t, (SELECT CASE WHEN sum(r.n) > 0 THEN sum(r.sum) / sum(r.n) END
                       FROM tuneplane.telemetry_rollups r
                      WHERE r.series_id = p_series_id AND r.width = cell
                        AND r.bucket > floor((t.t::numeric - p_window) / cell)
                        AND r.bucket <= floor(t.t::numeric / cell))
          FROM unnest(p_steps) AS t(t);
END;
$$;


--
-- Name: telemetry_smoothed(bigint, bigint, bigint, bigint[]); Type: FUNCTION; Schema: tuneplane; Owner: -
--

CREATE FUNCTION tuneplane.telemetry_smoothed(p_actor_id bigint, p_series_id bigint, p_window bigint, p_steps bigint[]) RETURNS TABLE(step bigint, value double precision)
    LANGUAGE plpgsql STABLE
    AS $$
BEGIN
    PERFORM tuneplane.telemetry_require_series(p_actor_id, p_series_id);
    RETURN QUERY SELECT * FROM tuneplane.telemetry_series_smoothed(p_series_id, p_window, p_steps);
END;
$$;


--
-- Name: uncordon_node(text, text, text); Type: FUNCTION; Schema: tuneplane; Owner: -
--

CREATE FUNCTION tuneplane.uncordon_node(p_node text, p_reason text DEFAULT NULL::text, p_actor text DEFAULT NULL::text) RETURNS TABLE(node_id bigint, fleet text, node text, scheduling_state text, changed boolean)
    LANGUAGE sql
    AS $$ SELECT * FROM tuneplane.change_node_scheduling(p_node, 'uncordon', p_reason, p_actor) $$;


--
-- Name: unfence_node(text, text, text); Type: FUNCTION; Schema: tuneplane; Owner: -
--

CREATE FUNCTION tuneplane.unfence_node(p_node text, p_reason text DEFAULT NULL::text, p_actor text DEFAULT NULL::text) RETURNS boolean
    LANGUAGE plpgsql
    AS $$
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
       AND (c.acked_at IS NULL OR (c.error IS NOT NULL AND c.created_at >= n.fenced_at));
    IF v_pending > 0 THEN
        RAISE EXCEPTION 'node % cannot be unfenced yet: % KILL command(s) are not acknowledged by its agent '
            '(or failed since the fence)', n.name, v_pending USING ERRCODE = 'TP409', COLUMN = 'node';
    END IF;
    UPDATE tuneplane.nodes SET fenced_at = NULL, fenced_reason = NULL WHERE id = v_id;
    PERFORM tuneplane.log_node_event(n.fleet_id, v_id, 'unfenced', p_actor, coalesce(p_reason, ''));
    RETURN true;
END;
$$;


--
-- Name: pgqueuer; Type: TABLE; Schema: public; Owner: -
--

CREATE TABLE public.pgqueuer (
    id bigint NOT NULL,
    priority integer NOT NULL,
    queue_manager_id uuid,
    created timestamp with time zone DEFAULT now() NOT NULL,
    updated timestamp with time zone DEFAULT now() NOT NULL,
    heartbeat timestamp with time zone DEFAULT now() NOT NULL,
    execute_after timestamp with time zone DEFAULT now() NOT NULL,
    status public.pgqueuer_status NOT NULL,
    entrypoint text NOT NULL,
    dedupe_key text,
    payload bytea,
    headers jsonb,
    attempts integer DEFAULT 0 NOT NULL,
    slot bigint
);


--
-- Name: pgqueuer_id_seq; Type: SEQUENCE; Schema: public; Owner: -
--

CREATE SEQUENCE public.pgqueuer_id_seq
    START WITH 1
    INCREMENT BY 1
    NO MINVALUE
    NO MAXVALUE
    CACHE 1;


--
-- Name: pgqueuer_id_seq; Type: SEQUENCE OWNED BY; Schema: public; Owner: -
--

ALTER SEQUENCE public.pgqueuer_id_seq OWNED BY public.pgqueuer.id;


--
-- Name: pgqueuer_log; Type: TABLE; Schema: public; Owner: -
--

CREATE TABLE public.pgqueuer_log (
    id bigint NOT NULL,
    created timestamp with time zone DEFAULT now() NOT NULL,
    job_id bigint NOT NULL,
    status public.pgqueuer_status NOT NULL,
    priority integer NOT NULL,
    entrypoint text NOT NULL,
    traceback jsonb,
    aggregated boolean DEFAULT false
);


--
-- Name: pgqueuer_log_id_seq; Type: SEQUENCE; Schema: public; Owner: -
--

ALTER TABLE public.pgqueuer_log ALTER COLUMN id ADD GENERATED BY DEFAULT AS IDENTITY (
    SEQUENCE NAME public.pgqueuer_log_id_seq
    START WITH 1
    INCREMENT BY 1
    NO MINVALUE
    NO MAXVALUE
    CACHE 1
);


--
-- Name: pgqueuer_schedules; Type: TABLE; Schema: public; Owner: -
--

CREATE TABLE public.pgqueuer_schedules (
    id bigint NOT NULL,
    expression text NOT NULL,
    entrypoint text NOT NULL,
    heartbeat timestamp with time zone DEFAULT now() NOT NULL,
    created timestamp with time zone DEFAULT now() NOT NULL,
    updated timestamp with time zone DEFAULT now() NOT NULL,
    next_run timestamp with time zone DEFAULT now() NOT NULL,
    last_run timestamp with time zone,
    status public.pgqueuer_status DEFAULT 'queued'::public.pgqueuer_status
);


--
-- Name: pgqueuer_schedules_id_seq; Type: SEQUENCE; Schema: public; Owner: -
--

CREATE SEQUENCE public.pgqueuer_schedules_id_seq
    START WITH 1
    INCREMENT BY 1
    NO MINVALUE
    NO MAXVALUE
    CACHE 1;


--
-- Name: pgqueuer_schedules_id_seq; Type: SEQUENCE OWNED BY; Schema: public; Owner: -
--

ALTER SEQUENCE public.pgqueuer_schedules_id_seq OWNED BY public.pgqueuer_schedules.id;


--
-- Name: pgqueuer_statistics; Type: TABLE; Schema: public; Owner: -
--

CREATE TABLE public.pgqueuer_statistics (
    id bigint NOT NULL,
    created timestamp with time zone DEFAULT date_trunc('sec'::text, now()) NOT NULL,
    count bigint NOT NULL,
    priority integer NOT NULL,
    status public.pgqueuer_status NOT NULL,
    entrypoint text NOT NULL
);


--
-- Name: pgqueuer_statistics_id_seq; Type: SEQUENCE; Schema: public; Owner: -
--

CREATE SEQUENCE public.pgqueuer_statistics_id_seq
    START WITH 1
    INCREMENT BY 1
    NO MINVALUE
    NO MAXVALUE
    CACHE 1;


--
-- Name: pgqueuer_statistics_id_seq; Type: SEQUENCE OWNED BY; Schema: public; Owner: -
--

ALTER SEQUENCE public.pgqueuer_statistics_id_seq OWNED BY public.pgqueuer_statistics.id;


--
-- Name: api_tokens_id_seq; Type: SEQUENCE; Schema: tuneplane; Owner: -
--

ALTER TABLE tuneplane.api_tokens ALTER COLUMN id ADD GENERATED ALWAYS AS IDENTITY (
    SEQUENCE NAME tuneplane.api_tokens_id_seq
    START WITH 1
    INCREMENT BY 1
    NO MINVALUE
    NO MAXVALUE
    CACHE 1
);


--
-- Name: artifact_chunks; Type: TABLE; Schema: tuneplane; Owner: -
--

CREATE TABLE tuneplane.artifact_chunks (
    artifact_id bigint NOT NULL,
    file_index integer NOT NULL,
    chunk_index integer NOT NULL,
    size integer NOT NULL,
    sha256 text,
    recorded_at timestamp with time zone DEFAULT now() NOT NULL,
    crc32c bigint,
    CONSTRAINT artifact_chunks_chunk_index_check CHECK ((chunk_index >= 0)),
    CONSTRAINT artifact_chunks_crc32c_check CHECK (((crc32c >= 0) AND (crc32c <= '4294967295'::bigint))),
    CONSTRAINT artifact_chunks_digest CHECK (((sha256 IS NOT NULL) OR (crc32c IS NOT NULL))),
    CONSTRAINT artifact_chunks_sha256_check CHECK ((sha256 ~ '^[0-9a-f]{64}$'::text)),
    CONSTRAINT artifact_chunks_size_check CHECK ((size > 0))
);


--
-- Name: artifact_files; Type: TABLE; Schema: tuneplane; Owner: -
--

CREATE TABLE tuneplane.artifact_files (
    artifact_id bigint NOT NULL,
    file_index integer NOT NULL,
    path text NOT NULL,
    size bigint NOT NULL,
    sha256 text NOT NULL,
    verified_at timestamp with time zone,
    CONSTRAINT artifact_files_file_index_check CHECK ((file_index >= 0)),
    CONSTRAINT artifact_files_sha256_check CHECK ((sha256 ~ '^[0-9a-f]{64}$'::text)),
    CONSTRAINT artifact_files_size_check CHECK ((size >= 0))
);


--
-- Name: artifact_settings; Type: TABLE; Schema: tuneplane; Owner: -
--

CREATE TABLE tuneplane.artifact_settings (
    singleton boolean DEFAULT true NOT NULL,
    chunk_size integer DEFAULT ((32 * 1024) * 1024) NOT NULL,
    max_files integer DEFAULT 100000 NOT NULL,
    max_total_bytes bigint DEFAULT ((((1024)::bigint * 1024) * 1024) * 1024) NOT NULL,
    keep_checkpoints integer DEFAULT 5 NOT NULL,
    CONSTRAINT artifact_settings_chunk_size_check CHECK (((chunk_size >= 4096) AND (chunk_size <= ((256 * 1024) * 1024)))),
    CONSTRAINT artifact_settings_keep_checkpoints_check CHECK ((keep_checkpoints >= 1)),
    CONSTRAINT artifact_settings_max_files_check CHECK ((max_files >= 1)),
    CONSTRAINT artifact_settings_max_total_bytes_check CHECK ((max_total_bytes >= 0)),
    CONSTRAINT artifact_settings_singleton_check CHECK (singleton)
);


--
-- Name: artifact_verifications_id_seq; Type: SEQUENCE; Schema: tuneplane; Owner: -
--

ALTER TABLE tuneplane.artifact_verifications ALTER COLUMN id ADD GENERATED ALWAYS AS IDENTITY (
    SEQUENCE NAME tuneplane.artifact_verifications_id_seq
    START WITH 1
    INCREMENT BY 1
    NO MINVALUE
    NO MAXVALUE
    CACHE 1
);


--
-- Name: artifacts_id_seq; Type: SEQUENCE; Schema: tuneplane; Owner: -
--

ALTER TABLE tuneplane.artifacts ALTER COLUMN id ADD GENERATED ALWAYS AS IDENTITY (
    SEQUENCE NAME tuneplane.artifacts_id_seq
    START WITH 1
    INCREMENT BY 1
    NO MINVALUE
    NO MAXVALUE
    CACHE 1
);


--
-- Name: attempts_id_seq; Type: SEQUENCE; Schema: tuneplane; Owner: -
--

ALTER TABLE tuneplane.attempts ALTER COLUMN id ADD GENERATED ALWAYS AS IDENTITY (
    SEQUENCE NAME tuneplane.attempts_id_seq
    START WITH 1
    INCREMENT BY 1
    NO MINVALUE
    NO MAXVALUE
    CACHE 1
);


--
-- Name: enrollment_tokens; Type: TABLE; Schema: tuneplane; Owner: -
--

CREATE TABLE tuneplane.enrollment_tokens (
    id bigint NOT NULL,
    fleet_id bigint NOT NULL,
    token_hash text NOT NULL,
    created_at timestamp with time zone DEFAULT now() NOT NULL,
    created_by text NOT NULL,
    expires_at timestamp with time zone NOT NULL,
    used_at timestamp with time zone,
    used_by_node bigint,
    CONSTRAINT enrollment_tokens_token_hash_check CHECK ((token_hash ~ '^[0-9a-f]{64}$'::text))
);


--
-- Name: enrollment_tokens_id_seq; Type: SEQUENCE; Schema: tuneplane; Owner: -
--

ALTER TABLE tuneplane.enrollment_tokens ALTER COLUMN id ADD GENERATED ALWAYS AS IDENTITY (
    SEQUENCE NAME tuneplane.enrollment_tokens_id_seq
    START WITH 1
    INCREMENT BY 1
    NO MINVALUE
    NO MAXVALUE
    CACHE 1
);


--
-- Name: fleets_id_seq; Type: SEQUENCE; Schema: tuneplane; Owner: -
--

ALTER TABLE tuneplane.fleets ALTER COLUMN id ADD GENERATED ALWAYS AS IDENTITY (
    SEQUENCE NAME tuneplane.fleets_id_seq
    START WITH 1
    INCREMENT BY 1
    NO MINVALUE
    NO MAXVALUE
    CACHE 1
);


--
-- Name: gpu_allocations; Type: TABLE; Schema: tuneplane; Owner: -
--

CREATE TABLE tuneplane.gpu_allocations (
    member_id bigint NOT NULL,
    node_id bigint NOT NULL,
    gpu_index integer NOT NULL,
    allocated_at timestamp with time zone DEFAULT clock_timestamp() NOT NULL,
    released_at timestamp with time zone
);


--
-- Name: job_events_id_seq; Type: SEQUENCE; Schema: tuneplane; Owner: -
--

ALTER TABLE tuneplane.job_events ALTER COLUMN id ADD GENERATED ALWAYS AS IDENTITY (
    SEQUENCE NAME tuneplane.job_events_id_seq
    START WITH 1
    INCREMENT BY 1
    NO MINVALUE
    NO MAXVALUE
    CACHE 1
);


--
-- Name: jobs_id_seq; Type: SEQUENCE; Schema: tuneplane; Owner: -
--

ALTER TABLE tuneplane.jobs ALTER COLUMN id ADD GENERATED BY DEFAULT AS IDENTITY (
    SEQUENCE NAME tuneplane.jobs_id_seq
    START WITH 1
    INCREMENT BY 1
    NO MINVALUE
    NO MAXVALUE
    CACHE 1
);


--
-- Name: launch_decisions; Type: TABLE; Schema: tuneplane; Owner: -
--

CREATE TABLE tuneplane.launch_decisions (
    attempt_id bigint NOT NULL,
    decision text NOT NULL,
    reason text NOT NULL,
    decided_at timestamp with time zone DEFAULT clock_timestamp() NOT NULL,
    CONSTRAINT launch_decisions_decision_check CHECK ((decision = ANY (ARRAY['commit'::text, 'abort'::text])))
);


--
-- Name: launch_settings; Type: TABLE; Schema: tuneplane; Owner: -
--

CREATE TABLE tuneplane.launch_settings (
    singleton boolean DEFAULT true NOT NULL,
    prepare_timeout interval DEFAULT '00:15:00'::interval NOT NULL,
    stop_grace interval DEFAULT '00:00:10'::interval NOT NULL,
    rendezvous_port_base integer DEFAULT 29500 NOT NULL,
    rendezvous_port_span integer DEFAULT 2000 NOT NULL,
    start_timeout interval DEFAULT '00:05:00'::interval NOT NULL,
    stop_timeout interval DEFAULT '00:01:00'::interval NOT NULL,
    free_relaunches integer DEFAULT 2 NOT NULL,
    CONSTRAINT launch_settings_free_relaunches_check CHECK (((free_relaunches >= 0) AND (free_relaunches <= 20))),
    CONSTRAINT launch_settings_prepare_timeout_check CHECK ((prepare_timeout > '00:00:00'::interval)),
    CONSTRAINT launch_settings_singleton_check CHECK (singleton),
    CONSTRAINT launch_settings_start_timeout_check CHECK ((start_timeout > '00:00:00'::interval)),
    CONSTRAINT launch_settings_stop_grace_check CHECK ((stop_grace >= '00:00:00'::interval)),
    CONSTRAINT launch_settings_stop_timeout_check CHECK ((stop_timeout > '00:00:00'::interval))
);


--
-- Name: member_log_chunks; Type: TABLE; Schema: tuneplane; Owner: -
--

CREATE TABLE tuneplane.member_log_chunks (
    member_id bigint NOT NULL,
    stream text NOT NULL,
    start_offset bigint NOT NULL,
    end_offset bigint NOT NULL,
    text text NOT NULL,
    received_at timestamp with time zone DEFAULT clock_timestamp() NOT NULL,
    CONSTRAINT member_log_chunks_check CHECK ((end_offset > start_offset)),
    CONSTRAINT member_log_chunks_start_offset_check CHECK ((start_offset >= 0))
);


--
-- Name: member_log_settings; Type: TABLE; Schema: tuneplane; Owner: -
--

CREATE TABLE tuneplane.member_log_settings (
    singleton boolean DEFAULT true NOT NULL,
    max_chunk_bytes integer DEFAULT 65536 NOT NULL,
    max_stream_bytes bigint DEFAULT 67108864 NOT NULL,
    max_read_bytes integer DEFAULT 1048576 NOT NULL,
    CONSTRAINT member_log_settings_max_chunk_bytes_check CHECK (((max_chunk_bytes >= 1024) AND (max_chunk_bytes <= 1048576))),
    CONSTRAINT member_log_settings_max_read_bytes_check CHECK ((max_read_bytes >= 1024)),
    CONSTRAINT member_log_settings_max_stream_bytes_check CHECK ((max_stream_bytes >= 0)),
    CONSTRAINT member_log_settings_singleton_check CHECK (singleton)
);


--
-- Name: member_log_streams; Type: TABLE; Schema: tuneplane; Owner: -
--

CREATE TABLE tuneplane.member_log_streams (
    member_id bigint NOT NULL,
    stream text NOT NULL,
    next_offset bigint DEFAULT 0 NOT NULL,
    stored_bytes bigint DEFAULT 0 NOT NULL,
    dropped_bytes bigint DEFAULT 0 NOT NULL,
    chunks integer DEFAULT 0 NOT NULL,
    updated_at timestamp with time zone DEFAULT clock_timestamp() NOT NULL,
    CONSTRAINT member_log_streams_chunks_check CHECK ((chunks >= 0)),
    CONSTRAINT member_log_streams_dropped_bytes_check CHECK ((dropped_bytes >= 0)),
    CONSTRAINT member_log_streams_next_offset_check CHECK ((next_offset >= 0)),
    CONSTRAINT member_log_streams_stored_bytes_check CHECK ((stored_bytes >= 0)),
    CONSTRAINT member_log_streams_stream_check CHECK ((stream = ANY (ARRAY['stdout'::text, 'stderr'::text])))
);


--
-- Name: members_id_seq; Type: SEQUENCE; Schema: tuneplane; Owner: -
--

ALTER TABLE tuneplane.members ALTER COLUMN id ADD GENERATED ALWAYS AS IDENTITY (
    SEQUENCE NAME tuneplane.members_id_seq
    START WITH 1
    INCREMENT BY 1
    NO MINVALUE
    NO MAXVALUE
    CACHE 1
);


--
-- Name: node_commands_id_seq; Type: SEQUENCE; Schema: tuneplane; Owner: -
--

ALTER TABLE tuneplane.node_commands ALTER COLUMN id ADD GENERATED ALWAYS AS IDENTITY (
    SEQUENCE NAME tuneplane.node_commands_id_seq
    START WITH 1
    INCREMENT BY 1
    NO MINVALUE
    NO MAXVALUE
    CACHE 1
);


--
-- Name: node_credentials; Type: TABLE; Schema: tuneplane; Owner: -
--

CREATE TABLE tuneplane.node_credentials (
    id bigint NOT NULL,
    node_id bigint NOT NULL,
    credential_hash text NOT NULL,
    issued_at timestamp with time zone DEFAULT now() NOT NULL,
    first_used_at timestamp with time zone,
    superseded_at timestamp with time zone,
    grace_until timestamp with time zone,
    revoked_at timestamp with time zone,
    revoked_reason text,
    CONSTRAINT node_credentials_credential_hash_check CHECK ((credential_hash ~ '^[0-9a-f]{64}$'::text))
);


--
-- Name: node_credentials_id_seq; Type: SEQUENCE; Schema: tuneplane; Owner: -
--

ALTER TABLE tuneplane.node_credentials ALTER COLUMN id ADD GENERATED ALWAYS AS IDENTITY (
    SEQUENCE NAME tuneplane.node_credentials_id_seq
    START WITH 1
    INCREMENT BY 1
    NO MINVALUE
    NO MAXVALUE
    CACHE 1
);


--
-- Name: node_events; Type: TABLE; Schema: tuneplane; Owner: -
--

CREATE TABLE tuneplane.node_events (
    id bigint NOT NULL,
    at timestamp with time zone DEFAULT clock_timestamp() NOT NULL,
    fleet_id bigint,
    node_id bigint,
    kind text NOT NULL,
    actor text NOT NULL,
    reason text DEFAULT ''::text NOT NULL,
    details jsonb DEFAULT '{}'::jsonb NOT NULL
);


--
-- Name: node_events_id_seq; Type: SEQUENCE; Schema: tuneplane; Owner: -
--

ALTER TABLE tuneplane.node_events ALTER COLUMN id ADD GENERATED ALWAYS AS IDENTITY (
    SEQUENCE NAME tuneplane.node_events_id_seq
    START WITH 1
    INCREMENT BY 1
    NO MINVALUE
    NO MAXVALUE
    CACHE 1
);


--
-- Name: node_gpus; Type: TABLE; Schema: tuneplane; Owner: -
--

CREATE TABLE tuneplane.node_gpus (
    node_id bigint NOT NULL,
    gpu_index integer NOT NULL,
    model text NOT NULL,
    memory_bytes bigint DEFAULT 0 NOT NULL,
    simulated boolean DEFAULT false NOT NULL,
    CONSTRAINT node_gpus_gpu_index_check CHECK ((gpu_index >= 0))
);


--
-- Name: node_usage; Type: TABLE; Schema: tuneplane; Owner: -
--

CREATE TABLE tuneplane.node_usage (
    node_id bigint NOT NULL,
    fleet_id bigint NOT NULL,
    total_gpus integer DEFAULT 0 NOT NULL,
    used_gpus integer DEFAULT 0 NOT NULL,
    used_cpus integer DEFAULT 0 NOT NULL,
    used_memory bigint DEFAULT 0 NOT NULL,
    free_gpus integer GENERATED ALWAYS AS ((total_gpus - used_gpus)) STORED,
    CONSTRAINT node_usage_total_gpus_check CHECK ((total_gpus >= 0)),
    CONSTRAINT node_usage_used_cpus_check CHECK ((used_cpus >= 0)),
    CONSTRAINT node_usage_used_gpus_check CHECK ((used_gpus >= 0)),
    CONSTRAINT node_usage_used_memory_check CHECK ((used_memory >= 0))
);


--
-- Name: nodes_id_seq; Type: SEQUENCE; Schema: tuneplane; Owner: -
--

ALTER TABLE tuneplane.nodes ALTER COLUMN id ADD GENERATED ALWAYS AS IDENTITY (
    SEQUENCE NAME tuneplane.nodes_id_seq
    START WITH 1
    INCREMENT BY 1
    NO MINVALUE
    NO MAXVALUE
    CACHE 1
);


--
-- Name: schema_components; Type: TABLE; Schema: tuneplane; Owner: -
--

CREATE TABLE tuneplane.schema_components (
    name text NOT NULL,
    version text NOT NULL,
    checksum text NOT NULL,
    applied_at timestamp with time zone DEFAULT now() NOT NULL
);


--
-- Name: schema_migrations; Type: TABLE; Schema: tuneplane; Owner: -
--

CREATE TABLE tuneplane.schema_migrations (
    version integer NOT NULL,
    name text NOT NULL,
    checksum text NOT NULL,
    applied_at timestamp with time zone DEFAULT now() NOT NULL
);


--
-- Name: schema_repeatables; Type: TABLE; Schema: tuneplane; Owner: -
--

CREATE TABLE tuneplane.schema_repeatables (
    name text NOT NULL,
    checksum text NOT NULL,
    applied_at timestamp with time zone DEFAULT now() NOT NULL
);


--
-- Name: server_secrets; Type: TABLE; Schema: tuneplane; Owner: -
--

CREATE TABLE tuneplane.server_secrets (
    name text NOT NULL,
    value text NOT NULL,
    created_at timestamp with time zone DEFAULT now() NOT NULL
);


--
-- Name: slurm_fleets; Type: TABLE; Schema: tuneplane; Owner: -
--

CREATE TABLE tuneplane.slurm_fleets (
    fleet_id bigint NOT NULL,
    slurm_conf text,
    partition text NOT NULL,
    account text,
    qos text,
    version text,
    reachable boolean DEFAULT false NOT NULL,
    last_error text,
    checked_at timestamp with time zone,
    reached_at timestamp with time zone,
    max_nodes integer,
    max_time_minutes integer,
    CONSTRAINT slurm_fleets_account_check CHECK ((account ~ '^[A-Za-z0-9_.-]{1,64}$'::text)),
    CONSTRAINT slurm_fleets_partition_check CHECK ((partition ~ '^[A-Za-z0-9_.-]{1,64}$'::text)),
    CONSTRAINT slurm_fleets_qos_check CHECK ((qos ~ '^[A-Za-z0-9_.-]{1,64}$'::text))
);


--
-- Name: slurm_jobs; Type: TABLE; Schema: tuneplane; Owner: -
--

CREATE TABLE tuneplane.slurm_jobs (
    attempt_id bigint NOT NULL,
    job_id bigint NOT NULL,
    fleet_id bigint NOT NULL,
    slurm_job_id bigint,
    slurm_state text,
    slurm_reason text,
    jobs_ahead integer,
    node_list text[],
    submitted_at timestamp with time zone,
    started_at timestamp with time zone,
    scancel_at timestamp with time zone,
    gone_at timestamp with time zone,
    created_at timestamp with time zone DEFAULT now() NOT NULL
);


--
-- Name: slurm_nodes; Type: TABLE; Schema: tuneplane; Owner: -
--

CREATE TABLE tuneplane.slurm_nodes (
    node_id bigint NOT NULL,
    slurm_state text NOT NULL,
    reason text,
    updated_at timestamp with time zone DEFAULT now() NOT NULL
);


--
-- Name: source_archive_uploads; Type: TABLE; Schema: tuneplane; Owner: -
--

CREATE TABLE tuneplane.source_archive_uploads (
    sha256 text NOT NULL,
    user_id bigint NOT NULL,
    first_uploaded_at timestamp with time zone DEFAULT now() NOT NULL
);


--
-- Name: state_transitions; Type: TABLE; Schema: tuneplane; Owner: -
--

CREATE TABLE tuneplane.state_transitions (
    entity text NOT NULL,
    from_state text NOT NULL,
    to_state text NOT NULL,
    writers text[] NOT NULL,
    CONSTRAINT state_transitions_entity_check CHECK ((entity = ANY (ARRAY['job'::text, 'attempt'::text, 'member'::text])))
);


--
-- Name: telemetry_batches; Type: TABLE; Schema: tuneplane; Owner: -
--

CREATE TABLE tuneplane.telemetry_batches (
    collector_id text NOT NULL,
    seq bigint NOT NULL,
    token_id bigint NOT NULL,
    digest text NOT NULL,
    points integer NOT NULL,
    received_at timestamp with time zone DEFAULT now() NOT NULL,
    job_id bigint NOT NULL,
    attempt integer NOT NULL,
    member_rank integer NOT NULL
);


--
-- Name: telemetry_canonical_rules; Type: TABLE; Schema: tuneplane; Owner: -
--

CREATE TABLE tuneplane.telemetry_canonical_rules (
    priority integer NOT NULL,
    pattern text NOT NULL,
    canonical text NOT NULL,
    CONSTRAINT telemetry_canonical_rules_canonical_check CHECK ((canonical = ANY (ARRAY['loss'::text, 'eval_loss'::text, 'learning_rate'::text, 'throughput'::text, 'grad_norm'::text, 'gpu_utilization'::text, 'gpu_memory'::text, 'gpu_power'::text, 'cpu_utilization'::text, 'memory_rss'::text])))
);


--
-- Name: telemetry_collectors; Type: TABLE; Schema: tuneplane; Owner: -
--

CREATE TABLE tuneplane.telemetry_collectors (
    collector_id text NOT NULL,
    job_id bigint NOT NULL,
    attempt integer NOT NULL,
    member_rank integer NOT NULL,
    batches bigint DEFAULT 0 NOT NULL,
    points bigint DEFAULT 0 NOT NULL,
    duplicates bigint DEFAULT 0 NOT NULL,
    health jsonb DEFAULT '{}'::jsonb NOT NULL,
    first_seen_at timestamp with time zone DEFAULT now() NOT NULL,
    last_batch_at timestamp with time zone
);


--
-- Name: telemetry_damage; Type: TABLE; Schema: tuneplane; Owner: -
--

CREATE TABLE tuneplane.telemetry_damage (
    id bigint NOT NULL,
    job_id bigint NOT NULL,
    attempt integer NOT NULL,
    member_rank integer NOT NULL,
    source text NOT NULL,
    file text NOT NULL,
    file_offset bigint NOT NULL,
    bytes bigint NOT NULL,
    reason text NOT NULL,
    recorded_at timestamp with time zone DEFAULT now() NOT NULL,
    CONSTRAINT telemetry_damage_bytes_check CHECK ((bytes > 0)),
    CONSTRAINT telemetry_damage_file_offset_check CHECK ((file_offset >= 0))
);


--
-- Name: telemetry_damage_id_seq; Type: SEQUENCE; Schema: tuneplane; Owner: -
--

ALTER TABLE tuneplane.telemetry_damage ALTER COLUMN id ADD GENERATED ALWAYS AS IDENTITY (
    SEQUENCE NAME tuneplane.telemetry_damage_id_seq
    START WITH 1
    INCREMENT BY 1
    NO MINVALUE
    NO MAXVALUE
    CACHE 1
);


--
-- Name: telemetry_members; Type: TABLE; Schema: tuneplane; Owner: -
--

CREATE TABLE tuneplane.telemetry_members (
    job_id bigint NOT NULL,
    attempt integer NOT NULL,
    member_rank integer NOT NULL,
    state text DEFAULT 'collecting'::text NOT NULL,
    reason text DEFAULT ''::text NOT NULL,
    series integer DEFAULT 0 NOT NULL,
    refused_points bigint DEFAULT 0 NOT NULL,
    damaged_regions bigint DEFAULT 0 NOT NULL,
    member_ended_at timestamp with time zone,
    finished_at timestamp with time zone,
    updated_at timestamp with time zone DEFAULT now() NOT NULL,
    CONSTRAINT telemetry_members_state_check CHECK ((state = ANY (ARRAY['collecting'::text, 'complete'::text, 'incomplete'::text])))
);


--
-- Name: telemetry_points; Type: TABLE; Schema: tuneplane; Owner: -
--

CREATE TABLE tuneplane.telemetry_points (
    series_id bigint NOT NULL,
    step bigint NOT NULL,
    value double precision NOT NULL,
    wall_time double precision NOT NULL
);


--
-- Name: telemetry_refusals; Type: TABLE; Schema: tuneplane; Owner: -
--

CREATE TABLE tuneplane.telemetry_refusals (
    job_id bigint NOT NULL,
    attempt integer NOT NULL,
    member_rank integer NOT NULL,
    source text NOT NULL,
    name text NOT NULL,
    reason text NOT NULL,
    count bigint NOT NULL,
    first_at timestamp with time zone DEFAULT now() NOT NULL,
    last_at timestamp with time zone DEFAULT now() NOT NULL,
    CONSTRAINT telemetry_refusals_count_check CHECK ((count > 0))
);


--
-- Name: telemetry_rollups; Type: TABLE; Schema: tuneplane; Owner: -
--

CREATE TABLE tuneplane.telemetry_rollups (
    series_id bigint NOT NULL,
    width integer NOT NULL,
    bucket bigint NOT NULL,
    n bigint NOT NULL,
    sum double precision NOT NULL,
    min double precision,
    max double precision,
    first_step bigint NOT NULL,
    last_step bigint NOT NULL,
    last_value double precision NOT NULL,
    last_wall double precision
);


--
-- Name: telemetry_series_id_seq; Type: SEQUENCE; Schema: tuneplane; Owner: -
--

ALTER TABLE tuneplane.telemetry_series ALTER COLUMN id ADD GENERATED ALWAYS AS IDENTITY (
    SEQUENCE NAME tuneplane.telemetry_series_id_seq
    START WITH 1
    INCREMENT BY 1
    NO MINVALUE
    NO MAXVALUE
    CACHE 1
);


--
-- Name: telemetry_tokens_id_seq; Type: SEQUENCE; Schema: tuneplane; Owner: -
--

ALTER TABLE tuneplane.telemetry_tokens ALTER COLUMN id ADD GENERATED ALWAYS AS IDENTITY (
    SEQUENCE NAME tuneplane.telemetry_tokens_id_seq
    START WITH 1
    INCREMENT BY 1
    NO MINVALUE
    NO MAXVALUE
    CACHE 1
);


--
-- Name: users_id_seq; Type: SEQUENCE; Schema: tuneplane; Owner: -
--

ALTER TABLE tuneplane.users ALTER COLUMN id ADD GENERATED ALWAYS AS IDENTITY (
    SEQUENCE NAME tuneplane.users_id_seq
    START WITH 1
    INCREMENT BY 1
    NO MINVALUE
    NO MAXVALUE
    CACHE 1
);


--
-- Name: v_artifacts; Type: VIEW; Schema: tuneplane; Owner: -
--

CREATE VIEW tuneplane.v_artifacts AS
 SELECT a.id,
    a.job_id,
    at.number AS attempt,
    a.rank,
    a.name,
    a.kind,
    a.state,
    a.reason,
    a.delivery,
    a.shared_path,
    a.manifest_digest,
    a.file_count,
    a.total_bytes,
    ( SELECT count(*) AS count
           FROM tuneplane.artifact_files f
          WHERE ((f.artifact_id = a.id) AND (f.verified_at IS NOT NULL))) AS files_verified,
    ( SELECT count(*) AS count
           FROM tuneplane.artifact_chunks c
          WHERE (c.artifact_id = a.id)) AS chunks_held,
    a.created_at,
    a.updated_at,
    a.completed_at
   FROM (tuneplane.artifacts a
     JOIN tuneplane.attempts at ON ((at.id = a.attempt_id)));


--
-- Name: v_fleet; Type: VIEW; Schema: tuneplane; Owner: -
--

CREATE VIEW tuneplane.v_fleet AS
SELECT
    NULL::bigint AS fleet_id,
    NULL::text AS fleet,
    NULL::text AS backend,
    NULL::jsonb AS capabilities,
    NULL::integer AS nodes,
    NULL::integer AS connected,
    NULL::integer AS stale,
    NULL::integer AS lost,
    NULL::integer AS active,
    NULL::integer AS cordoned,
    NULL::integer AS draining,
    NULL::integer AS retired,
    NULL::integer AS gpus,
    NULL::integer AS simulated_gpus,
    NULL::integer AS schedulable_gpus,
    NULL::integer AS allocated_gpus,
    NULL::integer AS cpus,
    NULL::bigint AS memory_bytes,
    NULL::timestamp with time zone AS created_at,
    NULL::integer AS fenced;


--
-- Name: v_launches; Type: VIEW; Schema: tuneplane; Owner: -
--

CREATE VIEW tuneplane.v_launches AS
 SELECT a.job_id,
    a.number AS attempt,
    a.id AS attempt_id,
    a.state,
    a.reason,
    a.launch_owner,
    a.launch_epoch,
    a.capsule_digest,
    d.decision,
    d.reason AS decision_reason,
    a.prepare_deadline,
    a.created_at,
    a.committed_at,
    a.running_at
   FROM (tuneplane.attempts a
     LEFT JOIN tuneplane.launch_decisions d ON ((d.attempt_id = a.id)))
  WHERE (a.state = ANY (ARRAY['reserved'::text, 'preparing'::text, 'running'::text, 'stopping'::text]));


--
-- Name: v_node_commands_pending; Type: VIEW; Schema: tuneplane; Owner: -
--

CREATE VIEW tuneplane.v_node_commands_pending AS
 SELECT c.id,
    f.name AS fleet,
    n.name AS node,
    c.node_id,
    c.kind,
    c.created_at,
    c.created_by,
    c.delivery_count,
    c.delivered_at,
    c.claimed_epoch,
    n.session_epoch,
    round(EXTRACT(epoch FROM (now() - c.created_at)), 1) AS age_s
   FROM ((tuneplane.node_commands c
     JOIN tuneplane.nodes n ON ((n.id = c.node_id)))
     JOIN tuneplane.fleets f ON ((f.id = n.fleet_id)))
  WHERE (c.acked_at IS NULL);


--
-- Name: v_node_events; Type: VIEW; Schema: tuneplane; Owner: -
--

CREATE VIEW tuneplane.v_node_events AS
 SELECT e.id,
    e.at,
    f.name AS fleet,
    n.name AS node,
    e.node_id,
    e.kind,
    e.actor,
    e.reason,
    e.details
   FROM ((tuneplane.node_events e
     LEFT JOIN tuneplane.fleets f ON ((f.id = e.fleet_id)))
     LEFT JOIN tuneplane.nodes n ON ((n.id = e.node_id)));


--
-- Name: v_nodes; Type: VIEW; Schema: tuneplane; Owner: -
--

CREATE VIEW tuneplane.v_nodes AS
 SELECT f.name AS fleet,
    n.id AS node_id,
    n.name AS node,
    n.scheduling_state,
    tuneplane.node_connectivity(n.last_heartbeat_at) AS connectivity,
    round(EXTRACT(epoch FROM (now() - n.last_heartbeat_at)), 1) AS heartbeat_age_s,
    n.last_heartbeat_at,
    n.cpus,
    n.memory_bytes,
    COALESCE(g.gpus, 0) AS gpus,
    COALESCE(g.models, ''::text) AS gpu_models,
    COALESCE(g.gpu_memory_bytes, (0)::bigint) AS gpu_memory_bytes,
    COALESCE(g.simulated, 0) AS simulated_gpus,
    a.gpus AS allocated_gpus,
    a.cpus AS allocated_cpus,
    a.memory_bytes AS allocated_memory_bytes,
    n.agent_version,
    n.container_runtimes,
    n.hostname,
    n.address,
    jsonb_array_length(n.reported_running) AS running,
    n.session_epoch,
    ((n.session_closed_at IS NULL) AND (n.session_opened_at IS NOT NULL)) AS session_open,
    n.enrolled_at,
    n.fleet_id,
    n.fenced_at,
    n.fenced_reason,
    n.last_peer_check,
    n.last_storage_check,
    n.caches,
    n.caches_reported_at
   FROM (((tuneplane.nodes n
     JOIN tuneplane.fleets f ON ((f.id = n.fleet_id)))
     LEFT JOIN LATERAL ( SELECT (count(*))::integer AS gpus,
            string_agg(DISTINCT (gg.model ||
                CASE
                    WHEN gg.simulated THEN ' (simulated)'::text
                    ELSE ''::text
                END), ', '::text) AS models,
            (sum(gg.memory_bytes))::bigint AS gpu_memory_bytes,
            (count(*) FILTER (WHERE gg.simulated))::integer AS simulated
           FROM tuneplane.node_gpus gg
          WHERE (gg.node_id = n.id)) g ON (true))
     CROSS JOIN LATERAL tuneplane.node_allocation(n.id) a(gpus, cpus, memory_bytes));


--
-- Name: v_queue; Type: VIEW; Schema: tuneplane; Owner: -
--

CREATE VIEW tuneplane.v_queue AS
 SELECT j.id AS job_id,
    f.name AS fleet,
    j.priority,
    row_number() OVER (PARTITION BY j.fleet_id ORDER BY j.priority DESC, j.created_at, j.id) AS "position",
    u.username AS owner,
    j.nodes,
    j.gpus_per_node,
    j.cpus_per_node,
    j.memory_per_node,
    j.created_at,
    (now() - j.created_at) AS waiting,
    j.state_reason
   FROM ((tuneplane.jobs j
     JOIN tuneplane.fleets f ON ((f.id = j.fleet_id)))
     JOIN tuneplane.users u ON ((u.id = j.owner_id)))
  WHERE (j.state = 'queued'::text);


--
-- Name: v_reservations; Type: VIEW; Schema: tuneplane; Owner: -
--

CREATE VIEW tuneplane.v_reservations AS
 SELECT m.job_id,
    a.number AS attempt,
    a.state AS attempt_state,
    m.id AS member_id,
    m.rank,
    n.name AS node,
    m.gpu_indices,
    m.cpus,
    m.memory_bytes,
    m.state AS member_state,
    m.reason,
    tuneplane.node_connectivity(n.last_heartbeat_at) AS node_connectivity,
    a.created_at AS reserved_at
   FROM ((tuneplane.members m
     JOIN tuneplane.attempts a ON ((a.id = m.attempt_id)))
     JOIN tuneplane.nodes n ON ((n.id = m.node_id)))
  WHERE (m.released_at IS NULL);


--
-- Name: v_telemetry_collectors; Type: VIEW; Schema: tuneplane; Owner: -
--

CREATE VIEW tuneplane.v_telemetry_collectors AS
 SELECT collector_id,
    job_id,
    attempt,
    member_rank,
    batches,
    points,
    duplicates,
    last_batch_at,
    (now() - last_batch_at) AS silent_for,
    health
   FROM tuneplane.telemetry_collectors c;


--
-- Name: v_telemetry_series; Type: VIEW; Schema: tuneplane; Owner: -
--

CREATE VIEW tuneplane.v_telemetry_series AS
 SELECT id,
    job_id,
    attempt,
    member_rank,
    source,
    name,
    canonical,
    point_count,
    min_step,
    max_step,
    last_value,
    last_at
   FROM tuneplane.telemetry_series s;


--
-- Name: v_uncertain; Type: VIEW; Schema: tuneplane; Owner: -
--

CREATE VIEW tuneplane.v_uncertain AS
 SELECT m.job_id,
    a.number AS attempt,
    m.id AS member_id,
    m.rank,
    n.name AS node,
    m.state,
    m.reason,
    n.last_heartbeat_at,
    tuneplane.node_connectivity(n.last_heartbeat_at) AS connectivity,
    m.gpu_indices,
    m.updated_at,
    m.contact_lost_at
   FROM ((tuneplane.members m
     JOIN tuneplane.attempts a ON ((a.id = m.attempt_id)))
     JOIN tuneplane.nodes n ON ((n.id = m.node_id)))
  WHERE ((m.contact_lost_at IS NOT NULL) AND (m.released_at IS NULL));


--
-- Name: pgqueuer id; Type: DEFAULT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.pgqueuer ALTER COLUMN id SET DEFAULT nextval('public.pgqueuer_id_seq'::regclass);


--
-- Name: pgqueuer_schedules id; Type: DEFAULT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.pgqueuer_schedules ALTER COLUMN id SET DEFAULT nextval('public.pgqueuer_schedules_id_seq'::regclass);


--
-- Name: pgqueuer_statistics id; Type: DEFAULT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.pgqueuer_statistics ALTER COLUMN id SET DEFAULT nextval('public.pgqueuer_statistics_id_seq'::regclass);


--
-- Data for Name: pgqueuer; Type: TABLE DATA; Schema: public; Owner: -
--

COPY public.pgqueuer (id, priority, queue_manager_id, created, updated, heartbeat, execute_after, status, entrypoint, dedupe_key, payload, headers, attempts, slot) FROM stdin;
1	0	\N	2026-12-03 19:29:34.82629+00	2026-12-03 19:29:34.82629+00	2026-12-03 19:29:34.82629+00	2026-12-03 19:29:34.82629+00	queued	launch	launch:1	\\x7b22617474656d70745f6964223a20317d	\N	0	\N
\.


--
-- Data for Name: pgqueuer_log; Type: TABLE DATA; Schema: public; Owner: -
--

COPY public.pgqueuer_log (id, created, job_id, status, priority, entrypoint, traceback, aggregated) FROM stdin;
\.


--
-- Data for Name: pgqueuer_schedules; Type: TABLE DATA; Schema: public; Owner: -
--

COPY public.pgqueuer_schedules (id, expression, entrypoint, heartbeat, created, updated, next_run, last_run, status) FROM stdin;
\.


--
-- Data for Name: pgqueuer_statistics; Type: TABLE DATA; Schema: public; Owner: -
--

COPY public.pgqueuer_statistics (id, created, count, priority, status, entrypoint) FROM stdin;
\.


--
-- Data for Name: api_tokens; Type: TABLE DATA; Schema: tuneplane; Owner: -
--

COPY tuneplane.api_tokens (id, user_id, name, token_hash, scopes, created_at, expires_at, revoked_at, last_used_at) FROM stdin;
1	1	alice cli	43bf2e9a8b046473438c62ef95e6eab6e9444bc82c494f729388636e44eee3f6	{api}	2026-12-03 19:29:34.534055+00	\N	\N	\N
2	2	bob cli	e186e5959e0f90455e98db26e52248dd28f6c9a63f1704055b6718793e90a031	{api}	2026-12-03 19:29:34.566523+00	\N	\N	\N
3	3	root cli	4cfa81e512b69ecfd1018b567b878d1b021ac875112050198017c7f0d5e002a0	{api}	2026-12-03 19:29:34.616736+00	\N	\N	\N
\.


--
-- Data for Name: artifact_chunks; Type: TABLE DATA; Schema: tuneplane; Owner: -
--

COPY tuneplane.artifact_chunks (artifact_id, file_index, chunk_index, size, sha256, recorded_at, crc32c) FROM stdin;
\.


--
-- Data for Name: artifact_files; Type: TABLE DATA; Schema: tuneplane; Owner: -
--

COPY tuneplane.artifact_files (artifact_id, file_index, path, size, sha256, verified_at) FROM stdin;
1	0	config.json	2	44136fa355b3678a1146ad16f7e8649e94fb4fc21fe77e8310c060f61caaff8a	2026-12-03 19:29:35.09336+00
1	1	model.bin	700	a82087423a13cb9d32812403246e56861ec29245d76c8c90a455255bf91dff17	2026-12-03 19:29:35.117658+00
\.


--
-- Data for Name: artifact_settings; Type: TABLE DATA; Schema: tuneplane; Owner: -
--

COPY tuneplane.artifact_settings (singleton, chunk_size, max_files, max_total_bytes, keep_checkpoints) FROM stdin;
t	33554432	100000	1099511627776	5
\.


--
-- Data for Name: artifact_verifications; Type: TABLE DATA; Schema: tuneplane; Owner: -
--

COPY tuneplane.artifact_verifications (id, artifact_id, at, ok, checked, problems, requested_by) FROM stdin;
\.


--
-- Data for Name: artifacts; Type: TABLE DATA; Schema: tuneplane; Owner: -
--

COPY tuneplane.artifacts (id, job_id, attempt_id, member_id, rank, name, kind, state, reason, delivery, shared_path, manifest, manifest_digest, file_count, total_bytes, chunk_size, registered_by, created_at, updated_at, completed_at, pruned_at) FROM stdin;
1	1	1	1	0	model	output	complete	server verified 2 files (702 bytes) against manifest 3d5dc9c1174e5ce4	object	\N	{"files": [{"path": "config.json", "size": 2, "sha256": "44136fa355b3678a1146ad16f7e8649e94fb4fc21fe77e8310c060f61caaff8a"}, {"path": "model.bin", "size": 700, "sha256": "a82087423a13cb9d32812403246e56861ec29245d76c8c90a455255bf91dff17"}], "version": 1}	3d5dc9c1174e5ce4011ea7c8325ec15d401a0912556bde91b48d24ff1858e0c7	2	702	33554432	node:1	2026-12-03 19:29:35.063477+00	2026-12-03 19:29:35.117658+00	2026-12-03 19:29:35.117658+00	\N
\.


--
-- Data for Name: attempts; Type: TABLE DATA; Schema: tuneplane; Owner: -
--

COPY tuneplane.attempts (id, job_id, number, fleet_id, state, reason, launch_epoch, launch_owner, capsule_digest, master_addr, master_port, prepare_deadline, cancel_requested_at, created_at, committed_at, running_at, ended_at) FROM stdin;
1	1	1	1	running	committed	1	test-worker	0000000000000000000000000000000000000000000000000000000000000000	127.0.0.1	29532	2026-12-03 19:44:34.929485+00	\N	2026-12-03 19:29:34.82629+00	2026-12-03 19:29:34.968304+00	2026-12-03 19:29:34.997999+00	\N
\.


--
-- Data for Name: confirmations; Type: TABLE DATA; Schema: tuneplane; Owner: -
--

COPY tuneplane.confirmations (owner_id, retry_key, preview_id, digest, job_id, created_at) FROM stdin;
\.


--
-- Data for Name: enrollment_tokens; Type: TABLE DATA; Schema: tuneplane; Owner: -
--

COPY tuneplane.enrollment_tokens (id, fleet_id, token_hash, created_at, created_by, expires_at, used_at, used_by_node) FROM stdin;
\.


--
-- Data for Name: fleets; Type: TABLE DATA; Schema: tuneplane; Owner: -
--

COPY tuneplane.fleets (id, name, backend, capabilities, created_at, created_by) FROM stdin;
1	gpu	node	{"object_delivery": true}	2026-12-03 19:29:34.676618+00	\N
\.


--
-- Data for Name: gpu_allocations; Type: TABLE DATA; Schema: tuneplane; Owner: -
--

COPY tuneplane.gpu_allocations (member_id, node_id, gpu_index, allocated_at, released_at) FROM stdin;
1	1	0	2026-12-03 19:29:34.856938+00	\N
\.


--
-- Data for Name: job_events; Type: TABLE DATA; Schema: tuneplane; Owner: -
--

COPY tuneplane.job_events (id, job_id, at, from_state, to_state, reason, detail) FROM stdin;
1	1	2026-12-03 19:29:34.804181+00	\N	queued	queued	{}
2	1	2026-12-03 19:29:34.869532+00	queued	reserved	reserved 1 node × 1 GPU, 1 CPU, 0 bytes memory on gpu-node (attempt 1); waiting for a worker to prepare it	{"nodes": [1], "attempt": 1}
3	1	2026-12-03 19:29:34.945884+00	reserved	preparing	attempt 1: preparing 1 member(s); commit once every member is prepared (deadline 2026-12-03 19:44:34 UTC)	{}
4	1	2026-12-03 19:29:34.978256+00	preparing	running	attempt 1: commit recorded; starting 1 member(s)	{}
5	1	2026-12-03 19:29:34.998623+00	running	running	attempt 1: all 1 member(s) running	{}
6	2	2026-12-03 19:29:35.127663+00	\N	queued	queued	{}
7	3	2026-12-03 19:29:35.146674+00	\N	queued	queued	{}
8	3	2026-12-03 19:29:35.168786+00	queued	cancelled	cancel requested by bob: changed my mind	{}
9	4	2026-12-03 19:29:35.193812+00	\N	queued	queued	{}
10	2	2026-12-03 19:29:35.217041+00	queued	queued	waiting for resources: needs 1 node × 2 GPUs, 1 CPU, 0 bytes memory; at the head of the queue, waiting for capacity to free up	{}
11	4	2026-12-03 19:29:35.219221+00	queued	queued	waiting for resources: needs 2 nodes × 1 GPU, 1 CPU, 0 bytes memory; behind job 2 at the head of the queue	{}
\.


--
-- Data for Name: jobs; Type: TABLE DATA; Schema: tuneplane; Owner: -
--

COPY tuneplane.jobs (id, owner_id, preview_id, fleet_id, state, state_reason, priority, nodes, gpus_per_node, cpus_per_node, memory_per_node, max_attempts, spec, created_at, updated_at, free_relaunches_used) FROM stdin;
1	1	2e17c542-7515-4fe0-97de-d63a1684e62f	1	running	attempt 1: all 1 member(s) running	0	1	1	1	0	1	{"nodes": 1, "nonce": "40b113d8-0ee4-43f6-96cf-2da1cb560437", "gpus_per_node": 1}	2026-12-03 19:29:34.801789+00	2026-12-03 19:29:34.994946+00	0
3	2	8522e474-800e-4f99-aaa4-b7a3a3edee60	1	cancelled	cancel requested by bob: changed my mind	0	1	1	1	0	1	{"nodes": 1, "nonce": "f27a6bdc-61f2-4246-aedf-130fbc12f520", "gpus_per_node": 1}	2026-12-03 19:29:35.144656+00	2026-12-03 19:29:35.167344+00	0
2	1	c18e3473-7de6-4c8e-a007-a9fec0ee407f	1	queued	waiting for resources: needs 1 node × 2 GPUs, 1 CPU, 0 bytes memory; at the head of the queue, waiting for capacity to free up	0	1	2	1	0	1	{"nodes": 1, "nonce": "5a681392-47cc-48d2-ae85-284fbed7229c", "gpus_per_node": 2}	2026-12-03 19:29:35.12687+00	2026-12-03 19:29:35.204701+00	0
4	2	395a8996-3425-4d4d-928b-c5f687b5cefa	1	queued	waiting for resources: needs 2 nodes × 1 GPU, 1 CPU, 0 bytes memory; behind job 2 at the head of the queue	0	2	1	1	0	1	{"nodes": 2, "nonce": "17f69a0f-0213-43bf-a4a1-a6fda849362c", "gpus_per_node": 1}	2026-12-03 19:29:35.180773+00	2026-12-03 19:29:35.204701+00	0
\.


--
-- Data for Name: launch_decisions; Type: TABLE DATA; Schema: tuneplane; Owner: -
--

COPY tuneplane.launch_decisions (attempt_id, decision, reason, decided_at) FROM stdin;
1	commit	all 1 member(s) prepared	2026-12-03 19:29:34.96803+00
\.


--
-- Data for Name: launch_settings; Type: TABLE DATA; Schema: tuneplane; Owner: -
--

COPY tuneplane.launch_settings (singleton, prepare_timeout, stop_grace, rendezvous_port_base, rendezvous_port_span, start_timeout, stop_timeout, free_relaunches) FROM stdin;
t	00:15:00	00:00:10	29500	2000	00:05:00	00:01:00	2
\.


--
-- Data for Name: member_log_chunks; Type: TABLE DATA; Schema: tuneplane; Owner: -
--

COPY tuneplane.member_log_chunks (member_id, stream, start_offset, end_offset, text, received_at) FROM stdin;
\.


--
-- Data for Name: member_log_settings; Type: TABLE DATA; Schema: tuneplane; Owner: -
--

COPY tuneplane.member_log_settings (singleton, max_chunk_bytes, max_stream_bytes, max_read_bytes) FROM stdin;
t	65536	67108864	1048576
\.


--
-- Data for Name: member_log_streams; Type: TABLE DATA; Schema: tuneplane; Owner: -
--

COPY tuneplane.member_log_streams (member_id, stream, next_offset, stored_bytes, dropped_bytes, chunks, updated_at) FROM stdin;
\.


--
-- Data for Name: members; Type: TABLE DATA; Schema: tuneplane; Owner: -
--

COPY tuneplane.members (id, attempt_id, job_id, rank, node_id, gpu_indices, cpus, memory_bytes, state, reason, exit_code, pid, updated_at, started_at, ended_at, released_at, contact_lost_at, started_epoch, kill_requested_at) FROM stdin;
1	1	1	0	1	{0}	1	0	running	running	\N	1000	2026-12-03 19:29:34.996805+00	2026-12-03 19:29:34.996484+00	\N	\N	\N	0	\N
\.


--
-- Data for Name: node_commands; Type: TABLE DATA; Schema: tuneplane; Owner: -
--

COPY tuneplane.node_commands (id, node_id, kind, payload, created_at, created_by, claimed_epoch, delivered_at, delivery_count, acked_at, result, error) FROM stdin;
1	1	prepare	{"cpus": 1, "rank": 0, "peers": [{"node": "gpu-node", "rank": 0, "address": "127.0.0.1", "node_id": 1, "probe_port": null}], "job_id": 1, "attempt": 1, "deadline": 1796327074.929485, "member_id": 1, "attempt_id": 1, "world_size": 1, "gpu_indices": [0], "master_addr": "127.0.0.1", "master_port": 29532, "shared_path": null, "memory_bytes": 0, "capsule_digest": "0000000000000000000000000000000000000000000000000000000000000000"}	2026-12-03 19:29:34.944966+00	db:postgres	\N	\N	0	\N	\N	\N
2	1	start	{"member_id": 1, "attempt_id": 1}	2026-12-03 19:29:34.977861+00	db:postgres	\N	\N	0	\N	\N	\N
\.


--
-- Data for Name: node_credentials; Type: TABLE DATA; Schema: tuneplane; Owner: -
--

COPY tuneplane.node_credentials (id, node_id, credential_hash, issued_at, first_used_at, superseded_at, grace_until, revoked_at, revoked_reason) FROM stdin;
1	1	0b8d8b3f4dd0a5290d8bb5522d6d1f80ca14fb3b527ea159aae5d6df4ff66e10	2026-12-03 19:29:34.793684+00	2026-12-03 19:29:35.063477+00	\N	\N	\N	\N
\.


--
-- Data for Name: node_events; Type: TABLE DATA; Schema: tuneplane; Owner: -
--

COPY tuneplane.node_events (id, at, fleet_id, node_id, kind, actor, reason, details) FROM stdin;
\.


--
-- Data for Name: node_gpus; Type: TABLE DATA; Schema: tuneplane; Owner: -
--

COPY tuneplane.node_gpus (node_id, gpu_index, model, memory_bytes, simulated) FROM stdin;
1	0	Simulated GPU	85899345920	t
1	1	Simulated GPU	85899345920	t
\.


--
-- Data for Name: node_settings; Type: TABLE DATA; Schema: tuneplane; Owner: -
--

COPY tuneplane.node_settings (singleton, heartbeat_interval, stale_after, lost_after, credential_rotate_after, credential_grace, enrollment_token_max_ttl) FROM stdin;
t	00:00:10	00:00:30	00:01:30	24:00:00	00:10:00	30 days
\.


--
-- Data for Name: node_usage; Type: TABLE DATA; Schema: tuneplane; Owner: -
--

COPY tuneplane.node_usage (node_id, fleet_id, total_gpus, used_gpus, used_cpus, used_memory) FROM stdin;
1	1	2	1	1	0
\.


--
-- Data for Name: nodes; Type: TABLE DATA; Schema: tuneplane; Owner: -
--

COPY tuneplane.nodes (id, fleet_id, name, scheduling_state, last_heartbeat_at, cpus, memory_bytes, agent_version, container_runtimes, address, enrolled_at, session_epoch, session_opened_at, session_closed_at, hostname, reported_running, connectivity_noted, fenced_at, fenced_reason, last_peer_check, last_storage_check, probe_port, session_reconciled_epoch, caches, caches_reported_at) FROM stdin;
1	1	gpu-node	active	2026-12-03 19:29:34.757072+00	32	274877906944	\N	{}	127.0.0.1	2026-12-03 19:29:34.757072+00	0	\N	\N	\N	[]	lost	\N	\N	\N	\N	\N	0	{}	\N
\.


--
-- Data for Name: previews; Type: TABLE DATA; Schema: tuneplane; Owner: -
--

COPY tuneplane.previews (id, owner_id, fleet_id, spec, resolved, canonical, digest, observed, created_at, expires_at) FROM stdin;
2e17c542-7515-4fe0-97de-d63a1684e62f	1	1	{}	{"nodes": 1, "nonce": "40b113d8-0ee4-43f6-96cf-2da1cb560437", "gpus_per_node": 1}	{"gpus_per_node":1,"nodes":1,"nonce":"40b113d8-0ee4-43f6-96cf-2da1cb560437"}	8001c8ddcd9c1a3857c98b7135ef687010b72f2ee7449856514be8e10ae9f11b	{}	2026-12-03 19:29:34.801789+00	2026-12-03 20:29:34.801789+00
c18e3473-7de6-4c8e-a007-a9fec0ee407f	1	1	{}	{"nodes": 1, "nonce": "5a681392-47cc-48d2-ae85-284fbed7229c", "gpus_per_node": 2}	{"gpus_per_node":2,"nodes":1,"nonce":"5a681392-47cc-48d2-ae85-284fbed7229c"}	f438f0d5a446e445b8511c72952343b402aaea41b9f9235dc229b8c0ce7a5df6	{}	2026-12-03 19:29:35.12687+00	2026-12-03 20:29:35.12687+00
8522e474-800e-4f99-aaa4-b7a3a3edee60	2	1	{}	{"nodes": 1, "nonce": "f27a6bdc-61f2-4246-aedf-130fbc12f520", "gpus_per_node": 1}	{"gpus_per_node":1,"nodes":1,"nonce":"f27a6bdc-61f2-4246-aedf-130fbc12f520"}	8ac915c978523e12ec43afc971cc29d9f710d492519f19355e58dc6325b6d2d9	{}	2026-12-03 19:29:35.144656+00	2026-12-03 20:29:35.144656+00
395a8996-3425-4d4d-928b-c5f687b5cefa	2	1	{}	{"nodes": 2, "nonce": "17f69a0f-0213-43bf-a4a1-a6fda849362c", "gpus_per_node": 1}	{"gpus_per_node":1,"nodes":2,"nonce":"17f69a0f-0213-43bf-a4a1-a6fda849362c"}	550158a4794cc18ed354c7368baf75c5a57e31b5ff9308ef4d1aef80844c5f54	{}	2026-12-03 19:29:35.180773+00	2026-12-03 20:29:35.180773+00
\.


--
-- Data for Name: schema_components; Type: TABLE DATA; Schema: tuneplane; Owner: -
--

COPY tuneplane.schema_components (name, version, checksum, applied_at) FROM stdin;
pgqueuer	1.6.0	1e5896acb7fcc9a781b6fa723d12b7f078dfb19ad061b5e2376e81b6dc863ee1	2026-12-03 19:29:33.896737+00
\.


--
-- Data for Name: schema_migrations; Type: TABLE DATA; Schema: tuneplane; Owner: -
--

COPY tuneplane.schema_migrations (version, name, checksum, applied_at) FROM stdin;
1	0001_foundation	9224f0e418e5c0201ab82e224c6fc06b4b8b5c271cc79d0538300d0a6f09f15c	2026-12-03 19:29:30.248646+00
2	0002_users	41f3f9bbe7bd4da001a3c9297c4f3e70affaf54a3ce81b61ca1847014debe823	2026-12-03 19:29:30.33264+00
3	0003_fleets_nodes	28195b50b31d1cc8376330634330b264bd0abcb2d50138ae368cfdd097e429ee	2026-12-03 19:29:30.450349+00
10	0010_submission_tables	26a710373e34847a4a13f990a5be1627aabc8c659618bfaf6c32df9d922aacab	2026-12-03 19:29:30.549208+00
11	0011_preview_functions	67efbe49a6df952e8eacee3631bc2e1e7963034480d8e8cec99fbb1b00201650	2026-12-03 19:29:30.817372+00
12	0012_confirmation_and_jobs	00c581584dc1df4d8065252b53c53c5762ba2b75218950c9399cff69274071b1	2026-12-03 19:29:30.837169+00
20	0020_node_identity	0cb95d3ab4db024a8eb20f89765abffb9e17a9f4ec693c9fbd6663736d284cf7	2026-12-03 19:29:30.868964+00
21	0021_node_control	49af1c97aa8beb4d8040ad56be1c0b130cb0aa9c56b388a287a1cdbb96876616	2026-12-03 19:29:31.041634+00
22	0022_node_operations	58e92fb95c3afd5c1bd92edd0045cf259ea83875d1c9bbc05d64e83f8b9449bd	2026-12-03 19:29:31.125891+00
30	0030_telemetry_storage	23ed8bad8ad9802d45426c4ac0a6204749046f248492bb46177b213e64473593	2026-12-03 19:29:31.162117+00
31	0031_telemetry_functions	cfdd784a1849a2fe92bb8f5d493f4d967124238a17db65b5e82f78ebfa5d544e	2026-12-03 19:29:31.378347+00
40	0040_launch_tables	2f2065e312ac4f42fa02b83fd3de6b04975e0d69fb31f758387cad8dce48c19c	2026-12-03 19:29:31.412982+00
41	0041_placement	affed1015498e98aa9279d0581c56c6022da3e3ce27226932329b9530a76cfad	2026-12-03 19:29:31.635175+00
42	0042_launch_lifecycle	140ff627a31528d6d52e9ba7f19d432efedf8d919e24579699c8a4a558a40e7a	2026-12-03 19:29:31.660814+00
43	0043_launch_processes	c2f599e74e5f7ff74bbf700066617ebe331ec4e5e2b857c156fbe62dea368d3f	2026-12-03 19:29:31.696977+00
45	0045_member_logs	07f22f97fc829a1742cbdf2c68f3f72e95cad60571cdc7b56cc323947163506b	2026-12-03 19:29:31.727941+00
46	0046_job_launch_reads	6e05f01c49d08da4287006f64663bc5fb60763fb9084066af2ed1523b439197e	2026-12-03 19:29:31.833331+00
47	0047_node_fence_and_checks_view	d94840e70639e8f5285c27a047360d675049da2d0ff0c0c602127dad9b1f2f1b	2026-12-03 19:29:31.861104+00
50	0050_artifacts	6963e431700c91176a5ce76dd4f18694433437f025c20613a3012c75ea75cd8d	2026-12-03 19:29:31.888745+00
51	0051_artifact_inputs_and_capabilities	559db23b80efa73b41dafcd3196e695f766b3294a0bec55a327c98b9f4f92294	2026-12-03 19:29:32.109204+00
52	0052_artifact_operator	25efd77917c8b267efb6afe67e6dc725899f34529feaa371076427221c86c341	2026-12-03 19:29:32.135122+00
60	0060_repeatable_functions	70d1b9b057c33645dc6c2c1381cc1b1586be42de1397f21454dd9e43acd44cc8	2026-12-03 19:29:32.141836+00
61	0061_launch_state_machine	c7bae4d7c4a12c51373f6228543ff1e450d5790f90ae20a7af748f63eefac02f	2026-12-03 19:29:32.182175+00
65	0065_rendezvous_ports_unique	db2f346c60983ff84285e6797ca3b08a5ec56f7036a64e34861c171962c45245	2026-12-03 19:29:32.268759+00
70	0070_telemetry_member_completion	56119f74c097d0fe0d15cad65a7aeed235cc6caba7b90ea106d69d3b94b38543	2026-12-03 19:29:32.309458+00
71	0071_telemetry_canonical_names	d84bb45f37909cea3eacb5ae61b76f36025bd894edd208a20aff909b2a2f56fb	2026-12-03 19:29:32.446532+00
72	0072_telemetry_rollup_wall_time	93decec4c1361b1c427bc2ea84b6820f8b8e73d23cb46d124302a79d0dc6da53	2026-12-03 19:29:32.457714+00
80	0080_artifact_chunk_crc32c	6a4c5ecc3b383f7af977a6e439b8894cfe393bf7a57e6880ab9f7f764863ee0a	2026-12-03 19:29:32.476643+00
81	0081_checkpoint_retention	9f32f0707c4b030349e86900e36c759b4b84aba5971567c2174a05e8d11e9fac	2026-12-03 19:29:32.492641+00
110	0110_slurm_backend	b5e3a1f11a022a197026933a04da4e3e93a864b3b77e3252528359a2cb4a9912	2026-12-03 19:29:32.514799+00
120	0120_node_caches	891c3bea9da6929707b95f80826c7b078b2e2e860cd49affbb5c0e578ec74c2a	2026-12-03 19:29:32.608638+00
140	0140_free_relaunches	e67988dcfb1ba4483b905c54bc90f76779e20f79959d41b45b873571619b24c8	2026-12-03 19:29:32.649962+00
\.


--
-- Data for Name: schema_repeatables; Type: TABLE DATA; Schema: tuneplane; Owner: -
--

COPY tuneplane.schema_repeatables (name, checksum, applied_at) FROM stdin;
common.sql	ed319a9fa0454643ac162ae5459162c1fd48a782c75433548a5eba2ba26733d2	2026-12-03 19:29:34.032627+00
users.sql	dd97be9bb6de88b51216caa81d9d4ad6d8cd1d04181c78b7c8c0b6c9328b3ee6	2026-12-03 19:29:34.032627+00
nodes.sql	0f067533dd28f15d4f836316803493e0b88a75f7313d8bf332a1e79dfe1e709d	2026-12-03 19:29:34.032627+00
submission.sql	a55d9f090e9d3ff248f95a979ee7903006bd03578a439dd56f95e1ed79552192	2026-12-03 19:29:34.032627+00
placement.sql	496d622e1a9b8ce30bd4e659a9f3a00e6727e1ae5704d83acc07ff415cc46765	2026-12-03 19:29:34.032627+00
launch.sql	89e39b4b7453915a10468199be397493b5862811e36098d734a33db430a41af7	2026-12-03 19:29:34.032627+00
runtimes.sql	690f8eae9985bc41ff8c161080a42694f0a132c743c9781e0dd46dd93acdb92e	2026-12-03 19:29:34.032627+00
slurm.sql	2a9addce144e87bcf09c30ded0146b0b683ad8f6837581a28773e0a42b6dde20	2026-12-03 19:29:34.032627+00
member_logs.sql	c33e16280b2d3783cc2a28ef80e179701c8349b62c2d19b39e8937c2cec97944	2026-12-03 19:29:34.032627+00
telemetry.sql	069731d3addf40d36faef99e2be44e12d7010d41cafa321582d69bb134d89945	2026-12-03 19:29:34.032627+00
artifacts.sql	fe6f22f9a7ab6083a9958e326e4a148908313035ddc127de0dc1c9421d4586f3	2026-12-03 19:29:34.032627+00
\.


--
-- Data for Name: server_secrets; Type: TABLE DATA; Schema: tuneplane; Owner: -
--

COPY tuneplane.server_secrets (name, value, created_at) FROM stdin;
\.


--
-- Data for Name: slurm_fleets; Type: TABLE DATA; Schema: tuneplane; Owner: -
--

COPY tuneplane.slurm_fleets (fleet_id, slurm_conf, partition, account, qos, version, reachable, last_error, checked_at, reached_at, max_nodes, max_time_minutes) FROM stdin;
\.


--
-- Data for Name: slurm_jobs; Type: TABLE DATA; Schema: tuneplane; Owner: -
--

COPY tuneplane.slurm_jobs (attempt_id, job_id, fleet_id, slurm_job_id, slurm_state, slurm_reason, jobs_ahead, node_list, submitted_at, started_at, scancel_at, gone_at, created_at) FROM stdin;
\.


--
-- Data for Name: slurm_nodes; Type: TABLE DATA; Schema: tuneplane; Owner: -
--

COPY tuneplane.slurm_nodes (node_id, slurm_state, reason, updated_at) FROM stdin;
\.


--
-- Data for Name: source_archive_uploads; Type: TABLE DATA; Schema: tuneplane; Owner: -
--

COPY tuneplane.source_archive_uploads (sha256, user_id, first_uploaded_at) FROM stdin;
\.


--
-- Data for Name: source_archives; Type: TABLE DATA; Schema: tuneplane; Owner: -
--

COPY tuneplane.source_archives (sha256, size_bytes, member_count, unpacked_bytes, created_at) FROM stdin;
\.


--
-- Data for Name: state_transitions; Type: TABLE DATA; Schema: tuneplane; Owner: -
--

COPY tuneplane.state_transitions (entity, from_state, to_state, writers) FROM stdin;
job	queued	reserved	{reserve_next,job_transition}
job	reserved	preparing	{begin_prepare,job_transition}
job	reserved	running	{member_prepared,job_transition}
job	preparing	running	{member_prepared,slurm_member_prepared,job_transition}
job	queued	cancelled	{cancel_job,finish_attempt_if_done,job_transition}
job	queued	preparing	{slurm_allocation_started,job_transition}
job	queued	failed	{finish_attempt_if_done,job_transition}
job	reserved	queued	{finish_attempt_if_done,job_transition}
job	reserved	succeeded	{finish_attempt_if_done,job_transition}
job	reserved	failed	{finish_attempt_if_done,job_transition}
job	reserved	cancelled	{finish_attempt_if_done,job_transition}
job	preparing	queued	{finish_attempt_if_done,job_transition}
job	preparing	succeeded	{finish_attempt_if_done,job_transition}
job	preparing	failed	{finish_attempt_if_done,job_transition}
job	preparing	cancelled	{finish_attempt_if_done,job_transition}
job	running	queued	{finish_attempt_if_done,job_transition}
job	running	succeeded	{finish_attempt_if_done,job_transition}
job	running	failed	{finish_attempt_if_done,job_transition}
job	running	cancelled	{finish_attempt_if_done,job_transition}
attempt	reserved	preparing	{begin_prepare,slurm_allocation_started}
attempt	preparing	running	{member_prepared,slurm_member_prepared}
attempt	reserved	stopping	{decide_abort}
attempt	preparing	stopping	{decide_abort}
attempt	running	stopping	{stop_attempt}
attempt	reserved	succeeded	{finish_attempt_if_done}
attempt	reserved	failed	{finish_attempt_if_done}
attempt	reserved	aborted	{finish_attempt_if_done}
attempt	reserved	cancelled	{finish_attempt_if_done}
attempt	preparing	succeeded	{finish_attempt_if_done}
attempt	preparing	failed	{finish_attempt_if_done}
attempt	preparing	aborted	{finish_attempt_if_done}
attempt	preparing	cancelled	{finish_attempt_if_done}
attempt	running	succeeded	{finish_attempt_if_done}
attempt	running	failed	{finish_attempt_if_done}
attempt	running	aborted	{finish_attempt_if_done}
attempt	running	cancelled	{finish_attempt_if_done}
attempt	stopping	succeeded	{finish_attempt_if_done}
attempt	stopping	failed	{finish_attempt_if_done}
attempt	stopping	aborted	{finish_attempt_if_done}
attempt	stopping	cancelled	{finish_attempt_if_done}
member	reserved	preparing	{begin_prepare}
member	preparing	prepared	{member_prepared,slurm_member_prepared}
member	prepared	starting	{member_prepared,slurm_member_prepared}
member	starting	running	{member_started,slurm_member_started}
member	starting	stopping	{stop_attempt}
member	running	stopping	{stop_attempt}
member	reserved	aborted	{decide_abort}
member	preparing	aborted	{decide_abort}
member	prepared	aborted	{decide_abort}
member	starting	exited	{record_member_exit}
member	starting	failed	{record_member_exit}
member	starting	cancelled	{record_member_exit}
member	running	exited	{record_member_exit}
member	running	failed	{record_member_exit}
member	running	cancelled	{record_member_exit}
member	stopping	exited	{record_member_exit}
member	stopping	failed	{record_member_exit}
member	stopping	cancelled	{record_member_exit}
member	reserved	lost	{lose_node_members}
member	preparing	lost	{lose_node_members}
member	prepared	lost	{lose_node_members}
member	starting	lost	{lose_node_members}
member	running	lost	{lose_node_members}
member	stopping	lost	{lose_node_members}
\.


--
-- Data for Name: submission_settings; Type: TABLE DATA; Schema: tuneplane; Owner: -
--

COPY tuneplane.submission_settings (name, value, description) FROM stdin;
max_gpus_per_job	64	default per-user limit: GPUs one job may request in total (nodes × gpus_per_node)
max_nodes_per_job	16	default per-user limit: nodes (members) one job may request
preview_ttl_seconds	3600	how long after its creation a preview can still be confirmed
archive_max_bytes	536870912	largest source archive upload (compressed bytes)
archive_max_members	5000	most members (files, directories, links) a source archive may hold
archive_max_unpacked_bytes	2147483648	largest decompressed size of a source archive (guards against zip bombs)
\.


--
-- Data for Name: telemetry_batches; Type: TABLE DATA; Schema: tuneplane; Owner: -
--

COPY tuneplane.telemetry_batches (collector_id, seq, token_id, digest, points, received_at, job_id, attempt, member_rank) FROM stdin;
\.


--
-- Data for Name: telemetry_canonical_rules; Type: TABLE DATA; Schema: tuneplane; Owner: -
--

COPY tuneplane.telemetry_canonical_rules (priority, pattern, canonical) FROM stdin;
10	^(eval|val|valid|validation|test)[/_.-]?(total_)?loss$	eval_loss
11	^loss[/_.-](eval|val|valid|validation|test)$	eval_loss
20	^((train|training)[/_.-])?(total_)?loss$	loss
21	^loss[/_.-](train|training|step|epoch)$	loss
22	^train[/_.-]loss[/_.-](step|epoch)$	loss
30	^((train|optimizer|optim)[/_.-])?(lr|learning[_.-]?rate)$	learning_rate
31	^lr[-_ /].+$	learning_rate
40	^((train|training|perf|speed)[/_.-])?throughput([/_.-].*)?$	throughput
41	^((train|training)[/_.-])?(samples|tokens|examples|images|sequences)[/_.-]?per[/_.-]?(sec|second)$	throughput
42	^((train|training)[/_.-])?(it|iter|iters|iterations)[/_.-]?(per[/_.-]?)?(s|sec|second)$	throughput
50	^((train|training|optimizer|optim)[/_.-])?(grad|gradient)[_.-]?norm$	grad_norm
51	^((train|optimizer)[/_.-])?global[_.-]?norm$	grad_norm
60	^((system|sys)[/_.-])?gpu.*util	gpu_utilization
61	^((system|sys)[/_.-])?gpu\\.[0-9]+\\.gpu$	gpu_utilization
70	^((system|sys)[/_.-])?gpu.*mem	gpu_memory
71	^(cuda|torch)[/_.-]?(max_)?mem(ory)?([/_.-].*)?$	gpu_memory
72	^(max_)?memory[/_.-]?(allocated|reserved)$	gpu_memory
43	^(.+[/_.-])?throughput([/_.-].*)?$	throughput
44	^((train|training|perf|speed)[/_.-])?(tokens|samples|examples|images|sequences|steps)[/_.-]?(per[/_.-]?(sec|second|s)|/s)([/_.-]per[/_.-]?(gpu|device|rank))?$	throughput
65	^((system|sys)[/_.-])?gpu.*power	gpu_power
73	^peak[_.-]memory[_.-](active|alloc|allocated|reserved)$	gpu_memory
80	^((system|sys)[/_.-])?(cpu|proc|process)[/_.-]?(util|utilization|percent|pct)	cpu_utilization
81	^((system|sys)[/_.-])?((proc|process)[/_.-]?)?(memory[/_.-]?)?rss([/_.-]?bytes)?$	memory_rss
\.


--
-- Data for Name: telemetry_collectors; Type: TABLE DATA; Schema: tuneplane; Owner: -
--

COPY tuneplane.telemetry_collectors (collector_id, job_id, attempt, member_rank, batches, points, duplicates, health, first_seen_at, last_batch_at) FROM stdin;
\.


--
-- Data for Name: telemetry_damage; Type: TABLE DATA; Schema: tuneplane; Owner: -
--

COPY tuneplane.telemetry_damage (id, job_id, attempt, member_rank, source, file, file_offset, bytes, reason, recorded_at) FROM stdin;
\.


--
-- Data for Name: telemetry_members; Type: TABLE DATA; Schema: tuneplane; Owner: -
--

COPY tuneplane.telemetry_members (job_id, attempt, member_rank, state, reason, series, refused_points, damaged_regions, member_ended_at, finished_at, updated_at) FROM stdin;
\.


--
-- Data for Name: telemetry_points; Type: TABLE DATA; Schema: tuneplane; Owner: -
--

COPY tuneplane.telemetry_points (series_id, step, value, wall_time) FROM stdin;
\.


--
-- Data for Name: telemetry_refusals; Type: TABLE DATA; Schema: tuneplane; Owner: -
--

COPY tuneplane.telemetry_refusals (job_id, attempt, member_rank, source, name, reason, count, first_at, last_at) FROM stdin;
\.


--
-- Data for Name: telemetry_rollups; Type: TABLE DATA; Schema: tuneplane; Owner: -
--

COPY tuneplane.telemetry_rollups (series_id, width, bucket, n, sum, min, max, first_step, last_step, last_value, last_wall) FROM stdin;
\.


--
-- Data for Name: telemetry_series; Type: TABLE DATA; Schema: tuneplane; Owner: -
--

COPY tuneplane.telemetry_series (id, job_id, attempt, member_rank, source, name, canonical, point_count, min_step, max_step, last_step, last_value, created_at, last_at) FROM stdin;
\.


--
-- Data for Name: telemetry_settings; Type: TABLE DATA; Schema: tuneplane; Owner: -
--

COPY tuneplane.telemetry_settings (singleton, retention, token_ttl, max_batch_points, drain_grace, max_series_per_member) FROM stdin;
t	180 days	30 days	200000	00:02:00	2000
\.


--
-- Data for Name: telemetry_tokens; Type: TABLE DATA; Schema: tuneplane; Owner: -
--

COPY tuneplane.telemetry_tokens (id, token_hash, job_id, attempt, member_rank, created_at, expires_at, revoked_at) FROM stdin;
\.


--
-- Data for Name: user_limits; Type: TABLE DATA; Schema: tuneplane; Owner: -
--

COPY tuneplane.user_limits (user_id, max_gpus_per_job, max_nodes_per_job, updated_at) FROM stdin;
\.


--
-- Data for Name: users; Type: TABLE DATA; Schema: tuneplane; Owner: -
--

COPY tuneplane.users (id, username, password_hash, role, created_at, disabled_at) FROM stdin;
1	alice	\N	user	2026-12-03 19:29:34.460889+00	\N
2	bob	\N	user	2026-12-03 19:29:34.488819+00	\N
3	root	\N	admin	2026-12-03 19:29:34.516516+00	\N
\.


--
-- Name: pgqueuer_id_seq; Type: SEQUENCE SET; Schema: public; Owner: -
--

SELECT pg_catalog.setval('public.pgqueuer_id_seq', 1, true);


--
-- Name: pgqueuer_log_id_seq; Type: SEQUENCE SET; Schema: public; Owner: -
--

SELECT pg_catalog.setval('public.pgqueuer_log_id_seq', 1, false);


--
-- Name: pgqueuer_schedules_id_seq; Type: SEQUENCE SET; Schema: public; Owner: -
--

SELECT pg_catalog.setval('public.pgqueuer_schedules_id_seq', 1, false);


--
-- Name: pgqueuer_statistics_id_seq; Type: SEQUENCE SET; Schema: public; Owner: -
--

SELECT pg_catalog.setval('public.pgqueuer_statistics_id_seq', 1, false);


--
-- Name: api_tokens_id_seq; Type: SEQUENCE SET; Schema: tuneplane; Owner: -
--

SELECT pg_catalog.setval('tuneplane.api_tokens_id_seq', 3, true);


--
-- Name: artifact_verifications_id_seq; Type: SEQUENCE SET; Schema: tuneplane; Owner: -
--

SELECT pg_catalog.setval('tuneplane.artifact_verifications_id_seq', 1, false);


--
-- Name: artifacts_id_seq; Type: SEQUENCE SET; Schema: tuneplane; Owner: -
--

SELECT pg_catalog.setval('tuneplane.artifacts_id_seq', 1, true);


--
-- Name: attempts_id_seq; Type: SEQUENCE SET; Schema: tuneplane; Owner: -
--

SELECT pg_catalog.setval('tuneplane.attempts_id_seq', 1, true);


--
-- Name: enrollment_tokens_id_seq; Type: SEQUENCE SET; Schema: tuneplane; Owner: -
--

SELECT pg_catalog.setval('tuneplane.enrollment_tokens_id_seq', 1, false);


--
-- Name: fleets_id_seq; Type: SEQUENCE SET; Schema: tuneplane; Owner: -
--

SELECT pg_catalog.setval('tuneplane.fleets_id_seq', 1, true);


--
-- Name: job_events_id_seq; Type: SEQUENCE SET; Schema: tuneplane; Owner: -
--

SELECT pg_catalog.setval('tuneplane.job_events_id_seq', 11, true);


--
-- Name: jobs_id_seq; Type: SEQUENCE SET; Schema: tuneplane; Owner: -
--

SELECT pg_catalog.setval('tuneplane.jobs_id_seq', 4, true);


--
-- Name: members_id_seq; Type: SEQUENCE SET; Schema: tuneplane; Owner: -
--

SELECT pg_catalog.setval('tuneplane.members_id_seq', 1, true);


--
-- Name: node_commands_id_seq; Type: SEQUENCE SET; Schema: tuneplane; Owner: -
--

SELECT pg_catalog.setval('tuneplane.node_commands_id_seq', 2, true);


--
-- Name: node_credentials_id_seq; Type: SEQUENCE SET; Schema: tuneplane; Owner: -
--

SELECT pg_catalog.setval('tuneplane.node_credentials_id_seq', 1, true);


--
-- Name: node_events_id_seq; Type: SEQUENCE SET; Schema: tuneplane; Owner: -
--

SELECT pg_catalog.setval('tuneplane.node_events_id_seq', 1, false);


--
-- Name: nodes_id_seq; Type: SEQUENCE SET; Schema: tuneplane; Owner: -
--

SELECT pg_catalog.setval('tuneplane.nodes_id_seq', 1, true);


--
-- Name: telemetry_damage_id_seq; Type: SEQUENCE SET; Schema: tuneplane; Owner: -
--

SELECT pg_catalog.setval('tuneplane.telemetry_damage_id_seq', 1, false);


--
-- Name: telemetry_series_id_seq; Type: SEQUENCE SET; Schema: tuneplane; Owner: -
--

SELECT pg_catalog.setval('tuneplane.telemetry_series_id_seq', 1, false);


--
-- Name: telemetry_tokens_id_seq; Type: SEQUENCE SET; Schema: tuneplane; Owner: -
--

SELECT pg_catalog.setval('tuneplane.telemetry_tokens_id_seq', 1, false);


--
-- Name: users_id_seq; Type: SEQUENCE SET; Schema: tuneplane; Owner: -
--

SELECT pg_catalog.setval('tuneplane.users_id_seq', 3, true);


--
-- Name: pgqueuer_log pgqueuer_log_pkey; Type: CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.pgqueuer_log
    ADD CONSTRAINT pgqueuer_log_pkey PRIMARY KEY (id);


--
-- Name: pgqueuer pgqueuer_pkey; Type: CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.pgqueuer
    ADD CONSTRAINT pgqueuer_pkey PRIMARY KEY (id);


--
-- Name: pgqueuer_schedules pgqueuer_schedules_expression_entrypoint_key; Type: CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.pgqueuer_schedules
    ADD CONSTRAINT pgqueuer_schedules_expression_entrypoint_key UNIQUE (expression, entrypoint);


--
-- Name: pgqueuer_schedules pgqueuer_schedules_pkey; Type: CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.pgqueuer_schedules
    ADD CONSTRAINT pgqueuer_schedules_pkey PRIMARY KEY (id);


--
-- Name: pgqueuer_statistics pgqueuer_statistics_pkey; Type: CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.pgqueuer_statistics
    ADD CONSTRAINT pgqueuer_statistics_pkey PRIMARY KEY (id);


--
-- Name: api_tokens api_tokens_pkey; Type: CONSTRAINT; Schema: tuneplane; Owner: -
--

ALTER TABLE ONLY tuneplane.api_tokens
    ADD CONSTRAINT api_tokens_pkey PRIMARY KEY (id);


--
-- Name: api_tokens api_tokens_token_hash_key; Type: CONSTRAINT; Schema: tuneplane; Owner: -
--

ALTER TABLE ONLY tuneplane.api_tokens
    ADD CONSTRAINT api_tokens_token_hash_key UNIQUE (token_hash);


--
-- Name: artifact_chunks artifact_chunks_pkey; Type: CONSTRAINT; Schema: tuneplane; Owner: -
--

ALTER TABLE ONLY tuneplane.artifact_chunks
    ADD CONSTRAINT artifact_chunks_pkey PRIMARY KEY (artifact_id, file_index, chunk_index);


--
-- Name: artifact_files artifact_files_artifact_id_path_key; Type: CONSTRAINT; Schema: tuneplane; Owner: -
--

ALTER TABLE ONLY tuneplane.artifact_files
    ADD CONSTRAINT artifact_files_artifact_id_path_key UNIQUE (artifact_id, path);


--
-- Name: artifact_files artifact_files_pkey; Type: CONSTRAINT; Schema: tuneplane; Owner: -
--

ALTER TABLE ONLY tuneplane.artifact_files
    ADD CONSTRAINT artifact_files_pkey PRIMARY KEY (artifact_id, file_index);


--
-- Name: artifact_settings artifact_settings_pkey; Type: CONSTRAINT; Schema: tuneplane; Owner: -
--

ALTER TABLE ONLY tuneplane.artifact_settings
    ADD CONSTRAINT artifact_settings_pkey PRIMARY KEY (singleton);


--
-- Name: artifact_verifications artifact_verifications_pkey; Type: CONSTRAINT; Schema: tuneplane; Owner: -
--

ALTER TABLE ONLY tuneplane.artifact_verifications
    ADD CONSTRAINT artifact_verifications_pkey PRIMARY KEY (id);


--
-- Name: artifacts artifacts_member_id_name_key; Type: CONSTRAINT; Schema: tuneplane; Owner: -
--

ALTER TABLE ONLY tuneplane.artifacts
    ADD CONSTRAINT artifacts_member_id_name_key UNIQUE (member_id, name);


--
-- Name: artifacts artifacts_pkey; Type: CONSTRAINT; Schema: tuneplane; Owner: -
--

ALTER TABLE ONLY tuneplane.artifacts
    ADD CONSTRAINT artifacts_pkey PRIMARY KEY (id);


--
-- Name: attempts attempts_job_id_number_key; Type: CONSTRAINT; Schema: tuneplane; Owner: -
--

ALTER TABLE ONLY tuneplane.attempts
    ADD CONSTRAINT attempts_job_id_number_key UNIQUE (job_id, number);


--
-- Name: attempts attempts_pkey; Type: CONSTRAINT; Schema: tuneplane; Owner: -
--

ALTER TABLE ONLY tuneplane.attempts
    ADD CONSTRAINT attempts_pkey PRIMARY KEY (id);


--
-- Name: confirmations confirmations_pkey; Type: CONSTRAINT; Schema: tuneplane; Owner: -
--

ALTER TABLE ONLY tuneplane.confirmations
    ADD CONSTRAINT confirmations_pkey PRIMARY KEY (owner_id, retry_key);


--
-- Name: enrollment_tokens enrollment_tokens_pkey; Type: CONSTRAINT; Schema: tuneplane; Owner: -
--

ALTER TABLE ONLY tuneplane.enrollment_tokens
    ADD CONSTRAINT enrollment_tokens_pkey PRIMARY KEY (id);


--
-- Name: enrollment_tokens enrollment_tokens_token_hash_key; Type: CONSTRAINT; Schema: tuneplane; Owner: -
--

ALTER TABLE ONLY tuneplane.enrollment_tokens
    ADD CONSTRAINT enrollment_tokens_token_hash_key UNIQUE (token_hash);


--
-- Name: fleets fleets_name_key; Type: CONSTRAINT; Schema: tuneplane; Owner: -
--

ALTER TABLE ONLY tuneplane.fleets
    ADD CONSTRAINT fleets_name_key UNIQUE (name);


--
-- Name: fleets fleets_pkey; Type: CONSTRAINT; Schema: tuneplane; Owner: -
--

ALTER TABLE ONLY tuneplane.fleets
    ADD CONSTRAINT fleets_pkey PRIMARY KEY (id);


--
-- Name: gpu_allocations gpu_allocations_pkey; Type: CONSTRAINT; Schema: tuneplane; Owner: -
--

ALTER TABLE ONLY tuneplane.gpu_allocations
    ADD CONSTRAINT gpu_allocations_pkey PRIMARY KEY (member_id, gpu_index);


--
-- Name: job_events job_events_pkey; Type: CONSTRAINT; Schema: tuneplane; Owner: -
--

ALTER TABLE ONLY tuneplane.job_events
    ADD CONSTRAINT job_events_pkey PRIMARY KEY (id);


--
-- Name: jobs jobs_pkey; Type: CONSTRAINT; Schema: tuneplane; Owner: -
--

ALTER TABLE ONLY tuneplane.jobs
    ADD CONSTRAINT jobs_pkey PRIMARY KEY (id);


--
-- Name: jobs jobs_preview_id_key; Type: CONSTRAINT; Schema: tuneplane; Owner: -
--

ALTER TABLE ONLY tuneplane.jobs
    ADD CONSTRAINT jobs_preview_id_key UNIQUE (preview_id);


--
-- Name: launch_decisions launch_decisions_pkey; Type: CONSTRAINT; Schema: tuneplane; Owner: -
--

ALTER TABLE ONLY tuneplane.launch_decisions
    ADD CONSTRAINT launch_decisions_pkey PRIMARY KEY (attempt_id);


--
-- Name: launch_settings launch_settings_pkey; Type: CONSTRAINT; Schema: tuneplane; Owner: -
--

ALTER TABLE ONLY tuneplane.launch_settings
    ADD CONSTRAINT launch_settings_pkey PRIMARY KEY (singleton);


--
-- Name: member_log_chunks member_log_chunks_pkey; Type: CONSTRAINT; Schema: tuneplane; Owner: -
--

ALTER TABLE ONLY tuneplane.member_log_chunks
    ADD CONSTRAINT member_log_chunks_pkey PRIMARY KEY (member_id, stream, start_offset);


--
-- Name: member_log_settings member_log_settings_pkey; Type: CONSTRAINT; Schema: tuneplane; Owner: -
--

ALTER TABLE ONLY tuneplane.member_log_settings
    ADD CONSTRAINT member_log_settings_pkey PRIMARY KEY (singleton);


--
-- Name: member_log_streams member_log_streams_pkey; Type: CONSTRAINT; Schema: tuneplane; Owner: -
--

ALTER TABLE ONLY tuneplane.member_log_streams
    ADD CONSTRAINT member_log_streams_pkey PRIMARY KEY (member_id, stream);


--
-- Name: members members_attempt_id_rank_key; Type: CONSTRAINT; Schema: tuneplane; Owner: -
--

ALTER TABLE ONLY tuneplane.members
    ADD CONSTRAINT members_attempt_id_rank_key UNIQUE (attempt_id, rank);


--
-- Name: members members_pkey; Type: CONSTRAINT; Schema: tuneplane; Owner: -
--

ALTER TABLE ONLY tuneplane.members
    ADD CONSTRAINT members_pkey PRIMARY KEY (id);


--
-- Name: node_commands node_commands_pkey; Type: CONSTRAINT; Schema: tuneplane; Owner: -
--

ALTER TABLE ONLY tuneplane.node_commands
    ADD CONSTRAINT node_commands_pkey PRIMARY KEY (id);


--
-- Name: node_credentials node_credentials_credential_hash_key; Type: CONSTRAINT; Schema: tuneplane; Owner: -
--

ALTER TABLE ONLY tuneplane.node_credentials
    ADD CONSTRAINT node_credentials_credential_hash_key UNIQUE (credential_hash);


--
-- Name: node_credentials node_credentials_pkey; Type: CONSTRAINT; Schema: tuneplane; Owner: -
--

ALTER TABLE ONLY tuneplane.node_credentials
    ADD CONSTRAINT node_credentials_pkey PRIMARY KEY (id);


--
-- Name: node_events node_events_pkey; Type: CONSTRAINT; Schema: tuneplane; Owner: -
--

ALTER TABLE ONLY tuneplane.node_events
    ADD CONSTRAINT node_events_pkey PRIMARY KEY (id);


--
-- Name: node_gpus node_gpus_pkey; Type: CONSTRAINT; Schema: tuneplane; Owner: -
--

ALTER TABLE ONLY tuneplane.node_gpus
    ADD CONSTRAINT node_gpus_pkey PRIMARY KEY (node_id, gpu_index);


--
-- Name: node_settings node_settings_pkey; Type: CONSTRAINT; Schema: tuneplane; Owner: -
--

ALTER TABLE ONLY tuneplane.node_settings
    ADD CONSTRAINT node_settings_pkey PRIMARY KEY (singleton);


--
-- Name: node_usage node_usage_pkey; Type: CONSTRAINT; Schema: tuneplane; Owner: -
--

ALTER TABLE ONLY tuneplane.node_usage
    ADD CONSTRAINT node_usage_pkey PRIMARY KEY (node_id);


--
-- Name: nodes nodes_fleet_id_name_key; Type: CONSTRAINT; Schema: tuneplane; Owner: -
--

ALTER TABLE ONLY tuneplane.nodes
    ADD CONSTRAINT nodes_fleet_id_name_key UNIQUE (fleet_id, name);


--
-- Name: nodes nodes_pkey; Type: CONSTRAINT; Schema: tuneplane; Owner: -
--

ALTER TABLE ONLY tuneplane.nodes
    ADD CONSTRAINT nodes_pkey PRIMARY KEY (id);


--
-- Name: previews previews_pkey; Type: CONSTRAINT; Schema: tuneplane; Owner: -
--

ALTER TABLE ONLY tuneplane.previews
    ADD CONSTRAINT previews_pkey PRIMARY KEY (id);


--
-- Name: schema_components schema_components_pkey; Type: CONSTRAINT; Schema: tuneplane; Owner: -
--

ALTER TABLE ONLY tuneplane.schema_components
    ADD CONSTRAINT schema_components_pkey PRIMARY KEY (name);


--
-- Name: schema_migrations schema_migrations_pkey; Type: CONSTRAINT; Schema: tuneplane; Owner: -
--

ALTER TABLE ONLY tuneplane.schema_migrations
    ADD CONSTRAINT schema_migrations_pkey PRIMARY KEY (version);


--
-- Name: schema_repeatables schema_repeatables_pkey; Type: CONSTRAINT; Schema: tuneplane; Owner: -
--

ALTER TABLE ONLY tuneplane.schema_repeatables
    ADD CONSTRAINT schema_repeatables_pkey PRIMARY KEY (name);


--
-- Name: server_secrets server_secrets_pkey; Type: CONSTRAINT; Schema: tuneplane; Owner: -
--

ALTER TABLE ONLY tuneplane.server_secrets
    ADD CONSTRAINT server_secrets_pkey PRIMARY KEY (name);


--
-- Name: slurm_fleets slurm_fleets_pkey; Type: CONSTRAINT; Schema: tuneplane; Owner: -
--

ALTER TABLE ONLY tuneplane.slurm_fleets
    ADD CONSTRAINT slurm_fleets_pkey PRIMARY KEY (fleet_id);


--
-- Name: slurm_jobs slurm_jobs_pkey; Type: CONSTRAINT; Schema: tuneplane; Owner: -
--

ALTER TABLE ONLY tuneplane.slurm_jobs
    ADD CONSTRAINT slurm_jobs_pkey PRIMARY KEY (attempt_id);


--
-- Name: slurm_nodes slurm_nodes_pkey; Type: CONSTRAINT; Schema: tuneplane; Owner: -
--

ALTER TABLE ONLY tuneplane.slurm_nodes
    ADD CONSTRAINT slurm_nodes_pkey PRIMARY KEY (node_id);


--
-- Name: source_archive_uploads source_archive_uploads_pkey; Type: CONSTRAINT; Schema: tuneplane; Owner: -
--

ALTER TABLE ONLY tuneplane.source_archive_uploads
    ADD CONSTRAINT source_archive_uploads_pkey PRIMARY KEY (user_id, sha256);


--
-- Name: source_archives source_archives_pkey; Type: CONSTRAINT; Schema: tuneplane; Owner: -
--

ALTER TABLE ONLY tuneplane.source_archives
    ADD CONSTRAINT source_archives_pkey PRIMARY KEY (sha256);


--
-- Name: state_transitions state_transitions_pkey; Type: CONSTRAINT; Schema: tuneplane; Owner: -
--

ALTER TABLE ONLY tuneplane.state_transitions
    ADD CONSTRAINT state_transitions_pkey PRIMARY KEY (entity, from_state, to_state);


--
-- Name: submission_settings submission_settings_pkey; Type: CONSTRAINT; Schema: tuneplane; Owner: -
--

ALTER TABLE ONLY tuneplane.submission_settings
    ADD CONSTRAINT submission_settings_pkey PRIMARY KEY (name);


--
-- Name: telemetry_batches telemetry_batches_pkey; Type: CONSTRAINT; Schema: tuneplane; Owner: -
--

ALTER TABLE ONLY tuneplane.telemetry_batches
    ADD CONSTRAINT telemetry_batches_pkey PRIMARY KEY (job_id, attempt, member_rank, collector_id, seq);


--
-- Name: telemetry_canonical_rules telemetry_canonical_rules_pkey; Type: CONSTRAINT; Schema: tuneplane; Owner: -
--

ALTER TABLE ONLY tuneplane.telemetry_canonical_rules
    ADD CONSTRAINT telemetry_canonical_rules_pkey PRIMARY KEY (priority);


--
-- Name: telemetry_collectors telemetry_collectors_pkey; Type: CONSTRAINT; Schema: tuneplane; Owner: -
--

ALTER TABLE ONLY tuneplane.telemetry_collectors
    ADD CONSTRAINT telemetry_collectors_pkey PRIMARY KEY (job_id, attempt, member_rank, collector_id);


--
-- Name: telemetry_damage telemetry_damage_job_id_attempt_member_rank_file_file_offse_key; Type: CONSTRAINT; Schema: tuneplane; Owner: -
--

ALTER TABLE ONLY tuneplane.telemetry_damage
    ADD CONSTRAINT telemetry_damage_job_id_attempt_member_rank_file_file_offse_key UNIQUE (job_id, attempt, member_rank, file, file_offset);


--
-- Name: telemetry_damage telemetry_damage_pkey; Type: CONSTRAINT; Schema: tuneplane; Owner: -
--

ALTER TABLE ONLY tuneplane.telemetry_damage
    ADD CONSTRAINT telemetry_damage_pkey PRIMARY KEY (id);


--
-- Name: telemetry_members telemetry_members_pkey; Type: CONSTRAINT; Schema: tuneplane; Owner: -
--

ALTER TABLE ONLY tuneplane.telemetry_members
    ADD CONSTRAINT telemetry_members_pkey PRIMARY KEY (job_id, attempt, member_rank);


--
-- Name: telemetry_refusals telemetry_refusals_pkey; Type: CONSTRAINT; Schema: tuneplane; Owner: -
--

ALTER TABLE ONLY tuneplane.telemetry_refusals
    ADD CONSTRAINT telemetry_refusals_pkey PRIMARY KEY (job_id, attempt, member_rank, source, name, reason);


--
-- Name: telemetry_rollups telemetry_rollups_pkey; Type: CONSTRAINT; Schema: tuneplane; Owner: -
--

ALTER TABLE ONLY tuneplane.telemetry_rollups
    ADD CONSTRAINT telemetry_rollups_pkey PRIMARY KEY (series_id, width, bucket);


--
-- Name: telemetry_series telemetry_series_job_id_attempt_member_rank_source_name_key; Type: CONSTRAINT; Schema: tuneplane; Owner: -
--

ALTER TABLE ONLY tuneplane.telemetry_series
    ADD CONSTRAINT telemetry_series_job_id_attempt_member_rank_source_name_key UNIQUE (job_id, attempt, member_rank, source, name);


--
-- Name: telemetry_series telemetry_series_pkey; Type: CONSTRAINT; Schema: tuneplane; Owner: -
--

ALTER TABLE ONLY tuneplane.telemetry_series
    ADD CONSTRAINT telemetry_series_pkey PRIMARY KEY (id);


--
-- Name: telemetry_settings telemetry_settings_pkey; Type: CONSTRAINT; Schema: tuneplane; Owner: -
--

ALTER TABLE ONLY tuneplane.telemetry_settings
    ADD CONSTRAINT telemetry_settings_pkey PRIMARY KEY (singleton);


--
-- Name: telemetry_tokens telemetry_tokens_pkey; Type: CONSTRAINT; Schema: tuneplane; Owner: -
--

ALTER TABLE ONLY tuneplane.telemetry_tokens
    ADD CONSTRAINT telemetry_tokens_pkey PRIMARY KEY (id);


--
-- Name: telemetry_tokens telemetry_tokens_token_hash_key; Type: CONSTRAINT; Schema: tuneplane; Owner: -
--

ALTER TABLE ONLY tuneplane.telemetry_tokens
    ADD CONSTRAINT telemetry_tokens_token_hash_key UNIQUE (token_hash);


--
-- Name: user_limits user_limits_pkey; Type: CONSTRAINT; Schema: tuneplane; Owner: -
--

ALTER TABLE ONLY tuneplane.user_limits
    ADD CONSTRAINT user_limits_pkey PRIMARY KEY (user_id);


--
-- Name: users users_pkey; Type: CONSTRAINT; Schema: tuneplane; Owner: -
--

ALTER TABLE ONLY tuneplane.users
    ADD CONSTRAINT users_pkey PRIMARY KEY (id);


--
-- Name: users users_username_key; Type: CONSTRAINT; Schema: tuneplane; Owner: -
--

ALTER TABLE ONLY tuneplane.users
    ADD CONSTRAINT users_username_key UNIQUE (username);


--
-- Name: pgqueuer_ep_ea_idx; Type: INDEX; Schema: public; Owner: -
--

CREATE INDEX pgqueuer_ep_ea_idx ON public.pgqueuer USING btree (entrypoint, execute_after) WHERE (status = 'queued'::public.pgqueuer_status);


--
-- Name: pgqueuer_ep_prio_id_idx; Type: INDEX; Schema: public; Owner: -
--

CREATE INDEX pgqueuer_ep_prio_id_idx ON public.pgqueuer USING btree (entrypoint, priority DESC, id) WHERE (status = 'queued'::public.pgqueuer_status);


--
-- Name: pgqueuer_log_created; Type: INDEX; Schema: public; Owner: -
--

CREATE INDEX pgqueuer_log_created ON public.pgqueuer_log USING btree (created);


--
-- Name: pgqueuer_log_job_id_status; Type: INDEX; Schema: public; Owner: -
--

CREATE INDEX pgqueuer_log_job_id_status ON public.pgqueuer_log USING btree (job_id, created DESC);


--
-- Name: pgqueuer_log_not_aggregated; Type: INDEX; Schema: public; Owner: -
--

CREATE INDEX pgqueuer_log_not_aggregated ON public.pgqueuer_log USING btree ((1)) WHERE (NOT aggregated);


--
-- Name: pgqueuer_log_status; Type: INDEX; Schema: public; Owner: -
--

CREATE INDEX pgqueuer_log_status ON public.pgqueuer_log USING btree (status);


--
-- Name: pgqueuer_picked_heartbeat_idx; Type: INDEX; Schema: public; Owner: -
--

CREATE INDEX pgqueuer_picked_heartbeat_idx ON public.pgqueuer USING btree (heartbeat) WHERE (status = 'picked'::public.pgqueuer_status);


--
-- Name: pgqueuer_picked_slot_idx; Type: INDEX; Schema: public; Owner: -
--

CREATE UNIQUE INDEX pgqueuer_picked_slot_idx ON public.pgqueuer USING btree (entrypoint, slot) WHERE ((status = 'picked'::public.pgqueuer_status) AND (slot IS NOT NULL));


--
-- Name: pgqueuer_priority_id_id1_idx; Type: INDEX; Schema: public; Owner: -
--

CREATE INDEX pgqueuer_priority_id_id1_idx ON public.pgqueuer USING btree (priority, id DESC) INCLUDE (id) WHERE (status = 'queued'::public.pgqueuer_status);


--
-- Name: pgqueuer_queue_manager_id_idx; Type: INDEX; Schema: public; Owner: -
--

CREATE INDEX pgqueuer_queue_manager_id_idx ON public.pgqueuer USING btree (queue_manager_id) WHERE (queue_manager_id IS NOT NULL);


--
-- Name: pgqueuer_statistics_unique_count; Type: INDEX; Schema: public; Owner: -
--

CREATE UNIQUE INDEX pgqueuer_statistics_unique_count ON public.pgqueuer_statistics USING btree (priority, date_trunc('sec'::text, timezone('UTC'::text, created)), status, entrypoint);


--
-- Name: pgqueuer_unique_dedupe_key; Type: INDEX; Schema: public; Owner: -
--

CREATE UNIQUE INDEX pgqueuer_unique_dedupe_key ON public.pgqueuer USING btree (dedupe_key) WHERE ((status = ANY (ARRAY['queued'::public.pgqueuer_status, 'picked'::public.pgqueuer_status])) AND (dedupe_key IS NOT NULL));


--
-- Name: pgqueuer_updated_id_id1_idx; Type: INDEX; Schema: public; Owner: -
--

CREATE INDEX pgqueuer_updated_id_id1_idx ON public.pgqueuer USING btree (updated, id DESC) INCLUDE (id) WHERE (status = 'picked'::public.pgqueuer_status);


--
-- Name: api_tokens_user; Type: INDEX; Schema: tuneplane; Owner: -
--

CREATE INDEX api_tokens_user ON tuneplane.api_tokens USING btree (user_id);


--
-- Name: artifact_verifications_artifact; Type: INDEX; Schema: tuneplane; Owner: -
--

CREATE INDEX artifact_verifications_artifact ON tuneplane.artifact_verifications USING btree (artifact_id, id DESC);


--
-- Name: artifacts_digest; Type: INDEX; Schema: tuneplane; Owner: -
--

CREATE INDEX artifacts_digest ON tuneplane.artifacts USING btree (manifest_digest) WHERE (state = 'complete'::text);


--
-- Name: artifacts_job; Type: INDEX; Schema: tuneplane; Owner: -
--

CREATE INDEX artifacts_job ON tuneplane.artifacts USING btree (job_id, name, attempt_id);


--
-- Name: attempts_one_live; Type: INDEX; Schema: tuneplane; Owner: -
--

CREATE UNIQUE INDEX attempts_one_live ON tuneplane.attempts USING btree (job_id) WHERE (state = ANY (ARRAY['reserved'::text, 'preparing'::text, 'running'::text, 'stopping'::text]));


--
-- Name: attempts_preparing; Type: INDEX; Schema: tuneplane; Owner: -
--

CREATE INDEX attempts_preparing ON tuneplane.attempts USING btree (prepare_deadline) WHERE (state = 'preparing'::text);


--
-- Name: attempts_rendezvous_live; Type: INDEX; Schema: tuneplane; Owner: -
--

CREATE UNIQUE INDEX attempts_rendezvous_live ON tuneplane.attempts USING btree (master_addr, master_port) WHERE (state = ANY (ARRAY['reserved'::text, 'preparing'::text, 'running'::text, 'stopping'::text]));


--
-- Name: confirmations_job; Type: INDEX; Schema: tuneplane; Owner: -
--

CREATE INDEX confirmations_job ON tuneplane.confirmations USING btree (job_id);


--
-- Name: gpu_allocations_active; Type: INDEX; Schema: tuneplane; Owner: -
--

CREATE UNIQUE INDEX gpu_allocations_active ON tuneplane.gpu_allocations USING btree (node_id, gpu_index) WHERE (released_at IS NULL);


--
-- Name: job_events_job; Type: INDEX; Schema: tuneplane; Owner: -
--

CREATE INDEX job_events_job ON tuneplane.job_events USING btree (job_id, id);


--
-- Name: jobs_owner; Type: INDEX; Schema: tuneplane; Owner: -
--

CREATE INDEX jobs_owner ON tuneplane.jobs USING btree (owner_id, id DESC);


--
-- Name: jobs_queued; Type: INDEX; Schema: tuneplane; Owner: -
--

CREATE INDEX jobs_queued ON tuneplane.jobs USING btree (fleet_id, priority DESC, id) WHERE (state = 'queued'::text);


--
-- Name: jobs_state; Type: INDEX; Schema: tuneplane; Owner: -
--

CREATE INDEX jobs_state ON tuneplane.jobs USING btree (state, id DESC);


--
-- Name: members_contact_lost; Type: INDEX; Schema: tuneplane; Owner: -
--

CREATE INDEX members_contact_lost ON tuneplane.members USING btree (node_id) WHERE (contact_lost_at IS NOT NULL);


--
-- Name: members_job; Type: INDEX; Schema: tuneplane; Owner: -
--

CREATE INDEX members_job ON tuneplane.members USING btree (job_id, attempt_id);


--
-- Name: members_node_held; Type: INDEX; Schema: tuneplane; Owner: -
--

CREATE INDEX members_node_held ON tuneplane.members USING btree (node_id) WHERE (released_at IS NULL);


--
-- Name: node_commands_pending; Type: INDEX; Schema: tuneplane; Owner: -
--

CREATE INDEX node_commands_pending ON tuneplane.node_commands USING btree (node_id, id) WHERE (acked_at IS NULL);


--
-- Name: node_credentials_node; Type: INDEX; Schema: tuneplane; Owner: -
--

CREATE INDEX node_credentials_node ON tuneplane.node_credentials USING btree (node_id, id);


--
-- Name: node_events_fleet; Type: INDEX; Schema: tuneplane; Owner: -
--

CREATE INDEX node_events_fleet ON tuneplane.node_events USING btree (fleet_id, id);


--
-- Name: node_events_node; Type: INDEX; Schema: tuneplane; Owner: -
--

CREATE INDEX node_events_node ON tuneplane.node_events USING btree (node_id, id);


--
-- Name: node_usage_fit; Type: INDEX; Schema: tuneplane; Owner: -
--

CREATE INDEX node_usage_fit ON tuneplane.node_usage USING btree (fleet_id, free_gpus, node_id);


--
-- Name: previews_owner; Type: INDEX; Schema: tuneplane; Owner: -
--

CREATE INDEX previews_owner ON tuneplane.previews USING btree (owner_id, created_at DESC);


--
-- Name: slurm_jobs_followed; Type: INDEX; Schema: tuneplane; Owner: -
--

CREATE INDEX slurm_jobs_followed ON tuneplane.slurm_jobs USING btree (fleet_id) WHERE (gone_at IS NULL);


--
-- Name: slurm_jobs_slurm_id; Type: INDEX; Schema: tuneplane; Owner: -
--

CREATE UNIQUE INDEX slurm_jobs_slurm_id ON tuneplane.slurm_jobs USING btree (fleet_id, slurm_job_id);


--
-- Name: telemetry_batches_received; Type: INDEX; Schema: tuneplane; Owner: -
--

CREATE INDEX telemetry_batches_received ON tuneplane.telemetry_batches USING btree (received_at);


--
-- Name: telemetry_points_series_step; Type: INDEX; Schema: tuneplane; Owner: -
--

CREATE INDEX telemetry_points_series_step ON tuneplane.telemetry_points USING btree (series_id, step);


--
-- Name: telemetry_series_canonical; Type: INDEX; Schema: tuneplane; Owner: -
--

CREATE INDEX telemetry_series_canonical ON tuneplane.telemetry_series USING btree (job_id, canonical);


--
-- Name: telemetry_series_last_at; Type: INDEX; Schema: tuneplane; Owner: -
--

CREATE INDEX telemetry_series_last_at ON tuneplane.telemetry_series USING btree (last_at);


--
-- Name: telemetry_tokens_scope; Type: INDEX; Schema: tuneplane; Owner: -
--

CREATE INDEX telemetry_tokens_scope ON tuneplane.telemetry_tokens USING btree (job_id, attempt, member_rank);


--
-- Name: v_fleet _RETURN; Type: RULE; Schema: tuneplane; Owner: -
--

CREATE OR REPLACE VIEW tuneplane.v_fleet AS
 SELECT f.id AS fleet_id,
    f.name AS fleet,
    f.backend,
    f.capabilities,
    (count(v.node_id) FILTER (WHERE (v.scheduling_state <> 'retired'::text)))::integer AS nodes,
    (count(*) FILTER (WHERE ((v.connectivity = 'connected'::text) AND (v.scheduling_state <> 'retired'::text))))::integer AS connected,
    (count(*) FILTER (WHERE ((v.connectivity = 'stale'::text) AND (v.scheduling_state <> 'retired'::text))))::integer AS stale,
    (count(*) FILTER (WHERE ((v.connectivity = 'lost'::text) AND (v.scheduling_state <> 'retired'::text))))::integer AS lost,
    (count(*) FILTER (WHERE (v.scheduling_state = 'active'::text)))::integer AS active,
    (count(*) FILTER (WHERE (v.scheduling_state = 'cordoned'::text)))::integer AS cordoned,
    (count(*) FILTER (WHERE (v.scheduling_state = 'draining'::text)))::integer AS draining,
    (count(*) FILTER (WHERE (v.scheduling_state = 'retired'::text)))::integer AS retired,
    (COALESCE(sum(v.gpus) FILTER (WHERE (v.scheduling_state <> 'retired'::text)), (0)::bigint))::integer AS gpus,
    (COALESCE(sum(v.simulated_gpus) FILTER (WHERE (v.scheduling_state <> 'retired'::text)), (0)::bigint))::integer AS simulated_gpus,
    (COALESCE(sum(v.gpus) FILTER (WHERE ((v.scheduling_state = 'active'::text) AND (v.connectivity = 'connected'::text) AND (v.fenced_at IS NULL))), (0)::bigint))::integer AS schedulable_gpus,
    (COALESCE(sum(v.allocated_gpus), (0)::bigint))::integer AS allocated_gpus,
    (COALESCE(sum(v.cpus) FILTER (WHERE (v.scheduling_state <> 'retired'::text)), (0)::bigint))::integer AS cpus,
    (COALESCE(sum(v.memory_bytes) FILTER (WHERE (v.scheduling_state <> 'retired'::text)), (0)::numeric))::bigint AS memory_bytes,
    f.created_at,
    (count(*) FILTER (WHERE ((v.fenced_at IS NOT NULL) AND (v.scheduling_state <> 'retired'::text))))::integer AS fenced
   FROM (tuneplane.fleets f
     LEFT JOIN tuneplane.v_nodes v ON ((v.fleet_id = f.id)))
  GROUP BY f.id;


--
-- Name: pgqueuer tg_pgqueuer_changed; Type: TRIGGER; Schema: public; Owner: -
--

CREATE TRIGGER tg_pgqueuer_changed AFTER INSERT OR DELETE OR UPDATE OR TRUNCATE ON public.pgqueuer FOR EACH STATEMENT EXECUTE FUNCTION public.fn_pgqueuer_changed();


--
-- Name: artifact_files artifact_files_guard_change; Type: TRIGGER; Schema: tuneplane; Owner: -
--

CREATE TRIGGER artifact_files_guard_change BEFORE DELETE OR UPDATE ON tuneplane.artifact_files FOR EACH ROW EXECUTE FUNCTION tuneplane.artifact_files_guard_change();


--
-- Name: artifact_files artifact_files_no_truncate; Type: TRIGGER; Schema: tuneplane; Owner: -
--

CREATE TRIGGER artifact_files_no_truncate BEFORE TRUNCATE ON tuneplane.artifact_files FOR EACH STATEMENT EXECUTE FUNCTION tuneplane.refuse_change();


--
-- Name: artifacts artifacts_guard_change; Type: TRIGGER; Schema: tuneplane; Owner: -
--

CREATE TRIGGER artifacts_guard_change BEFORE DELETE OR UPDATE ON tuneplane.artifacts FOR EACH ROW EXECUTE FUNCTION tuneplane.artifacts_guard_change();


--
-- Name: artifacts artifacts_no_truncate; Type: TRIGGER; Schema: tuneplane; Owner: -
--

CREATE TRIGGER artifacts_no_truncate BEFORE TRUNCATE ON tuneplane.artifacts FOR EACH STATEMENT EXECUTE FUNCTION tuneplane.refuse_change();


--
-- Name: members artifacts_of_lost_member; Type: TRIGGER; Schema: tuneplane; Owner: -
--

CREATE TRIGGER artifacts_of_lost_member AFTER UPDATE OF state ON tuneplane.members FOR EACH ROW WHEN (((new.state = 'lost'::text) AND (old.state IS DISTINCT FROM 'lost'::text))) EXECUTE FUNCTION tuneplane.artifacts_of_lost_member();


--
-- Name: attempts attempts_state_transition; Type: TRIGGER; Schema: tuneplane; Owner: -
--

CREATE TRIGGER attempts_state_transition BEFORE UPDATE OF state ON tuneplane.attempts FOR EACH ROW EXECUTE FUNCTION tuneplane.guard_state_transition();


--
-- Name: jobs jobs_event_on_change; Type: TRIGGER; Schema: tuneplane; Owner: -
--

CREATE TRIGGER jobs_event_on_change AFTER UPDATE OF state, state_reason ON tuneplane.jobs FOR EACH ROW WHEN (((old.state IS DISTINCT FROM new.state) OR (old.state_reason IS DISTINCT FROM new.state_reason))) EXECUTE FUNCTION tuneplane.jobs_record_event();


--
-- Name: jobs jobs_event_on_insert; Type: TRIGGER; Schema: tuneplane; Owner: -
--

CREATE TRIGGER jobs_event_on_insert AFTER INSERT ON tuneplane.jobs FOR EACH ROW EXECUTE FUNCTION tuneplane.jobs_record_event();


--
-- Name: jobs jobs_guard_change; Type: TRIGGER; Schema: tuneplane; Owner: -
--

CREATE TRIGGER jobs_guard_change BEFORE UPDATE ON tuneplane.jobs FOR EACH ROW EXECUTE FUNCTION tuneplane.jobs_guard_change();


--
-- Name: jobs jobs_state_transition; Type: TRIGGER; Schema: tuneplane; Owner: -
--

CREATE TRIGGER jobs_state_transition BEFORE UPDATE OF state ON tuneplane.jobs FOR EACH ROW EXECUTE FUNCTION tuneplane.guard_state_transition();


--
-- Name: launch_decisions launch_decisions_immutable; Type: TRIGGER; Schema: tuneplane; Owner: -
--

CREATE TRIGGER launch_decisions_immutable BEFORE DELETE OR UPDATE ON tuneplane.launch_decisions FOR EACH ROW EXECUTE FUNCTION tuneplane.refuse_change();


--
-- Name: launch_decisions launch_decisions_no_truncate; Type: TRIGGER; Schema: tuneplane; Owner: -
--

CREATE TRIGGER launch_decisions_no_truncate BEFORE TRUNCATE ON tuneplane.launch_decisions FOR EACH STATEMENT EXECUTE FUNCTION tuneplane.refuse_change();


--
-- Name: members members_state_transition; Type: TRIGGER; Schema: tuneplane; Owner: -
--

CREATE TRIGGER members_state_transition BEFORE UPDATE OF state ON tuneplane.members FOR EACH ROW EXECUTE FUNCTION tuneplane.guard_state_transition();


--
-- Name: node_gpus node_usage_on_gpu_delete; Type: TRIGGER; Schema: tuneplane; Owner: -
--

CREATE TRIGGER node_usage_on_gpu_delete AFTER DELETE ON tuneplane.node_gpus REFERENCING OLD TABLE AS changed FOR EACH STATEMENT EXECUTE FUNCTION tuneplane.node_usage_follow_gpus();


--
-- Name: node_gpus node_usage_on_gpu_insert; Type: TRIGGER; Schema: tuneplane; Owner: -
--

CREATE TRIGGER node_usage_on_gpu_insert AFTER INSERT ON tuneplane.node_gpus REFERENCING NEW TABLE AS changed FOR EACH STATEMENT EXECUTE FUNCTION tuneplane.node_usage_follow_gpus();


--
-- Name: nodes node_usage_on_node; Type: TRIGGER; Schema: tuneplane; Owner: -
--

CREATE TRIGGER node_usage_on_node AFTER INSERT ON tuneplane.nodes FOR EACH ROW EXECUTE FUNCTION tuneplane.node_usage_follow_nodes();


--
-- Name: previews previews_immutable; Type: TRIGGER; Schema: tuneplane; Owner: -
--

CREATE TRIGGER previews_immutable BEFORE DELETE OR UPDATE ON tuneplane.previews FOR EACH ROW EXECUTE FUNCTION tuneplane.refuse_change();


--
-- Name: previews previews_no_truncate; Type: TRIGGER; Schema: tuneplane; Owner: -
--

CREATE TRIGGER previews_no_truncate BEFORE TRUNCATE ON tuneplane.previews FOR EACH STATEMENT EXECUTE FUNCTION tuneplane.refuse_change();


--
-- Name: members telemetry_member_ended; Type: TRIGGER; Schema: tuneplane; Owner: -
--

CREATE TRIGGER telemetry_member_ended AFTER UPDATE OF state ON tuneplane.members FOR EACH ROW EXECUTE FUNCTION tuneplane.telemetry_member_ended();


--
-- Name: nodes telemetry_node_fenced; Type: TRIGGER; Schema: tuneplane; Owner: -
--

CREATE TRIGGER telemetry_node_fenced AFTER UPDATE OF fenced_at ON tuneplane.nodes FOR EACH ROW EXECUTE FUNCTION tuneplane.telemetry_node_fenced();


--
-- Name: api_tokens api_tokens_user_id_fkey; Type: FK CONSTRAINT; Schema: tuneplane; Owner: -
--

ALTER TABLE ONLY tuneplane.api_tokens
    ADD CONSTRAINT api_tokens_user_id_fkey FOREIGN KEY (user_id) REFERENCES tuneplane.users(id);


--
-- Name: artifact_chunks artifact_chunks_artifact_id_file_index_fkey; Type: FK CONSTRAINT; Schema: tuneplane; Owner: -
--

ALTER TABLE ONLY tuneplane.artifact_chunks
    ADD CONSTRAINT artifact_chunks_artifact_id_file_index_fkey FOREIGN KEY (artifact_id, file_index) REFERENCES tuneplane.artifact_files(artifact_id, file_index) ON DELETE CASCADE;


--
-- Name: artifact_files artifact_files_artifact_id_fkey; Type: FK CONSTRAINT; Schema: tuneplane; Owner: -
--

ALTER TABLE ONLY tuneplane.artifact_files
    ADD CONSTRAINT artifact_files_artifact_id_fkey FOREIGN KEY (artifact_id) REFERENCES tuneplane.artifacts(id);


--
-- Name: artifact_verifications artifact_verifications_artifact_id_fkey; Type: FK CONSTRAINT; Schema: tuneplane; Owner: -
--

ALTER TABLE ONLY tuneplane.artifact_verifications
    ADD CONSTRAINT artifact_verifications_artifact_id_fkey FOREIGN KEY (artifact_id) REFERENCES tuneplane.artifacts(id);


--
-- Name: artifacts artifacts_attempt_id_fkey; Type: FK CONSTRAINT; Schema: tuneplane; Owner: -
--

ALTER TABLE ONLY tuneplane.artifacts
    ADD CONSTRAINT artifacts_attempt_id_fkey FOREIGN KEY (attempt_id) REFERENCES tuneplane.attempts(id);


--
-- Name: artifacts artifacts_job_id_fkey; Type: FK CONSTRAINT; Schema: tuneplane; Owner: -
--

ALTER TABLE ONLY tuneplane.artifacts
    ADD CONSTRAINT artifacts_job_id_fkey FOREIGN KEY (job_id) REFERENCES tuneplane.jobs(id);


--
-- Name: artifacts artifacts_member_id_fkey; Type: FK CONSTRAINT; Schema: tuneplane; Owner: -
--

ALTER TABLE ONLY tuneplane.artifacts
    ADD CONSTRAINT artifacts_member_id_fkey FOREIGN KEY (member_id) REFERENCES tuneplane.members(id);


--
-- Name: attempts attempts_fleet_id_fkey; Type: FK CONSTRAINT; Schema: tuneplane; Owner: -
--

ALTER TABLE ONLY tuneplane.attempts
    ADD CONSTRAINT attempts_fleet_id_fkey FOREIGN KEY (fleet_id) REFERENCES tuneplane.fleets(id);


--
-- Name: attempts attempts_job_id_fkey; Type: FK CONSTRAINT; Schema: tuneplane; Owner: -
--

ALTER TABLE ONLY tuneplane.attempts
    ADD CONSTRAINT attempts_job_id_fkey FOREIGN KEY (job_id) REFERENCES tuneplane.jobs(id);


--
-- Name: confirmations confirmations_job_id_fkey; Type: FK CONSTRAINT; Schema: tuneplane; Owner: -
--

ALTER TABLE ONLY tuneplane.confirmations
    ADD CONSTRAINT confirmations_job_id_fkey FOREIGN KEY (job_id) REFERENCES tuneplane.jobs(id) DEFERRABLE INITIALLY DEFERRED;


--
-- Name: confirmations confirmations_owner_id_fkey; Type: FK CONSTRAINT; Schema: tuneplane; Owner: -
--

ALTER TABLE ONLY tuneplane.confirmations
    ADD CONSTRAINT confirmations_owner_id_fkey FOREIGN KEY (owner_id) REFERENCES tuneplane.users(id);


--
-- Name: confirmations confirmations_preview_id_fkey; Type: FK CONSTRAINT; Schema: tuneplane; Owner: -
--

ALTER TABLE ONLY tuneplane.confirmations
    ADD CONSTRAINT confirmations_preview_id_fkey FOREIGN KEY (preview_id) REFERENCES tuneplane.previews(id);


--
-- Name: enrollment_tokens enrollment_tokens_fleet_id_fkey; Type: FK CONSTRAINT; Schema: tuneplane; Owner: -
--

ALTER TABLE ONLY tuneplane.enrollment_tokens
    ADD CONSTRAINT enrollment_tokens_fleet_id_fkey FOREIGN KEY (fleet_id) REFERENCES tuneplane.fleets(id);


--
-- Name: enrollment_tokens enrollment_tokens_used_by_node_fkey; Type: FK CONSTRAINT; Schema: tuneplane; Owner: -
--

ALTER TABLE ONLY tuneplane.enrollment_tokens
    ADD CONSTRAINT enrollment_tokens_used_by_node_fkey FOREIGN KEY (used_by_node) REFERENCES tuneplane.nodes(id);


--
-- Name: fleets fleets_created_by_fkey; Type: FK CONSTRAINT; Schema: tuneplane; Owner: -
--

ALTER TABLE ONLY tuneplane.fleets
    ADD CONSTRAINT fleets_created_by_fkey FOREIGN KEY (created_by) REFERENCES tuneplane.users(id);


--
-- Name: gpu_allocations gpu_allocations_member_id_fkey; Type: FK CONSTRAINT; Schema: tuneplane; Owner: -
--

ALTER TABLE ONLY tuneplane.gpu_allocations
    ADD CONSTRAINT gpu_allocations_member_id_fkey FOREIGN KEY (member_id) REFERENCES tuneplane.members(id);


--
-- Name: gpu_allocations gpu_allocations_node_id_fkey; Type: FK CONSTRAINT; Schema: tuneplane; Owner: -
--

ALTER TABLE ONLY tuneplane.gpu_allocations
    ADD CONSTRAINT gpu_allocations_node_id_fkey FOREIGN KEY (node_id) REFERENCES tuneplane.nodes(id);


--
-- Name: job_events job_events_job_id_fkey; Type: FK CONSTRAINT; Schema: tuneplane; Owner: -
--

ALTER TABLE ONLY tuneplane.job_events
    ADD CONSTRAINT job_events_job_id_fkey FOREIGN KEY (job_id) REFERENCES tuneplane.jobs(id);


--
-- Name: jobs jobs_fleet_id_fkey; Type: FK CONSTRAINT; Schema: tuneplane; Owner: -
--

ALTER TABLE ONLY tuneplane.jobs
    ADD CONSTRAINT jobs_fleet_id_fkey FOREIGN KEY (fleet_id) REFERENCES tuneplane.fleets(id);


--
-- Name: jobs jobs_owner_id_fkey; Type: FK CONSTRAINT; Schema: tuneplane; Owner: -
--

ALTER TABLE ONLY tuneplane.jobs
    ADD CONSTRAINT jobs_owner_id_fkey FOREIGN KEY (owner_id) REFERENCES tuneplane.users(id);


--
-- Name: jobs jobs_preview_id_fkey; Type: FK CONSTRAINT; Schema: tuneplane; Owner: -
--

ALTER TABLE ONLY tuneplane.jobs
    ADD CONSTRAINT jobs_preview_id_fkey FOREIGN KEY (preview_id) REFERENCES tuneplane.previews(id);


--
-- Name: launch_decisions launch_decisions_attempt_id_fkey; Type: FK CONSTRAINT; Schema: tuneplane; Owner: -
--

ALTER TABLE ONLY tuneplane.launch_decisions
    ADD CONSTRAINT launch_decisions_attempt_id_fkey FOREIGN KEY (attempt_id) REFERENCES tuneplane.attempts(id);


--
-- Name: member_log_chunks member_log_chunks_member_id_stream_fkey; Type: FK CONSTRAINT; Schema: tuneplane; Owner: -
--

ALTER TABLE ONLY tuneplane.member_log_chunks
    ADD CONSTRAINT member_log_chunks_member_id_stream_fkey FOREIGN KEY (member_id, stream) REFERENCES tuneplane.member_log_streams(member_id, stream);


--
-- Name: member_log_streams member_log_streams_member_id_fkey; Type: FK CONSTRAINT; Schema: tuneplane; Owner: -
--

ALTER TABLE ONLY tuneplane.member_log_streams
    ADD CONSTRAINT member_log_streams_member_id_fkey FOREIGN KEY (member_id) REFERENCES tuneplane.members(id);


--
-- Name: members members_attempt_id_fkey; Type: FK CONSTRAINT; Schema: tuneplane; Owner: -
--

ALTER TABLE ONLY tuneplane.members
    ADD CONSTRAINT members_attempt_id_fkey FOREIGN KEY (attempt_id) REFERENCES tuneplane.attempts(id);


--
-- Name: members members_job_id_fkey; Type: FK CONSTRAINT; Schema: tuneplane; Owner: -
--

ALTER TABLE ONLY tuneplane.members
    ADD CONSTRAINT members_job_id_fkey FOREIGN KEY (job_id) REFERENCES tuneplane.jobs(id);


--
-- Name: members members_node_id_fkey; Type: FK CONSTRAINT; Schema: tuneplane; Owner: -
--

ALTER TABLE ONLY tuneplane.members
    ADD CONSTRAINT members_node_id_fkey FOREIGN KEY (node_id) REFERENCES tuneplane.nodes(id);


--
-- Name: node_commands node_commands_node_id_fkey; Type: FK CONSTRAINT; Schema: tuneplane; Owner: -
--

ALTER TABLE ONLY tuneplane.node_commands
    ADD CONSTRAINT node_commands_node_id_fkey FOREIGN KEY (node_id) REFERENCES tuneplane.nodes(id);


--
-- Name: node_credentials node_credentials_node_id_fkey; Type: FK CONSTRAINT; Schema: tuneplane; Owner: -
--

ALTER TABLE ONLY tuneplane.node_credentials
    ADD CONSTRAINT node_credentials_node_id_fkey FOREIGN KEY (node_id) REFERENCES tuneplane.nodes(id);


--
-- Name: node_events node_events_fleet_id_fkey; Type: FK CONSTRAINT; Schema: tuneplane; Owner: -
--

ALTER TABLE ONLY tuneplane.node_events
    ADD CONSTRAINT node_events_fleet_id_fkey FOREIGN KEY (fleet_id) REFERENCES tuneplane.fleets(id);


--
-- Name: node_events node_events_node_id_fkey; Type: FK CONSTRAINT; Schema: tuneplane; Owner: -
--

ALTER TABLE ONLY tuneplane.node_events
    ADD CONSTRAINT node_events_node_id_fkey FOREIGN KEY (node_id) REFERENCES tuneplane.nodes(id);


--
-- Name: node_gpus node_gpus_node_id_fkey; Type: FK CONSTRAINT; Schema: tuneplane; Owner: -
--

ALTER TABLE ONLY tuneplane.node_gpus
    ADD CONSTRAINT node_gpus_node_id_fkey FOREIGN KEY (node_id) REFERENCES tuneplane.nodes(id) ON DELETE CASCADE;


--
-- Name: node_usage node_usage_node_id_fkey; Type: FK CONSTRAINT; Schema: tuneplane; Owner: -
--

ALTER TABLE ONLY tuneplane.node_usage
    ADD CONSTRAINT node_usage_node_id_fkey FOREIGN KEY (node_id) REFERENCES tuneplane.nodes(id) ON DELETE CASCADE;


--
-- Name: nodes nodes_fleet_id_fkey; Type: FK CONSTRAINT; Schema: tuneplane; Owner: -
--

ALTER TABLE ONLY tuneplane.nodes
    ADD CONSTRAINT nodes_fleet_id_fkey FOREIGN KEY (fleet_id) REFERENCES tuneplane.fleets(id);


--
-- Name: previews previews_owner_id_fkey; Type: FK CONSTRAINT; Schema: tuneplane; Owner: -
--

ALTER TABLE ONLY tuneplane.previews
    ADD CONSTRAINT previews_owner_id_fkey FOREIGN KEY (owner_id) REFERENCES tuneplane.users(id);


--
-- Name: slurm_fleets slurm_fleets_fleet_id_fkey; Type: FK CONSTRAINT; Schema: tuneplane; Owner: -
--

ALTER TABLE ONLY tuneplane.slurm_fleets
    ADD CONSTRAINT slurm_fleets_fleet_id_fkey FOREIGN KEY (fleet_id) REFERENCES tuneplane.fleets(id);


--
-- Name: slurm_jobs slurm_jobs_attempt_id_fkey; Type: FK CONSTRAINT; Schema: tuneplane; Owner: -
--

ALTER TABLE ONLY tuneplane.slurm_jobs
    ADD CONSTRAINT slurm_jobs_attempt_id_fkey FOREIGN KEY (attempt_id) REFERENCES tuneplane.attempts(id);


--
-- Name: slurm_jobs slurm_jobs_fleet_id_fkey; Type: FK CONSTRAINT; Schema: tuneplane; Owner: -
--

ALTER TABLE ONLY tuneplane.slurm_jobs
    ADD CONSTRAINT slurm_jobs_fleet_id_fkey FOREIGN KEY (fleet_id) REFERENCES tuneplane.fleets(id);


--
-- Name: slurm_jobs slurm_jobs_job_id_fkey; Type: FK CONSTRAINT; Schema: tuneplane; Owner: -
--

ALTER TABLE ONLY tuneplane.slurm_jobs
    ADD CONSTRAINT slurm_jobs_job_id_fkey FOREIGN KEY (job_id) REFERENCES tuneplane.jobs(id);


--
-- Name: slurm_nodes slurm_nodes_node_id_fkey; Type: FK CONSTRAINT; Schema: tuneplane; Owner: -
--

ALTER TABLE ONLY tuneplane.slurm_nodes
    ADD CONSTRAINT slurm_nodes_node_id_fkey FOREIGN KEY (node_id) REFERENCES tuneplane.nodes(id) ON DELETE CASCADE;


--
-- Name: source_archive_uploads source_archive_uploads_sha256_fkey; Type: FK CONSTRAINT; Schema: tuneplane; Owner: -
--

ALTER TABLE ONLY tuneplane.source_archive_uploads
    ADD CONSTRAINT source_archive_uploads_sha256_fkey FOREIGN KEY (sha256) REFERENCES tuneplane.source_archives(sha256);


--
-- Name: source_archive_uploads source_archive_uploads_user_id_fkey; Type: FK CONSTRAINT; Schema: tuneplane; Owner: -
--

ALTER TABLE ONLY tuneplane.source_archive_uploads
    ADD CONSTRAINT source_archive_uploads_user_id_fkey FOREIGN KEY (user_id) REFERENCES tuneplane.users(id);


--
-- Name: user_limits user_limits_user_id_fkey; Type: FK CONSTRAINT; Schema: tuneplane; Owner: -
--

ALTER TABLE ONLY tuneplane.user_limits
    ADD CONSTRAINT user_limits_user_id_fkey FOREIGN KEY (user_id) REFERENCES tuneplane.users(id);


--
-- PostgreSQL database dump complete
--

\unrestrict nKeTYwoxRoosMTQ34vuCkiySiIItRwmq4aegMvazn7GPkWnQ4FFUGFGj2uEig15

