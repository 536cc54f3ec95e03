-- 0030 telemetry storage: scoped collector/SDK tokens, series, bulk-loaded points, rollups maintained at
-- ingest, the batch ledger that makes a re-sent batch a no-op, and the retention setting.
--
-- Telemetry is scoped by (job_id, attempt number, member rank). job_id is a plain column, not a foreign key:
-- metrics arrive on their own path and must not block (or be blocked by) job rows; attempts and members are
-- created by the launch migrations after this one. Reads join tuneplane.jobs for the owner at query time.

CREATE TABLE tuneplane.telemetry_settings (
    singleton        boolean     PRIMARY KEY DEFAULT true CHECK (singleton),
    -- Series whose last point is older than this are deleted by telemetry_prune().
    retention        interval    NOT NULL DEFAULT interval '180 days' CHECK (retention > interval '0'),
    -- Lifetime of a member's telemetry token when the issuer does not say.
    token_ttl        interval    NOT NULL DEFAULT interval '30 days' CHECK (token_ttl > interval '0'),
    max_batch_points integer     NOT NULL DEFAULT 200000 CHECK (max_batch_points > 0)
);
INSERT INTO tuneplane.telemetry_settings DEFAULT VALUES;

CREATE TABLE tuneplane.telemetry_tokens (
    id          bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    token_hash  text        NOT NULL UNIQUE CHECK (token_hash ~ '^[0-9a-f]{64}$'),
    job_id      bigint      NOT NULL,
    attempt     integer     NOT NULL CHECK (attempt >= 1),
    member_rank integer     NOT NULL CHECK (member_rank >= 0),
    created_at  timestamptz NOT NULL DEFAULT now(),
    expires_at  timestamptz NOT NULL,
    revoked_at  timestamptz
);
CREATE INDEX telemetry_tokens_scope ON tuneplane.telemetry_tokens (job_id, attempt, member_rank);

CREATE TABLE tuneplane.telemetry_series (
    id          bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    job_id      bigint      NOT NULL,
    attempt     integer     NOT NULL,
    member_rank integer     NOT NULL,
    source      text        NOT NULL,  -- tensorboard:<run dir> | jsonl:<file> | sdk
    name        text        NOT NULL,  -- the raw tag or key, always kept
    canonical   text,                  -- loss, eval_loss, learning_rate, … (telemetry_canonical)
    point_count bigint      NOT NULL DEFAULT 0,
    min_step    bigint,
    max_step    bigint,
    last_step   bigint,
    last_value  double precision,
    created_at  timestamptz NOT NULL DEFAULT now(),
    last_at     timestamptz,           -- when the last batch of this series was stored
    UNIQUE (job_id, attempt, member_rank, source, name)
);
CREATE INDEX telemetry_series_canonical ON tuneplane.telemetry_series (job_id, canonical);
CREATE INDEX telemetry_series_last_at ON tuneplane.telemetry_series (last_at);

-- Points are loaded with binary COPY. No foreign key to series (a per-row check would halve the load rate);
-- the ingest transaction creates the series rows before it copies their points.
CREATE TABLE tuneplane.telemetry_points (
    series_id bigint           NOT NULL,
    step      bigint           NOT NULL,
    value     double precision NOT NULL,
    wall_time double precision NOT NULL  -- seconds since the epoch, as the writer recorded it
);
CREATE INDEX telemetry_points_series_step ON tuneplane.telemetry_points (series_id, step);

-- Per-bucket aggregates at widths 64, 512, 4096 and 32768 steps, merged in the ingest transaction, so a
-- 1,000-bucket view of any range reads at most ~8,000 rows. Non-finite values count in no aggregate but
-- `last_value`.
CREATE TABLE tuneplane.telemetry_rollups (
    series_id  bigint           NOT NULL,
    width      integer          NOT NULL,
    bucket     bigint           NOT NULL,  -- floor(step / width)
    n          bigint           NOT NULL,
    sum        double precision NOT NULL,
    min        double precision,
    max        double precision,
    first_step bigint           NOT NULL,
    last_step  bigint           NOT NULL,
    last_value double precision NOT NULL,
    PRIMARY KEY (series_id, width, bucket)
);

-- The batch ledger: written in the same transaction as the batch's points, so a batch is stored at most
-- once; a re-send (collector restart, lost ack) finds its row and is skipped.
CREATE TABLE tuneplane.telemetry_batches (
    collector_id text        NOT NULL,
    seq          bigint      NOT NULL,
    token_id     bigint      NOT NULL,
    digest       text        NOT NULL,
    points       integer     NOT NULL,
    received_at  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (collector_id, seq)
);
CREATE INDEX telemetry_batches_received ON tuneplane.telemetry_batches (received_at);

-- What each collector last said about itself (damaged records, files whose framing was lost, last data).
CREATE TABLE tuneplane.telemetry_collectors (
    collector_id  text PRIMARY KEY,
    job_id        bigint      NOT NULL,
    attempt       integer     NOT NULL,
    member_rank   integer     NOT NULL,
    batches       bigint      NOT NULL DEFAULT 0,
    points        bigint      NOT NULL DEFAULT 0,
    duplicates    bigint      NOT NULL DEFAULT 0,
    health        jsonb       NOT NULL DEFAULT '{}'::jsonb,
    first_seen_at timestamptz NOT NULL DEFAULT now(),
    last_batch_at timestamptz
);
CREATE INDEX telemetry_collectors_job ON tuneplane.telemetry_collectors (job_id, attempt, member_rank);

-- Canonical metric names: the first rule (lowest priority number) whose case-insensitive regular expression
-- matches the raw name wins. Operators may add rules; telemetry_recanonicalize() re-applies them.
CREATE TABLE tuneplane.telemetry_canonical_rules (
    priority  integer PRIMARY KEY,
    pattern   text NOT NULL,
    canonical text NOT NULL CHECK (canonical IN ('loss', 'eval_loss', 'learning_rate', 'throughput',
                                                 'grad_norm', 'gpu_utilization', 'gpu_memory'))
);
INSERT INTO tuneplane.telemetry_canonical_rules (priority, pattern, canonical) VALUES
    (10, '^(eval|val|valid|validation|test)[/_.-]?(total_)?loss$', 'eval_loss'),
    (11, '^loss[/_.-](eval|val|valid|validation|test)$', 'eval_loss'),
    (20, '^((train|training)[/_.-])?(total_)?loss$', 'loss'),
    (21, '^loss[/_.-](train|training|step|epoch)$', 'loss'),
    (22, '^train[/_.-]loss[/_.-](step|epoch)$', 'loss'),
    (30, '^((train|optimizer|optim)[/_.-])?(lr|learning[_.-]?rate)$', 'learning_rate'),
    (31, '^lr[-_ /].+$', 'learning_rate'),
    (40, '^((train|training|perf|speed)[/_.-])?throughput([/_.-].*)?$', 'throughput'),
    (41, '^((train|training)[/_.-])?(samples|tokens|examples|images|sequences)[/_.-]?per[/_.-]?(sec|second)$',
         'throughput'),
    (42, '^((train|training)[/_.-])?(it|iter|iters|iterations)[/_.-]?(per[/_.-]?)?(s|sec|second)$', 'throughput'),
    (50, '^((train|training|optimizer|optim)[/_.-])?(grad|gradient)[_.-]?norm$', 'grad_norm'),
    (51, '^((train|optimizer)[/_.-])?global[_.-]?norm$', 'grad_norm'),
    (60, '^((system|sys)[/_.-])?gpu.*util', 'gpu_utilization'),
    (61, '^((system|sys)[/_.-])?gpu\.[0-9]+\.gpu$', 'gpu_utilization'),
    (70, '^((system|sys)[/_.-])?gpu.*mem', 'gpu_memory'),
    (71, '^(cuda|torch)[/_.-]?(max_)?mem(ory)?([/_.-].*)?$', 'gpu_memory'),
    (72, '^(max_)?memory[/_.-]?(allocated|reserved)$', 'gpu_memory');

-- telemetry_canonical: the canonical name for a raw metric name, or NULL.
CREATE FUNCTION tuneplane.telemetry_canonical(p_name text)
RETURNS text
LANGUAGE sql STABLE AS $$
    SELECT r.canonical FROM tuneplane.telemetry_canonical_rules r
     WHERE lower(p_name) ~ r.pattern
     ORDER BY r.priority
     LIMIT 1;
$$;

-- telemetry_recanonicalize: re-applies the rules to every series (after an operator changed them).
CREATE FUNCTION tuneplane.telemetry_recanonicalize()
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
CREATE FUNCTION tuneplane.set_telemetry_settings(p_actor_id bigint, p_retention interval DEFAULT NULL,
                                                 p_token_ttl interval DEFAULT NULL,
                                                 p_max_batch_points integer DEFAULT NULL)
RETURNS tuneplane.telemetry_settings
LANGUAGE plpgsql AS $$
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
