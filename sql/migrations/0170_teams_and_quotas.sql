-- 0170 teams, roles, scoped API tokens, fleet access and quotas (issue 20; docs/teams.md).
--
-- Every job belongs to one team. A user's role in a team is admin, member or viewer; installation admins
-- (users.role = 'admin') keep seeing everything. Existing installations migrate without loss: every
-- existing user gets a personal team (teams.personal_of = the user) in which they are admin, it becomes
-- their default team, and every existing job moves into its owner's personal team.
--
-- Tokens may be narrowed to teams (api_token_teams; no row = every team of the user) and to read-only.
-- Fleets may be open to every team (team_access = 'open', the default: nothing changes for existing
-- fleets) or only to the teams listed in fleet_team_access, which also maps a team to its Slurm account.
-- Quotas per (team, fleet, GPU model): a fleet without any quota row is admitted as before (priority, then
-- age); once it has one, reserve_next admits by guarantee, then fair share (ADR 0170).

CREATE TABLE tuneplane.teams (
    id          bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    name        text        NOT NULL UNIQUE CHECK (name ~ '^[a-z0-9][a-z0-9_.-]{1,62}$'),
    -- The user whose personal team this is (made with the user); NULL for a shared team.
    personal_of bigint      UNIQUE REFERENCES tuneplane.users (id),
    created_at  timestamptz NOT NULL DEFAULT now(),
    created_by  bigint      REFERENCES tuneplane.users (id)
);

CREATE TABLE tuneplane.team_members (
    team_id  bigint      NOT NULL REFERENCES tuneplane.teams (id),
    user_id  bigint      NOT NULL REFERENCES tuneplane.users (id),
    role     text        NOT NULL CHECK (role IN ('admin', 'member', 'viewer')),
    added_at timestamptz NOT NULL DEFAULT now(),
    added_by bigint      REFERENCES tuneplane.users (id),
    PRIMARY KEY (team_id, user_id)
);
CREATE INDEX team_members_user ON tuneplane.team_members (user_id, team_id);

-- The team a preview uses when the spec names none.
ALTER TABLE tuneplane.users ADD COLUMN default_team_id bigint REFERENCES tuneplane.teams (id);

-- Jobs: the team they belong to, and whether they may be preempted (only preemptible jobs borrow idle
-- capacity above their team's guarantee until issue 21's preemption can take it back). A preview records
-- the team it resolved to (also inside `resolved`, so the digest covers it); no foreign key, like fleet_id:
-- an immutable row must not pin another one forever. Previews made before this migration have none.
ALTER TABLE tuneplane.jobs ADD COLUMN team_id bigint REFERENCES tuneplane.teams (id);
ALTER TABLE tuneplane.jobs ADD COLUMN preemptible boolean NOT NULL DEFAULT false;
ALTER TABLE tuneplane.previews ADD COLUMN team_id bigint;
-- Attempts admitted above their team's guarantee (borrowed idle capacity): preemption reclaims these first.
ALTER TABLE tuneplane.attempts ADD COLUMN borrowing boolean NOT NULL DEFAULT false;

-- Backfill: one personal team per existing user (named after the user; `<name>-<id>` where a team of that
-- name exists, which cannot happen on a database of the previous release, where there are no teams).
INSERT INTO tuneplane.teams (name, personal_of, created_at, created_by)
SELECT u.username, u.id, u.created_at, u.id FROM tuneplane.users u ORDER BY u.id;
INSERT INTO tuneplane.team_members (team_id, user_id, role, added_at, added_by)
SELECT t.id, t.personal_of, 'admin', t.created_at, t.personal_of FROM tuneplane.teams t;
UPDATE tuneplane.users u SET default_team_id = t.id FROM tuneplane.teams t WHERE t.personal_of = u.id;

-- Moving the jobs must not look like a change of the jobs: their guard triggers (updated_at, state
-- transition checks) are user triggers and stay off for this one statement; foreign keys stay on.
ALTER TABLE tuneplane.jobs DISABLE TRIGGER USER;
UPDATE tuneplane.jobs j SET team_id = t.id FROM tuneplane.teams t WHERE t.personal_of = j.owner_id;
ALTER TABLE tuneplane.jobs ENABLE TRIGGER USER;
ALTER TABLE tuneplane.jobs ALTER COLUMN team_id SET NOT NULL;
CREATE INDEX jobs_team ON tuneplane.jobs (team_id, id DESC);

-- Scoped tokens: read_only forbids every write (preview, confirm, cancel, …); api_token_teams narrows a
-- token to some of its user's teams (no row: every team). Effective right = role ∩ token scope.
ALTER TABLE tuneplane.api_tokens ADD COLUMN read_only boolean NOT NULL DEFAULT false;
CREATE TABLE tuneplane.api_token_teams (
    token_id bigint NOT NULL REFERENCES tuneplane.api_tokens (id),
    team_id  bigint NOT NULL REFERENCES tuneplane.teams (id),
    PRIMARY KEY (token_id, team_id)
);

-- Which teams may use which fleet. 'open': every team; 'listed': only the teams in fleet_team_access.
-- usage_half_life: fair share counts past usage decayed with this half-life (NULL: current allocation only).
ALTER TABLE tuneplane.fleets
    ADD COLUMN team_access text NOT NULL DEFAULT 'open' CHECK (team_access IN ('open', 'listed')),
    ADD COLUMN usage_half_life interval CHECK (usage_half_life > interval '0');

CREATE TABLE tuneplane.fleet_team_access (
    fleet_id      bigint      NOT NULL REFERENCES tuneplane.fleets (id),
    team_id       bigint      NOT NULL REFERENCES tuneplane.teams (id),
    -- Slurm fleets: the account the team's jobs are submitted under (sbatch --account); NULL: none given.
    slurm_account text        CHECK (slurm_account ~ '^[A-Za-z0-9_.-]{1,64}$'),
    granted_at    timestamptz NOT NULL DEFAULT now(),
    granted_by    bigint      REFERENCES tuneplane.users (id),
    PRIMARY KEY (fleet_id, team_id)
);
CREATE INDEX fleet_team_access_team ON tuneplane.fleet_team_access (team_id);

-- Quotas per (team, fleet, GPU model); gpu_model '' is the row for every model of the fleet.
--   guaranteed_gpus: always available to the team's jobs, lent to preemptible jobs of others while unused;
--   limit_gpus:      hard cap on the team's GPUs in the fleet, borrowing included (NULL: no cap);
--   weight:          share of idle capacity (fair share = allocated GPUs ÷ weight, lowest first);
--   overcommit:      written with --overcommit although the fleet's guarantees sum past its GPUs.
-- A team with no row on a fleet that has quotas: guarantee 0, no limit, weight 1.
CREATE TABLE tuneplane.team_quotas (
    team_id         bigint           NOT NULL REFERENCES tuneplane.teams (id),
    fleet_id        bigint           NOT NULL REFERENCES tuneplane.fleets (id),
    gpu_model       text             NOT NULL DEFAULT '' CHECK (length(gpu_model) <= 200),
    guaranteed_gpus integer          NOT NULL DEFAULT 0 CHECK (guaranteed_gpus >= 0),
    limit_gpus      integer          CHECK (limit_gpus >= guaranteed_gpus),
    weight          double precision NOT NULL DEFAULT 1 CHECK (weight > 0 AND weight <= 1000000),
    overcommit      boolean          NOT NULL DEFAULT false,
    updated_at      timestamptz      NOT NULL DEFAULT now(),
    updated_by      bigint           REFERENCES tuneplane.users (id),
    PRIMARY KEY (team_id, fleet_id, gpu_model)
);
CREATE INDEX team_quotas_fleet ON tuneplane.team_quotas (fleet_id);

-- Decayed past usage per (team, fleet) for fair share with a half-life; written by the placement pass
-- under the fleet's placement lock (so never contended), read by the same pass.
CREATE TABLE tuneplane.team_fleet_usage (
    team_id          bigint           NOT NULL REFERENCES tuneplane.teams (id),
    fleet_id         bigint           NOT NULL REFERENCES tuneplane.fleets (id),
    decayed_gpu_secs double precision NOT NULL DEFAULT 0 CHECK (decayed_gpu_secs >= 0),
    decayed_at       timestamptz      NOT NULL DEFAULT now(),
    PRIMARY KEY (fleet_id, team_id)
);
