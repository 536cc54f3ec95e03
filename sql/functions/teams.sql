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
-- require_installation_admin says what it guards (issue 34).
DROP FUNCTION IF EXISTS tuneplane.require_installation_admin(bigint);

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

-- team_role: the actor's role in a team (admin, member, viewer), or NULL; a disabled user has none.
CREATE OR REPLACE FUNCTION tuneplane.team_role(p_user_id bigint, p_team_id bigint)
RETURNS text
LANGUAGE sql STABLE AS $$
    SELECT tm.role FROM tuneplane.team_members tm JOIN tuneplane.users u ON u.id = tm.user_id
     WHERE tm.user_id = p_user_id AND tm.team_id = p_team_id AND u.disabled_at IS NULL;
$$;

-- require_token_write: THE rule for "may this request write", as far as its API token goes (a request
-- without a token — the console's session, a local admin command — passes; the user's own rights are the
-- caller's check). Every function that changes something asks it (job and team writes through
-- token_scope_allows, which is the same rule as values), after the role check and before it writes:
--   * a read-only token may only read: every write is refused (teams, members, quotas, fleet access,
--     tokens, source uploads, every installation-admin change, cancel, checkpoints);
--   * p_reach 'team': a token scoped to teams writes only in those (p_team_id, the team the write changes);
--   * p_reach 'installation': an installation-wide change (fleets, nodes, prices, settings, quotas, a new
--     team, preempting or exempting a job) needs a token that is not scoped to teams — a scoped token
--     reaches only its teams, and these changes belong to none or to every team;
--   * p_reach 'own': the caller's own things (a source upload, their tokens): any token that may write.
-- Refuses 403 naming the field `token`, saying what was refused (p_what: "setting prices") and the command
-- that makes a token that may (docs/teams.md "Tokens").
CREATE OR REPLACE FUNCTION tuneplane.require_token_write(p_what text, p_reach text DEFAULT 'own',
                                                         p_team_id bigint DEFAULT NULL)
RETURNS void
LANGUAGE plpgsql STABLE AS $$
DECLARE
    v_scope record;
BEGIN
    IF p_reach IS NULL OR p_reach NOT IN ('own', 'team', 'installation') THEN
        RAISE EXCEPTION 'require_token_write: unknown reach %', coalesce(p_reach, 'NULL');
    END IF;
    SELECT * INTO v_scope FROM tuneplane.request_token_scope();
    IF coalesce(v_scope.read_only, false) THEN
        RAISE EXCEPTION 'this API token is read-only: it may only read, and % is a change (make a token that '
                        'may act: tuneplane token create)', coalesce(nullif(p_what, ''), 'this')
            USING ERRCODE = 'TP403', COLUMN = 'token';
    END IF;
    IF v_scope.teams IS NOT NULL AND p_reach = 'installation' THEN
        RAISE EXCEPTION 'this API token is scoped to teams: % is an installation-wide change (use a token '
                        'made without --team: tuneplane token create)', coalesce(nullif(p_what, ''), 'this')
            USING ERRCODE = 'TP403', COLUMN = 'token';
    END IF;
    IF v_scope.teams IS NOT NULL AND p_reach = 'team' AND NOT coalesce(p_team_id = ANY (v_scope.teams), false) THEN
        RAISE EXCEPTION 'this API token does not reach team %: % (make one that does: tuneplane token create '
                        '--team %)', (SELECT t.name FROM tuneplane.teams t WHERE t.id = p_team_id),
            coalesce(nullif(p_what, ''), 'this'), (SELECT t.name FROM tuneplane.teams t WHERE t.id = p_team_id)
            USING ERRCODE = 'TP403', COLUMN = 'token';
    END IF;
END;
$$;

-- require_installation_admin: the actor, if an active installation admin and the request's token may make
-- an installation-wide change (require_token_write); 403 otherwise.
CREATE OR REPLACE FUNCTION tuneplane.require_installation_admin(p_actor_id bigint, p_what text DEFAULT 'this')
RETURNS tuneplane.users
LANGUAGE plpgsql STABLE AS $$
DECLARE
    actor tuneplane.users := tuneplane.require_active_user(p_actor_id);
BEGIN
    IF actor.role <> 'admin' THEN
        RAISE EXCEPTION 'only an installation admin may do this' USING ERRCODE = 'TP403', COLUMN = 'user';
    END IF;
    PERFORM tuneplane.require_token_write(p_what, 'installation');
    RETURN actor;
END;
$$;

-- team_by_name: the team named p_name; 404 naming the field otherwise.
CREATE OR REPLACE FUNCTION tuneplane.team_by_name(p_name text, p_field text DEFAULT 'team')
RETURNS tuneplane.teams
LANGUAGE plpgsql STABLE AS $$
DECLARE
    result tuneplane.teams;
BEGIN
    SELECT * INTO result FROM tuneplane.teams WHERE name = p_name;
    IF result.id IS NULL THEN
        RAISE EXCEPTION 'no team named %', left(p_name, 100) USING ERRCODE = 'TP404', COLUMN = p_field;
    END IF;
    RETURN result;
END;
$$;

-- create_team: any active user makes a shared team and becomes its admin. Refuses a malformed or taken
-- name (400, 409), and a read-only or team-scoped request token (403, require_token_write's reach
-- `installation`: a new team would be outside a scoped token's teams, so a token would reach wider than
-- itself). Locks nothing but the new rows.
CREATE OR REPLACE FUNCTION tuneplane.create_team(p_actor_id bigint, p_name text)
RETURNS tuneplane.teams
LANGUAGE plpgsql AS $$
DECLARE
    actor  tuneplane.users := tuneplane.require_active_user(p_actor_id);
    result tuneplane.teams;
BEGIN
    -- The one write rule: not read-only, and not scoped to teams (a new team is outside a scoped token's
    -- teams: an installation-wide change).
    PERFORM tuneplane.require_token_write('creating a team', 'installation');
    IF p_name IS NULL OR p_name !~ '^[a-z0-9][a-z0-9_.-]{1,62}$' THEN
        RAISE EXCEPTION 'team name must be 2-63 characters of a-z, 0-9, _ . - starting with a letter or digit'
            USING ERRCODE = 'TP400', COLUMN = 'name';
    END IF;
    INSERT INTO tuneplane.teams (name, created_by) VALUES (p_name, actor.id)
    ON CONFLICT (name) DO NOTHING
    RETURNING * INTO result;
    IF result.id IS NULL THEN
        RAISE EXCEPTION 'team % already exists', p_name USING ERRCODE = 'TP409', COLUMN = 'name';
    END IF;
    INSERT INTO tuneplane.team_members (team_id, user_id, role, added_by) VALUES (result.id, actor.id, 'admin', actor.id);
    RETURN result;
END;
$$;

-- set_team_member: a team admin (or an installation admin) adds a user to the team or changes their role
-- (p_role NULL removes them). Refuses an unknown role (400), a non-admin actor (404 for a team the actor
-- cannot see, 403 for a viewer or member), and leaving a team without an admin (409). Locks the team row
-- FOR NO KEY UPDATE so two admins changing roles at once cannot both remove the last admin.
CREATE OR REPLACE FUNCTION tuneplane.set_team_member(p_actor_id bigint, p_team_id bigint, p_user_id bigint,
                                                     p_role text)
RETURNS text
LANGUAGE plpgsql AS $$
DECLARE
    actor  tuneplane.users;
    v_role text;
BEGIN
    SELECT * INTO actor FROM tuneplane.users WHERE id = p_actor_id AND disabled_at IS NULL;
    v_role := tuneplane.team_role(p_actor_id, p_team_id);
    IF actor.id IS NULL OR (v_role IS NULL AND actor.role <> 'admin') THEN
        RAISE EXCEPTION 'no team % of yours', p_team_id USING ERRCODE = 'TP404', COLUMN = 'team';
    END IF;
    IF v_role IS DISTINCT FROM 'admin' AND actor.role <> 'admin' THEN
        RAISE EXCEPTION 'only an admin of the team may change its members (you are %)', v_role
            USING ERRCODE = 'TP403', COLUMN = 'team';
    END IF;
    PERFORM tuneplane.require_token_write('changing team members', 'team', p_team_id);
    IF p_role IS NOT NULL AND p_role NOT IN ('admin', 'member', 'viewer') THEN
        RAISE EXCEPTION 'role must be admin, member or viewer' USING ERRCODE = 'TP400', COLUMN = 'role';
    END IF;
    IF NOT EXISTS (SELECT 1 FROM tuneplane.users WHERE id = p_user_id) THEN
        RAISE EXCEPTION 'no such user' USING ERRCODE = 'TP404', COLUMN = 'user';
    END IF;
    PERFORM 1 FROM tuneplane.teams WHERE id = p_team_id FOR NO KEY UPDATE;
    IF p_role IS NULL THEN
        DELETE FROM tuneplane.team_members WHERE team_id = p_team_id AND user_id = p_user_id;
    ELSE
        INSERT INTO tuneplane.team_members (team_id, user_id, role, added_by)
        VALUES (p_team_id, p_user_id, p_role, actor.id)
        ON CONFLICT (team_id, user_id) DO UPDATE SET role = EXCLUDED.role;
    END IF;
    IF NOT EXISTS (SELECT 1 FROM tuneplane.team_members WHERE team_id = p_team_id AND role = 'admin') THEN
        RAISE EXCEPTION 'a team keeps at least one admin' USING ERRCODE = 'TP409', COLUMN = 'role';
    END IF;
    RETURN p_role;
END;
$$;

-- set_team_quota: an installation admin writes a team's quota on a fleet (GPU model '' = every model).
-- Refuses (409, with the numbers) guarantees that would sum past the fleet's schedulable GPUs (of that
-- model) unless p_overcommit, which is recorded and shown. p_guaranteed NULL deletes the quota. Locks the
-- fleet row FOR NO KEY UPDATE (two writers cannot both pass the sum; job inserts' KEY SHARE still pass).
CREATE OR REPLACE FUNCTION tuneplane.set_team_quota(p_actor_id bigint, p_team_id bigint, p_fleet_id bigint,
                                                    p_gpu_model text, p_guaranteed integer, p_limit integer,
                                                    p_weight double precision, p_overcommit boolean DEFAULT false)
RETURNS tuneplane.team_quotas
LANGUAGE plpgsql AS $$
DECLARE
    actor     tuneplane.users := tuneplane.require_installation_admin(p_actor_id, 'setting a quota');
    v_fleet   tuneplane.fleets;
    v_team    tuneplane.teams;
    v_model   text := coalesce(p_gpu_model, '');
    v_gpus    integer;
    v_sum     integer;
    v_listing text;
    result    tuneplane.team_quotas;
BEGIN
    SELECT * INTO v_fleet FROM tuneplane.fleets WHERE id = p_fleet_id FOR NO KEY UPDATE;
    IF v_fleet.id IS NULL THEN
        RAISE EXCEPTION 'no such fleet' USING ERRCODE = 'TP404', COLUMN = 'fleet';
    END IF;
    SELECT * INTO v_team FROM tuneplane.teams WHERE id = p_team_id;
    IF v_team.id IS NULL THEN
        RAISE EXCEPTION 'no such team' USING ERRCODE = 'TP404', COLUMN = 'team';
    END IF;
    IF p_guaranteed IS NULL THEN
        DELETE FROM tuneplane.team_quotas
         WHERE team_id = p_team_id AND fleet_id = p_fleet_id AND gpu_model = v_model RETURNING * INTO result;
        RETURN result;
    END IF;
    IF p_guaranteed < 0 THEN
        RAISE EXCEPTION 'guaranteed_gpus must be 0 or more' USING ERRCODE = 'TP400', COLUMN = 'guaranteed_gpus';
    END IF;
    IF p_limit IS NOT NULL AND p_limit < p_guaranteed THEN
        RAISE EXCEPTION 'limit_gpus (%) must be at least guaranteed_gpus (%)', p_limit, p_guaranteed
            USING ERRCODE = 'TP400', COLUMN = 'limit_gpus';
    END IF;
    IF p_weight IS NULL OR NOT (p_weight > 0 AND p_weight <= 1000000) THEN
        RAISE EXCEPTION 'weight must be above 0 and at most 1000000' USING ERRCODE = 'TP400', COLUMN = 'weight';
    END IF;
    -- Schedulable GPUs: on active, unfenced nodes of the fleet (of the model, for a per-model quota).
    SELECT count(*) INTO v_gpus
      FROM tuneplane.nodes n JOIN tuneplane.node_gpus g ON g.node_id = n.id
     WHERE n.fleet_id = p_fleet_id AND n.scheduling_state = 'active' AND n.fenced_at IS NULL
       AND (v_model = '' OR g.model = v_model);
    SELECT sum(x.g), string_agg(format('%s %s', x.name, x.g), ', ' ORDER BY x.name)
      INTO v_sum, v_listing
      FROM (SELECT t.name, q.guaranteed_gpus AS g FROM tuneplane.team_quotas q JOIN tuneplane.teams t ON t.id = q.team_id
             WHERE q.fleet_id = p_fleet_id AND q.gpu_model = v_model AND q.team_id <> p_team_id
               AND q.guaranteed_gpus > 0
            UNION ALL SELECT v_team.name, p_guaranteed WHERE p_guaranteed > 0) x;
    IF coalesce(v_sum, 0) > v_gpus AND NOT coalesce(p_overcommit, false) THEN
        RAISE EXCEPTION 'guarantees on fleet % would sum to % GPUs (%), but the fleet has % schedulable GPUs%; '
                        'pass overcommit to accept',
            v_fleet.name || CASE WHEN v_model = '' THEN '' ELSE ' (model ' || v_model || ')' END,
            v_sum, v_listing, v_gpus, CASE WHEN v_model = '' THEN '' ELSE ' of that model' END
            USING ERRCODE = 'TP409', COLUMN = 'guaranteed_gpus';
    END IF;
    INSERT INTO tuneplane.team_quotas AS q (team_id, fleet_id, gpu_model, guaranteed_gpus, limit_gpus, weight,
                                            overcommit, updated_by)
    VALUES (p_team_id, p_fleet_id, v_model, p_guaranteed, p_limit, p_weight,
            coalesce(p_overcommit, false) AND coalesce(v_sum, 0) > v_gpus, actor.id)
    ON CONFLICT (team_id, fleet_id, gpu_model) DO UPDATE
       SET guaranteed_gpus = EXCLUDED.guaranteed_gpus, limit_gpus = EXCLUDED.limit_gpus, weight = EXCLUDED.weight,
           overcommit = EXCLUDED.overcommit, updated_at = now(), updated_by = EXCLUDED.updated_by
    RETURNING * INTO result;
    -- Admission changed: wake the schedulers.
    PERFORM pg_notify('tuneplane_placement', p_fleet_id::text);
    RETURN result;
END;
$$;

-- request_token_scope: the request token's scope as values (job_access_allowed takes them as arguments):
-- read_only, and the teams it is narrowed to (NULL: every team); both NULL without a token.
CREATE OR REPLACE FUNCTION tuneplane.request_token_scope()
RETURNS TABLE (read_only boolean, teams bigint[])
LANGUAGE sql STABLE AS $$
    SELECT t.read_only, (SELECT array_agg(s.team_id) FROM tuneplane.api_token_teams s WHERE s.token_id = t.id)
      FROM (SELECT 1) one LEFT JOIN tuneplane.api_tokens t ON t.id = tuneplane.request_token();
$$;

-- token_scope_allows: whether a token scope (read_only, teams; both NULL: no token) reaches team p_team_id
-- for p_action ('read' or 'act'): a read-only token never acts, a token scoped to teams reaches only those.
CREATE OR REPLACE FUNCTION tuneplane.token_scope_allows(p_read_only boolean, p_teams bigint[], p_team_id bigint,
                                                        p_action text)
RETURNS boolean
LANGUAGE sql IMMUTABLE AS $$
    SELECT (p_action = 'read' OR NOT coalesce(p_read_only, false))
       AND (p_teams IS NULL OR p_team_id = ANY (p_teams));
$$;

-- token_allows: whether the request's token (if any) reaches team p_team_id for p_action.
CREATE OR REPLACE FUNCTION tuneplane.token_allows(p_team_id bigint, p_action text)
RETURNS boolean
LANGUAGE sql STABLE AS $$
    SELECT tuneplane.token_scope_allows(s.read_only, s.teams, p_team_id, p_action)
      FROM tuneplane.request_token_scope() s;
$$;

-- team_rule: THE rule for a team and its jobs, as a boolean over values only (PostgreSQL inlines it into a
-- list's WHERE clause): an enabled user who is an installation admin or has a role in the team (p_role) —
-- any role may 'read', admin and member may 'act' (submit into the team, cancel and change its jobs) —
-- narrowed by the request token's scope (token_scope_allows). Effective right = role ∩ token scope.
-- job_access_allowed (access.sql) is this rule for a job's team; team_access_allowed for a team.
CREATE OR REPLACE FUNCTION tuneplane.team_rule(p_user tuneplane.users, p_role text, p_team_id bigint, p_action text,
                                               p_token_read_only boolean, p_token_teams bigint[])
RETURNS boolean
LANGUAGE sql IMMUTABLE AS $$
    SELECT coalesce(p_action IN ('read', 'act')
                    AND (p_user).id IS NOT NULL AND (p_user).disabled_at IS NULL
                    AND ((p_user).role = 'admin'
                         OR p_role IN ('admin', 'member')
                         OR (p_role = 'viewer' AND p_action = 'read'))
                    AND tuneplane.token_scope_allows(p_token_read_only, p_token_teams, p_team_id, p_action), false);
$$;

-- team_access_allowed: team_rule for a team, under the request's token. p_role is the user's role in the
-- team (team_role), passed in so list filters can join it.
CREATE OR REPLACE FUNCTION tuneplane.team_access_allowed(p_user tuneplane.users, p_role text, p_team_id bigint,
                                                         p_action text)
RETURNS boolean
LANGUAGE sql STABLE AS $$
    SELECT tuneplane.team_rule(p_user, p_role, p_team_id, p_action, s.read_only, s.teams)
      FROM tuneplane.request_token_scope() s;
$$;

-- require_team_submit: the team a preview of p_actor_id goes to: p_team (a name) or the user's default
-- team. Refuses a team the user has no role in (404, as if it did not exist), a viewer (403), and a token
-- that is read-only or does not reach the team (403).
CREATE OR REPLACE FUNCTION tuneplane.require_team_submit(p_actor tuneplane.users, p_team text)
RETURNS tuneplane.teams
LANGUAGE plpgsql STABLE AS $$
DECLARE
    v_team tuneplane.teams;
    v_role text;
BEGIN
    SELECT * INTO v_team FROM tuneplane.teams
     WHERE CASE WHEN p_team IS NULL THEN id = p_actor.default_team_id ELSE name = p_team END;
    v_role := tuneplane.team_role(p_actor.id, v_team.id);
    IF v_team.id IS NULL OR (v_role IS NULL AND p_actor.role <> 'admin') THEN
        RAISE EXCEPTION '%', CASE WHEN p_team IS NULL THEN 'you have no default team; name one with team'
                                  ELSE format('no team %s of yours', left(p_team, 100)) END
            USING ERRCODE = 'TP404', COLUMN = 'team';
    END IF;
    IF NOT tuneplane.team_access_allowed(p_actor, v_role, v_team.id, 'act') THEN
        RAISE EXCEPTION '%', CASE WHEN NOT tuneplane.token_allows(v_team.id, 'act')
                                  THEN format('this API token may not submit to team %s (read-only or scoped to '
                                              'other teams)', v_team.name)
                                  ELSE format('you are a viewer of team %s: viewers cannot submit', v_team.name) END
            USING ERRCODE = 'TP403', COLUMN = 'team';
    END IF;
    RETURN v_team;
END;
$$;

-- fleet_admits_team: THE rule for which teams may use a fleet: every team on an open fleet, the listed
-- teams (fleet_team_access) on a fleet whose team_access is 'listed'.
CREATE OR REPLACE FUNCTION tuneplane.fleet_admits_team(p_fleet tuneplane.fleets, p_team_id bigint)
RETURNS boolean
LANGUAGE sql STABLE AS $$
    SELECT p_fleet.team_access IS DISTINCT FROM 'listed'
        OR EXISTS (SELECT 1 FROM tuneplane.fleet_team_access a
                    WHERE a.fleet_id = p_fleet.id AND a.team_id = p_team_id);
$$;

-- require_fleet_for_team: refuses (403) a fleet open only to listed teams when p_team is not listed.
CREATE OR REPLACE FUNCTION tuneplane.require_fleet_for_team(p_fleet_id bigint, p_team tuneplane.teams)
RETURNS void
LANGUAGE plpgsql STABLE AS $$
DECLARE
    v_fleet tuneplane.fleets;
BEGIN
    SELECT * INTO v_fleet FROM tuneplane.fleets WHERE id = p_fleet_id;
    IF NOT tuneplane.fleet_admits_team(v_fleet, p_team.id) THEN
        RAISE EXCEPTION 'team % may not use fleet % (an installation admin grants it: tuneplane teams grant % %)',
            p_team.name, v_fleet.name, p_team.name, v_fleet.name USING ERRCODE = 'TP403', COLUMN = 'fleet';
    END IF;
END;
$$;

-- require_fleet_for_user: for a write that names a fleet but no team (POST /sources?fleet=NAME keeps the
-- archive in that fleet's store, issue 32): refuses an unknown fleet (404) and (403) a user none of whose
-- teams both may submit (team_access_allowed 'act', under the request's token) and may use the fleet
-- (fleet_admits_team). An installation admin may use every fleet. Reads only.
CREATE OR REPLACE FUNCTION tuneplane.require_fleet_for_user(p_user_id bigint, p_fleet text)
RETURNS void
LANGUAGE plpgsql STABLE AS $$
DECLARE
    v_user tuneplane.users;
    v_fleet tuneplane.fleets;
BEGIN
    SELECT * INTO v_fleet FROM tuneplane.fleets WHERE name = p_fleet;
    IF v_fleet.id IS NULL THEN
        RAISE EXCEPTION 'no fleet named %', left(p_fleet, 100) USING ERRCODE = 'TP404', COLUMN = 'fleet';
    END IF;
    SELECT * INTO v_user FROM tuneplane.users WHERE id = p_user_id AND disabled_at IS NULL;
    IF v_user.role = 'admin' THEN
        RETURN;
    END IF;
    IF NOT EXISTS (SELECT 1 FROM tuneplane.team_members tm
                    WHERE tm.user_id = v_user.id
                      AND tuneplane.team_access_allowed(v_user, tm.role, tm.team_id, 'act')
                      AND tuneplane.fleet_admits_team(v_fleet, tm.team_id)) THEN
        RAISE EXCEPTION 'none of your teams may submit to fleet % (an installation admin grants a team: '
                        'tuneplane teams grant TEAM %)', v_fleet.name, v_fleet.name
            USING ERRCODE = 'TP403', COLUMN = 'fleet';
    END IF;
END;
$$;

-- team_priority_limit: the highest priority class team p_team_id may use on fleet p_fleet_id: its grant for
-- that fleet, else its grant for every fleet, else `normal` (migration 0300). Reads only.
CREATE OR REPLACE FUNCTION tuneplane.team_priority_limit(p_team_id bigint, p_fleet_id bigint)
RETURNS tuneplane.priority_classes
LANGUAGE sql STABLE AS $$
    SELECT c.* FROM tuneplane.priority_classes c
     WHERE c.name = coalesce((SELECT g.max_class FROM tuneplane.team_priority_grants g
                               WHERE g.team_id = p_team_id AND (g.fleet_id = p_fleet_id OR g.fleet_id IS NULL)
                               ORDER BY g.fleet_id NULLS LAST LIMIT 1), 'normal');
$$;

-- require_priority_grant: at preview, refuses (403, field priority) a priority class above the team's
-- limit on the fleet (team_priority_limit), naming the limit and the command that grants more, unless the
-- user is an installation admin; and refuses (422, field preemption.grace_seconds) a grace above the
-- fleet's cap (preemption_grace_cap, preemption.sql) — refused rather than
-- clamped, so that what the preview pins is what was asked (docs/preemption.md). p_resolved: the
-- preview's resolved document (resolve_preemption's keys).
CREATE OR REPLACE FUNCTION tuneplane.require_priority_grant(p_actor tuneplane.users, p_team tuneplane.teams,
                                                            p_fleet_id bigint, p_resolved jsonb)
RETURNS void
LANGUAGE plpgsql STABLE AS $$
DECLARE
    v_fleet  tuneplane.fleets;
    v_asked  tuneplane.priority_classes;
    v_limit  tuneplane.priority_classes := tuneplane.team_priority_limit(p_team.id, p_fleet_id);
    v_cap    integer;
BEGIN
    SELECT * INTO v_fleet FROM tuneplane.fleets WHERE id = p_fleet_id;
    SELECT * INTO v_asked FROM tuneplane.priority_classes WHERE name = p_resolved ->> 'priority_class';
    IF v_asked.value > v_limit.value AND p_actor.role <> 'admin' THEN
        RAISE EXCEPTION 'priority: team % may use classes up to % on fleet %, not %; an installation admin grants more: tuneplane teams priority % --max % --fleet %',
            p_team.name, v_limit.name, v_fleet.name, v_asked.name, p_team.name, v_asked.name, v_fleet.name
            USING ERRCODE = 'TP403', COLUMN = 'priority';
    END IF;
    v_cap := extract(epoch FROM tuneplane.preemption_grace_cap(p_fleet_id))::integer;
    IF (p_resolved -> 'preemption' ->> 'grace_seconds')::integer > v_cap THEN
        RAISE EXCEPTION 'preemption.grace_seconds must be at most % on fleet % (its cap), not %',
            v_cap, v_fleet.name, p_resolved -> 'preemption' ->> 'grace_seconds'
            USING ERRCODE = 'TP422', COLUMN = 'preemption.grace_seconds';
    END IF;
END;
$$;

-- set_team_priority_grant: an installation admin sets the highest priority class team p_team's members may
-- use, on fleet p_fleet (NULL: every fleet); p_max_class NULL removes that grant (the team is back to its
-- other grant or `normal`). Refuses a non-admin (403), an unknown team, fleet or class (404). Returns the
-- team's grants. Locks the team's grant rows only.
CREATE OR REPLACE FUNCTION tuneplane.set_team_priority_grant(p_actor_id bigint, p_team text, p_fleet text,
                                                             p_max_class text)
RETURNS TABLE (team text, fleet text, max_class text, granted_at timestamptz)
LANGUAGE plpgsql AS $$
DECLARE
    actor   tuneplane.users := tuneplane.require_admin(p_actor_id, 'granting priority classes');
    v_team  tuneplane.teams := tuneplane.team_by_name(p_team, 'team');
    v_fleet bigint;
BEGIN
    IF p_fleet IS NOT NULL THEN
        SELECT id INTO v_fleet FROM tuneplane.fleets WHERE name = p_fleet;
        IF v_fleet IS NULL THEN
            RAISE EXCEPTION 'no fleet named %', left(p_fleet, 100) USING ERRCODE = 'TP404', COLUMN = 'fleet';
        END IF;
    END IF;
    IF p_max_class IS NULL THEN
        DELETE FROM tuneplane.team_priority_grants g
         WHERE g.team_id = v_team.id AND g.fleet_id IS NOT DISTINCT FROM v_fleet;
    ELSE
        IF NOT EXISTS (SELECT 1 FROM tuneplane.priority_classes c WHERE c.name = p_max_class) THEN
            RAISE EXCEPTION 'no priority class named %; the classes are %', left(p_max_class, 100),
                (SELECT string_agg(c.name, ', ' ORDER BY c.value) FROM tuneplane.priority_classes c)
                USING ERRCODE = 'TP404', COLUMN = 'max_class';
        END IF;
        INSERT INTO tuneplane.team_priority_grants (team_id, fleet_id, max_class, granted_by)
        VALUES (v_team.id, v_fleet, p_max_class, actor.id)
        ON CONFLICT (team_id, coalesce(fleet_id, 0))
        DO UPDATE SET max_class = EXCLUDED.max_class, granted_by = EXCLUDED.granted_by, granted_at = now();
    END IF;
    RETURN QUERY SELECT g.team, g.fleet, g.max_class, g.granted_at FROM tuneplane.team_priority_grants_of(v_team.id) g;
END;
$$;

-- team_priority_grants_of: a team's priority grants (fleet NULL: every fleet), for its page and the CLI.
CREATE OR REPLACE FUNCTION tuneplane.team_priority_grants_of(p_team_id bigint)
RETURNS TABLE (team text, fleet text, max_class text, granted_at timestamptz)
LANGUAGE sql STABLE AS $$
    SELECT t.name, f.name, g.max_class, g.granted_at
      FROM tuneplane.team_priority_grants g
      JOIN tuneplane.teams t ON t.id = g.team_id
      LEFT JOIN tuneplane.fleets f ON f.id = g.fleet_id
     WHERE g.team_id = p_team_id
     ORDER BY f.name NULLS FIRST;
$$;

-- fleet_for_access: the fleet named p_fleet, locked FOR NO KEY UPDATE (two admins changing its access
-- serialise; job inserts' KEY SHARE still pass); 404 naming `fleet` otherwise.
CREATE OR REPLACE FUNCTION tuneplane.fleet_for_access(p_fleet text)
RETURNS tuneplane.fleets
LANGUAGE plpgsql AS $$
DECLARE
    result tuneplane.fleets;
BEGIN
    SELECT * INTO result FROM tuneplane.fleets WHERE name = p_fleet FOR NO KEY UPDATE;
    IF result.id IS NULL THEN
        RAISE EXCEPTION 'no fleet named %', left(coalesce(p_fleet, ''), 100) USING ERRCODE = 'TP404', COLUMN = 'fleet';
    END IF;
    RETURN result;
END;
$$;

-- set_fleet_team_access: an installation admin grants team p_team the use of fleet p_fleet (a row of
-- fleet_team_access, with the Slurm account its jobs are submitted under, NULL: none; granting again
-- changes the account) or revokes it (p_grant false; 404 when there is none). Only a fleet whose
-- team_access is 'listed' asks the list (require_fleet_for_team); set_fleet_access_mode switches it.
-- Locks the fleet row (fleet_for_access), then the grant row.
CREATE OR REPLACE FUNCTION tuneplane.set_fleet_team_access(p_actor_id bigint, p_fleet text, p_team text,
                                                           p_grant boolean, p_slurm_account text DEFAULT NULL)
RETURNS TABLE (fleet text, team text, team_access text, slurm_account text, granted boolean)
LANGUAGE plpgsql AS $$
DECLARE
    actor   tuneplane.users := tuneplane.require_installation_admin(p_actor_id,
                                   CASE WHEN p_grant THEN 'granting a fleet to a team' ELSE 'revoking a team''s fleet' END);
    v_fleet tuneplane.fleets := tuneplane.fleet_for_access(p_fleet);
    v_team  tuneplane.teams := tuneplane.team_by_name(p_team);
    v_acct  text := nullif(btrim(coalesce(p_slurm_account, '')), '');
BEGIN
    IF p_grant IS NULL THEN
        RAISE EXCEPTION 'say grant or revoke' USING ERRCODE = 'TP400', COLUMN = 'action';
    END IF;
    IF NOT p_grant THEN
        DELETE FROM tuneplane.fleet_team_access a WHERE a.fleet_id = v_fleet.id AND a.team_id = v_team.id;
        IF NOT FOUND THEN
            RAISE EXCEPTION 'team % has no grant on fleet % (tuneplane teams show %)', v_team.name, v_fleet.name,
                v_team.name USING ERRCODE = 'TP404', COLUMN = 'team';
        END IF;
        RETURN QUERY SELECT v_fleet.name, v_team.name, v_fleet.team_access, NULL::text, false;
        RETURN;
    END IF;
    IF v_acct IS NOT NULL AND v_acct !~ '^[A-Za-z0-9_.-]{1,64}$' THEN
        RAISE EXCEPTION 'slurm_account must be 1-64 characters of A-Z, a-z, 0-9, _ . -'
            USING ERRCODE = 'TP400', COLUMN = 'slurm_account';
    END IF;
    INSERT INTO tuneplane.fleet_team_access AS a (fleet_id, team_id, slurm_account, granted_by)
    VALUES (v_fleet.id, v_team.id, v_acct, actor.id)
    ON CONFLICT (fleet_id, team_id) DO UPDATE
       SET slurm_account = EXCLUDED.slurm_account, granted_at = now(), granted_by = EXCLUDED.granted_by;
    RETURN QUERY SELECT v_fleet.name, v_team.name, v_fleet.team_access, v_acct, true;
END;
$$;

-- set_fleet_access_mode: an installation admin opens fleet p_fleet to every team ('open') or to the teams
-- granted it only ('listed'). Refuses another mode (400 naming `mode`). Locks the fleet row.
CREATE OR REPLACE FUNCTION tuneplane.set_fleet_access_mode(p_actor_id bigint, p_fleet text, p_mode text)
RETURNS TABLE (fleet text, team_access text, teams_granted integer)
LANGUAGE plpgsql AS $$
DECLARE
    actor   tuneplane.users := tuneplane.require_installation_admin(p_actor_id, 'changing who may use a fleet');
    v_fleet tuneplane.fleets := tuneplane.fleet_for_access(p_fleet);
BEGIN
    IF p_mode IS NULL OR p_mode NOT IN ('open', 'listed') THEN
        RAISE EXCEPTION 'mode must be open (every team) or listed (the teams granted it)'
            USING ERRCODE = 'TP400', COLUMN = 'mode';
    END IF;
    UPDATE tuneplane.fleets f SET team_access = p_mode WHERE f.id = v_fleet.id;
    RETURN QUERY SELECT v_fleet.name, p_mode,
                        (SELECT count(*)::integer FROM tuneplane.fleet_team_access a WHERE a.fleet_id = v_fleet.id);
END;
$$;

-- fleet_team_access_of: who may use which fleet — each fleet (or only p_fleet) with its mode, and its
-- grants (or only p_team's) to the teams the actor may read (an installation admin: every team; others:
-- their own, narrowed by the request's token); a fleet with no grant shown gets one row with team NULL.
CREATE OR REPLACE FUNCTION tuneplane.fleet_team_access_of(p_actor_id bigint, p_fleet text DEFAULT NULL,
                                                          p_team text DEFAULT NULL)
RETURNS TABLE (fleet text, team_access text, team text, slurm_account text, granted_at timestamptz)
LANGUAGE sql STABLE AS $$
    WITH actor AS (SELECT u FROM tuneplane.users u WHERE u.id = p_actor_id AND u.disabled_at IS NULL),
    grants AS (
        SELECT a.fleet_id, t.name AS team, a.slurm_account, a.granted_at
          FROM tuneplane.fleet_team_access a JOIN tuneplane.teams t ON t.id = a.team_id, actor
         WHERE (p_team IS NULL OR t.name = p_team)
           AND tuneplane.team_access_allowed(actor.u, tuneplane.team_role(p_actor_id, t.id), t.id, 'read')
    )
    SELECT f.name, f.team_access, g.team, g.slurm_account, g.granted_at
      FROM tuneplane.fleets f LEFT JOIN grants g ON g.fleet_id = f.id
     WHERE EXISTS (SELECT 1 FROM actor) AND (p_fleet IS NULL OR f.name = p_fleet)
       AND (p_team IS NULL OR g.team IS NOT NULL)
     ORDER BY f.name, g.team;
$$;

-- teams_of: the teams the user has a role in, with the role (the submit dialog, `tuneplane teams`).
CREATE OR REPLACE FUNCTION tuneplane.teams_of(p_actor_id bigint)
RETURNS TABLE (team_id bigint, team text, role text, personal boolean, is_default boolean)
LANGUAGE sql STABLE AS $$
    SELECT t.id, t.name, tm.role, t.personal_of IS NOT NULL, t.id = u.default_team_id
      FROM tuneplane.team_members tm
      JOIN tuneplane.teams t ON t.id = tm.team_id
      JOIN tuneplane.users u ON u.id = tm.user_id AND u.disabled_at IS NULL
     WHERE tm.user_id = p_actor_id
     ORDER BY t.id = u.default_team_id DESC, t.name;
$$;

-- issue_scoped_api_token: a user makes an API token for themselves (shown once; only its hash is stored),
-- optionally narrowed to some of their teams (p_teams, names) and to read-only. A token may only make a
-- token no wider than itself: under a read-only request token nothing is made (403); under a token
-- scoped to teams, the new one must name teams within that scope (403). A team the user has no role in is
-- a 404 naming `teams`. Locks nothing but the new rows.
CREATE OR REPLACE FUNCTION tuneplane.issue_scoped_api_token(p_actor_id bigint, p_name text, p_token_hash text,
                                                            p_ttl interval, p_teams text[], p_read_only boolean)
RETURNS tuneplane.api_tokens
LANGUAGE plpgsql AS $$
DECLARE
    actor    tuneplane.users := tuneplane.require_active_user(p_actor_id);
    v_ids    bigint[];
    v_bad    text;
    v_parent tuneplane.api_tokens;
    result   tuneplane.api_tokens;
BEGIN
    SELECT array_agg(t.id), string_agg(n.name, ', ') FILTER (WHERE t.id IS NULL OR tm.role IS NULL)
      INTO v_ids, v_bad
      FROM unnest(coalesce(p_teams, '{}')) AS n (name)
      LEFT JOIN tuneplane.teams t ON t.name = n.name
      LEFT JOIN tuneplane.team_members tm ON tm.team_id = t.id AND tm.user_id = actor.id;
    IF v_bad IS NOT NULL THEN
        RAISE EXCEPTION 'no team % of yours', left(v_bad, 200) USING ERRCODE = 'TP404', COLUMN = 'teams';
    END IF;
    SELECT * INTO v_parent FROM tuneplane.api_tokens WHERE id = tuneplane.request_token();
    PERFORM tuneplane.require_token_write('making a token');
    IF v_parent.id IS NOT NULL THEN
        IF EXISTS (SELECT 1 FROM tuneplane.api_token_teams s WHERE s.token_id = v_parent.id)
           AND (cardinality(coalesce(v_ids, '{}')) = 0
                OR EXISTS (SELECT 1 FROM unnest(v_ids) i
                            WHERE NOT EXISTS (SELECT 1 FROM tuneplane.api_token_teams s
                                               WHERE s.token_id = v_parent.id AND s.team_id = i))) THEN
            RAISE EXCEPTION 'this token is scoped to some teams: a token it makes must name teams within them'
                USING ERRCODE = 'TP403', COLUMN = 'teams';
        END IF;
    END IF;
    result := tuneplane.issue_api_token(actor.id, p_name, p_token_hash, p_ttl);
    UPDATE tuneplane.api_tokens SET read_only = coalesce(p_read_only, false) WHERE id = result.id
    RETURNING * INTO result;
    INSERT INTO tuneplane.api_token_teams (token_id, team_id) SELECT DISTINCT result.id, i FROM unnest(v_ids) i;
    RETURN result;
END;
$$;

-- tokens_of: the actor's API tokens (never their hashes) with scope, last use and state, newest first.
CREATE OR REPLACE FUNCTION tuneplane.tokens_of(p_actor_id bigint)
RETURNS TABLE (id bigint, name text, created_at timestamptz, expires_at timestamptz, revoked_at timestamptz,
               last_used_at timestamptz, read_only boolean, teams text[], current boolean)
LANGUAGE sql STABLE AS $$
    SELECT t.id, t.name, t.created_at, t.expires_at, t.revoked_at, t.last_used_at, t.read_only,
           coalesce((SELECT array_agg(tm.name ORDER BY tm.name) FROM tuneplane.api_token_teams s
                       JOIN tuneplane.teams tm ON tm.id = s.team_id WHERE s.token_id = t.id), '{}'),
           t.id IS NOT DISTINCT FROM tuneplane.request_token()
      FROM tuneplane.api_tokens t
     WHERE t.user_id = p_actor_id
     ORDER BY t.id DESC;
$$;
