-- sql/functions/nodes.sql — the current definition of every nodes function, view and trigger.
-- Nodes: enrollment, control credentials and rotation, control sessions and their epochs, the command
-- outbox, heartbeats and connectivity, scheduling state (cordon/drain/retire/fence), node views.
--
-- Lock order: launch.sql's (its header lists every step and what each function may lock). Two functions
-- here lock jobs, and follow it: ack_node_command (session lock shared → launch_command_locks: the jobs,
-- attempts and members of the command's members → usage rows → the command row) and retire
-- (change_node_scheduling: the fleet's placement lock → lock_node_rows: jobs → attempts → members → the
-- node row → usage rows → leaf rows). Every other function here locks at most the node row (cordon, drain,
-- uncordon FOR UPDATE; heartbeats, session open/close, capacity FOR NO KEY UPDATE, capacity then its
-- node_usage row through node_gpus' trigger) or the fleet row (set_fleet_storage FOR NO KEY UPDATE, as
-- teams.sql's fleet writers: the KEY SHARE of a node or job inserted meanwhile still passes), credential
-- or token rows, and inserts leaf rows (events, commands) while holding no lock of a job. claim_node_commands and claim_sessions_commands take session
-- locks (shared, in node id order) and command rows SKIP LOCKED, nothing else.
--
-- Repeatable file (ADR 0012): `tuneplane db migrate` re-applies every file of sql/functions/ (in the order
-- of order.txt, one transaction) whenever one changes. Edit definitions here, never in a migration.
-- Tables, columns and data changes go in a new numbered migration. A changed signature or a view whose
-- columns change: add its DROP below (it runs before the new definition is created), e.g.
--   DROP FUNCTION IF EXISTS tuneplane.f(bigint, text);
--
-- Drops (signature changes):
DROP FUNCTION IF EXISTS tuneplane.ack_node_command(bigint, bigint, jsonb, text);

-- node_connectivity: connected | stale | lost from a heartbeat time (NULL = never heard from = lost).
CREATE OR REPLACE FUNCTION tuneplane.node_connectivity(p_last_heartbeat_at timestamptz)
RETURNS text
LANGUAGE sql STABLE AS $$
    SELECT CASE
        WHEN p_last_heartbeat_at IS NULL THEN 'lost'
        WHEN now() - p_last_heartbeat_at < s.stale_after THEN 'connected'
        WHEN now() - p_last_heartbeat_at < s.lost_after THEN 'stale'
        ELSE 'lost'
    END
    FROM tuneplane.node_settings s;
$$;

-- node_fresh_since: the oldest heartbeat that still counts as connected (now - node_settings.stale_after).
-- Read it once per statement — `(SELECT tuneplane.node_fresh_since())` is evaluated once — and pass it to
-- node_is_connected.
CREATE OR REPLACE FUNCTION tuneplane.node_fresh_since()
RETURNS timestamptz
LANGUAGE sql STABLE AS $$
    SELECT now() - s.stale_after FROM tuneplane.node_settings s;
$$;

-- node_is_connected: the one rule for a node that may take new work now: connected (its agent heard
-- after p_fresh_since, node_fresh_since(); the same line node_connectivity draws for 'connected'),
-- active (not cordoned, draining or retired) and not fenced. Placement, its free-capacity and best-fit
-- reads all ask this. It reads only its arguments, so PostgreSQL inlines it: a row lock or an index on
-- the node's columns works as if the condition were written out.
CREATE OR REPLACE FUNCTION tuneplane.node_is_connected(p_node tuneplane.nodes, p_fresh_since timestamptz)
RETURNS boolean
LANGUAGE sql STABLE AS $$
    SELECT coalesce((p_node).scheduling_state = 'active' AND (p_node).fenced_at IS NULL
                    AND (p_node).last_heartbeat_at > p_fresh_since, false);
$$;

-- configure_node_settings: change thresholds; NULL keeps a value. Refuses an inconsistent set
-- (stale must exceed the heartbeat interval, lost must exceed stale).
CREATE OR REPLACE FUNCTION tuneplane.configure_node_settings(
    p_heartbeat_interval interval DEFAULT NULL,
    p_stale_after interval DEFAULT NULL,
    p_lost_after interval DEFAULT NULL,
    p_credential_rotate_after interval DEFAULT NULL,
    p_credential_grace interval DEFAULT NULL)
RETURNS tuneplane.node_settings
LANGUAGE plpgsql AS $$
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

-- log_node_event: the one writer of node_events.
CREATE OR REPLACE FUNCTION tuneplane.log_node_event(p_fleet_id bigint, p_node_id bigint, p_kind text, p_actor text,
                                         p_reason text DEFAULT '', p_details jsonb DEFAULT '{}'::jsonb)
RETURNS bigint
LANGUAGE sql AS $$
    INSERT INTO tuneplane.node_events (fleet_id, node_id, kind, actor, reason, details)
    VALUES (coalesce(p_fleet_id, (SELECT fleet_id FROM tuneplane.nodes WHERE id = p_node_id)),
            p_node_id, p_kind, coalesce(nullif(p_actor, ''), 'db:' || session_user),
            coalesce(p_reason, ''), coalesce(p_details, '{}'::jsonb))
    RETURNING id;
$$;

-- create_fleet: a new fleet. Refuses a malformed or taken name and an empty backend.
CREATE OR REPLACE FUNCTION tuneplane.create_fleet(p_name text, p_backend text, p_capabilities jsonb DEFAULT '{}'::jsonb,
                                       p_created_by bigint DEFAULT NULL)
RETURNS tuneplane.fleets
LANGUAGE plpgsql AS $$
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
$$;

-- fleet_storage: the S3 store of the fleet named p_fleet (fleets.storage, migration 0245), where the source
-- archives uploaded for it are kept (POST /sources?fleet=…, issue 32); NULL for the server's own store.
-- Never credentials. Refuses an unknown fleet (404).
CREATE OR REPLACE FUNCTION tuneplane.fleet_storage(p_fleet text)
RETURNS jsonb
LANGUAGE plpgsql STABLE AS $$
DECLARE
    f tuneplane.fleets;
BEGIN
    SELECT * INTO f FROM tuneplane.fleets WHERE name = p_fleet;
    IF f.id IS NULL THEN
        RAISE EXCEPTION 'no fleet named %', p_fleet USING ERRCODE = 'TP404', COLUMN = 'fleet';
    END IF;
    RETURN CASE WHEN f.storage ->> 'kind' = 's3' THEN f.storage END;
END;
$$;

-- set_fleet_storage: where a fleet's artifact bytes live (migration 0245). NULL or {"kind": "filesystem"}: the
-- installation's default store. {"kind": "s3", "bucket", "prefix", "endpoint", "region", "addressing_style"}:
-- an S3 API. Any other key is refused, so credentials can never be stored here (the server holds them).
-- The store of a fleet that holds artifacts cannot change: their bytes are looked for in their fleet's store
-- (artifact_storage), so a change would lose them from sight (409; a new fleet for the new store). A live
-- attempt's capsule written to the old store is fetched again or rebuilt by its relaunch. (An artifact
-- registered in the same instant as the change is not seen by the count: registration takes no lock of the
-- fleet; a change of store is an operator's rare act.) Locks the fleet row FOR NO KEY UPDATE (no key
-- changes: nodes enrolled and jobs placed meanwhile go on).
CREATE OR REPLACE FUNCTION tuneplane.set_fleet_storage(p_fleet text, p_storage jsonb, p_actor text DEFAULT NULL)
RETURNS tuneplane.fleets
LANGUAGE plpgsql AS $$
DECLARE
    f tuneplane.fleets;
    extra text;
    held bigint;
    kind text := coalesce(p_storage ->> 'kind', 'filesystem');
BEGIN
    SELECT * INTO f FROM tuneplane.fleets WHERE name = p_fleet FOR NO KEY UPDATE;
    IF f.id IS NULL THEN
        RAISE EXCEPTION 'no fleet named %', p_fleet USING ERRCODE = 'TP404', COLUMN = 'fleet';
    END IF;
    IF p_storage IS NOT NULL AND jsonb_typeof(p_storage) <> 'object' THEN
        RAISE EXCEPTION 'storage must be a JSON object' USING ERRCODE = 'TP400', COLUMN = 'storage';
    END IF;
    IF kind NOT IN ('filesystem', 's3') THEN
        RAISE EXCEPTION 'storage kind must be filesystem or s3, not %', kind USING ERRCODE = 'TP400', COLUMN = 'storage';
    END IF;
    SELECT k INTO extra FROM jsonb_object_keys(coalesce(p_storage, '{}'::jsonb)) k
     WHERE k NOT IN ('kind', 'bucket', 'prefix', 'endpoint', 'region', 'addressing_style') LIMIT 1;
    IF extra IS NOT NULL THEN
        RAISE EXCEPTION 'storage has no field % (credentials are the server''s, never a fleet''s)', extra
            USING ERRCODE = 'TP400', COLUMN = 'storage';
    END IF;
    IF kind = 's3' THEN
        IF coalesce(p_storage ->> 'bucket', '') !~ '^[a-z0-9][a-z0-9.\-]{1,61}[a-z0-9]$' THEN
            RAISE EXCEPTION 'storage bucket must be an S3 bucket name' USING ERRCODE = 'TP400', COLUMN = 'storage';
        END IF;
        IF coalesce(p_storage ->> 'endpoint', 'https://x') !~ '^https?://[^\s/]+(/\S*)?$' THEN
            RAISE EXCEPTION 'storage endpoint must be an http(s) URL' USING ERRCODE = 'TP400', COLUMN = 'storage';
        END IF;
        -- Nodes fetch capsules, inputs and resume checkpoints from the store and refuse plain HTTP to anything
        -- but loopback (app/client/transport.py): such a fleet could upload but never launch or resume.
        IF p_storage ->> 'endpoint' ~ '^http://'
           AND p_storage ->> 'endpoint' !~ '^http://(127\.[0-9]+\.[0-9]+\.[0-9]+|localhost|\[::1\])(:[0-9]+)?(/|$)' THEN
            RAISE EXCEPTION 'storage endpoint %: plain http:// only to a loopback address (nodes refuse it elsewhere); use https://',
                p_storage ->> 'endpoint' USING ERRCODE = 'TP400', COLUMN = 'storage';
        END IF;
        IF coalesce(p_storage ->> 'addressing_style', 'path') NOT IN ('path', 'virtual', 'auto') THEN
            RAISE EXCEPTION 'storage addressing_style must be path, virtual or auto'
                USING ERRCODE = 'TP400', COLUMN = 'storage';
        END IF;
        IF coalesce(p_storage ->> 'prefix', '') ~ '(^/|(^|/)\.\.(/|$))' THEN
            RAISE EXCEPTION 'storage prefix must be relative, without ..' USING ERRCODE = 'TP400', COLUMN = 'storage';
        END IF;
        IF coalesce(p_storage ->> 'region', 'us-east-1') !~ '^[a-z0-9][a-z0-9-]{0,62}$' THEN
            RAISE EXCEPTION 'storage region must be a region name (lower-case letters, digits, -)'
                USING ERRCODE = 'TP400', COLUMN = 'storage';
        END IF;
    END IF;
    IF (CASE WHEN kind = 'filesystem' THEN NULL ELSE p_storage END) IS DISTINCT FROM f.storage THEN
        SELECT count(*) INTO held FROM tuneplane.artifacts a JOIN tuneplane.attempts t ON t.id = a.attempt_id
         WHERE t.fleet_id = f.id;
        IF held > 0 THEN
            RAISE EXCEPTION 'fleet % holds % artifact(s) in its store (%): a fleet''s store changes only while '
                            'it holds none; create a new fleet for the new store',
                            f.name, held,
                            coalesce('s3://' || (f.storage ->> 'bucket') || '/' || coalesce(f.storage ->> 'prefix', ''),
                                     'filesystem')
                USING ERRCODE = 'TP409', COLUMN = 'storage';
        END IF;
    END IF;
    UPDATE tuneplane.fleets SET storage = CASE WHEN kind = 'filesystem' THEN NULL ELSE p_storage END
     WHERE id = f.id RETURNING * INTO f;
    PERFORM tuneplane.log_node_event(f.id, NULL, 'fleet_storage', p_actor,
                                     CASE WHEN kind = 's3' THEN 's3://' || (p_storage ->> 'bucket') || '/'
                                          || coalesce(p_storage ->> 'prefix', '') ELSE 'filesystem' END);
    RETURN f;
END;
$$;

-- create_enrollment_token: stores the hash of a one-time token for a node fleet. Refuses an unknown
-- fleet, a fleet whose backend is not `node`, and a TTL that is not positive or exceeds the maximum.
CREATE OR REPLACE FUNCTION tuneplane.create_enrollment_token(p_fleet text, p_token_hash text, p_ttl interval,
                                                  p_created_by text DEFAULT NULL)
RETURNS TABLE (token_id bigint, fleet text, expires_at timestamptz)
LANGUAGE plpgsql AS $$
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
                                     -- read on the Fleet page: a minute in UTC, not timestamptz's text
                                     'expires ' || to_char(tok.expires_at AT TIME ZONE 'UTC', 'YYYY-MM-DD HH24:MI "UTC"'),
                                     jsonb_build_object('token_id', tok.id));
    RETURN QUERY SELECT tok.id, f.name, tok.expires_at;
END;
$$;

-- enroll_node: consumes a one-time enrollment token and creates the node (scheduling state active) with
-- its first credential. Refuses an unknown, already used or expired token (401) and a node name already
-- enrolled in the fleet (409). The token row is locked, so two agents racing with one token get one node.
CREATE OR REPLACE FUNCTION tuneplane.enroll_node(p_token_hash text, p_node_name text, p_credential_hash text,
                                      p_address text DEFAULT NULL)
RETURNS TABLE (node_id bigint, fleet_id bigint, fleet text, node text)
LANGUAGE plpgsql AS $$
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
$$;

-- authenticate_node_credential: the node behind a credential hash. A credential is live until it is
-- revoked or its grace period (after rotation) ends. Using a credential supersedes every older live
-- credential of the node (they keep working for the grace period). Refuses an unknown credential, a
-- rotated-out one past its grace, a revoked one (401) and a retired node (403).
CREATE OR REPLACE FUNCTION tuneplane.authenticate_node_credential(p_credential_hash text)
RETURNS TABLE (node_id bigint, fleet_id bigint, fleet text, node text, credential_id bigint,
               rotate_due_at timestamptz, scheduling_state text)
LANGUAGE plpgsql AS $$
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

-- rotate_node_credential: issues a new credential for a node, only from the node's newest confirmed
-- credential: p_current_credential_id must be live, confirmed (first used or confirmed saved) and not
-- superseded (no grace period running; no newer confirmed credential). So a rotated-out credential still
-- inside its grace period (a stale copy of the state directory, an old agent process) cannot start a
-- rotation whose confirmation would push the real agent's credential into its grace period and lock it out.
-- The old one keeps working until the agent confirms it saved the new one (confirm_node_credential) or
-- first authenticates with it, and then for the grace period only. A still-unconfirmed newer credential
-- from an earlier, interrupted rotation is revoked so at most one is outstanding. Refuses (409) anything else.
CREATE OR REPLACE FUNCTION tuneplane.rotate_node_credential(p_node_id bigint, p_current_credential_id bigint,
                                                 p_new_credential_hash text)
RETURNS bigint
LANGUAGE plpgsql AS $$
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

-- confirm_node_credential: the agent saved credential p_credential_id; older live credentials of the node
-- enter their grace period. Idempotent. Writes a credential_rotated event.
CREATE OR REPLACE FUNCTION tuneplane.confirm_node_credential(p_node_id bigint, p_credential_id bigint)
RETURNS timestamptz
LANGUAGE plpgsql AS $$
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

-- record_node_refusal: the gateway calls this in its own transaction after a refused enrollment or
-- authentication (the refusing function's own writes roll back with its error). The event is attached to
-- the node or fleet the presented secret belongs to, when it belongs to any.
CREATE OR REPLACE FUNCTION tuneplane.record_node_refusal(p_action text, p_secret_hash text, p_message text,
                                              p_address text DEFAULT NULL, p_details jsonb DEFAULT '{}'::jsonb)
RETURNS bigint
LANGUAGE plpgsql AS $$
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

-- require_node_session: refuses (409) a report or claim from a control session that is no longer current.
-- Holds the node's session lock in shared mode until the caller's transaction ends, and
-- node_session_opened takes it exclusively: a report that passed this check cannot be applied after a
-- newer session opened (first in the lock order).
CREATE OR REPLACE FUNCTION tuneplane.require_node_session(p_node_id bigint, p_epoch bigint)
RETURNS tuneplane.nodes
LANGUAGE plpgsql AS $$
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

-- node_session_opened: an authenticated agent connected. Starts a new session epoch (older sessions are
-- fenced off: it waits for every report of the old session still in flight, see require_node_session),
-- counts as a heartbeat, writes a `session_opened` event. Commands are withheld from the new session until
-- it has reconciled (claim_node_commands). Returns the epoch and the heartbeat interval the agent must keep.
CREATE OR REPLACE FUNCTION tuneplane.node_session_opened(p_node_id bigint, p_address text, p_gateway text)
RETURNS TABLE (epoch bigint, heartbeat_interval_s double precision)
LANGUAGE plpgsql AS $$
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

-- node_session_closed: the control connection of session p_epoch ended. A close of an already replaced
-- session changes nothing. Connectivity is not changed here: it follows heartbeat age.
CREATE OR REPLACE FUNCTION tuneplane.node_session_closed(p_node_id bigint, p_epoch bigint, p_reason text)
RETURNS boolean
LANGUAGE plpgsql AS $$
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

-- node_heartbeats: liveness for many nodes in one statement. p_batch is a JSON array of
-- {"node_id": 1, "epoch": 3, "running": [...]} ("running" optional: sent when it changed). Heartbeats of
-- replaced sessions are ignored. Returns how many nodes were touched. Never NOTIFYs.
CREATE OR REPLACE FUNCTION tuneplane.node_heartbeats(p_batch jsonb)
RETURNS integer
LANGUAGE sql AS $$
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

-- report_node_capacity (report kind `capacity`): what the node has. p_payload:
-- {"cpus": 8, "memory_bytes": 1, "agent_version": "0.1.0", "container_runtimes": ["podman"],
--  "hostname": "h", "gpus": [{"index": 0, "model": "…", "memory_bytes": 1, "simulated": false}]}
-- Refuses a malformed report (400) and a replaced session (409). Writes a `capacity` event when the
-- capacity differs from what was stored. Counts as a heartbeat.
CREATE OR REPLACE FUNCTION tuneplane.report_node_capacity(p_node_id bigint, p_epoch bigint, p_payload jsonb)
RETURNS jsonb
LANGUAGE plpgsql AS $$
DECLARE
    n tuneplane.nodes;
    before jsonb;
    after jsonb;
    gpus jsonb := coalesce(p_payload -> 'gpus', '[]'::jsonb);
    runtimes jsonb := coalesce(p_payload -> 'container_runtimes', '[]'::jsonb);
BEGIN
    n := tuneplane.require_node_session(p_node_id, p_epoch);
    -- IS DISTINCT FROM and jsonb_whole_number, not <>: an absent key is NULL, and NULL <> 'number' let `{}`
    -- through to the UPDATE (a NOT NULL violation answered 503 "send it again").
    IF jsonb_typeof(p_payload) IS DISTINCT FROM 'object' THEN
        RAISE EXCEPTION 'a capacity report is an object' USING ERRCODE = 'TP400', COLUMN = 'capacity';
    END IF;
    IF tuneplane.jsonb_whole_number(p_payload -> 'cpus', 2147483647) IS NULL THEN
        RAISE EXCEPTION 'cpus must be a whole number of CPUs (0 or more)' USING ERRCODE = 'TP400', COLUMN = 'cpus';
    END IF;
    IF tuneplane.jsonb_whole_number(p_payload -> 'memory_bytes', 9223372036854775807) IS NULL THEN
        RAISE EXCEPTION 'memory_bytes must be a whole number of bytes (0 or more)'
            USING ERRCODE = 'TP400', COLUMN = 'memory_bytes';
    END IF;
    IF jsonb_typeof(runtimes) IS DISTINCT FROM 'array'
       OR EXISTS (SELECT 1 FROM jsonb_array_elements(runtimes) r WHERE jsonb_typeof(r) IS DISTINCT FROM 'string') THEN
        RAISE EXCEPTION 'container_runtimes must be an array of names'
            USING ERRCODE = 'TP400', COLUMN = 'container_runtimes';
    END IF;
    IF jsonb_typeof(gpus) IS DISTINCT FROM 'array'
       OR EXISTS (SELECT 1 FROM jsonb_array_elements(gpus) g
                   WHERE jsonb_typeof(g) IS DISTINCT FROM 'object'
                      OR tuneplane.jsonb_whole_number(g -> 'index', 2147483647) IS NULL
                      OR jsonb_typeof(g -> 'model') IS DISTINCT FROM 'string'
                      OR (g ? 'memory_bytes'
                          AND tuneplane.jsonb_whole_number(g -> 'memory_bytes', 9223372036854775807) IS NULL)
                      OR (g ? 'simulated' AND jsonb_typeof(g -> 'simulated') IS DISTINCT FROM 'boolean')) THEN
        RAISE EXCEPTION 'gpus must be an array of GPUs, each with a whole index (0 or more) and a model name '
                        '(memory_bytes a whole number and simulated a boolean where given)'
            USING ERRCODE = 'TP400', COLUMN = 'gpus';
    END IF;
    IF (SELECT count(DISTINCT g -> 'index') FROM jsonb_array_elements(gpus) g) <> jsonb_array_length(gpus) THEN
        RAISE EXCEPTION 'gpus lists a GPU index twice' USING ERRCODE = 'TP400', COLUMN = 'gpus';
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
           container_runtimes = ARRAY(SELECT jsonb_array_elements_text(runtimes)),
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

-- record_node_note (report kind `note`): an agent-side observation worth an event (a GPU probe that
-- failed, a handler error). Refuses a replaced session.
CREATE OR REPLACE FUNCTION tuneplane.record_node_note(p_node_id bigint, p_epoch bigint, p_payload jsonb)
RETURNS jsonb
LANGUAGE plpgsql AS $$
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

-- note_connectivity_changes: writes a `connectivity` event for every node whose computed connectivity
-- differs from the one last written (connected -> stale -> lost, or back). SKIP LOCKED lets several
-- workers sweep at once without double events (workers/sweeps.py). Retired nodes are not swept.
CREATE OR REPLACE FUNCTION tuneplane.note_connectivity_changes()
RETURNS integer
LANGUAGE plpgsql AS $$
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

-- enqueue_node_command: writes a command to a node's outbox and NOTIFYs `tuneplane_node_commands` with the
-- node id (a wake-up for the gateway holding that node; it also polls). Refuses an unknown or retired node.
CREATE OR REPLACE FUNCTION tuneplane.enqueue_node_command(p_node_id bigint, p_kind text, p_payload jsonb DEFAULT '{}'::jsonb,
                                               p_created_by text DEFAULT NULL)
RETURNS tuneplane.node_commands
LANGUAGE plpgsql AS $$
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
$$;

-- claim_node_commands: up to p_limit unacknowledged commands of a node, oldest first, that the session
-- p_epoch has not yet taken; marks them taken by it. Nothing until the session has reconciled
-- (reconcile_node): a command must never race the reconcile list that predates it. Refuses a replaced
-- session (409).
CREATE OR REPLACE FUNCTION tuneplane.claim_node_commands(p_node_id bigint, p_epoch bigint, p_limit integer DEFAULT 100)
RETURNS SETOF tuneplane.node_commands
LANGUAGE plpgsql AS $$
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

-- claim_sessions_commands: claim_node_commands for several control sessions in one call (the gateway
-- wakes every node a commit or a placement pass wrote commands for at once: one transaction for them all,
-- not one each). p_node_ids[i] is held by session p_epochs[i]; a session that is no longer current is
-- skipped (its node's newer session claims for itself), one not yet reconciled gets nothing. Rows come
-- node by node, each node's oldest first. Locks: each node's session lock (shared) in node id order, as
-- member_reports takes them, then that node's command rows SKIP LOCKED.
CREATE OR REPLACE FUNCTION tuneplane.claim_sessions_commands(p_node_ids bigint[], p_epochs bigint[],
                                                            p_limit integer DEFAULT 100)
RETURNS SETOF tuneplane.node_commands
LANGUAGE plpgsql AS $$
DECLARE
    s record;
BEGIN
    IF cardinality(p_node_ids) IS DISTINCT FROM cardinality(p_epochs) THEN
        RAISE EXCEPTION 'one epoch per node: % node(s), % epoch(s)', cardinality(p_node_ids), cardinality(p_epochs)
            USING ERRCODE = 'TP400', COLUMN = 'epochs';
    END IF;
    FOR s IN SELECT DISTINCT u.node_id, u.epoch FROM unnest(p_node_ids, p_epochs) AS u(node_id, epoch)
              ORDER BY u.node_id, u.epoch LOOP
        PERFORM pg_advisory_xact_lock_shared(hashtext('tuneplane.node_session'), s.node_id::integer);
        -- Under the shared session lock the epoch cannot change (node_session_opened takes it exclusively).
        IF EXISTS (SELECT 1 FROM tuneplane.nodes WHERE id = s.node_id AND session_epoch = s.epoch) THEN
            RETURN QUERY SELECT * FROM tuneplane.claim_node_commands(s.node_id, s.epoch, p_limit);
        END IF;
    END LOOP;
END;
$$;

-- nodes_with_pending_commands: the subset of p_node_ids that have commands their current, reconciled
-- session has not taken yet (the gateway's bounded-poll fallback to NOTIFY).
CREATE OR REPLACE FUNCTION tuneplane.nodes_with_pending_commands(p_node_ids bigint[])
RETURNS TABLE (node_id bigint)
LANGUAGE sql STABLE AS $$
    SELECT DISTINCT c.node_id
      FROM tuneplane.node_commands c JOIN tuneplane.nodes n ON n.id = c.node_id
     WHERE c.node_id = ANY (p_node_ids) AND c.acked_at IS NULL
       AND n.session_reconciled_epoch = n.session_epoch
       AND c.claimed_epoch IS DISTINCT FROM n.session_epoch;
$$;

-- ack_node_command: the node handled command p_command_id (result or error) in session p_epoch.
-- Idempotent: a second ack keeps the first outcome. Refuses a replaced session (409: the command is
-- delivered again to the current one) and a command of another node (404). The first ack's meaning for
-- the launch lifecycle is decided by launch_command_acked (START/STOP errors, KILL done). Locks (the
-- launch lock order, launch.sql): the node's session lock (shared), launch_command_locks (jobs → attempts
-- → members → node_usage rows of the members the command names), then the command row, then what
-- launch_command_acked writes.
CREATE OR REPLACE FUNCTION tuneplane.ack_node_command(p_node_id bigint, p_epoch bigint, p_command_id bigint,
                                           p_result jsonb DEFAULT NULL, p_error text DEFAULT NULL)
RETURNS tuneplane.node_commands
LANGUAGE plpgsql AS $$
DECLARE
    v_cmd tuneplane.node_commands;
    v_first boolean;
BEGIN
    PERFORM tuneplane.require_node_session(p_node_id, p_epoch);
    SELECT * INTO v_cmd FROM tuneplane.node_commands WHERE id = p_command_id AND node_id = p_node_id;
    IF v_cmd.acked_at IS NULL THEN
        -- What the acknowledgement's meaning will lock (jobs → attempts → members → usage rows), before the
        -- command row: the lock order (launch.sql) puts leaf rows such as this one last.
        v_cmd.error := p_error;
        PERFORM tuneplane.launch_command_locks(v_cmd);
    END IF;
    SELECT acked_at IS NULL INTO v_first FROM tuneplane.node_commands
     WHERE id = p_command_id AND node_id = p_node_id FOR UPDATE;
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

-- prune_node_commands: deletes acknowledged commands older than p_older_than; returns how many.
CREATE OR REPLACE FUNCTION tuneplane.prune_node_commands(p_older_than interval DEFAULT interval '7 days')
RETURNS integer
LANGUAGE sql AS $$
    WITH d AS (DELETE FROM tuneplane.node_commands WHERE acked_at < now() - p_older_than RETURNING 1)
    SELECT count(*)::integer FROM d;
$$;

-- resolve_node: a node id from a reference: its numeric id, `fleet/name`, or a name unique across fleets.
-- Refuses an unknown (404) or ambiguous (409) reference.
CREATE OR REPLACE FUNCTION tuneplane.resolve_node(p_ref text)
RETURNS bigint
LANGUAGE plpgsql STABLE AS $$
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
$$;

-- change_node_scheduling: the one function that moves a node's scheduling state.
--   cordon:   active | draining  -> cordoned  (no new work; running work continues)
--   drain:    active | cordoned  -> draining  (no new work; running work finishes, then the node is idle)
--   uncordon: cordoned | draining -> active
--   retire:   any but retired    -> retired   (credentials revoked; the node can no longer connect)
-- Asking for the state a node is already in changes nothing and writes no event. Refuses any change of a
-- retired node (409) and an unknown action (400). Writes an event with actor and reason.
CREATE OR REPLACE FUNCTION tuneplane.change_node_scheduling(p_node text, p_action text, p_reason text DEFAULT NULL,
                                                 p_actor text DEFAULT NULL)
RETURNS TABLE (node_id bigint, fleet text, node text, scheduling_state text, changed boolean)
LANGUAGE plpgsql AS $$
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
    IF target = 'retired' THEN
        -- Retire loses the node's members (lose_node_members): the launch lock order, after the fleet's
        -- placement lock (so no pass places on it meanwhile): jobs → attempts → members → node row.
        PERFORM pg_advisory_xact_lock(hashtext('tuneplane.placement'),
                                      (SELECT fleet_id FROM tuneplane.nodes WHERE id = v_id)::integer);
        n := tuneplane.lock_node_rows(v_id);
    ELSE
        -- Cordon, drain, uncordon hold the node row only (FOR UPDATE: a placement pass skips the node).
        SELECT * INTO n FROM tuneplane.nodes WHERE id = v_id FOR UPDATE;
    END IF;
    IF n.scheduling_state = 'retired' AND target <> 'retired' THEN
        RAISE EXCEPTION 'node % is retired; a retired node does not come back (enroll the machine again)',
                        n.name USING ERRCODE = 'TP409', COLUMN = 'node';
    END IF;
    IF n.scheduling_state <> target THEN
        IF target = 'retired' THEN
            -- A retired node never reconnects (its credentials are revoked below): what it held is lost
            -- and released now, so its jobs can still be cancelled and retried (lose_node_members). Its
            -- members get KILL all the same: an agent still connected stops them and acknowledges.
            PERFORM tuneplane.lose_node_members(n.id, format('node %s retired by %s%s', n.name, actor,
                CASE WHEN coalesce(p_reason, '') = '' THEN '' ELSE ': ' || p_reason END), true);
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

CREATE OR REPLACE FUNCTION tuneplane.cordon_node(p_node text, p_reason text DEFAULT NULL, p_actor text DEFAULT NULL)
RETURNS TABLE (node_id bigint, fleet text, node text, scheduling_state text, changed boolean)
LANGUAGE sql AS $$ SELECT * FROM tuneplane.change_node_scheduling(p_node, 'cordon', p_reason, p_actor) $$;

CREATE OR REPLACE FUNCTION tuneplane.drain_node(p_node text, p_reason text DEFAULT NULL, p_actor text DEFAULT NULL)
RETURNS TABLE (node_id bigint, fleet text, node text, scheduling_state text, changed boolean)
LANGUAGE sql AS $$ SELECT * FROM tuneplane.change_node_scheduling(p_node, 'drain', p_reason, p_actor) $$;

CREATE OR REPLACE FUNCTION tuneplane.uncordon_node(p_node text, p_reason text DEFAULT NULL, p_actor text DEFAULT NULL)
RETURNS TABLE (node_id bigint, fleet text, node text, scheduling_state text, changed boolean)
LANGUAGE sql AS $$ SELECT * FROM tuneplane.change_node_scheduling(p_node, 'uncordon', p_reason, p_actor) $$;

CREATE OR REPLACE FUNCTION tuneplane.retire_node(p_node text, p_reason text DEFAULT NULL, p_actor text DEFAULT NULL)
RETURNS TABLE (node_id bigint, fleet text, node text, scheduling_state text, changed boolean)
LANGUAGE sql AS $$ SELECT * FROM tuneplane.change_node_scheduling(p_node, 'retire', p_reason, p_actor) $$;

-- node_allocation (declared by 0022 as a stub): what is allocated on a node now.
CREATE OR REPLACE FUNCTION tuneplane.node_allocation(p_node_id bigint)
RETURNS TABLE (gpus integer, cpus integer, memory_bytes bigint)
LANGUAGE sql STABLE AS $$
    SELECT coalesce(u.used_gpus, 0), coalesce(u.used_cpus, 0), coalesce(u.used_memory, 0::bigint)
      FROM (SELECT p_node_id AS id) n LEFT JOIN tuneplane.node_usage u ON u.node_id = n.id;
$$;

-- 0047 Fleet view of fencing and of what the control connection cannot prove: v_nodes gains the fence
-- (fenced_at, fenced_reason) and the last peer-network and shared-storage checks each prepare reports.
-- CREATE OR REPLACE VIEW may only append columns, so the earlier columns are restated unchanged.
CREATE OR REPLACE VIEW tuneplane.v_nodes AS
SELECT f.name AS fleet,
       n.id AS node_id,
       n.name AS node,
       n.scheduling_state,
       tuneplane.node_connectivity(n.last_heartbeat_at) AS connectivity,
       round(extract(epoch FROM now() - n.last_heartbeat_at)::numeric, 1) AS heartbeat_age_s,
       n.last_heartbeat_at,
       n.cpus,
       n.memory_bytes,
       coalesce(g.gpus, 0) AS gpus,
       coalesce(g.models, '') AS gpu_models,
       coalesce(g.gpu_memory_bytes, 0) AS gpu_memory_bytes,
       coalesce(g.simulated, 0) AS simulated_gpus,
       a.gpus AS allocated_gpus,
       a.cpus AS allocated_cpus,
       a.memory_bytes AS allocated_memory_bytes,
       n.agent_version,
       n.container_runtimes,
       n.hostname,
       n.address,
       jsonb_array_length(n.reported_running) AS running,
       n.session_epoch,
       n.session_closed_at IS NULL AND n.session_opened_at IS NOT NULL AS session_open,
       n.enrolled_at,
       n.fleet_id,
       n.fenced_at,
       n.fenced_reason,
       n.last_peer_check,
       n.last_storage_check,
       n.caches,
       n.caches_reported_at
  FROM tuneplane.nodes n
  JOIN tuneplane.fleets f ON f.id = n.fleet_id
  LEFT JOIN LATERAL (
        SELECT count(*)::integer AS gpus,
               string_agg(DISTINCT gg.model || CASE WHEN gg.simulated THEN ' (simulated)' ELSE '' END, ', ') AS models,
               sum(gg.memory_bytes)::bigint AS gpu_memory_bytes,
               (count(*) FILTER (WHERE gg.simulated))::integer AS simulated
          FROM tuneplane.node_gpus gg WHERE gg.node_id = n.id) g ON true
  CROSS JOIN LATERAL tuneplane.node_allocation(n.id) a;

CREATE OR REPLACE VIEW tuneplane.v_fleet AS
SELECT f.id AS fleet_id,
       f.name AS fleet,
       f.backend,
       f.capabilities,
       count(v.node_id) FILTER (WHERE v.scheduling_state <> 'retired')::integer AS nodes,
       count(*) FILTER (WHERE v.connectivity = 'connected' AND v.scheduling_state <> 'retired')::integer AS connected,
       count(*) FILTER (WHERE v.connectivity = 'stale' AND v.scheduling_state <> 'retired')::integer AS stale,
       count(*) FILTER (WHERE v.connectivity = 'lost' AND v.scheduling_state <> 'retired')::integer AS lost,
       count(*) FILTER (WHERE v.scheduling_state = 'active')::integer AS active,
       count(*) FILTER (WHERE v.scheduling_state = 'cordoned')::integer AS cordoned,
       count(*) FILTER (WHERE v.scheduling_state = 'draining')::integer AS draining,
       count(*) FILTER (WHERE v.scheduling_state = 'retired')::integer AS retired,
       coalesce(sum(v.gpus) FILTER (WHERE v.scheduling_state <> 'retired'), 0)::integer AS gpus,
       coalesce(sum(v.simulated_gpus) FILTER (WHERE v.scheduling_state <> 'retired'), 0)::integer AS simulated_gpus,
       -- What the scheduler may use now: active, connected and unfenced nodes only (reserve_next's rule).
       coalesce(sum(v.gpus) FILTER (WHERE v.scheduling_state = 'active' AND v.connectivity = 'connected'
                                      AND v.fenced_at IS NULL), 0)::integer
           AS schedulable_gpus,
       coalesce(sum(v.allocated_gpus), 0)::integer AS allocated_gpus,
       coalesce(sum(v.cpus) FILTER (WHERE v.scheduling_state <> 'retired'), 0)::integer AS cpus,
       coalesce(sum(v.memory_bytes) FILTER (WHERE v.scheduling_state <> 'retired'), 0)::bigint AS memory_bytes,
       f.created_at,
       -- Appended (CREATE OR REPLACE VIEW only appends): fenced nodes, whatever their scheduling state.
       count(*) FILTER (WHERE v.fenced_at IS NOT NULL AND v.scheduling_state <> 'retired')::integer AS fenced,
       f.storage,
       -- Appended for the fleets overview (/fleets) and the home page: what a new job could get now (GPUs on
       -- schedulable nodes less what is allocated), and the fleet's jobs placed (reserved, preparing or
       -- running: they hold resources) and waiting (queued; the jobs_queued index).
       greatest(coalesce(sum(v.gpus) FILTER (WHERE v.scheduling_state = 'active' AND v.connectivity = 'connected'
                                             AND v.fenced_at IS NULL), 0)
                - coalesce(sum(v.allocated_gpus), 0), 0)::integer AS free_gpus,
       (SELECT count(*) FROM tuneplane.jobs j
         WHERE j.fleet_id = f.id AND j.state IN ('reserved', 'preparing', 'running'))::integer AS running_jobs,
       (SELECT count(*) FROM tuneplane.jobs j WHERE j.fleet_id = f.id AND j.state = 'queued')::integer AS waiting_jobs
  FROM tuneplane.fleets f
  LEFT JOIN tuneplane.v_nodes v ON v.fleet_id = f.id
 GROUP BY f.id;

CREATE OR REPLACE VIEW tuneplane.v_node_events AS
SELECT e.id, e.at, f.name AS fleet, n.name AS node, e.node_id, e.kind, e.actor, e.reason, e.details
  FROM tuneplane.node_events e
  LEFT JOIN tuneplane.fleets f ON f.id = e.fleet_id
  LEFT JOIN tuneplane.nodes n ON n.id = e.node_id;

CREATE OR REPLACE VIEW tuneplane.v_node_commands_pending AS
SELECT c.id, f.name AS fleet, n.name AS node, c.node_id, c.kind, c.created_at, c.created_by,
       c.delivery_count, c.delivered_at, c.claimed_epoch, n.session_epoch,
       round(extract(epoch FROM now() - c.created_at)::numeric, 1) AS age_s
  FROM tuneplane.node_commands c
  JOIN tuneplane.nodes n ON n.id = c.node_id
  JOIN tuneplane.fleets f ON f.id = n.fleet_id
 WHERE c.acked_at IS NULL;
