-- sql/functions/team_reads.sql — what the console's team page, Fleet page and submit dialog read about
-- teams (issue 20, Build 7; docs/teams.md "Console"), and the by-name wrapper the team page writes through.
--
-- Contract: reads only, each answering one question for an actor who may read the team (any role in it, or
-- an installation admin; narrowed by the request's API token: team_access_allowed in teams.sql); anybody
-- else is told there is no such team (404). GPUs "in use" are the usage ledger's open rows (what is held
-- now, node and Slurm fleets alike); "borrowed" those of attempts admitted above the guarantee
-- (attempts.borrowing). The one write, set_team_member_by_name, resolves names and calls set_team_member
-- (teams.sql), which holds the rules. Locks nothing.
--
-- Repeatable file (ADR 0012). Drops (signature changes):

-- team_read_of: the team named p_team if the actor may read it; 404 otherwise.
CREATE OR REPLACE FUNCTION tuneplane.team_read_of(p_actor_id bigint, p_team text)
RETURNS tuneplane.teams
LANGUAGE plpgsql STABLE AS $$
DECLARE
    t tuneplane.teams;
    u tuneplane.users;
BEGIN
    SELECT * INTO u FROM tuneplane.users WHERE id = p_actor_id;
    SELECT * INTO t FROM tuneplane.teams WHERE name = p_team;
    IF t.id IS NULL OR NOT tuneplane.team_access_allowed(u, tuneplane.team_role(u.id, t.id), t.id, 'read') THEN
        RAISE EXCEPTION 'no team % of yours', left(p_team, 100) USING ERRCODE = 'TP404', COLUMN = 'team';
    END IF;
    RETURN t;
END;
$$;

-- team_members_of: a team's members and roles, admins first.
CREATE OR REPLACE FUNCTION tuneplane.team_members_of(p_actor_id bigint, p_team text)
RETURNS TABLE (user_id bigint, username text, role text, disabled boolean, added_at timestamptz)
LANGUAGE sql STABLE AS $$
    SELECT u.id, u.username, tm.role, u.disabled_at IS NOT NULL, tm.added_at
      FROM tuneplane.team_members tm JOIN tuneplane.users u ON u.id = tm.user_id
     WHERE tm.team_id = (tuneplane.team_read_of(p_actor_id, p_team)).id
     ORDER BY CASE tm.role WHEN 'admin' THEN 0 WHEN 'member' THEN 1 ELSE 2 END, u.username;
$$;

-- set_team_member_by_name: the team page's form: set_team_member with the team and user named.
CREATE OR REPLACE FUNCTION tuneplane.set_team_member_by_name(p_actor_id bigint, p_team text, p_username text,
                                                             p_role text)
RETURNS text
LANGUAGE plpgsql AS $$
DECLARE
    v_user bigint;
BEGIN
    SELECT id INTO v_user FROM tuneplane.users WHERE username = p_username;
    IF v_user IS NULL THEN
        RAISE EXCEPTION 'no user named %', left(p_username, 100) USING ERRCODE = 'TP404', COLUMN = 'username';
    END IF;
    RETURN tuneplane.set_team_member(p_actor_id, (tuneplane.team_read_of(p_actor_id, p_team)).id, v_user, p_role);
END;
$$;

-- team_fleet_gauges: per fleet where a team has a quota or holds GPUs: its quota (fleet-wide and per GPU
-- model rows) against GPUs in use now, borrowed above the guarantee, and queued.
CREATE OR REPLACE FUNCTION tuneplane.team_fleet_gauges(p_team_id bigint)
RETURNS TABLE (fleet text, gpu_model text, guaranteed_gpus integer, limit_gpus integer, weight double precision,
               overcommit boolean, used_gpus integer, borrowed_gpus integer, queued_gpus integer,
               fleet_gpus integer)
LANGUAGE sql STABLE AS $$
    WITH held AS (
        SELECT l.fleet_id, l.gpu_model, sum(l.gpus)::integer AS gpus,
               sum(l.gpus) FILTER (WHERE a.borrowing)::integer AS borrowed
          FROM tuneplane.usage_ledger l JOIN tuneplane.attempts a ON a.id = l.attempt_id
         WHERE l.team_id = p_team_id AND l.ended_at IS NULL
         GROUP BY 1, 2
    ), rows AS (
        SELECT q.fleet_id, q.gpu_model FROM tuneplane.team_quotas q WHERE q.team_id = p_team_id
        UNION SELECT h.fleet_id, '' FROM held h
    )
    SELECT f.name, r.gpu_model, coalesce(q.guaranteed_gpus, 0), q.limit_gpus, coalesce(q.weight, 1),
           coalesce(q.overcommit, false),
           coalesce((SELECT sum(h.gpus) FROM held h WHERE h.fleet_id = r.fleet_id
                        AND (r.gpu_model = '' OR h.gpu_model = r.gpu_model)), 0)::integer,
           coalesce((SELECT sum(h.borrowed) FROM held h WHERE h.fleet_id = r.fleet_id
                        AND (r.gpu_model = '' OR h.gpu_model = r.gpu_model)), 0)::integer,
           coalesce((SELECT sum(j.nodes * j.gpus_per_node) FROM tuneplane.jobs j
                      WHERE j.team_id = p_team_id AND j.fleet_id = r.fleet_id AND j.state = 'queued'), 0)::integer,
           (SELECT count(*) FROM tuneplane.nodes n JOIN tuneplane.node_gpus g ON g.node_id = n.id
             WHERE n.fleet_id = r.fleet_id AND n.scheduling_state = 'active' AND n.fenced_at IS NULL
               AND (r.gpu_model = '' OR g.model = r.gpu_model))::integer
      FROM rows r
      JOIN tuneplane.fleets f ON f.id = r.fleet_id
      LEFT JOIN tuneplane.team_quotas q ON q.team_id = p_team_id AND q.fleet_id = r.fleet_id
                                        AND q.gpu_model = r.gpu_model
     ORDER BY f.name, r.gpu_model;
$$;

-- team_quotas_of: the team page's gauges for an actor who may read the team.
CREATE OR REPLACE FUNCTION tuneplane.team_quotas_of(p_actor_id bigint, p_team text)
RETURNS TABLE (fleet text, gpu_model text, guaranteed_gpus integer, limit_gpus integer, weight double precision,
               overcommit boolean, used_gpus integer, borrowed_gpus integer, queued_gpus integer,
               fleet_gpus integer)
LANGUAGE sql STABLE AS $$
    SELECT * FROM tuneplane.team_fleet_gauges((tuneplane.team_read_of(p_actor_id, p_team)).id);
$$;

-- team_queue_of: the team's queued jobs with their place in their fleet's admission order (overall) and
-- among the team's own queued jobs there, and their reason.
CREATE OR REPLACE FUNCTION tuneplane.team_queue_of(p_actor_id bigint, p_team text)
RETURNS TABLE (job_id bigint, fleet text, owner text, gpus integer, priority integer, preemptible boolean,
               position_overall bigint, position_in_team bigint, queued_in_fleet bigint, reason text,
               waiting interval)
LANGUAGE sql STABLE AS $$
    WITH t AS (SELECT (tuneplane.team_read_of(p_actor_id, p_team)).id AS id),
    fleets AS (SELECT DISTINCT j.fleet_id FROM tuneplane.jobs j, t WHERE j.team_id = t.id AND j.state = 'queued'),
    ordered AS (
        SELECT f.fleet_id, q.job_id, q.ord, count(*) OVER (PARTITION BY f.fleet_id) AS n
          FROM fleets f CROSS JOIN LATERAL tuneplane.admission_queue(f.fleet_id) q
    )
    SELECT j.id, fl.name, u.username, j.nodes * j.gpus_per_node, j.priority, j.preemptible,
           o.ord, row_number() OVER (PARTITION BY j.fleet_id ORDER BY o.ord), o.n, j.state_reason,
           now() - j.created_at
      FROM ordered o
      JOIN tuneplane.jobs j ON j.id = o.job_id
      JOIN t ON j.team_id = t.id
      JOIN tuneplane.fleets fl ON fl.id = j.fleet_id
      JOIN tuneplane.users u ON u.id = j.owner_id
     ORDER BY fl.name, o.ord;
$$;

-- quota_effect: what admitting a job of p_gpus GPUs would do to its team's quota on the fleet, in the words
-- of the quota reasons (the submit dialog shows it before confirmation; nothing is reserved by it).
CREATE OR REPLACE FUNCTION tuneplane.quota_effect(p_team_id bigint, p_fleet_id bigint, p_gpus integer,
                                                  p_preemptible boolean)
RETURNS text
LANGUAGE plpgsql STABLE AS $$
DECLARE
    g      record;
    v_team text := (SELECT name FROM tuneplane.teams WHERE id = p_team_id);
    v_fleet text := (SELECT name FROM tuneplane.fleets WHERE id = p_fleet_id);
    v_after integer;
BEGIN
    IF NOT tuneplane.fleet_has_quotas(p_fleet_id) THEN
        RETURN format('fleet %s has no team quotas: jobs are admitted in queue order (priority, then age)',
                      v_fleet);
    END IF;
    SELECT * INTO g FROM tuneplane.team_fleet_gauges(p_team_id) x WHERE x.fleet = v_fleet AND x.gpu_model = '';
    g.used_gpus := coalesce(g.used_gpus, 0);
    g.queued_gpus := coalesce(g.queued_gpus, 0);
    g.guaranteed_gpus := coalesce(g.guaranteed_gpus, 0);
    v_after := g.used_gpus + g.queued_gpus + p_gpus;
    RETURN format('team %s uses %s of its %s guaranteed GPU%s on fleet %s (limit %s)%s; this job asks %s: ',
                  v_team, g.used_gpus, g.guaranteed_gpus, CASE WHEN g.guaranteed_gpus = 1 THEN '' ELSE 's' END,
                  v_fleet, coalesce(g.limit_gpus::text, 'none'),
                  CASE WHEN g.queued_gpus > 0 THEN format(', %s more queued', g.queued_gpus) ELSE '' END, p_gpus)
        || CASE
               WHEN p_gpus = 0 THEN 'no GPUs, so the quota does not apply'
               WHEN g.limit_gpus IS NOT NULL AND v_after > g.limit_gpus
                   THEN format('%s with it, past the limit of %s: it waits until the team''s jobs release GPUs',
                               v_after, g.limit_gpus)
               WHEN v_after <= g.guaranteed_gpus
                   THEN format('%s of %s guaranteed with it: within the guarantee', v_after, g.guaranteed_gpus)
               WHEN p_preemptible
                   THEN format('%s with it: %s above the guarantee, borrowed from idle GPUs (it is preemptible)',
                               v_after, v_after - greatest(g.guaranteed_gpus, g.used_gpus + g.queued_gpus))
               ELSE format('%s with it, above the guarantee of %s; it is not preemptible, so it waits until the '
                           'team''s GPUs fit within its guarantee', v_after, g.guaranteed_gpus)
           END;
END;
$$;

-- preview_quota_effect: quota_effect for a preview of the actor (its team, fleet, GPU request, preemptible).
CREATE OR REPLACE FUNCTION tuneplane.preview_quota_effect(p_actor_id bigint, p_preview_id uuid)
RETURNS text
LANGUAGE sql STABLE AS $$
    SELECT tuneplane.quota_effect(p.team_id, p.fleet_id,
                                  ((p.resolved -> 'resources' ->> 'nodes')::integer
                                   * (p.resolved -> 'resources' ->> 'gpus_per_node')::integer),
                                  coalesce((p.resolved ->> 'preemptible')::boolean, false))
      FROM tuneplane.previews p
     WHERE p.id = p_preview_id AND p.owner_id = p_actor_id AND p.team_id IS NOT NULL;
$$;

-- fleet_team_share_of: each team's share of a fleet now (the Fleet page): GPUs held, borrowed, guaranteed,
-- limit and weight, and the CPUs its running members hold (a CPU-only job holds no GPU but is not nothing),
-- largest holder first.
DROP FUNCTION IF EXISTS tuneplane.fleet_team_share_of(text);
CREATE OR REPLACE FUNCTION tuneplane.fleet_team_share_of(p_fleet text)
RETURNS TABLE (team text, used_gpus integer, borrowed_gpus integer, guaranteed_gpus integer, limit_gpus integer,
               weight double precision, used_cpus integer)
LANGUAGE sql STABLE AS $$
    SELECT s.team, s.used_gpus,
           coalesce((SELECT sum(l.gpus) FROM tuneplane.usage_ledger l JOIN tuneplane.attempts a ON a.id = l.attempt_id
                      WHERE l.team_id = s.team_id AND l.fleet_id = f.id AND l.ended_at IS NULL AND a.borrowing),
                    0)::integer,
           s.guaranteed_gpus, s.limit_gpus, s.weight,
           coalesce((SELECT sum(l.cpus) FROM tuneplane.usage_ledger l
                      WHERE l.team_id = s.team_id AND l.fleet_id = f.id AND l.ended_at IS NULL), 0)::integer
      FROM tuneplane.fleets f CROSS JOIN LATERAL tuneplane.fleet_team_shares(f.id) s
     WHERE f.name = p_fleet
     ORDER BY s.used_gpus DESC, s.team;
$$;
