-- 0020 node identity: connectivity thresholds, node events, enrollment tokens, rotating node credentials,
-- and the functions that enroll a node, authenticate its credential and rotate it.
--
-- Connectivity (connected | stale | lost) is never stored as a state: node_connectivity() derives it from
-- the age of last_heartbeat_at against the thresholds in node_settings. Scheduling state is changed only
-- by the operator functions in 0022. Secrets (enrollment tokens, node credentials) are stored as sha256
-- hashes only; the plaintext is made by the caller (app.security.new_token) and shown once.

-- One row of knobs. Thresholds are configurable (configure_node_settings) so tests can use seconds.
CREATE TABLE tuneplane.node_settings (
    singleton             boolean  PRIMARY KEY DEFAULT true CHECK (singleton),
    heartbeat_interval    interval NOT NULL DEFAULT interval '10 seconds',
    stale_after           interval NOT NULL DEFAULT interval '30 seconds',
    lost_after            interval NOT NULL DEFAULT interval '90 seconds',
    credential_rotate_after interval NOT NULL DEFAULT interval '24 hours',
    credential_grace      interval NOT NULL DEFAULT interval '10 minutes',
    enrollment_token_max_ttl interval NOT NULL DEFAULT interval '30 days',
    CHECK (heartbeat_interval > interval '0'),
    CHECK (stale_after > heartbeat_interval),
    CHECK (lost_after > stale_after),
    CHECK (credential_rotate_after > interval '0'),
    CHECK (credential_grace > interval '0')
);
INSERT INTO tuneplane.node_settings DEFAULT VALUES;

-- Session fencing and what the node said it runs, next to the core columns of 0003.
ALTER TABLE tuneplane.nodes
    -- Incremented by node_session_opened: a report or claim carrying an older epoch changes nothing.
    ADD COLUMN session_epoch        bigint      NOT NULL DEFAULT 0,
    ADD COLUMN session_opened_at    timestamptz,
    ADD COLUMN session_closed_at    timestamptz,
    ADD COLUMN hostname             text,
    -- The agent's `running` list from its last heartbeat (the launch issue reconciles against it).
    ADD COLUMN reported_running     jsonb       NOT NULL DEFAULT '[]'::jsonb,
    -- The connectivity last written to node_events by note_connectivity_changes(); bookkeeping for
    -- events only, never read as the node's connectivity (that is always node_connectivity()).
    ADD COLUMN connectivity_noted   text        NOT NULL DEFAULT 'lost';

-- Who did what to which node and why: every scheduling change, connectivity change and refusal.
CREATE TABLE tuneplane.node_events (
    id        bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    at        timestamptz NOT NULL DEFAULT clock_timestamp(),
    fleet_id  bigint REFERENCES tuneplane.fleets (id),
    node_id   bigint REFERENCES tuneplane.nodes (id),
    kind      text        NOT NULL,
    actor     text        NOT NULL,
    reason    text        NOT NULL DEFAULT '',
    details   jsonb       NOT NULL DEFAULT '{}'::jsonb
);
CREATE INDEX node_events_node ON tuneplane.node_events (node_id, id);
CREATE INDEX node_events_fleet ON tuneplane.node_events (fleet_id, id);

CREATE TABLE tuneplane.enrollment_tokens (
    id           bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    fleet_id     bigint      NOT NULL REFERENCES tuneplane.fleets (id),
    token_hash   text        NOT NULL UNIQUE CHECK (token_hash ~ '^[0-9a-f]{64}$'),
    created_at   timestamptz NOT NULL DEFAULT now(),
    created_by   text        NOT NULL,
    expires_at   timestamptz NOT NULL,
    used_at      timestamptz,
    used_by_node bigint REFERENCES tuneplane.nodes (id)
);

CREATE TABLE tuneplane.node_credentials (
    id              bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    node_id         bigint      NOT NULL REFERENCES tuneplane.nodes (id),
    credential_hash text        NOT NULL UNIQUE CHECK (credential_hash ~ '^[0-9a-f]{64}$'),
    issued_at       timestamptz NOT NULL DEFAULT now(),
    -- First successful authentication with this credential.
    first_used_at   timestamptz,
    -- Set when a newer credential took over; the credential keeps working until grace_until.
    superseded_at   timestamptz,
    grace_until     timestamptz,
    revoked_at      timestamptz,
    revoked_reason  text
);
CREATE INDEX node_credentials_node ON tuneplane.node_credentials (node_id, id);

-- node_connectivity: connected | stale | lost from a heartbeat time (NULL = never heard from = lost).
CREATE FUNCTION tuneplane.node_connectivity(p_last_heartbeat_at timestamptz)
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

-- configure_node_settings: change thresholds; NULL keeps a value. Refuses an inconsistent set
-- (stale must exceed the heartbeat interval, lost must exceed stale).
CREATE FUNCTION tuneplane.configure_node_settings(
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
CREATE FUNCTION tuneplane.log_node_event(p_fleet_id bigint, p_node_id bigint, p_kind text, p_actor text,
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
CREATE FUNCTION tuneplane.create_fleet(p_name text, p_backend text, p_capabilities jsonb DEFAULT '{}'::jsonb,
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

-- create_enrollment_token: stores the hash of a one-time token for a node fleet. Refuses an unknown
-- fleet, a fleet whose backend is not `node`, and a TTL that is not positive or exceeds the maximum.
CREATE FUNCTION tuneplane.create_enrollment_token(p_fleet text, p_token_hash text, p_ttl interval,
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
                                     'expires ' || tok.expires_at::text, jsonb_build_object('token_id', tok.id));
    RETURN QUERY SELECT tok.id, f.name, tok.expires_at;
END;
$$;

-- enroll_node: consumes a one-time enrollment token and creates the node (scheduling state active) with
-- its first credential. Refuses an unknown, already used or expired token (401) and a node name already
-- enrolled in the fleet (409). The token row is locked, so two agents racing with one token get one node.
CREATE FUNCTION tuneplane.enroll_node(p_token_hash text, p_node_name text, p_credential_hash text,
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
CREATE FUNCTION tuneplane.authenticate_node_credential(p_credential_hash text)
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

-- rotate_node_credential: issues a new credential for a node while p_current_credential_id is live.
-- The old one keeps working until the agent confirms it saved the new one (confirm_node_credential) or
-- first authenticates with it, and then for the grace period only. A still-unconfirmed newer credential
-- from an earlier, interrupted rotation is revoked so at most one is outstanding.
CREATE FUNCTION tuneplane.rotate_node_credential(p_node_id bigint, p_current_credential_id bigint,
                                                 p_new_credential_hash text)
RETURNS bigint
LANGUAGE plpgsql AS $$
DECLARE
    new_id bigint;
BEGIN
    PERFORM 1 FROM tuneplane.node_credentials
     WHERE id = p_current_credential_id AND node_id = p_node_id AND revoked_at IS NULL
       AND (grace_until IS NULL OR grace_until > now())
       FOR UPDATE;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'credential % is not a live credential of node %', p_current_credential_id, p_node_id
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
CREATE FUNCTION tuneplane.confirm_node_credential(p_node_id bigint, p_credential_id bigint)
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
CREATE FUNCTION tuneplane.record_node_refusal(p_action text, p_secret_hash text, p_message text,
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
