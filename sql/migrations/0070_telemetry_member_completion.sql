-- 0070 telemetry per member: metrics completion (collecting → complete | incomplete with a reason), points
-- refused one by one with their reasons, damaged file regions, a per-member series cap, a drain grace after
-- which a member's token stops working, and the batch ledger and collector rows keyed by the token's scope
-- (one job's token can no longer claim another job's collector id or batch).

ALTER TABLE tuneplane.telemetry_settings
    -- After a member ends its telemetry token works this much longer (its collector's drain), then is refused.
    ADD COLUMN drain_grace          interval NOT NULL DEFAULT interval '2 minutes'
                                    CHECK (drain_grace >= interval '0'),
    -- A member may have at most this many series; points of further series are refused (and counted).
    ADD COLUMN max_series_per_member integer NOT NULL DEFAULT 2000 CHECK (max_series_per_member > 0);

-- revoked_at may lie in the future: "refused from then on" (a member's end plus the drain grace).
COMMENT ON COLUMN tuneplane.telemetry_tokens.revoked_at IS 'refused from this time on (may be in the future)';

-- One row per member that got a token: where its metrics stand.
CREATE TABLE tuneplane.telemetry_members (
    job_id          bigint      NOT NULL,
    attempt         integer     NOT NULL,
    member_rank     integer     NOT NULL,
    state           text        NOT NULL DEFAULT 'collecting'
                                CHECK (state IN ('collecting', 'complete', 'incomplete')),
    reason          text        NOT NULL DEFAULT '',
    series          integer     NOT NULL DEFAULT 0,   -- series created (for the per-member cap)
    refused_points  bigint      NOT NULL DEFAULT 0,
    damaged_regions bigint      NOT NULL DEFAULT 0,
    member_ended_at timestamptz,                      -- set by the member-end trigger
    finished_at     timestamptz,                      -- the collector's final batch
    updated_at      timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (job_id, attempt, member_rank)
);

-- Points refused one by one (by the collector while reading, or by the gateway), counted per reason.
CREATE TABLE tuneplane.telemetry_refusals (
    job_id      bigint      NOT NULL,
    attempt     integer     NOT NULL,
    member_rank integer     NOT NULL,
    source      text        NOT NULL,
    name        text        NOT NULL,  -- '' when the name itself was the problem (or the whole line)
    reason      text        NOT NULL,
    count       bigint      NOT NULL CHECK (count > 0),
    first_at    timestamptz NOT NULL DEFAULT now(),
    last_at     timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (job_id, attempt, member_rank, source, name, reason)
);

-- Regions of a file the reader skipped (a damaged TensorBoard record, a cut-short tail), recorded even when
-- no point came with them.
CREATE TABLE tuneplane.telemetry_damage (
    id          bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    job_id      bigint      NOT NULL,
    attempt     integer     NOT NULL,
    member_rank integer     NOT NULL,
    source      text        NOT NULL,
    file        text        NOT NULL,
    file_offset bigint      NOT NULL CHECK (file_offset >= 0),
    bytes       bigint      NOT NULL CHECK (bytes > 0),
    reason      text        NOT NULL,
    recorded_at timestamptz NOT NULL DEFAULT now(),
    UNIQUE (job_id, attempt, member_rank, file, file_offset)
);

-- The ledger and the collector rows belong to the token's scope, not to whoever names a collector id.
ALTER TABLE tuneplane.telemetry_batches
    ADD COLUMN job_id      bigint,
    ADD COLUMN attempt     integer,
    ADD COLUMN member_rank integer;
UPDATE tuneplane.telemetry_batches b SET job_id = t.job_id, attempt = t.attempt, member_rank = t.member_rank
  FROM tuneplane.telemetry_tokens t WHERE t.id = b.token_id;
DELETE FROM tuneplane.telemetry_batches WHERE job_id IS NULL;
ALTER TABLE tuneplane.telemetry_batches
    ALTER COLUMN job_id SET NOT NULL, ALTER COLUMN attempt SET NOT NULL, ALTER COLUMN member_rank SET NOT NULL,
    DROP CONSTRAINT telemetry_batches_pkey,
    ADD PRIMARY KEY (job_id, attempt, member_rank, collector_id, seq);

ALTER TABLE tuneplane.telemetry_collectors
    DROP CONSTRAINT telemetry_collectors_pkey,
    ADD PRIMARY KEY (job_id, attempt, member_rank, collector_id);
DROP INDEX IF EXISTS tuneplane.telemetry_collectors_job;

INSERT INTO tuneplane.telemetry_members (job_id, attempt, member_rank)
SELECT DISTINCT job_id, attempt, member_rank FROM tuneplane.telemetry_tokens
ON CONFLICT DO NOTHING;
UPDATE tuneplane.telemetry_members m SET series = s.n
  FROM (SELECT job_id, attempt, member_rank, count(*)::integer AS n FROM tuneplane.telemetry_series
         GROUP BY 1, 2, 3) s
 WHERE s.job_id = m.job_id AND s.attempt = m.attempt AND s.member_rank = m.member_rank;
