-- GPUs each team holds on each fleet, counted as members are reserved and released (issue 20's placement
-- rate), so that a placement pass reads one row per team instead of summing every live member of the fleet
-- (fleet_team_shares, placement.sql). The rules that keep the count live in sql/functions/placement.sql
-- (reserve_next, release_member, team_fleet_held_now); docs/teams.md ("GPUs held") says why two tables.
--
-- team_fleet_held: the folded count per (fleet, team): GPUs (cardinality of gpu_indices) and members not
-- yet released on the fleet's nodes. A team holds something on the fleet while members > 0 (a member may
-- hold no GPU index: a 0-GPU job, a Slurm member). Written only by reserve_next under the fleet's
-- placement lock (its own placements, and the fold of the changes below), so never contended.
CREATE TABLE tuneplane.team_fleet_held (
    fleet_id bigint  NOT NULL REFERENCES tuneplane.fleets (id),
    team_id  bigint  NOT NULL REFERENCES tuneplane.teams (id),
    gpus     integer NOT NULL CHECK (gpus >= 0),
    members  integer NOT NULL CHECK (members >= 0),
    PRIMARY KEY (fleet_id, team_id)
);

-- team_fleet_held_changes: what happened since the last fold outside the placement lock, one row per
-- release (negative GPUs and members) and per Slurm allocation that started (its members). Insert-only
-- for every writer but reserve_next's fold, so a release never waits for a counter row another transaction
-- holds (a release runs under its job's locks, not the fleet's placement lock).
-- No foreign keys: the ids come from the released member's job and node in the same transaction, and a
-- key-share lock on a team or fleet row is one more lock a release would take.
CREATE TABLE tuneplane.team_fleet_held_changes (
    id       bigint  GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    fleet_id bigint  NOT NULL,
    team_id  bigint  NOT NULL,
    gpus     integer NOT NULL,
    members  integer NOT NULL
);
CREATE INDEX team_fleet_held_changes_fleet ON tuneplane.team_fleet_held_changes (fleet_id);

-- team_fleet_held_built: the fleets whose count exists. No backfill here: a release by the previous
-- functions between this migration's commit and the new function files (applied in a later transaction,
-- possibly while workers run) would be missed. reserve_next counts a fleet from its members the first time
-- it runs on it under the new functions (team_fleet_held_build), and readers recount a fleet not in this
-- table.
CREATE TABLE tuneplane.team_fleet_held_built (
    fleet_id bigint      PRIMARY KEY REFERENCES tuneplane.fleets (id),
    built_at timestamptz NOT NULL DEFAULT now()
);
