-- 0300: priority classes are granted (issue 38). A job's priority decides whom the planner preempts, so
-- the highest class a team's members may use is a grant, as Slurm's AllowQos or a Kubernetes
-- PriorityClass quota: every team may use the classes up to `normal`; an installation admin grants a
-- higher one per team, on every fleet (fleet_id NULL) or on one fleet. A preview above the team's grant
-- is refused (sql/functions/teams.sql: require_priority_grant). One grant per (team, fleet or every
-- fleet); the class is kept by name, following a rename of its class.
CREATE TABLE tuneplane.team_priority_grants (
    team_id    bigint NOT NULL REFERENCES tuneplane.teams (id) ON DELETE CASCADE,
    fleet_id   bigint REFERENCES tuneplane.fleets (id) ON DELETE CASCADE,
    max_class  text NOT NULL REFERENCES tuneplane.priority_classes (name) ON UPDATE CASCADE,
    granted_by bigint REFERENCES tuneplane.users (id),
    granted_at timestamptz NOT NULL DEFAULT now()
);
CREATE UNIQUE INDEX team_priority_grants_team_fleet ON tuneplane.team_priority_grants (team_id, coalesce(fleet_id, 0));
