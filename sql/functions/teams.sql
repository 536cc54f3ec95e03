-- sql/functions/teams.sql — the current definition of every teams function, view and trigger.
-- Teams and roles (docs/teams.md): personal teams, memberships, a job's team.
--
-- Repeatable file (ADR 0012): `tuneplane db migrate` re-applies every file of sql/functions/ (in the order
-- of order.txt, one transaction) whenever one changes. Edit definitions here, never in a migration.
-- Tables, columns and data changes go in a new numbered migration. A changed signature or a view whose
-- columns change: add its DROP below (it runs before the new definition is created), e.g.
--   DROP FUNCTION IF EXISTS tuneplane.f(bigint, text);
--
-- Lock order: users row → teams row → team_members rows (a new user's trigger inserts its team and
-- membership after the users row exists and updates only that users row).
--
-- Drops (signature changes):

-- users_personal_team: every new user gets a personal team (named after the user, `<name>-<id>` if a team
-- of that name exists), is its admin, and it becomes the user's default team. Migration 0170 did the same
-- for the users that existed before teams.
CREATE OR REPLACE FUNCTION tuneplane.users_personal_team() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    v_team bigint;
BEGIN
    INSERT INTO tuneplane.teams (name, personal_of, created_by)
    VALUES (NEW.username, NEW.id, NEW.id)
    ON CONFLICT (name) DO NOTHING
    RETURNING id INTO v_team;
    IF v_team IS NULL THEN
        INSERT INTO tuneplane.teams (name, personal_of, created_by)
        VALUES (left(NEW.username, 40) || '-' || NEW.id, NEW.id, NEW.id)
        RETURNING id INTO v_team;
    END IF;
    INSERT INTO tuneplane.team_members (team_id, user_id, role, added_by) VALUES (v_team, NEW.id, 'admin', NEW.id);
    UPDATE tuneplane.users SET default_team_id = v_team WHERE id = NEW.id AND default_team_id IS NULL;
    RETURN NULL;
END;
$$;

CREATE OR REPLACE TRIGGER users_personal_team AFTER INSERT ON tuneplane.users
    FOR EACH ROW EXECUTE FUNCTION tuneplane.users_personal_team();

-- jobs_default_team: a job inserted without a team belongs to its owner's default team (a preview made
-- before migration 0170 carries no team).
CREATE OR REPLACE FUNCTION tuneplane.jobs_default_team() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.team_id IS NULL THEN
        SELECT u.default_team_id INTO NEW.team_id FROM tuneplane.users u WHERE u.id = NEW.owner_id;
    END IF;
    RETURN NEW;
END;
$$;

CREATE OR REPLACE TRIGGER jobs_default_team BEFORE INSERT ON tuneplane.jobs
    FOR EACH ROW EXECUTE FUNCTION tuneplane.jobs_default_team();
