-- 0200 idle GPUs (issue 22): the idle policy per fleet, overridable per team, the sweep's settings, and each
-- running job's idle watch (what the last evaluation found, the warning, the reclaim deadline, an admin's
-- exemption, the idle GPU-seconds counted so far). The rules live in sql/functions/idle.sql.

-- One row per fleet (team_id NULL) and per (fleet, team) override. A NULL column inherits: a team's row
-- from the fleet's, the fleet's from the defaults written once in idle_policy_of().
CREATE TABLE tuneplane.idle_policies (
    id                bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    fleet_id          bigint      NOT NULL REFERENCES tuneplane.fleets (id) ON DELETE CASCADE,
    team_id           bigint REFERENCES tuneplane.teams (id) ON DELETE CASCADE,
    -- How long every GPU of the job must have been idle before the job is warned.
    idle_after        interval CHECK (idle_after > interval '0'),
    -- A GPU is idle over the window when all its utilization samples are below this (percent) ...
    utilization_below double precision CHECK (utilization_below > 0 AND utilization_below <= 100),
    -- ... or all its power samples are below this fraction of the board's power limit (ADR 0200).
    power_below       double precision CHECK (power_below >= 0 AND power_below <= 1),
    -- off: only measured; warn: the job's reason, timeline and webhook say it; reclaim: warn, then stop
    -- the job idle_grace later unless its GPUs became busy.
    action            text CHECK (action IN ('off', 'warn', 'reclaim')),
    idle_grace        interval CHECK (idle_grace >= interval '0'),
    updated_at        timestamptz NOT NULL DEFAULT now(),
    updated_by        bigint REFERENCES tuneplane.users (id)
);
CREATE UNIQUE INDEX idle_policies_scope ON tuneplane.idle_policies (fleet_id, coalesce(team_id, 0));

CREATE TABLE tuneplane.idle_settings (
    singleton      boolean  PRIMARY KEY DEFAULT true CHECK (singleton),
    -- Samples further apart than this (or missing this long at either end of the window) leave a GPU
    -- "unknown", never idle. The collector samples every 10 s by default.
    max_sample_gap interval NOT NULL DEFAULT interval '2 minutes' CHECK (max_sample_gap > interval '0'),
    -- A running job is evaluated at most this often (the sweep runs more often).
    check_every    interval NOT NULL DEFAULT interval '1 minute' CHECK (check_every >= interval '0')
);
INSERT INTO tuneplane.idle_settings DEFAULT VALUES;

-- Leaf rows: one per job that was ever evaluated. Written only by the functions of idle.sql.
CREATE TABLE tuneplane.job_idle (
    job_id           bigint PRIMARY KEY REFERENCES tuneplane.jobs (id),
    -- The attempt the watch below is about; a new attempt starts a new watch (the exemption stays).
    attempt_id       bigint REFERENCES tuneplane.attempts (id),
    status           text        NOT NULL DEFAULT 'unknown' CHECK (status IN ('unknown', 'busy', 'idle')),
    -- Start of the current idle stretch (the window's start when it was first found idle).
    idle_since       timestamptz,
    warned_at        timestamptz,
    -- The warning as the job's reason and timeline said it (kept while the warning stands).
    warning          text,
    -- When a warned job is reclaimed (action reclaim); NULL for action warn.
    deadline         timestamptz,
    reclaimed_at     timestamptz,
    checked_at       timestamptz,
    -- The numbers of the last evaluation (GPUs idle/busy/unknown, highest utilization and power fraction).
    evaluation       jsonb       NOT NULL DEFAULT '{}'::jsonb,
    -- GPU-seconds the job's GPUs were found idle, summed over its attempts.
    idle_gpu_seconds double precision NOT NULL DEFAULT 0 CHECK (idle_gpu_seconds >= 0),
    exempt_at        timestamptz,
    exempt_by        bigint REFERENCES tuneplane.users (id),
    exempt_reason    text,
    CONSTRAINT job_idle_exempt_has_reason CHECK ((exempt_at IS NULL) = (exempt_reason IS NULL)),
    CONSTRAINT job_idle_deadline_after_warning CHECK (deadline IS NULL OR warned_at IS NOT NULL)
);
CREATE INDEX job_idle_checked ON tuneplane.job_idle (checked_at);
-- The dashboard's "jobs warned for idle GPUs" reads only the warnings that stand.
CREATE INDEX job_idle_warned ON tuneplane.job_idle (job_id) WHERE warned_at IS NOT NULL AND reclaimed_at IS NULL;
