-- 0032 telemetry ingest without a hot row early in the transaction: batches of one collector may be sent
-- in parallel, and the per-collector row (and the series rows) must be locked only at the end of the
-- transaction, after the COPY, so that concurrent batches overlap instead of queueing behind each other.

DROP FUNCTION tuneplane.telemetry_begin_batch(text, text, bigint, text, integer, jsonb, text[], text[], jsonb);
DROP FUNCTION tuneplane.telemetry_merge_batch(bigint[], integer[], bigint[], bigint[], double precision[],
    double precision[], double precision[], bigint[], bigint[], double precision[], bigint[], bigint[], bigint[],
    bigint[], bigint[], double precision[]);

-- telemetry_begin_batch: first step of the ingest transaction. Checks the token's scope (401/403), the
-- batch size (413), records the batch in the ledger and returns duplicate = true if (collector, seq) was
-- already stored (the caller then stores nothing); a known (collector, seq) with a different digest is
-- refused (409). Creates missing series (with canonical names) and returns their ids in the order given,
-- and the token's scope for telemetry_merge_batch.
CREATE FUNCTION tuneplane.telemetry_begin_batch(p_token_hash text, p_collector text, p_seq bigint,
                                                p_digest text, p_points integer, p_scope jsonb,
                                                p_sources text[], p_names text[])
RETURNS TABLE (duplicate boolean, series_ids bigint[], job_id bigint, attempt integer, member_rank integer)
LANGUAGE plpgsql AS $$
DECLARE
    tok record;
    inserted boolean;
    known_digest text;
    ids bigint[];
    max_points integer;
BEGIN
    SELECT * INTO tok FROM tuneplane.telemetry_check_write(p_token_hash, p_scope);
    SELECT s.max_batch_points INTO max_points FROM tuneplane.telemetry_settings s;
    IF p_points > max_points THEN
        RAISE EXCEPTION 'batch holds % points; the limit is %', p_points, max_points
            USING ERRCODE = 'TP413', COLUMN = 'points';
    END IF;
    IF coalesce(array_length(p_sources, 1), 0) <> coalesce(array_length(p_names, 1), 0) THEN
        RAISE EXCEPTION 'sources and names differ in length' USING ERRCODE = 'TP400', COLUMN = 'series';
    END IF;

    INSERT INTO tuneplane.telemetry_batches (collector_id, seq, token_id, digest, points)
    VALUES (p_collector, p_seq, tok.token_id, p_digest, p_points)
    ON CONFLICT (collector_id, seq) DO NOTHING
    RETURNING true INTO inserted;

    IF inserted IS NULL THEN
        SELECT b.digest INTO known_digest FROM tuneplane.telemetry_batches b
         WHERE b.collector_id = p_collector AND b.seq = p_seq;
        IF known_digest IS DISTINCT FROM p_digest THEN
            RAISE EXCEPTION 'batch % of collector % was already stored with other content', p_seq, p_collector
                USING ERRCODE = 'TP409', COLUMN = 'seq';
        END IF;
        UPDATE tuneplane.telemetry_collectors c SET duplicates = c.duplicates + 1, last_batch_at = now()
         WHERE c.collector_id = p_collector;
        RETURN QUERY SELECT true, NULL::bigint[], tok.job_id, tok.attempt, tok.member_rank;
        RETURN;
    END IF;

    INSERT INTO tuneplane.telemetry_series (job_id, attempt, member_rank, source, name, canonical)
    SELECT DISTINCT tok.job_id, tok.attempt, tok.member_rank, u.src, u.nm, tuneplane.telemetry_canonical(u.nm)
      FROM unnest(p_sources, p_names) AS u(src, nm)
     WHERE NOT EXISTS (SELECT 1 FROM tuneplane.telemetry_series s
                        WHERE s.job_id = tok.job_id AND s.attempt = tok.attempt
                          AND s.member_rank = tok.member_rank AND s.source = u.src AND s.name = u.nm)
    ON CONFLICT ON CONSTRAINT telemetry_series_job_id_attempt_member_rank_source_name_key DO NOTHING;

    SELECT array_agg(s.id ORDER BY u.ord) INTO ids
      FROM unnest(p_sources, p_names) WITH ORDINALITY AS u(src, nm, ord)
      JOIN tuneplane.telemetry_series s
        ON s.job_id = tok.job_id AND s.attempt = tok.attempt AND s.member_rank = tok.member_rank
       AND s.source = u.src AND s.name = u.nm;
    RETURN QUERY SELECT false, coalesce(ids, ARRAY[]::bigint[]), tok.job_id, tok.attempt, tok.member_rank;
END;
$$;

-- telemetry_merge_batch: last step of the ingest transaction, after the points were copied. Merges the
-- batch's per-bucket aggregates into the rollups, its per-series summary into the series rows and the
-- collector's counters and health into its row. Rows arrive sorted by (series, width, bucket) so that
-- concurrent batches lock in one order.
CREATE FUNCTION tuneplane.telemetry_merge_batch(
    r_series bigint[], r_width integer[], r_bucket bigint[], r_n bigint[], r_sum double precision[],
    r_min double precision[], r_max double precision[], r_first bigint[], r_last bigint[],
    r_last_value double precision[],
    s_series bigint[], s_count bigint[], s_min_step bigint[], s_max_step bigint[], s_last_step bigint[],
    s_last_value double precision[],
    p_collector text, p_job_id bigint, p_attempt integer, p_member_rank integer, p_points integer,
    p_health jsonb)
RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO tuneplane.telemetry_rollups AS r
           (series_id, width, bucket, n, sum, min, max, first_step, last_step, last_value)
    SELECT * FROM unnest(r_series, r_width, r_bucket, r_n, r_sum, r_min, r_max, r_first, r_last, r_last_value)
    ON CONFLICT (series_id, width, bucket) DO UPDATE SET
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

    INSERT INTO tuneplane.telemetry_collectors AS c (collector_id, job_id, attempt, member_rank, batches,
                                                    points, health, last_batch_at)
    VALUES (p_collector, p_job_id, p_attempt, p_member_rank, 1, p_points, coalesce(p_health, '{}'::jsonb), now())
    ON CONFLICT (collector_id) DO UPDATE
        SET batches = c.batches + 1, points = c.points + EXCLUDED.points,
            health = CASE WHEN EXCLUDED.health = '{}'::jsonb THEN c.health ELSE EXCLUDED.health END,
            last_batch_at = now();
END;
$$;
