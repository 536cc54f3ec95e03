-- sql/functions/usage.sql — the usage ledger: who held which GPUs, CPUs and memory, when, and how it ended
-- (issue 20; docs/teams.md "Usage ledger"; table usage_ledger, migration 0180).
--
-- Contract
--   * open_usage(attempts) opens one row per member of the attempts, in the transaction that reserved the
--     members' resources: reserve_next (placement.sql) for node fleets, slurm_allocation_started (slurm.sql)
--     for Slurm fleets. started_at is the reservation instant the caller passes (reserve_next gives its
--     GPU allocations the same one). A member already in the ledger is left alone (idempotent).
--   * close_usage(member) closes the member's row in the transaction that released its resources
--     (release_member, placement.sql): ended_at is the member's released_at, ended_how its state then.
--     A closed row is never changed again by these two; only the columns issues 21 and 22 own
--     (lost_gpu_seconds, idle_gpu_seconds, charge_factor) are theirs to write.
--   * Nothing here moves a state; the ledger follows the launch lifecycle, it never decides it.
-- Locks: usage_ledger rows are leaf rows (lock order level 8 of launch.sql): written by the transitions above
-- under the locks their callers already hold, never locked first.
-- Reads: usage_report (one question: GPU-, CPU-seconds and cost per team/user/job/day over a window, as the
-- actor may see it), v_usage (operators, docs/runbook.md).
--
-- Repeatable file (ADR 0012). Drops (signature changes):

-- open_usage: one ledger row per member of p_attempts that has none. Team, user, node name and GPU model
-- are copied as they are now (the ledger is history).
CREATE OR REPLACE FUNCTION tuneplane.open_usage(p_attempts bigint[], p_at timestamptz)
RETURNS integer
LANGUAGE sql AS $$
    WITH added AS (
        INSERT INTO tuneplane.usage_ledger (member_id, job_id, attempt_id, attempt, rank, team_id, user_id, fleet_id,
                                            node_id, node_name, gpu_model, gpus, cpus, memory_bytes, started_at,
                                            charge_factor)
        SELECT m.id, m.job_id, a.id, a.number, m.rank, j.team_id, j.owner_id, a.fleet_id,
               n.id, n.name, g.model,
               -- Slurm members hold their GPUs through Slurm (no indices here): the job's request.
               CASE WHEN f.backend = 'node' THEN cardinality(m.gpu_indices) ELSE j.gpus_per_node END,
               m.cpus, m.memory_bytes, p_at,
               -- Scavenger work runs on idle capacity and is charged nothing (docs/preemption.md).
               CASE WHEN EXISTS (SELECT 1 FROM tuneplane.priority_classes pc
                                  WHERE pc.name = j.priority_class AND pc.scavenger) THEN 0 ELSE 1 END
          FROM tuneplane.members m
          JOIN tuneplane.attempts a ON a.id = m.attempt_id
          JOIN tuneplane.jobs j ON j.id = m.job_id
          JOIN tuneplane.fleets f ON f.id = a.fleet_id
          JOIN tuneplane.nodes n ON n.id = m.node_id
          LEFT JOIN LATERAL (
              SELECT min(ng.model) AS model FROM tuneplane.node_gpus ng
               WHERE ng.node_id = m.node_id
                 AND (ng.gpu_index = ANY (m.gpu_indices) OR (f.backend <> 'node' AND j.gpus_per_node > 0))
          ) g ON true
         WHERE m.attempt_id = ANY (p_attempts)
         ORDER BY m.id
        ON CONFLICT (member_id) DO NOTHING
        RETURNING 1
    )
    SELECT count(*)::integer FROM added;
$$;

-- close_usage: the member's resources were released (p_member is its row after release_member's update):
-- the ledger row ends at the same instant, with the member's state as how it ended. Idempotent.
CREATE OR REPLACE FUNCTION tuneplane.close_usage(p_member tuneplane.members)
RETURNS void
LANGUAGE sql AS $$
    UPDATE tuneplane.usage_ledger
       SET ended_at = p_member.released_at, ended_how = p_member.state, end_reason = p_member.reason
     WHERE member_id = p_member.id AND ended_at IS NULL;
$$;

-- usage_price: the price of one GPU-hour of a fleet's GPU model (the model's own price, else the fleet's).
CREATE OR REPLACE FUNCTION tuneplane.usage_price(p_fleet_id bigint, p_gpu_model text)
RETURNS tuneplane.usage_prices
LANGUAGE sql STABLE AS $$
    SELECT * FROM tuneplane.usage_prices p
     WHERE p.fleet_id = p_fleet_id AND (p.gpu_model IS NULL OR p.gpu_model = p_gpu_model)
     ORDER BY p.gpu_model IS NULL LIMIT 1;
$$;

-- usage_prices_list: every price, by fleet and GPU model (every user may read them).
CREATE OR REPLACE FUNCTION tuneplane.usage_prices_list()
RETURNS TABLE (fleet text, gpu_model text, price_per_gpu_hour numeric, currency text, updated_at timestamptz)
LANGUAGE sql STABLE AS $$
    SELECT f.name, p.gpu_model, p.price_per_gpu_hour, p.currency, p.updated_at
      FROM tuneplane.usage_prices p JOIN tuneplane.fleets f ON f.id = p.fleet_id
     ORDER BY f.name, p.gpu_model NULLS FIRST;
$$;

-- set_usage_price: an installation admin sets (or, with a NULL price, removes) the price of a GPU-hour on a
-- fleet, for one GPU model or for every model without its own price.
CREATE OR REPLACE FUNCTION tuneplane.set_usage_price(p_actor_id bigint, p_fleet text, p_gpu_model text,
                                                     p_price numeric, p_currency text DEFAULT 'USD')
RETURNS integer
LANGUAGE plpgsql AS $$
DECLARE
    v_fleet bigint;
BEGIN
    PERFORM tuneplane.require_admin(p_actor_id, 'setting prices');
    SELECT id INTO v_fleet FROM tuneplane.fleets WHERE name = p_fleet;
    IF v_fleet IS NULL THEN
        RAISE EXCEPTION 'no fleet %', p_fleet USING ERRCODE = 'TP404', COLUMN = 'fleet';
    END IF;
    IF p_price IS NOT NULL AND p_price < 0 THEN
        RAISE EXCEPTION 'a price per GPU-hour cannot be negative (%)', p_price
            USING ERRCODE = 'TP400', COLUMN = 'price';
    END IF;
    IF p_currency IS NULL OR p_currency !~ '^[A-Z]{3}$' THEN
        RAISE EXCEPTION 'currency must be three capital letters (ISO 4217), not %', p_currency
            USING ERRCODE = 'TP400', COLUMN = 'currency';
    END IF;
    DELETE FROM tuneplane.usage_prices WHERE fleet_id = v_fleet
       AND coalesce(gpu_model, '') = coalesce(nullif(p_gpu_model, ''), '');
    IF p_price IS NULL THEN
        RETURN 0;
    END IF;
    INSERT INTO tuneplane.usage_prices (fleet_id, gpu_model, price_per_gpu_hour, currency)
    VALUES (v_fleet, nullif(p_gpu_model, ''), p_price, p_currency);
    RETURN 1;
END;
$$;

-- usage_visible_teams: the teams whose usage an actor may read: the teams the actor has any role in (an
-- installation admin: every team), narrowed by the request's API token (team_access_allowed, teams.sql).
CREATE OR REPLACE FUNCTION tuneplane.usage_visible_teams(p_actor_id bigint)
RETURNS bigint[]
LANGUAGE sql STABLE AS $$
    SELECT coalesce(array_agg(t.id ORDER BY t.id), '{}')
      FROM tuneplane.users u CROSS JOIN tuneplane.teams t
     WHERE u.id = p_actor_id
       AND tuneplane.team_access_allowed(u, tuneplane.team_role(u.id, t.id), t.id, 'read');
$$;

-- usage_teams_of: the teams whose usage the actor may read, by name (the Usage page's team filter).
CREATE OR REPLACE FUNCTION tuneplane.usage_teams_of(p_actor_id bigint)
RETURNS TABLE (id bigint, name text)
LANGUAGE sql STABLE AS $$
    SELECT t.id, t.name FROM tuneplane.teams t
     WHERE t.id = ANY (tuneplane.usage_visible_teams(p_actor_id))
     ORDER BY t.name;
$$;

-- usage_report: GPU-seconds, CPU-seconds, lost and idle GPU-seconds and cost over [p_since, p_until), grouped
-- by p_by: 'team' (team), 'user' (team, user), 'job' (team, user, job), 'day' (UTC day, team). A member still
-- holding its resources counts up to now. A member that spans a day boundary is split at midnight UTC, so
-- the days add up exactly to the whole. Only what p_actor_id may see (usage_visible_teams); p_team narrows
-- to one team by name. Refuses an unknown grouping, an inverted window and a team the actor cannot see.
CREATE OR REPLACE FUNCTION tuneplane.usage_report(p_actor_id bigint, p_by text, p_team text,
                                                  p_since timestamptz, p_until timestamptz)
RETURNS TABLE (day date, team text, username text, job_id bigint, members bigint, gpu_seconds numeric,
               charged_gpu_seconds numeric, cpu_seconds numeric, lost_gpu_seconds numeric,
               idle_gpu_seconds numeric, cost numeric, currency text)
LANGUAGE plpgsql STABLE AS $$
DECLARE
    v_actor   tuneplane.users;
    v_teams   bigint[];
    v_team_id bigint;
    v_until   timestamptz := coalesce(p_until, now());
BEGIN
    SELECT * INTO v_actor FROM tuneplane.users WHERE id = p_actor_id AND disabled_at IS NULL;
    IF v_actor.id IS NULL THEN
        RAISE EXCEPTION 'no such active user' USING ERRCODE = 'TP404', COLUMN = 'user';
    END IF;
    IF p_by IS NULL OR p_by NOT IN ('team', 'user', 'job', 'day') THEN
        RAISE EXCEPTION 'by must be team, user, job or day, not %', p_by USING ERRCODE = 'TP400', COLUMN = 'by';
    END IF;
    IF p_since IS NULL OR p_since >= v_until THEN
        RAISE EXCEPTION 'since (%) must be before until (%)', p_since, v_until
            USING ERRCODE = 'TP400', COLUMN = 'since';
    END IF;
    v_teams := tuneplane.usage_visible_teams(p_actor_id);
    IF coalesce(p_team, '') <> '' THEN
        SELECT id INTO v_team_id FROM tuneplane.teams WHERE name = p_team;
        IF v_team_id IS NULL OR NOT v_team_id = ANY (v_teams) THEN
            RAISE EXCEPTION 'no team % of yours', p_team USING ERRCODE = 'TP404', COLUMN = 'team';
        END IF;
    END IF;
    RETURN QUERY
    WITH rows AS (
        SELECT l.*, greatest(l.started_at, p_since) AS s, least(coalesce(l.ended_at, now()), v_until) AS e
          FROM tuneplane.usage_ledger l
         WHERE l.started_at < v_until AND (l.ended_at IS NULL OR l.ended_at > p_since)
           AND l.team_id = ANY (v_teams)
           AND (v_team_id IS NULL OR l.team_id = v_team_id)
    ), pieces AS (
        -- Day pieces only when grouping by day; otherwise the whole clipped interval.
        SELECT r.*, d.day_start::date AS d,
               CASE WHEN p_by = 'day' THEN greatest(r.s, d.day_start AT TIME ZONE 'UTC') ELSE r.s END AS ps,
               CASE WHEN p_by = 'day' THEN least(r.e, (d.day_start + interval '1 day') AT TIME ZONE 'UTC')
                    ELSE r.e END AS pe
          FROM rows r
          CROSS JOIN LATERAL (
              SELECT x AS day_start FROM generate_series(date_trunc('day', r.s AT TIME ZONE 'UTC'),
                                                         date_trunc('day', r.e AT TIME ZONE 'UTC'),
                                                         interval '1 day') x
               WHERE p_by = 'day'
              UNION ALL SELECT NULL::timestamp WHERE p_by <> 'day'
          ) d
         WHERE r.e > r.s
    ), priced AS (
        SELECT p.*, p.gpus * extract(epoch FROM p.pe - p.ps) AS gs, pr.price_per_gpu_hour, pr.currency AS cur,
               -- Lost and idle seconds are per member; a member split by day carries them on its last piece.
               p.pe = p.e AS last_piece
          FROM pieces p
          LEFT JOIN LATERAL tuneplane.usage_price(p.fleet_id, p.gpu_model) pr ON true
         WHERE p.pe > p.ps
    )
    SELECT CASE WHEN p_by = 'day' THEN x.d END,
           t.name,
           CASE WHEN p_by IN ('user', 'job') THEN u.username END,
           CASE WHEN p_by = 'job' THEN x.job_id END,
           count(DISTINCT x.member_id),
           sum(x.gs),
           sum(x.gs * x.charge_factor),
           sum(x.cpus * extract(epoch FROM x.pe - x.ps)),
           sum(CASE WHEN x.last_piece THEN x.lost_gpu_seconds ELSE 0 END),
           sum(CASE WHEN x.last_piece THEN x.idle_gpu_seconds ELSE 0 END),
           -- Cost only where every piece has a price in one currency; otherwise none rather than a wrong one.
           CASE WHEN count(*) = count(x.price_per_gpu_hour) AND count(DISTINCT x.cur) = 1
                THEN round(sum(x.gs * x.charge_factor * x.price_per_gpu_hour / 3600), 2) END,
           CASE WHEN count(DISTINCT x.cur) = 1 THEN min(x.cur) END
      FROM priced x
      JOIN tuneplane.teams t ON t.id = x.team_id
      JOIN tuneplane.users u ON u.id = x.user_id
     GROUP BY 1, 2, 3, 4
     ORDER BY 1 NULLS FIRST, 2 NULLS FIRST, 3 NULLS FIRST, 4 NULLS FIRST;
END;
$$;

-- Operators (docs/runbook.md): every ledger row with its team, user, fleet and GPU-seconds so far.
CREATE OR REPLACE VIEW tuneplane.v_usage AS
SELECT l.member_id, l.job_id, l.attempt, l.rank, t.name AS team, u.username AS "user", f.name AS fleet,
       l.node_name AS node, l.gpu_model, l.gpus, l.cpus, l.started_at, l.ended_at, l.ended_how, l.end_reason,
       coalesce(l.gpu_seconds, l.gpus * extract(epoch FROM now() - l.started_at)) AS gpu_seconds,
       l.ended_at IS NULL AS holding, l.lost_gpu_seconds, l.idle_gpu_seconds, l.charge_factor
  FROM tuneplane.usage_ledger l
  JOIN tuneplane.users u ON u.id = l.user_id
  JOIN tuneplane.fleets f ON f.id = l.fleet_id
  JOIN tuneplane.teams t ON t.id = l.team_id;
