-- 0180: the usage ledger (issue 20, docs/teams.md "Usage ledger"). One row per member of an attempt, opened
-- by the transaction that reserves the member's resources (reserve_next; slurm_allocation_started for Slurm
-- fleets) and closed by the transaction that releases them (release_member), through open_usage and
-- close_usage (sql/functions/usage.sql). Never reconstructed later: GPU-seconds are exact for failed,
-- cancelled, aborted, lost and retried attempts too.
--
-- A member is charged from the instant its resources were reserved to the instant they were released (what
-- nobody else could use), not only while its process ran. reserve_next writes one instant to a pass's GPU
-- allocations and ledger rows, and release_member one instant to the member, its GPUs and its ledger row,
-- so the placement's own GPU records and the ledger agree to the microsecond
-- (tests/db/test_usage_ledger.py checks it over 200 jobs).
--
-- The ledger keeps what it was at the time (node name, GPU model, team, user): rows are history and outlive
-- renames; member_id, job_id, attempt_id carry no foreign keys so that pruning launch rows never needs the
-- ledger's consent.
CREATE TABLE tuneplane.usage_ledger (
    member_id        bigint      PRIMARY KEY,
    job_id           bigint      NOT NULL,
    attempt_id       bigint      NOT NULL,
    attempt          integer     NOT NULL CHECK (attempt >= 1),
    rank             integer     NOT NULL CHECK (rank >= 0),
    -- The job's team when the member was reserved.
    team_id          bigint      NOT NULL REFERENCES tuneplane.teams (id),
    user_id          bigint      NOT NULL REFERENCES tuneplane.users (id),
    fleet_id         bigint      NOT NULL REFERENCES tuneplane.fleets (id),
    node_id          bigint      NOT NULL,
    node_name        text        NOT NULL,
    -- NULL when the member holds no GPU.
    gpu_model        text,
    gpus             integer     NOT NULL CHECK (gpus >= 0),
    cpus             integer     NOT NULL CHECK (cpus >= 0),
    memory_bytes     bigint      NOT NULL CHECK (memory_bytes >= 0),
    started_at       timestamptz NOT NULL,
    ended_at         timestamptz,
    -- The member's state when its resources went back: exited, failed, aborted, cancelled, lost (and what
    -- later issues add, e.g. preempted).
    ended_how        text,
    end_reason       text,
    gpu_seconds      numeric GENERATED ALWAYS AS (gpus * extract(epoch FROM ended_at - started_at)) STORED,
    -- Issue 21 (preemption): GPU-seconds of this member's work lost (since its last verified checkpoint).
    lost_gpu_seconds numeric     NOT NULL DEFAULT 0 CHECK (lost_gpu_seconds >= 0),
    -- Issue 22 (idle GPUs): GPU-seconds this member held its GPUs idle.
    idle_gpu_seconds numeric     NOT NULL DEFAULT 0 CHECK (idle_gpu_seconds >= 0),
    -- What share of gpu_seconds is charged: 1 by default, 0 for scavenger work (issue 21).
    charge_factor    numeric     NOT NULL DEFAULT 1 CHECK (charge_factor >= 0),
    CONSTRAINT usage_ledger_ended_together CHECK ((ended_at IS NULL) = (ended_how IS NULL)),
    CONSTRAINT usage_ledger_ends_after_start CHECK (ended_at >= started_at)
);
CREATE INDEX usage_ledger_started ON tuneplane.usage_ledger (started_at);
CREATE INDEX usage_ledger_open ON tuneplane.usage_ledger (fleet_id) WHERE ended_at IS NULL;
CREATE INDEX usage_ledger_team ON tuneplane.usage_ledger (team_id, started_at);
CREATE INDEX usage_ledger_job ON tuneplane.usage_ledger (job_id);

-- Optional prices that turn GPU-seconds into cost on the Usage page and in `tuneplane usage`: per fleet, or
-- per (fleet, GPU model), the model-specific price winning. No row: no cost is shown.
CREATE TABLE tuneplane.usage_prices (
    id                 bigint  GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    fleet_id           bigint  NOT NULL REFERENCES tuneplane.fleets (id),
    gpu_model          text    CHECK (gpu_model <> ''),
    price_per_gpu_hour numeric NOT NULL CHECK (price_per_gpu_hour >= 0),
    currency           text    NOT NULL DEFAULT 'USD' CHECK (currency ~ '^[A-Z]{3}$'),
    updated_at         timestamptz NOT NULL DEFAULT now()
);
CREATE UNIQUE INDEX usage_prices_one ON tuneplane.usage_prices (fleet_id, coalesce(gpu_model, ''));
