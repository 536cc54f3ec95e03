-- sql/functions/telemetry.sql — the current definition of every telemetry function, view and trigger.
-- Telemetry: collector tokens, batch ledger, merge of metric batches, rollups and bounded queries.
--
-- Repeatable file (ADR 0012): `tuneplane db migrate` re-applies every file of sql/functions/ (in the order
-- of order.txt, one transaction) whenever one changes. Edit definitions here, never in a migration.
-- Tables, columns and data changes go in a new numbered migration. A changed signature or a view whose
-- columns change: add its DROP below (it runs before the new definition is created), e.g.
--   DROP FUNCTION IF EXISTS tuneplane.f(bigint, text);
--
-- Drops (signature changes):
DROP FUNCTION IF EXISTS tuneplane.telemetry_merge_batch(text, text, bigint, bigint[], integer[], bigint[],
    bigint[], double precision[], double precision[], double precision[], bigint[], bigint[],
    double precision[], bigint[], bigint[], bigint[], bigint[], bigint[], double precision[], integer, jsonb,
    text[], text[], text[], bigint[], text[], text[], bigint[], bigint[], text[], boolean);
DROP FUNCTION IF EXISTS tuneplane.telemetry_buckets(bigint, bigint, integer, bigint, bigint);
DROP FUNCTION IF EXISTS tuneplane.telemetry_series_buckets(bigint, integer, bigint, bigint, boolean);
DROP FUNCTION IF EXISTS tuneplane.telemetry_begin_batch(text, text, bigint, text, integer, jsonb, text[], text[]);
DROP FUNCTION IF EXISTS tuneplane.telemetry_merge_batch(bigint[], integer[], bigint[], bigint[],
    double precision[], double precision[], double precision[], bigint[], bigint[], double precision[],
    bigint[], bigint[], bigint[], bigint[], bigint[], double precision[], text, bigint, integer, integer,
    integer, jsonb);
-- telemetry_can_read, telemetry_require_read: replaced by require_job_access / job_access_allowed
-- (access.sql), one answer to "may this user see this job".
DROP FUNCTION IF EXISTS tuneplane.telemetry_can_read(bigint, bigint);
DROP FUNCTION IF EXISTS tuneplane.telemetry_require_read(bigint, bigint);

-- telemetry_canonical: the canonical name for a raw metric name, or NULL.
CREATE OR REPLACE FUNCTION tuneplane.telemetry_canonical(p_name text)
RETURNS text
LANGUAGE sql STABLE AS $$
    SELECT r.canonical FROM tuneplane.telemetry_canonical_rules r
     WHERE lower(p_name) ~ r.pattern
     ORDER BY r.priority
     LIMIT 1;
$$;

-- telemetry_recanonicalize: re-applies the rules to every series (after an operator changed them).
CREATE OR REPLACE FUNCTION tuneplane.telemetry_recanonicalize()
RETURNS bigint
LANGUAGE plpgsql AS $$
DECLARE
    changed bigint;
BEGIN
    UPDATE tuneplane.telemetry_series s SET canonical = tuneplane.telemetry_canonical(s.name)
     WHERE s.canonical IS DISTINCT FROM tuneplane.telemetry_canonical(s.name);
    GET DIAGNOSTICS changed = ROW_COUNT;
    RETURN changed;
END;
$$;

-- set_telemetry_settings: an admin changes retention / token lifetime / batch limit (NULL keeps a value).
CREATE OR REPLACE FUNCTION tuneplane.set_telemetry_settings(p_actor_id bigint, p_retention interval DEFAULT NULL,
                                                 p_token_ttl interval DEFAULT NULL,
                                                 p_max_batch_points integer DEFAULT NULL)
RETURNS tuneplane.telemetry_settings
LANGUAGE plpgsql AS $$
DECLARE
    result tuneplane.telemetry_settings;
BEGIN
    PERFORM tuneplane.require_admin(p_actor_id, 'changing telemetry settings');
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

-- issue_telemetry_token: stores the hash of a token scoped to one (job, attempt, member rank); the launch
-- code calls it when it starts a member and hands the plaintext to the runner/collector via the environment.
-- Refuses a malformed hash, a bad attempt/rank, and a job that does not exist (once jobs exist).
CREATE OR REPLACE FUNCTION tuneplane.issue_telemetry_token(p_job_id bigint, p_attempt integer, p_member_rank integer,
                                                p_token_hash text, p_ttl interval DEFAULT NULL)
RETURNS tuneplane.telemetry_tokens
LANGUAGE plpgsql AS $$
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
$$;

-- revoke_telemetry_tokens: revokes the tokens of a job (or one attempt of it) now; returns how many.
-- Members' tokens are revoked on their own when the member ends (telemetry_member_ended, after the drain
-- grace) and when its node is fenced (at once); this is for an operator.
CREATE OR REPLACE FUNCTION tuneplane.revoke_telemetry_tokens(p_job_id bigint, p_attempt integer DEFAULT NULL)
RETURNS bigint
LANGUAGE plpgsql AS $$
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

-- authenticate_telemetry_token: the scope of a live telemetry token. Only telemetry tokens exist here:
-- user API tokens and node credentials are different tables and never match. 401 for anything else.
CREATE OR REPLACE FUNCTION tuneplane.authenticate_telemetry_token(p_token_hash text)
RETURNS TABLE (token_id bigint, job_id bigint, attempt integer, member_rank integer, expires_at timestamptz)
LANGUAGE plpgsql STABLE AS $$
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

-- telemetry_check_write: the scope check for a write. A token may write only its own member's series; a
-- batch that names a scope must name exactly the token's (403 otherwise).
CREATE OR REPLACE FUNCTION tuneplane.telemetry_check_write(p_token_hash text, p_scope jsonb)
RETURNS TABLE (token_id bigint, job_id bigint, attempt integer, member_rank integer)
LANGUAGE plpgsql STABLE AS $$
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

-- telemetry_begin_batch: first step of the ingest transaction. Checks the token's scope (401/403), the
-- batch size (413), records the batch in the token's own ledger (job, attempt, member, collector, seq) and
-- returns duplicate = true if that batch was already stored (the caller then stores nothing); the same
-- batch with a different digest is refused (409). Creates missing series (with canonical names) and
-- returns their ids in the order given; a series over the member's cap or with a name PostgreSQL should
-- not hold gets a NULL id and its reason in `refused` (the caller refuses its points alone).
CREATE OR REPLACE FUNCTION tuneplane.telemetry_begin_batch(p_token_hash text, p_collector text, p_seq bigint,
                                                p_digest text, p_points integer, p_scope jsonb,
                                                p_sources text[], p_names text[])
RETURNS TABLE (duplicate boolean, series_ids bigint[], refused text[], job_id bigint, attempt integer,
               member_rank integer)
LANGUAGE plpgsql AS $$
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

-- telemetry_merge_batch: last step of the ingest transaction, after the points were copied. The scope is
-- the token's (re-read here, never handed in), and the batch must be one this token began. Merges the
-- batch's per-bucket aggregates into the rollups, its per-series summary into the series rows, the points
-- refused (source, name, reason, count) and the damaged regions (source, file, offset, bytes, reason) into
-- the member's records, and the collector's counters and health into its row. A `final` batch ends the
-- member's metrics: complete, or incomplete when the collector says batches were refused
-- (health.rejected_batches); the member's token is then revoked at once. Rows arrive sorted by (series,
-- width, bucket) so that concurrent batches lock in one order.
CREATE OR REPLACE FUNCTION tuneplane.telemetry_merge_batch(
    p_token_hash text, p_collector text, p_seq bigint,
    r_series bigint[], r_width integer[], r_bucket bigint[], r_n bigint[], r_sum double precision[],
    r_min double precision[], r_max double precision[], r_first bigint[], r_last bigint[],
    r_last_value double precision[], r_last_wall double precision[],
    s_series bigint[], s_count bigint[], s_min_step bigint[], s_max_step bigint[], s_last_step bigint[],
    s_last_value double precision[],
    p_points integer, p_health jsonb,
    f_source text[], f_name text[], f_reason text[], f_count bigint[],
    d_source text[], d_file text[], d_offset bigint[], d_bytes bigint[], d_reason text[],
    p_final boolean DEFAULT false)
RETURNS void
LANGUAGE plpgsql AS $$
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

-- telemetry_member_ended (trigger on members.state): when a member ends, its telemetry token stops working
-- after the drain grace (at once when the member was lost to a fence), and its metrics row notes the end.
CREATE OR REPLACE FUNCTION tuneplane.telemetry_member_ended()
RETURNS trigger
LANGUAGE plpgsql AS $$
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
    -- telemetry_members before telemetry_tokens, the order a collector's final batch takes them in
    -- (telemetry_merge_batch), so the two never wait for each other in a cycle.
    UPDATE tuneplane.telemetry_members m SET member_ended_at = coalesce(m.member_ended_at, now()), updated_at = now()
     WHERE m.job_id = NEW.job_id AND m.attempt = v_attempt AND m.member_rank = NEW.rank;
    UPDATE tuneplane.telemetry_tokens t SET revoked_at = v_until
     WHERE t.job_id = NEW.job_id AND t.attempt = v_attempt AND t.member_rank = NEW.rank
       AND (t.revoked_at IS NULL OR t.revoked_at > v_until);
    RETURN NEW;
END;
$$;

CREATE OR REPLACE TRIGGER telemetry_member_ended AFTER UPDATE OF state ON tuneplane.members
    FOR EACH ROW EXECUTE FUNCTION tuneplane.telemetry_member_ended();

-- telemetry_node_fenced (trigger on nodes.fenced_at): a fenced node is not trusted; the tokens of every
-- member placed on it stop working at once (also those still inside their drain grace).
CREATE OR REPLACE FUNCTION tuneplane.telemetry_node_fenced()
RETURNS trigger
LANGUAGE plpgsql AS $$
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

CREATE OR REPLACE TRIGGER telemetry_node_fenced AFTER UPDATE OF fenced_at ON tuneplane.nodes
    FOR EACH ROW EXECUTE FUNCTION tuneplane.telemetry_node_fenced();

-- telemetry_job_members: where each member's metrics stand. `collecting` becomes `incomplete` once the
-- member ended and its token's drain grace passed without the collector's final batch.
CREATE OR REPLACE FUNCTION tuneplane.telemetry_job_members(p_actor_id bigint, p_job_id bigint)
RETURNS TABLE (attempt integer, member_rank integer, state text, reason text, refused_points bigint,
               damaged_regions bigint, series integer, member_ended_at timestamptz, finished_at timestamptz)
LANGUAGE plpgsql STABLE AS $$
BEGIN
    PERFORM tuneplane.require_job_access(p_actor_id, p_job_id, 'read');
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

-- telemetry_job_problems: what could not be stored for a job, newest first and bounded: refused points by
-- reason (kind 'refused', with a count) and damaged file regions (kind 'damaged', with offset and bytes).
CREATE OR REPLACE FUNCTION tuneplane.telemetry_job_problems(p_actor_id bigint, p_job_id bigint,
                                                           p_limit integer DEFAULT 200)
RETURNS TABLE (kind text, attempt integer, member_rank integer, source text, what text, reason text,
               count bigint, file_offset bigint, bytes bigint, at timestamptz)
LANGUAGE plpgsql STABLE AS $$
BEGIN
    PERFORM tuneplane.require_job_access(p_actor_id, p_job_id, 'read');
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

-- telemetry_job_series: the series of a job the user may read, optionally narrowed.
CREATE OR REPLACE FUNCTION tuneplane.telemetry_job_series(p_actor_id bigint, p_job_id bigint, p_name text DEFAULT NULL,
                                               p_attempt integer DEFAULT NULL, p_member integer DEFAULT NULL,
                                               p_source text DEFAULT NULL)
RETURNS SETOF tuneplane.telemetry_series
LANGUAGE plpgsql STABLE AS $$
BEGIN
    PERFORM tuneplane.require_job_access(p_actor_id, p_job_id, 'read');
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

-- telemetry_series_buckets: one series downsampled to at most p_max_buckets buckets (1..1000) over a step
-- range, each with min, max, mean and the last value. Reads the coarsest rollup whose width fits the
-- bucket width (bucket edges then follow that rollup's grid), or raw points when buckets are narrower
-- than 64 steps. A step far outside the others (one step of 2^50 among steps 0..10,000) would leave all
-- real data in one or two equal-width buckets; when fewer than a quarter of the buckets would hold data,
-- the buckets instead split the occupied steps into equal shares (ntile over the raw points when at most
-- 64,000, else over the finest rollup cells that number at most 16 per bucket), so gaps cost nothing.
-- Step arithmetic is exact over the whole int64 range. No caller check: use telemetry_buckets for
-- user-facing reads.
CREATE OR REPLACE FUNCTION tuneplane.telemetry_series_buckets(p_series_id bigint, p_max_buckets integer,
                                                   p_step_from bigint DEFAULT NULL,
                                                   p_step_to bigint DEFAULT NULL,
                                                   p_use_rollups boolean DEFAULT true)
RETURNS TABLE (bucket_start bigint, bucket_end bigint, n bigint, min double precision,
               max double precision, mean double precision, last_step bigint, last_value double precision,
               last_wall double precision)
LANGUAGE plpgsql STABLE AS $$
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
        RAISE EXCEPTION 'max_points must be between 1 and 1000' USING ERRCODE = 'TP400', COLUMN = 'max_points';
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

-- telemetry_series_smoothed: the trailing mean of a series' finite values over (t - p_window, t] at each
-- given step t: smoothing defined on the full series, so it does not change with the zoom or the number
-- of buckets (the charts evaluate it at each bucket's last step). Windows under 1,024 steps read raw
-- points; wider ones the rollup cells of the widest width ≤ window/16 (the cell holding t counts whole,
-- an error of at most 1/16 of the window). At most 1,000 steps per call.
CREATE OR REPLACE FUNCTION tuneplane.telemetry_series_smoothed(p_series_id bigint, p_window bigint,
                                                               p_steps bigint[])
RETURNS TABLE (step bigint, value double precision)
LANGUAGE plpgsql STABLE AS $$
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

-- telemetry_require_series: 404 unless the user may read the series' job (no hint that it exists).
CREATE OR REPLACE FUNCTION tuneplane.telemetry_require_series(p_actor_id bigint, p_series_id bigint)
RETURNS void
LANGUAGE plpgsql STABLE AS $$
DECLARE
    job bigint;
BEGIN
    SELECT s.job_id INTO job FROM tuneplane.telemetry_series s WHERE s.id = p_series_id;
    PERFORM tuneplane.require_job_access(p_actor_id, job, 'read');
EXCEPTION WHEN SQLSTATE 'TP404' THEN
    RAISE EXCEPTION 'no such series of yours: %', p_series_id USING ERRCODE = 'TP404', COLUMN = 'series';
END;
$$;

-- telemetry_buckets: telemetry_series_buckets for a user (owner or admin; 404 otherwise).
CREATE OR REPLACE FUNCTION tuneplane.telemetry_buckets(p_actor_id bigint, p_series_id bigint, p_max_buckets integer,
                                            p_step_from bigint DEFAULT NULL, p_step_to bigint DEFAULT NULL)
RETURNS TABLE (bucket_start bigint, bucket_end bigint, n bigint, min double precision,
               max double precision, mean double precision, last_step bigint, last_value double precision,
               last_wall double precision)
LANGUAGE plpgsql STABLE AS $$
BEGIN
    PERFORM tuneplane.telemetry_require_series(p_actor_id, p_series_id);
    RETURN QUERY SELECT * FROM tuneplane.telemetry_series_buckets(p_series_id, p_max_buckets, p_step_from, p_step_to);
END;
$$;

-- telemetry_smoothed: telemetry_series_smoothed for a user (owner or admin; 404 otherwise).
CREATE OR REPLACE FUNCTION tuneplane.telemetry_smoothed(p_actor_id bigint, p_series_id bigint, p_window bigint,
                                                        p_steps bigint[])
RETURNS TABLE (step bigint, value double precision)
LANGUAGE plpgsql STABLE AS $$
BEGIN
    PERFORM tuneplane.telemetry_require_series(p_actor_id, p_series_id);
    RETURN QUERY SELECT * FROM tuneplane.telemetry_series_smoothed(p_series_id, p_window, p_steps);
END;
$$;

-- telemetry_raw_points: one page (at most 2000) of exact points of a series, by step. Page on with
-- p_step_from = the last step returned and p_skip = how many points of that step the page already held.
CREATE OR REPLACE FUNCTION tuneplane.telemetry_raw_points(p_actor_id bigint, p_series_id bigint, p_step_from bigint DEFAULT NULL,
                                               p_step_to bigint DEFAULT NULL, p_limit integer DEFAULT 500,
                                               p_skip integer DEFAULT 0)
RETURNS TABLE (step bigint, value double precision, wall_time double precision)
LANGUAGE plpgsql STABLE AS $$
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

-- telemetry_prune: retention. Deletes series (with their points and rollups) whose last batch is older
-- than the retention setting, and ledger, refusal, damage and member-completion rows as old; returns what
-- it deleted. The worker's sweeps call it hourly (workers/sweeps.py).
CREATE OR REPLACE FUNCTION tuneplane.telemetry_prune(p_now timestamptz DEFAULT now())
RETURNS TABLE (series bigint, points bigint, batches bigint)
LANGUAGE plpgsql AS $$
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

-- Operators: what each collector last reported, and every series with its size and freshness.
CREATE OR REPLACE VIEW tuneplane.v_telemetry_collectors AS
    SELECT c.collector_id, c.job_id, c.attempt, c.member_rank, c.batches, c.points, c.duplicates,
           c.last_batch_at, now() - c.last_batch_at AS silent_for, c.health
      FROM tuneplane.telemetry_collectors c;

CREATE OR REPLACE VIEW tuneplane.v_telemetry_series AS
    SELECT s.id, s.job_id, s.attempt, s.member_rank, s.source, s.name, s.canonical, s.point_count,
           s.min_step, s.max_step, s.last_value, s.last_at
      FROM tuneplane.telemetry_series s;
