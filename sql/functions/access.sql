-- sql/functions/access.sql — who may do what: the one answer to each access question.
-- Every function, in every lifecycle file, that asks "may this user see (or act on) this job" or "is this
-- user an admin" calls one of these; nothing writes the rule inline. tests/db/test_access.py checks the
-- rule itself; tests/db/test_route_access.py walks every route the console and both gateways register and
-- checks that each job-scoped one answers 404 to a user who may not see the job.
--
-- Repeatable file (ADR 0012): `tuneplane db migrate` re-applies every file of sql/functions/ (in the order
-- of order.txt, one transaction) whenever one changes. Edit definitions here, never in a migration.
-- A changed signature: add its DROP below (it runs before the new definition is created).
--
-- Locks: none. These functions only read users and jobs; a caller that changes the job locks it itself,
-- in its own file's lock order, after (or instead of) asking here.
--
-- Drops (signature changes):
-- job_access_allowed takes the team role and the request token's scope (issue 20).
DROP FUNCTION IF EXISTS tuneplane.job_access_allowed(tuneplane.users, tuneplane.jobs, text);

-- job_access_allowed: the rule, as a boolean over a users row and a jobs row, for filters over many jobs
-- (the jobs list, its owner filter, a digest search) and for require_job_access below. The job belongs to
-- a team (docs/teams.md): the user exists (p_user is not the NULL row), is not disabled, and is an
-- installation admin or has a role in the job's team (p_role, the caller's join of team_members) — any
-- role may 'read', admin and member may 'act' — and the request's API token reaches the team for that
-- action: p_token_read_only / p_token_teams are request_token_scope() (both NULL without a token; teams
-- NULL = every team), so a read-only token never acts and a token scoped to teams reaches only those.
--   p_action  'read'  see the job: its page, events, attempts, members, logs, artifacts, telemetry, usage
--             'act'   change it: cancel, request a checkpoint
-- An unknown action is never allowed. It reads nothing but its arguments, so PostgreSQL inlines it into a
-- list's WHERE clause (no call per row): whatever the rule needs is passed in, not looked up here.
CREATE OR REPLACE FUNCTION tuneplane.job_access_allowed(p_user tuneplane.users, p_job tuneplane.jobs, p_action text,
                                                        p_role text, p_token_read_only boolean,
                                                        p_token_teams bigint[])
RETURNS boolean
LANGUAGE sql STABLE AS $$
    SELECT (p_job).id IS NOT NULL
       AND tuneplane.team_rule(p_user, p_role, (p_job).team_id, p_action, p_token_read_only, p_token_teams);
$$;

-- require_job_access(principal, job, action): the jobs row when user p_user_id, under the request's API
-- token if any (the principal), may do p_action ('read' or 'act', see job_access_allowed) to job p_job_id.
-- A job the principal may not read is refused 404 "no job N of yours" naming job_id — the same answer as
-- for a job that does not exist, so job ids cannot be probed. A job it may read but not act on is refused
-- 403 saying why (a viewer of the team, or a read-only token or one scoped to other teams). A disabled user
-- may do nothing. An unknown action is a programming error (SQLSTATE P0001, a logged 500), not a refusal.
-- Locks nothing (a caller that changes the job locks it next, in its own lock order).
CREATE OR REPLACE FUNCTION tuneplane.require_job_access(p_user_id bigint, p_job_id bigint, p_action text)
RETURNS tuneplane.jobs
LANGUAGE plpgsql STABLE AS $$
DECLARE
    u       tuneplane.users;
    j       tuneplane.jobs;
    v_role  text;
    v_scope record;
BEGIN
    IF p_action IS NULL OR p_action NOT IN ('read', 'act') THEN
        RAISE EXCEPTION 'require_job_access: unknown action %', coalesce(p_action, 'NULL');
    END IF;
    SELECT * INTO u FROM tuneplane.users WHERE id = p_user_id;
    SELECT * INTO j FROM tuneplane.jobs WHERE id = p_job_id;
    v_role := tuneplane.team_role(p_user_id, j.team_id);
    SELECT * INTO v_scope FROM tuneplane.request_token_scope();
    IF j.id IS NULL OR NOT tuneplane.job_access_allowed(u, j, 'read', v_role, v_scope.read_only, v_scope.teams) THEN
        RAISE EXCEPTION 'no job % of yours', p_job_id USING ERRCODE = 'TP404', COLUMN = 'job_id';
    END IF;
    IF NOT tuneplane.job_access_allowed(u, j, p_action, v_role, v_scope.read_only, v_scope.teams) THEN
        RAISE EXCEPTION '%', CASE WHEN NOT tuneplane.token_scope_allows(v_scope.read_only, v_scope.teams, j.team_id,
                                                                       p_action)
                                  THEN format('job %s: this API token may only read it (read-only, or scoped to '
                                              'other teams)', p_job_id)
                                  ELSE format('job %s belongs to team %s, of which you are a viewer: viewers '
                                              'cannot change its jobs', p_job_id,
                                              (SELECT t.name FROM tuneplane.teams t WHERE t.id = j.team_id)) END
            USING ERRCODE = 'TP403', COLUMN = 'job_id';
    END IF;
    RETURN j;
END;
$$;

-- require_admin: the users row of p_actor_id when it is an enabled admin whose request may make an
-- installation-wide change (require_token_write, teams.sql: not under a read-only or team-scoped token);
-- otherwise refuses 403 "<p_what> needs the admin role" naming the field `actor` (or the token's refusal,
-- naming `token`). Used by every admin-only stored function — all of them change something — and by the
-- console's admin_required (app/web/auth.py), so the rule is written once.
CREATE OR REPLACE FUNCTION tuneplane.require_admin(p_actor_id bigint, p_what text)
RETURNS tuneplane.users
LANGUAGE plpgsql STABLE AS $$
DECLARE
    u tuneplane.users;
BEGIN
    SELECT * INTO u FROM tuneplane.users WHERE id = p_actor_id AND role = 'admin' AND disabled_at IS NULL;
    IF u.id IS NULL THEN
        RAISE EXCEPTION '% needs the admin role', coalesce(nullif(p_what, ''), 'this')
            USING ERRCODE = 'TP403', COLUMN = 'actor';
    END IF;
    PERFORM tuneplane.require_token_write(coalesce(nullif(p_what, ''), 'this'), 'installation');
    RETURN u;
END;
$$;
