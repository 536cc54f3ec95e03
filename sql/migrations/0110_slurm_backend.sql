-- 0110 Slurm backend (issue 13): how a Slurm fleet reaches its cluster, what the worker last saw of it, the
-- Slurm state of each of its nodes, and the Slurm job behind each attempt. Functions: sql/functions/slurm.sql.

-- One row per fleet with backend 'slurm': cluster access and where its jobs go.
CREATE TABLE tuneplane.slurm_fleets (
    fleet_id      bigint PRIMARY KEY REFERENCES tuneplane.fleets (id),
    -- Local binaries read this slurm.conf (SLURM_CONF); NULL: the binaries' default.
    slurm_conf    text,
    partition     text        NOT NULL CHECK (partition ~ '^[A-Za-z0-9_.-]{1,64}$'),
    account       text        CHECK (account ~ '^[A-Za-z0-9_.-]{1,64}$'),
    qos           text        CHECK (qos ~ '^[A-Za-z0-9_.-]{1,64}$'),
    -- What the worker saw at its last look (slurm_sync_fleet / slurm_controller_unreachable).
    version       text,
    reachable     boolean     NOT NULL DEFAULT false,
    last_error    text,
    checked_at    timestamptz,
    reached_at    timestamptz,
    -- The partition's limits: a preview beyond them is refused (Slurm would leave it pending forever).
    max_nodes     integer,
    max_time_minutes integer
);

-- Slurm's own state of a node (idle, alloc, mix, drain, down …): the Fleet page's scheduling state.
CREATE TABLE tuneplane.slurm_nodes (
    node_id     bigint PRIMARY KEY REFERENCES tuneplane.nodes (id) ON DELETE CASCADE,
    slurm_state text        NOT NULL,
    reason      text,
    updated_at  timestamptz NOT NULL DEFAULT now()
);

-- The Slurm job behind an attempt. TunePlane's ids never depend on Slurm's: the attempt exists first, the
-- Slurm job id is recorded when sbatch answers (a requeued Slurm job keeps its id; TunePlane makes it a new
-- attempt).
CREATE TABLE tuneplane.slurm_jobs (
    attempt_id    bigint PRIMARY KEY REFERENCES tuneplane.attempts (id),
    job_id        bigint      NOT NULL REFERENCES tuneplane.jobs (id),
    fleet_id      bigint      NOT NULL REFERENCES tuneplane.fleets (id),
    slurm_job_id  bigint,
    slurm_state   text,
    slurm_reason  text,
    jobs_ahead    integer,
    node_list     text[],
    submitted_at  timestamptz,
    started_at    timestamptz,
    scancel_at    timestamptz,
    -- Slurm no longer lists it (squeue) and its end was recorded.
    gone_at       timestamptz,
    created_at    timestamptz NOT NULL DEFAULT now()
);
CREATE UNIQUE INDEX slurm_jobs_slurm_id ON tuneplane.slurm_jobs (fleet_id, slurm_job_id);
CREATE INDEX slurm_jobs_followed ON tuneplane.slurm_jobs (fleet_id) WHERE gone_at IS NULL;
