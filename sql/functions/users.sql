-- sql/functions/users.sql — the current definition of every users function, view and trigger.
-- Users, console sessions and API tokens: login, token hashing and scope checks.
--
-- Repeatable file (ADR 0012): `tuneplane db migrate` re-applies every file of sql/functions/ (in the order
-- of order.txt, one transaction) whenever one changes. Edit definitions here, never in a migration.
-- Tables, columns and data changes go in a new numbered migration. A changed signature or a view whose
-- columns change: add its DROP below (it runs before the new definition is created), e.g.
--   DROP FUNCTION IF EXISTS tuneplane.f(bigint, text);
--
-- Drops (signature changes):

-- create_user: a new user; refuses a malformed or taken username and an unknown role.
CREATE OR REPLACE FUNCTION tuneplane.create_user(p_username text, p_password_hash text, p_role text)
RETURNS tuneplane.users
LANGUAGE plpgsql AS $$
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
$$;

-- require_active_user: the actor's row, if the user exists and is not disabled; 401 otherwise.
CREATE OR REPLACE FUNCTION tuneplane.require_active_user(p_actor_id bigint)
RETURNS tuneplane.users
LANGUAGE plpgsql STABLE AS $$
DECLARE
    actor tuneplane.users;
BEGIN
    SELECT * INTO actor FROM tuneplane.users WHERE id = p_actor_id AND disabled_at IS NULL;
    IF actor.id IS NULL THEN
        RAISE EXCEPTION 'no such active user' USING ERRCODE = 'TP401', COLUMN = 'user';
    END IF;
    RETURN actor;
END;
$$;

-- create_first_admin: the admin `tuneplane up` makes on an empty installation; NULL when any admin exists.
-- The advisory lock makes two concurrent `up`s create one admin, not two.
CREATE OR REPLACE FUNCTION tuneplane.create_first_admin(p_username text, p_password_hash text)
RETURNS tuneplane.users
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_advisory_xact_lock(hashtext('tuneplane.create_first_admin'));
    IF EXISTS (SELECT 1 FROM tuneplane.users WHERE role = 'admin') THEN
        RETURN NULL;
    END IF;
    RETURN tuneplane.create_user(p_username, p_password_hash, 'admin');
END;
$$;

-- issue_api_token: stores the hash of a token the caller generated and shows once.
CREATE OR REPLACE FUNCTION tuneplane.issue_api_token(p_user_id bigint, p_name text, p_token_hash text,
                                          p_ttl interval DEFAULT NULL)
RETURNS tuneplane.api_tokens
LANGUAGE plpgsql AS $$
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
$$;

-- authenticate_api_token: the user behind a token hash, if the token is live and carries p_scope.
CREATE OR REPLACE FUNCTION tuneplane.authenticate_api_token(p_token_hash text, p_scope text DEFAULT 'api')
RETURNS TABLE (user_id bigint, username text, role text, token_id bigint)
LANGUAGE plpgsql AS $$
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

-- request_token: the API token this transaction acts under (the server sets `tuneplane.token_id` for the
-- transactions of a request authenticated by a token; app/db.py), or NULL for a console session, a
-- worker or psql. Its scope narrows what the user's roles allow.
CREATE OR REPLACE FUNCTION tuneplane.request_token()
RETURNS bigint
LANGUAGE sql STABLE AS $$
    SELECT nullif(current_setting('tuneplane.token_id', true), '')::bigint;
$$;

-- revoke_api_token: the owner or an admin revokes; revoking twice is harmless.
CREATE OR REPLACE FUNCTION tuneplane.revoke_api_token(p_actor_id bigint, p_token_id bigint)
RETURNS boolean
LANGUAGE plpgsql AS $$
DECLARE
    actor tuneplane.users;
BEGIN
    SELECT * INTO actor FROM tuneplane.users WHERE id = p_actor_id;
    -- A read-only request token changes nothing, not even a revocation (require_token_write, teams.sql).
    PERFORM tuneplane.require_token_write('revoking a token');
    UPDATE tuneplane.api_tokens t SET revoked_at = coalesce(t.revoked_at, now())
     WHERE t.id = p_token_id AND (t.user_id = p_actor_id OR actor.role = 'admin');
    IF NOT FOUND THEN
        RAISE EXCEPTION 'no such token of yours' USING ERRCODE = 'TP404', COLUMN = 'token_id';
    END IF;
    RETURN true;
END;
$$;

-- server_secret: the named secret, creating it from p_candidate the first time (first writer wins).
CREATE OR REPLACE FUNCTION tuneplane.server_secret(p_name text, p_candidate text)
RETURNS text
LANGUAGE sql AS $$
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
