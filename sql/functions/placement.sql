-- sql/functions/placement.sql — the current definition of every placement function, view and trigger.
-- Placement: node usage accounting, the queue, reservations (reserve_next) and their views.
--
-- Repeatable file (ADR 0012): `tuneplane db migrate` re-applies every file of sql/functions/ (in the order
-- of order.txt, one transaction) whenever one changes. Edit definitions here, never in a migration.
-- Tables, columns and data changes go in a new numbered migration. A changed signature or a view whose
-- columns change: add its DROP below (it runs before the new definition is created), e.g.
--   DROP FUNCTION IF EXISTS tuneplane.f(bigint, text);
--
-- Drops (signature changes):
-- reserve_next writes its placements set-based now; its per-placement helper is gone.
DROP FUNCTION IF EXISTS tuneplane.reserve_job_on(tuneplane.jobs, bigint[]);
-- team_standing says the team's quota only (what it holds now is said when read: team_waiting_now).
DROP FUNCTION IF EXISTS tuneplane.team_standing(text, text, integer, integer, integer, double precision);

CREATE OR REPLACE FUNCTION tuneplane.node_usage_follow_nodes() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO tuneplane.node_usage (node_id, fleet_id) VALUES (NEW.id, NEW.fleet_id) ON CONFLICT DO NOTHING;
    RETURN NULL;
END;
$$;

CREATE OR REPLACE TRIGGER node_usage_on_node AFTER INSERT ON tuneplane.nodes
    FOR EACH ROW EXECUTE FUNCTION tuneplane.node_usage_follow_nodes();

CREATE OR REPLACE FUNCTION tuneplane.node_usage_follow_gpus() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO tuneplane.node_usage AS u (node_id, fleet_id, total_gpus)
    SELECT d.node_id, (SELECT n.fleet_id FROM tuneplane.nodes n WHERE n.id = d.node_id),
           (SELECT count(*) FROM tuneplane.node_gpus g WHERE g.node_id = d.node_id)
      FROM (SELECT DISTINCT node_id FROM changed) d
     WHERE EXISTS (SELECT 1 FROM tuneplane.nodes n WHERE n.id = d.node_id)
    ON CONFLICT (node_id) DO UPDATE SET total_gpus = EXCLUDED.total_gpus;
    RETURN NULL;
END;
$$;

CREATE OR REPLACE TRIGGER node_usage_on_gpu_insert AFTER INSERT ON tuneplane.node_gpus
    REFERENCING NEW TABLE AS changed FOR EACH STATEMENT EXECUTE FUNCTION tuneplane.node_usage_follow_gpus();

CREATE OR REPLACE TRIGGER node_usage_on_gpu_delete AFTER DELETE ON tuneplane.node_gpus
    REFERENCING OLD TABLE AS changed FOR EACH STATEMENT EXECUTE FUNCTION tuneplane.node_usage_follow_gpus();

CREATE OR REPLACE TRIGGER launch_decisions_immutable
    BEFORE UPDATE OR DELETE ON tuneplane.launch_decisions
    FOR EACH ROW EXECUTE FUNCTION tuneplane.refuse_change();

-- Decisions are forever: TRUNCATE (which skips row triggers) is refused too.
CREATE OR REPLACE TRIGGER launch_decisions_no_truncate
    BEFORE TRUNCATE ON tuneplane.launch_decisions
    FOR EACH STATEMENT EXECUTE FUNCTION tuneplane.refuse_change();

-- Eligible nodes of a fleet with their free capacity right now.
CREATE OR REPLACE FUNCTION tuneplane.fleet_free_capacity(p_fleet_id bigint)
RETURNS TABLE (node_id bigint, node_name text, address text, total_gpus integer, free_gpus integer,
               free_cpus integer, free_memory bigint, cpus integer, memory_bytes bigint)
LANGUAGE sql STABLE AS $$
    SELECT n.id, n.name, n.address, u.total_gpus, u.total_gpus - u.used_gpus,
           n.cpus - u.used_cpus, n.memory_bytes - u.used_memory, n.cpus, n.memory_bytes
      FROM tuneplane.nodes n
      JOIN tuneplane.node_usage u ON u.node_id = n.id
     WHERE n.fleet_id = p_fleet_id
       AND tuneplane.node_is_connected(n, (SELECT tuneplane.node_fresh_since()));
$$;

-- Human-readable resource request of a job.
CREATE OR REPLACE FUNCTION tuneplane.describe_request(p_job tuneplane.jobs)
RETURNS text
LANGUAGE sql IMMUTABLE AS $$
    -- A CPU-only job's needs name no GPU ("1 node × 4 CPUs, 1024 MB memory").
    SELECT format('%s node%s × %s%s CPU%s, %s memory',
                  p_job.nodes, CASE WHEN p_job.nodes = 1 THEN '' ELSE 's' END,
                  CASE WHEN p_job.gpus_per_node = 0 THEN ''
                       ELSE format('%s GPU%s, ', p_job.gpus_per_node,
                                   CASE WHEN p_job.gpus_per_node = 1 THEN '' ELSE 's' END) END,
                  p_job.cpus_per_node, CASE WHEN p_job.cpus_per_node = 1 THEN '' ELSE 's' END,
                  pg_size_pretty(p_job.memory_per_node));
$$;

-- set_job_state: the one writer of jobs.state/state_reason outside submission. Writes only on change
-- (each change is a job_events row, by trigger).
CREATE OR REPLACE FUNCTION tuneplane.set_job_state(p_job_id bigint, p_state text, p_reason text,
                                        p_detail jsonb DEFAULT NULL)
RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    IF p_detail IS NOT NULL THEN
        PERFORM set_config('tuneplane.event_detail', p_detail::text, true);
    END IF;
    UPDATE tuneplane.jobs SET state = p_state, state_reason = p_reason
     WHERE id = p_job_id AND (state IS DISTINCT FROM p_state OR state_reason IS DISTINCT FROM p_reason);
    IF p_detail IS NOT NULL THEN
        PERFORM set_config('tuneplane.event_detail', '', true);
    END IF;
END;
$$;

-- ---------------------------------------------------------------------------------------------------
-- Admission by team quotas (docs/teams.md, ADR 0170). A fleet with no row in team_quotas is unmanaged:
-- every job is admitted in plain queue order (priority, then age), as before teams. Once a fleet has a
-- quota, reserve_next admits in this order: jobs within their team's guarantee (priority, then age), then
-- jobs that borrow idle GPUs above it, ordered by weighted fair share — never past limit_gpus, and only
-- preemptible jobs borrow (a job within its guarantee takes lent GPUs back by preemption: the planner's
-- reclaim rule, preemption.sql). The helpers below hold every rule; reserve_next calls them.

-- fleet_has_quotas: whether admission on this fleet goes by team quotas.
CREATE OR REPLACE FUNCTION tuneplane.fleet_has_quotas(p_fleet_id bigint)
RETURNS boolean
LANGUAGE sql STABLE AS $$
    SELECT EXISTS (SELECT 1 FROM tuneplane.team_quotas q WHERE q.fleet_id = p_fleet_id);
$$;

-- ---- GPUs held per (fleet, team): a count kept by the transactions that reserve and release (0225) ----
-- Why: a pass on a fleet with quotas needs each team's GPUs held now; summing every live member of the
-- fleet on every pass cost as much as the rest of the admission order (docs/teams.md, "GPUs held").
-- Writers, each in the transaction that writes the members it counts:
--   * reserve_next (under the fleet's placement lock): its own placements, straight into team_fleet_held;
--     and, at the start of each pass, team_fleet_held_fold;
--   * release_member: a team_fleet_held_changes row (−GPUs, −1 member), an insert: it never waits for a
--     counter row, so it adds no lock to the launch lock order (launch.sql) and no contention;
--   * slurm_allocation_started (slurm.sql): a changes row (+members, no GPU indices).
-- Crash between two writes: there is none to crash between. A member row and the count that records it
-- commit in one transaction, so after a crash (or a rollback, or a deadlock victim) both are there or
-- neither is; nothing is reconstructed later. A job's team and a node's fleet never change (no function
-- writes jobs.team_id or nodes.fleet_id; a migration that moves them must move the count too, or delete
-- the fleet's team_fleet_held_built row so that the next pass counts it again).

-- team_fleet_held_recount: GPUs (cardinality of gpu_indices) and members not yet released on the fleet's
-- nodes, per team, summed from the members themselves: the truth the count must equal (the launch model
-- test compares them after every step), and how a fleet's count is first built.
CREATE OR REPLACE FUNCTION tuneplane.team_fleet_held_recount(p_fleet_id bigint)
RETURNS TABLE (team_id bigint, gpus integer, members integer)
LANGUAGE sql STABLE AS $$
    SELECT j.team_id, coalesce(sum(cardinality(m.gpu_indices)), 0)::integer, count(*)::integer
      FROM tuneplane.nodes n
      JOIN tuneplane.members m ON m.node_id = n.id AND m.released_at IS NULL
      JOIN tuneplane.jobs j ON j.id = m.job_id
     WHERE n.fleet_id = p_fleet_id
     GROUP BY j.team_id;
$$;

-- team_fleet_held_now: the same figures from the count: the folded rows plus the changes not folded yet,
-- read in one snapshot (a change row commits with the release it records). Teams with no live member on
-- the fleet are left out, as in the recount. A fleet whose count was never built is recounted.
CREATE OR REPLACE FUNCTION tuneplane.team_fleet_held_now(p_fleet_id bigint)
RETURNS TABLE (team_id bigint, gpus integer, members integer)
LANGUAGE sql STABLE AS $$
    SELECT x.team_id, sum(x.gpus)::integer, sum(x.members)::integer
      FROM (SELECT h.team_id, h.gpus, h.members FROM tuneplane.team_fleet_held h WHERE h.fleet_id = p_fleet_id
            UNION ALL
            SELECT c.team_id, c.gpus, c.members FROM tuneplane.team_fleet_held_changes c
             WHERE c.fleet_id = p_fleet_id) x
     WHERE EXISTS (SELECT 1 FROM tuneplane.team_fleet_held_built b WHERE b.fleet_id = p_fleet_id)
     GROUP BY x.team_id
    HAVING sum(x.members) > 0
    UNION ALL
    SELECT r.team_id, r.gpus, r.members FROM tuneplane.team_fleet_held_recount(p_fleet_id) r
     WHERE NOT EXISTS (SELECT 1 FROM tuneplane.team_fleet_held_built b WHERE b.fleet_id = p_fleet_id);
$$;

-- team_fleet_held_fold: brings the fleet's count rows up to date; called by reserve_next under the fleet's
-- placement lock (the only writer of team_fleet_held and the only one that deletes changes), before it
-- reads the teams' shares. The first time on a fleet it builds the count from the members, in one
-- statement (one snapshot: the changes it deletes are exactly those whose releases the recount sees),
-- after LOCK TABLE members IN SHARE MODE waited for every transaction writing members: a release by the
-- previous function files (before migration 0225's functions were applied), which writes no change row,
-- is then either in the recount or never happens. That lock is taken once per fleet, ever, holding only
-- the placement lock, which no transaction that writes members waits for afterwards (placement lock comes
-- before member rows in the lock order). Afterwards: one statement folds the committed changes into the rows.
CREATE OR REPLACE FUNCTION tuneplane.team_fleet_held_fold(p_fleet_id bigint)
RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM tuneplane.team_fleet_held_built b WHERE b.fleet_id = p_fleet_id) THEN
        LOCK TABLE tuneplane.members IN SHARE MODE;
        WITH gone AS (
            DELETE FROM tuneplane.team_fleet_held_changes c WHERE c.fleet_id = p_fleet_id
        ), counted AS (
            INSERT INTO tuneplane.team_fleet_held (fleet_id, team_id, gpus, members)
            SELECT p_fleet_id, r.team_id, r.gpus, r.members FROM tuneplane.team_fleet_held_recount(p_fleet_id) r
        )
        INSERT INTO tuneplane.team_fleet_held_built (fleet_id) VALUES (p_fleet_id);
        RETURN;
    END IF;
    -- (An UPDATE, then an INSERT of teams without a row: INSERT … ON CONFLICT would check the rows'
    -- CHECK (gpus >= 0) on the negative sums it proposes before it found the conflict.)
    WITH folded AS (
        DELETE FROM tuneplane.team_fleet_held_changes c WHERE c.fleet_id = p_fleet_id
        RETURNING c.team_id, c.gpus, c.members
    ), sums AS (
        SELECT f.team_id, sum(f.gpus)::integer AS gpus, sum(f.members)::integer AS members
          FROM folded f GROUP BY f.team_id
    ), updated AS (
        UPDATE tuneplane.team_fleet_held h SET gpus = h.gpus + s.gpus, members = h.members + s.members
          FROM sums s WHERE h.fleet_id = p_fleet_id AND h.team_id = s.team_id
        RETURNING h.team_id
    )
    INSERT INTO tuneplane.team_fleet_held (fleet_id, team_id, gpus, members)
    SELECT p_fleet_id, s.team_id, s.gpus, s.members FROM sums s
     WHERE NOT EXISTS (SELECT 1 FROM updated u WHERE u.team_id = s.team_id);
END;
$$;

-- decayed_gpus: a team's decayed average of GPUs held, brought from p_at to now while it held p_gpus:
-- avg(now) = avg(at)·d + gpus·(1 − d), d = 2^(−elapsed/half-life); stored as GPU-seconds (avg × H / ln 2,
-- the integral of the exponentially decayed allocation).
CREATE OR REPLACE FUNCTION tuneplane.decayed_gpus(p_secs double precision, p_at timestamptz, p_gpus integer,
                                                  p_half_life interval)
RETURNS double precision
LANGUAGE sql STABLE AS $$
    WITH k AS (SELECT extract(epoch FROM p_half_life) AS h,
                      power(2::double precision, -greatest(extract(epoch FROM now() - p_at), 0)
                                                  / extract(epoch FROM p_half_life)) AS d)
    SELECT (p_secs * ln(2) / k.h) * k.d + p_gpus * (1 - k.d) FROM k;
$$;

-- fleet_team_shares: every team with a quota on the fleet, GPUs held in it or a job queued in it, with its
-- fleet-wide quota (gpu_model ''; no row: guarantee 0, no limit, weight 1) and GPUs held now (members not
-- yet released: team_fleet_held_now, the count). share_gpus is what fair share compares (÷ weight): the GPUs held now or, when the fleet
-- has a usage_half_life, the team's decayed average of GPUs held (team_fleet_usage brought up to now).
-- Read by reserve_next under the fleet's placement lock, and by the reasons and the team pages.
CREATE OR REPLACE FUNCTION tuneplane.fleet_team_shares(p_fleet_id bigint)
RETURNS TABLE (team_id bigint, team text, used_gpus integer, guaranteed_gpus integer, limit_gpus integer,
               weight double precision, share_gpus double precision)
LANGUAGE sql STABLE AS $$
    WITH held AS (
        SELECT h.team_id, h.gpus FROM tuneplane.team_fleet_held_now(p_fleet_id) h
    ), teams AS (
        SELECT q.team_id FROM tuneplane.team_quotas q WHERE q.fleet_id = p_fleet_id AND q.gpu_model = ''
        UNION SELECT h.team_id FROM held h
        UNION SELECT DISTINCT j.team_id FROM tuneplane.jobs j WHERE j.fleet_id = p_fleet_id AND j.state = 'queued'
    )
    SELECT t.team_id, tm.name, coalesce(h.gpus, 0), coalesce(q.guaranteed_gpus, 0), q.limit_gpus,
           coalesce(q.weight, 1),
           CASE WHEN f.usage_half_life IS NULL OR u.team_id IS NULL THEN coalesce(h.gpus, 0)::double precision
                ELSE tuneplane.decayed_gpus(u.decayed_gpu_secs, u.decayed_at, coalesce(h.gpus, 0), f.usage_half_life)
           END
      FROM teams t
      JOIN tuneplane.teams tm ON tm.id = t.team_id
      JOIN tuneplane.fleets f ON f.id = p_fleet_id
      LEFT JOIN held h ON h.team_id = t.team_id
      LEFT JOIN tuneplane.team_quotas q ON q.team_id = t.team_id AND q.fleet_id = p_fleet_id AND q.gpu_model = ''
      LEFT JOIN tuneplane.team_fleet_usage u ON u.team_id = t.team_id AND u.fleet_id = p_fleet_id;
$$;

-- record_team_usage: brings team_fleet_usage of the fleet's teams up to now (a fleet with a half-life
-- only). Called by reserve_next under the fleet's placement lock, before it admits, so each team's decayed
-- usage is integrated over the GPUs it held since the last pass.
CREATE OR REPLACE FUNCTION tuneplane.record_team_usage(p_fleet_id bigint)
RETURNS void
LANGUAGE sql AS $$
    INSERT INTO tuneplane.team_fleet_usage AS u (fleet_id, team_id, decayed_gpu_secs, decayed_at)
    SELECT p_fleet_id, s.team_id, s.share_gpus * extract(epoch FROM f.usage_half_life) / ln(2), now()
      FROM tuneplane.fleet_team_shares(p_fleet_id) s
      JOIN tuneplane.fleets f ON f.id = p_fleet_id AND f.usage_half_life IS NOT NULL
    ON CONFLICT (fleet_id, team_id) DO UPDATE
       SET decayed_gpu_secs = EXCLUDED.decayed_gpu_secs, decayed_at = EXCLUDED.decayed_at;
$$;

-- admission_order: the queued jobs of a fleet with quotas in the order reserve_next considers them (a
-- fleet without quotas keeps plain queue order: priority, then age): first the jobs within their team's guarantee (the team's GPUs held plus
-- its queued jobs ahead of this one plus this one fit its guaranteed_gpus), by priority then age; then
-- every other job by weighted fair share as it would stand when the job is admitted — (the team's share
-- GPUs + its queued jobs' GPUs ahead of it) ÷ weight, lowest first (virtual-time fair queuing: a team with
-- weight 3 gets three jobs' turns for one of a weight-1 team), then priority and age.
CREATE OR REPLACE FUNCTION tuneplane.admission_order(p_fleet_id bigint, p_team bigint[], p_used integer[],
                                                     p_guaranteed integer[], p_share double precision[],
                                                     p_weight double precision[])
RETURNS TABLE (job_id bigint, ord bigint)
LANGUAGE sql STABLE AS $$
    WITH q AS (
        SELECT j.id, j.priority, j.created_at, j.team_id, j.nodes * j.gpus_per_node AS gpus,
               sum(j.nodes * j.gpus_per_node) OVER (PARTITION BY j.team_id
                                                    ORDER BY j.priority DESC, j.created_at, j.id)
               - j.nodes * j.gpus_per_node AS ahead
          FROM tuneplane.jobs j
         WHERE j.fleet_id = p_fleet_id AND j.state = 'queued'
    ), s AS (
        SELECT * FROM unnest(p_team, p_used, p_guaranteed, p_share, p_weight)
                      AS s (team_id, used_gpus, guaranteed_gpus, share_gpus, weight)
    )
    SELECT q.id, row_number() OVER (ORDER BY
               CASE WHEN s.team_id IS NULL OR q.gpus = 0
                      OR s.used_gpus + q.ahead + q.gpus <= s.guaranteed_gpus THEN 0 ELSE 1 END,
               CASE WHEN s.team_id IS NOT NULL AND q.gpus > 0
                     AND s.used_gpus + q.ahead + q.gpus > s.guaranteed_gpus
                    THEN (s.share_gpus + q.ahead) / s.weight END NULLS FIRST,
               q.priority DESC, q.created_at, q.id)
      FROM q LEFT JOIN s ON s.team_id = q.team_id;
$$;

-- admission_queue: admission_order with the fleet's team shares as they stand (for reads: v_queue, the
-- reasons; reserve_next passes the shares it already holds).
CREATE OR REPLACE FUNCTION tuneplane.admission_queue(p_fleet_id bigint)
RETURNS TABLE (job_id bigint, ord bigint)
LANGUAGE sql STABLE AS $$
    SELECT o.* FROM (SELECT array_agg(s.team_id) AS t, array_agg(s.used_gpus) AS u,
                            array_agg(s.guaranteed_gpus) AS g, array_agg(s.share_gpus) AS sh,
                            array_agg(s.weight) AS w
                       FROM tuneplane.fleet_team_shares(p_fleet_id) s) x,
           LATERAL tuneplane.admission_order(p_fleet_id, x.t, x.u, x.g, x.sh, x.w) o;
$$;

-- team_standing: a team's quota on a fleet, the words every stored quota reason uses. Stable numbers only
-- (guarantee, limit, weight): what the team holds now moves with every placement and release, so it is
-- said when the job is read (team_waiting_now), not stored — a pass rewrites a waiting job's reason (an
-- event) only when its situation changes, as placement's other reasons (docs/scheduling.md, ADR 0170).
CREATE OR REPLACE FUNCTION tuneplane.team_standing(p_team text, p_fleet text, p_guaranteed integer,
                                                   p_limit integer, p_weight double precision)
RETURNS text
LANGUAGE sql IMMUTABLE AS $$
    SELECT format('team %s on fleet %s: %s guaranteed GPU%s, limit %s, weight %s',
                  p_team, p_fleet, p_guaranteed, CASE WHEN p_guaranteed = 1 THEN '' ELSE 's' END,
                  coalesce(p_limit::text, 'none'), p_weight);
$$;

-- admission_verdict: may this job be admitted now, given its team's numbers in this pass (GPUs held now,
-- including what this pass placed), the fleet's free GPUs on schedulable nodes and the GPUs held back for
-- teams whose within-guarantee jobs wait? borrowing: NULL = not now (reason says why, with the team's quota),
-- false = within the guarantee, true = borrowing idle GPUs above it.
--   * never past limit_gpus;
--   * above the guarantee only a preemptible job (what is lent is reclaimed by preempting it);
--   * a borrower never takes the GPUs a waiting within-guarantee job of another team is owed.
CREATE OR REPLACE FUNCTION tuneplane.admission_verdict(p_job tuneplane.jobs, p_team text, p_fleet text,
                                                       p_used integer, p_guaranteed integer, p_limit integer,
                                                       p_weight double precision, p_free integer, p_held integer,
                                                       OUT borrowing boolean, OUT reason text)
LANGUAGE plpgsql IMMUTABLE AS $$
DECLARE
    v_gpus integer := p_job.nodes * p_job.gpus_per_node;
BEGIN
    IF v_gpus = 0 OR p_used + v_gpus <= p_guaranteed THEN
        borrowing := false;
        RETURN;
    END IF;
    IF p_limit IS NOT NULL AND p_used + v_gpus > p_limit THEN
        reason := format('team %s would go past its limit of %s GPU%s on fleet %s; this job asks %s',
                         p_team, p_limit, CASE WHEN p_limit = 1 THEN '' ELSE 's' END, p_fleet, v_gpus);
        RETURN;
    END IF;
    IF NOT p_job.preemptible THEN
        reason := format('team %s would go past its %s guaranteed GPU%s on fleet %s; this job asks %s; '
                         'it can borrow idle GPUs if it is preemptible',
                         p_team, p_guaranteed, CASE WHEN p_guaranteed = 1 THEN '' ELSE 's' END, p_fleet, v_gpus);
        RETURN;
    END IF;
    IF p_held > 0 AND p_free - v_gpus < p_held THEN
        reason := format('waiting for idle GPUs to borrow: free GPUs are held for teams waiting within their '
                         'guarantee; this job asks %s; %s', v_gpus,
                         tuneplane.team_standing(p_team, p_fleet, p_guaranteed, p_limit, p_weight));
        RETURN;
    END IF;
    borrowing := true;
END;
$$;

-- head_claim_nodes: the nodes the head of a fleet's queue claims (docs/scheduling.md, "Backfill: the head-claim
-- rule"): of the connected nodes that could ever hold one of its members, those it claimed before (p_kept:
-- the claim is kept across passes, so the GPUs that free up there gather for it), then those with the most
-- free GPUs (and CPUs) now — without run-time estimates, the nodes where it will most likely fit soonest.
CREATE OR REPLACE FUNCTION tuneplane.head_claim_nodes(p_fleet_id bigint, p_job tuneplane.jobs,
                                                      p_fresh timestamptz, p_kept bigint[])
RETURNS bigint[]
LANGUAGE sql STABLE AS $$
    SELECT coalesce(array_agg(x.node_id ORDER BY x.i), '{}')
      FROM (SELECT u.node_id, row_number() OVER (ORDER BY u.node_id = ANY (p_kept) DESC, u.free_gpus DESC,
                                                          n.cpus - u.used_cpus DESC, u.node_id) AS i
              FROM tuneplane.node_usage u JOIN tuneplane.nodes n ON n.id = u.node_id
             WHERE u.fleet_id = p_fleet_id
               AND tuneplane.node_is_connected(n, p_fresh)
               AND u.total_gpus >= p_job.gpus_per_node
               AND n.cpus >= p_job.cpus_per_node
               AND n.memory_bytes >= p_job.memory_per_node
             ORDER BY i
             LIMIT p_job.nodes) x;
$$;

-- head_claim_words: what a waiting reason says is held: the claimed nodes by name and, on a fleet with
-- quotas, for which team (stable words: the claim is kept across passes).
CREATE OR REPLACE FUNCTION tuneplane.head_claim_words(p_claim bigint[], p_team text)
RETURNS text
LANGUAGE sql STABLE AS $$
    SELECT format('%s held for it%s',
                  coalesce((SELECT CASE WHEN count(*) = 1 THEN 'node ' ELSE 'nodes ' END
                                   || string_agg(n.name, ', ' ORDER BY c.i)
                              FROM unnest(p_claim) WITH ORDINALITY c (id, i) JOIN tuneplane.nodes n ON n.id = c.id
                            HAVING count(*) > 0), 'no node'),
                  CASE WHEN p_team IS NULL THEN '' ELSE format(' (team %s)', p_team) END);
$$;

-- reserve_next: one placement pass over a fleet's queue; returns the attempts it created.
-- Serialized per fleet by a transaction-level advisory lock. Walks EVERY queued job of the fleet in queue
-- order (no count cap: a job that fits behind thousands that do not is placed); p_max_jobs bounds how many
-- jobs one pass places (NULL: no bound), so one transaction stays short; the worker runs another pass when
-- a pass hit the bound.
--   * Each placed job's whole envelope (every member's node, GPU indices, CPUs, memory) becomes a new
--     attempt `reserved`, and its pgqueuer `launch` job is enqueued in the same transaction.
--   * Node rows: the candidate search locks the nodes it picks FOR KEY SHARE SKIP LOCKED and re-reads them
--     under that lock. Cordon and drain lock the node FOR UPDATE, so a node being cordoned right now is
--     skipped; fence_node and retire take this fleet's placement lock before anything else (they lose the
--     node's members in the launch lock order, launch.sql), so a pass and a fence or retire never overlap:
--     one fenced before this pass is not eligible, one fenced after it sees (and loses) what the pass
--     reserved. Heartbeats (FOR NO KEY UPDATE) do not conflict with KEY SHARE. The node rows are taken
--     before jobs here, against the launch order: both with SKIP LOCKED, so the pass never waits for them.
--   * Queued jobs are read without a lock; a job is locked (FOR UPDATE SKIP LOCKED, still `queued`) only
--     when it fits, so a pass writes nothing for a job it cannot place unless that job's reason changes.
--   * Capacity only shrinks inside a pass, so a request shape (nodes, GPUs, CPUs, memory) that found no fit
--     is not searched again in the same pass.
--   * Rendezvous: rank 0's node address and a port from launch_settings' range that no live attempt uses at
--     that address (preferred: base + (job id * 31 + attempt number) mod span; the next free one otherwise).
--     The partial unique index attempts_rendezvous_live (0065) is the truth behind that rule.
--   * Writes are batched per pass: one INSERT for all attempts, one for all members and their GPUs, one for
--     the pgqueuer jobs (its NOTIFY trigger is per statement); per placement only the candidate search, the
--     job lock, the port probe and the node_usage update (later searches must see it) run in the loop.
--     Job state and reasons go through set_job_state, which writes (and makes an event) only on change.
--   * Held-GPU count (team_fleet_held, migration 0225): folded at the start of the pass
--     (team_fleet_held_fold), this pass's placements added in the same transaction as their members. The
--     first pass on a fleet (after the upgrade, or on a new fleet) builds the count after LOCK TABLE members
--     IN SHARE MODE, right after the placement lock (it waits for transactions writing members; see there).
--   * Admission (team quotas): the walk follows admission_order's order; on a fleet with quotas each job
--     first gets admission_verdict (limit, guarantee, preemptible borrowing, GPUs owed to waiting
--     within-guarantee jobs) with its team's numbers as this pass moves them; a job refused there claims
--     nothing and its reason says the numbers. attempts.borrowing records an admission above the guarantee.
--     A job admitted within its guarantee that does not fit may reclaim GPUs lent to other teams
--     (plan_preemption, given its team's numbers in this pass).
--   * The head's claim is kept across passes (head_claims, migration 0270; written here only, under the
--     placement lock): a pass starts with the head the last one kept, if it is still queued, and its nodes
--     (head_claim_nodes), so the room that frees up there gathers for it whatever order the fair-share
--     order gives the teams this pass. Only a job that outranks the head takes the claim over when it does
--     not fit: a higher priority (a fleet without quotas) or, with quotas, a job within its team's
--     guarantee over a borrowing head or one of higher priority within guarantee. Jobs walked before the
--     head search past its claim as jobs behind it do. Placed, or refused a placement now (quota, back-off,
--     no port), the head lets its claim go and the next job that does not fit claims afresh.
-- Reasons of jobs it cannot place are stable words (needs, head or behind which job), never the figures of
-- the moment, so a pass rewrites a reason only when the job's situation changes; the "best fit now" figures
-- are computed when read (placement_fit_now).
CREATE OR REPLACE FUNCTION tuneplane.reserve_next(p_fleet_id bigint, p_max_jobs integer DEFAULT 1000)
RETURNS TABLE (job_id bigint, attempt_id bigint)
-- Generic plans: the per-job statements take plpgsql parameters (a LIMIT among them), for which PostgreSQL
-- would otherwise keep planning a custom plan on every execution; that planning was 40% of a pass's CPU.
-- The generic plans are the index range scans the comments above describe (EXPLAIN checked).
LANGUAGE plpgsql SET plan_cache_mode = force_generic_plan AS $$
DECLARE
    v_job       tuneplane.jobs;
    v_nodes     bigint[];
    v_names     text[];
    v_addr      text;
    v_head_id   bigint;
    v_head      tuneplane.jobs;
    v_claim     bigint[] := '{}';
    v_fresh     timestamptz;
    v_settings  tuneplane.launch_settings;
    v_failed    text[] := '{}';
    v_shape     text;
    v_number    integer;
    v_port      integer;
    v_tries     integer;
    v_reason    text;
    v_short     integer;
    v_reserved_at timestamptz;
    -- This pass's placements (index i), written set-based after the walk.
    p_job       bigint[] := '{}';
    p_number    integer[] := '{}';
    p_addr      text[] := '{}';
    p_port      integer[] := '{}';
    p_prio      integer[] := '{}';
    p_reason    text[] := '{}';
    p_detail    jsonb[] := '{}';
    p_rdv       text[] := '{}';
    -- Their members, in placement order.
    m_job       bigint[] := '{}';
    m_rank      integer[] := '{}';
    m_node      bigint[] := '{}';
    m_gpus      integer[] := '{}';
    m_cpus      integer[] := '{}';
    m_memory    bigint[] := '{}';
    v_attempts  bigint[];
    -- Team quotas (admission_order, admission_verdict): each team's numbers in this pass, by slot.
    v_managed   boolean;
    v_fleet     text;
    t_team      bigint[];
    t_name      text[];
    t_used      integer[];
    t_guar      integer[];
    t_limit     integer[];
    t_weight    double precision[];
    t_waiting   boolean[];
    t_share     double precision[];
    v_t         integer;
    v_free      integer;
    v_held      integer := 0;
    v_borrow    boolean := false;
    p_borrow    boolean[] := '{}';
    v_queue     refcursor;
    v_decay     boolean;
    -- Preemption (preemption.sql): nodes held for waiting preemptors (h_node[i] for job h_job[i]).
    h_node      bigint[];
    h_job       bigint[];
    v_held_nodes bigint[] := '{}';
    v_searched  boolean;
    v_plan      text;
    v_within    boolean;
    v_standing  text := '';
    v_planned   text[] := '{}';
    -- The head's claim kept across passes (head_claims).
    v_kept      tuneplane.head_claims;
    v_head_borrows boolean := false;
    v_head_team text;
    v_head_t    integer;
    v_outranks  boolean;
    v_past_claim boolean;
    v_above     boolean;
    v_head_seen boolean := false;
BEGIN
    PERFORM pg_advisory_xact_lock(hashtext('tuneplane.placement'), p_fleet_id::integer);
    -- The teams' held-GPU count, folded under this lock (read by fleet_team_shares below).
    PERFORM tuneplane.team_fleet_held_fold(p_fleet_id);
    SELECT * INTO v_settings FROM tuneplane.launch_settings;
    -- Connected = heartbeat younger than stale_after (the same rule as node_connectivity()).
    v_fresh := tuneplane.node_fresh_since();
    v_managed := tuneplane.fleet_has_quotas(p_fleet_id);
    IF v_managed THEN
        SELECT f.name, f.usage_half_life IS NOT NULL INTO v_fleet, v_decay
          FROM tuneplane.fleets f WHERE f.id = p_fleet_id;
        IF v_decay THEN
            PERFORM tuneplane.record_team_usage(p_fleet_id);
        END IF;
        SELECT array_agg(s.team_id), array_agg(s.team), array_agg(s.used_gpus), array_agg(s.guaranteed_gpus),
               array_agg(s.limit_gpus), array_agg(s.weight), array_agg(false), array_agg(s.share_gpus)
          INTO t_team, t_name, t_used, t_guar, t_limit, t_weight, t_waiting, t_share
          FROM tuneplane.fleet_team_shares(p_fleet_id) s;
        -- Free GPUs on the nodes this pass may use (the candidate search's eligibility rule).
        SELECT coalesce(sum(u.free_gpus), 0) INTO v_free
          FROM tuneplane.node_usage u JOIN tuneplane.nodes n ON n.id = u.node_id
         WHERE u.fleet_id = p_fleet_id AND tuneplane.node_is_connected(n, v_fresh);
    END IF;
    SELECT array_agg(h.node_id), array_agg(h.job_id) INTO h_node, h_job FROM tuneplane.preemption_holds(p_fleet_id) h;
    -- The head the last pass kept room for, while it is still queued here: it keeps its claim.
    SELECT * INTO v_kept FROM tuneplane.head_claims c WHERE c.fleet_id = p_fleet_id;
    IF v_kept.job_id IS NOT NULL THEN
        SELECT * INTO v_head FROM tuneplane.jobs j
         WHERE j.id = v_kept.job_id AND j.fleet_id = p_fleet_id AND j.state = 'queued';
        IF v_head.id IS NOT NULL THEN
            v_head_id := v_head.id;
            v_claim := tuneplane.head_claim_nodes(p_fleet_id, v_head, v_fresh, v_kept.node_ids);
            IF v_managed THEN
                v_head_t := array_position(t_team, v_head.team_id);
                v_head_team := t_name[v_head_t];
                v_head_borrows := t_used[v_head_t] + v_head.nodes * v_head.gpus_per_node > t_guar[v_head_t];
            END IF;
        END IF;
    END IF;

    -- Queue order: plain (priority, then age) on a fleet without quotas, admission_order's with them.
    IF v_managed THEN
        OPEN v_queue FOR SELECT j.* FROM tuneplane.admission_order(p_fleet_id, t_team, t_used, t_guar, t_share,
                                                                    t_weight) q
                           JOIN tuneplane.jobs j ON j.id = q.job_id
                          ORDER BY q.ord;
    ELSE
        OPEN v_queue FOR SELECT * FROM tuneplane.jobs j
                          WHERE j.fleet_id = p_fleet_id AND j.state = 'queued'
                          ORDER BY j.priority DESC, j.created_at, j.id;
    END IF;
    LOOP
        FETCH v_queue INTO v_job;
        EXIT WHEN NOT FOUND;
        EXIT WHEN p_max_jobs IS NOT NULL AND cardinality(p_job) >= p_max_jobs;
        -- Jobs walked after the head never outrank it (they come after it in the order).
        v_head_seen := v_head_seen OR v_job.id = v_head_id;
        IF v_managed THEN
            v_t := array_position(t_team, v_job.team_id);
            SELECT v.borrowing, v.reason INTO v_borrow, v_reason
              FROM tuneplane.admission_verdict(v_job, t_name[v_t], v_fleet, t_used[v_t], t_guar[v_t], t_limit[v_t],
                                               t_weight[v_t], v_free, v_held) v;
            IF v_borrow IS NULL THEN
                -- Not admitted now (quota); it claims nothing and stays queued with its numbers.
                IF v_job.id = v_head_id THEN
                    v_head_id := NULL;
                    v_claim := '{}';
                END IF;
                IF v_job.state_reason IS DISTINCT FROM v_reason THEN
                    PERFORM tuneplane.set_job_state(v_job.id, 'queued', v_reason);
                END IF;
                CONTINUE;
            END IF;
            -- What every reason of an admitted job that waits ends with: its team's quota (stable words).
            -- Not for a job that asks no GPU: GPU quotas do not apply to it (admission_verdict), so its reason
            -- speaks of the CPUs and memory it waits for only.
            v_standing := CASE
                              WHEN v_job.nodes * v_job.gpus_per_node = 0 THEN ''
                              ELSE CASE WHEN v_borrow THEN '; to borrow idle GPUs: '
                                        ELSE '; within its guarantee: ' END
                                   || tuneplane.team_standing(t_name[v_t], v_fleet, t_guar[v_t], t_limit[v_t],
                                                              t_weight[v_t])
                          END;
        END IF;
        IF v_job.preemptions_used > 0 THEN
            -- Just preempted, while a job that outranks it still waits: it backs off (preemption.sql).
            v_reason := tuneplane.preemption_backoff_reason(v_job) || v_standing;
            IF v_reason IS NOT NULL THEN
                IF v_job.id = v_head_id THEN
                    v_head_id := NULL;
                    v_claim := '{}';
                END IF;
                IF v_job.state_reason IS DISTINCT FROM v_reason THEN
                    PERFORM tuneplane.set_job_state(v_job.id, 'queued', v_reason);
                END IF;
                CONTINUE;
            END IF;
        END IF;
        -- Weighted fair share while a borrowing head waits (docs/teams.md, "Fairness guarantee"): would this
        -- borrower of another team leave its team holding more GPUs per weight than the head's team holds now?
        v_above := v_managed AND v_borrow AND v_head_id IS NOT NULL AND v_head_borrows
                   AND v_job.team_id <> v_head.team_id
                   AND (t_used[v_t] + v_job.nodes * v_job.gpus_per_node) / t_weight[v_t]
                       > t_used[v_head_t] / t_weight[v_head_t];
        -- Does it outrank the head (it searches past the head's claim and, if it does not fit, takes it over)?
        -- Only a job walked before the head: on a fleet without quotas any (queue order is priority, then age);
        -- with quotas one within its team's guarantee, one of the head's own team (the team's order), or a
        -- borrower whose team stays at or below the borrowing head's team per weight with it.
        v_outranks := v_head_id IS NOT NULL AND NOT v_head_seen AND v_job.id <> v_head_id
                      AND (NOT v_managed OR NOT v_borrow OR v_job.team_id = v_head.team_id
                           OR (v_head_borrows AND NOT v_above));
        -- A job that may search past the head's claim: one that outranks it, or one within its team's guarantee
        -- while the head borrows (a borrower's claim never keeps a guarantee waiting, wherever the job stands
        -- in the order: admission_order counts the team's queued GPUs ahead of it, the verdict does not).
        v_past_claim := v_outranks OR (v_managed AND NOT v_borrow AND v_head_borrows);
        IF v_above THEN
            -- The room is kept for the head's team: this job takes no free GPU anywhere while the head waits.
            -- It claims nothing, and its shape is not marked as failed.
            v_reason := format('waiting for resources: needs %s; free GPUs are kept for job %s at the head of the '
                               'queue: team %s is below its fair share while it waits (%s)',
                               tuneplane.describe_request(v_job), v_head_id, v_head_team,
                               tuneplane.head_claim_words(v_claim, NULL)) || v_standing;
            IF v_job.state_reason IS DISTINCT FROM v_reason THEN
                PERFORM tuneplane.set_job_state(v_job.id, 'queued', v_reason);
            END IF;
            CONTINUE;
        END IF;
        v_shape := format('%s/%s/%s/%s', v_job.nodes, v_job.gpus_per_node, v_job.cpus_per_node,
                          v_job.memory_per_node);
        v_nodes := '{}';
        v_held_nodes := CASE WHEN h_node IS NULL THEN '{}' ELSE tuneplane.held_from(h_node, h_job, v_job.id) END;
        v_searched := NOT v_shape = ANY (v_failed) OR cardinality(v_held_nodes) > 0 OR v_job.id = v_head_id
                      OR v_past_claim;
        IF v_searched THEN
            -- Best fit (fewest free GPUs first), an index range scan on node_usage_fit that sees this pass's
            -- own allocations; the picked node rows are locked and re-checked (see above).
            SELECT coalesce(array_agg(c.node_id ORDER BY c.free_gpus, c.node_id), '{}'),
                   coalesce(array_agg(c.name ORDER BY c.free_gpus, c.node_id), '{}'),
                   (array_agg(c.address ORDER BY c.free_gpus, c.node_id))[1]
              INTO v_nodes, v_names, v_addr
              FROM (SELECT u.node_id, u.free_gpus, n.name, n.address
                      FROM tuneplane.node_usage u
                      JOIN tuneplane.nodes n ON n.id = u.node_id
                     WHERE u.fleet_id = p_fleet_id
                       AND u.free_gpus >= v_job.gpus_per_node
                       AND n.cpus - u.used_cpus >= v_job.cpus_per_node
                       AND n.memory_bytes - u.used_memory >= v_job.memory_per_node
                       AND tuneplane.node_is_connected(n, v_fresh)
                       AND NOT u.node_id = ANY (v_held_nodes)
                       AND (v_head_id IS NULL OR v_job.id = v_head_id OR v_past_claim
                            OR NOT u.node_id = ANY (v_claim)
                            OR (u.free_gpus - v_job.gpus_per_node >= v_head.gpus_per_node
                                AND n.cpus - u.used_cpus - v_job.cpus_per_node >= v_head.cpus_per_node
                                AND n.memory_bytes - u.used_memory - v_job.memory_per_node >= v_head.memory_per_node))
                     ORDER BY u.free_gpus, u.node_id
                     LIMIT v_job.nodes
                       FOR KEY SHARE OF n SKIP LOCKED) c;
        END IF;

        IF cardinality(v_nodes) = v_job.nodes THEN
            -- It fits: lock the job (a concurrent cancel holds it: skip it) and number the attempt.
            SELECT (SELECT coalesce(max(a.number), 0) + 1 FROM tuneplane.attempts a WHERE a.job_id = j.id)
              INTO v_number
              FROM tuneplane.jobs j
             WHERE j.id = v_job.id AND j.state = 'queued'
               FOR UPDATE OF j SKIP LOCKED;
            CONTINUE WHEN NOT FOUND;
            -- A rendezvous port no live attempt uses at rank 0's address (normally the preferred one).
            v_port := v_settings.rendezvous_port_base
                      + ((v_job.id * 31 + v_number) % v_settings.rendezvous_port_span)::integer;
            v_tries := 0;
            WHILE v_addr IS NOT NULL
                  AND ((v_addr || ':' || v_port) = ANY (p_rdv)
                       OR EXISTS (SELECT 1 FROM tuneplane.attempts a
                                   WHERE a.master_addr = v_addr AND a.master_port = v_port
                                     AND a.state IN ('reserved', 'preparing', 'running', 'stopping'))) LOOP
                v_tries := v_tries + 1;
                IF v_tries >= v_settings.rendezvous_port_span THEN
                    v_port := NULL;
                    EXIT;
                END IF;
                v_port := v_settings.rendezvous_port_base
                          + ((v_port - v_settings.rendezvous_port_base + 1) % v_settings.rendezvous_port_span);
            END LOOP;
            IF v_port IS NULL THEN
                -- Not placed this pass (nothing was taken yet); the operator widens the port range.
                IF v_job.id = v_head_id THEN
                    v_head_id := NULL;
                    v_claim := '{}';
                END IF;
                v_reason := format('waiting for a rendezvous port: every port of %s..%s is in use at %s '
                                   '(launch_settings.rendezvous_port_span)', v_settings.rendezvous_port_base,
                                   v_settings.rendezvous_port_base + v_settings.rendezvous_port_span - 1, v_addr)
                            || v_standing;
                IF v_job.state_reason IS DISTINCT FROM v_reason THEN
                    PERFORM tuneplane.set_job_state(v_job.id, 'queued', v_reason);
                END IF;
                CONTINUE;
            END IF;
            UPDATE tuneplane.node_usage
               SET used_gpus = used_gpus + v_job.gpus_per_node,
                   used_cpus = used_cpus + v_job.cpus_per_node,
                   used_memory = used_memory + v_job.memory_per_node
             WHERE node_id = ANY (v_nodes);
            IF v_managed THEN
                t_used[v_t] := t_used[v_t] + v_job.nodes * v_job.gpus_per_node;
                v_free := v_free - v_job.nodes * v_job.gpus_per_node;
            END IF;
            IF v_job.id = v_head_id THEN
                -- The head is placed: its claim goes; the next job that does not fit claims afresh.
                v_head_id := NULL;
                v_claim := '{}';
            END IF;
            p_borrow := p_borrow || v_borrow;
            p_job := p_job || v_job.id;
            p_number := p_number || v_number;
            p_addr := p_addr || v_addr;
            p_port := p_port || v_port;
            p_rdv := p_rdv || (v_addr || ':' || v_port);
            p_prio := p_prio || greatest(least(v_job.priority, 1000), -1000);
            p_reason := p_reason || format('reserved %s on %s (attempt %s); waiting for a worker to prepare it',
                                           tuneplane.describe_request(v_job), array_to_string(v_names, ', '),
                                           v_number);
            p_detail := p_detail || jsonb_build_object('attempt', v_number, 'nodes', to_jsonb(v_nodes));
            FOR i IN 1 .. v_job.nodes LOOP
                m_job := m_job || v_job.id;
                m_rank := m_rank || (i - 1);
                m_node := m_node || v_nodes[i];
                m_gpus := m_gpus || v_job.gpus_per_node;
                m_cpus := m_cpus || v_job.cpus_per_node;
                m_memory := m_memory || v_job.memory_per_node;
            END LOOP;
            CONTINUE;
        END IF;

        v_failed := v_failed || v_shape;
        v_reason := format('waiting for resources: needs %s', tuneplane.describe_request(v_job));
        IF v_managed AND NOT v_borrow AND NOT t_waiting[v_t] THEN
            -- A within-guarantee job waits: what its team is still owed is held back from borrowers.
            t_waiting[v_t] := true;
            v_held := v_held + greatest(t_guar[v_t] - t_used[v_t], 0);
        END IF;
        IF v_head_id IS NULL OR v_outranks THEN
            v_head_seen := true;
            v_head_id := v_job.id;
            v_head := v_job;
            v_head_borrows := v_managed AND v_borrow;
            v_head_t := v_t;
            v_head_team := CASE WHEN v_managed THEN t_name[v_t] END;
            v_claim := tuneplane.head_claim_nodes(p_fleet_id, v_job, v_fresh, '{}');
        END IF;
        IF v_job.id = v_head_id THEN
            v_short := cardinality(v_claim);
            IF v_short = 0 THEN
                v_reason := v_reason || '; at the head of the queue; no schedulable connected node in the fleet '
                                     || 'can hold a member';
            ELSIF v_short < v_job.nodes THEN
                v_reason := v_reason || format('; at the head of the queue; only %s schedulable node(s) could '
                                               'ever hold a member', v_short);
            ELSE
                v_reason := v_reason || '; at the head of the queue, waiting for capacity to free up; '
                                     || tuneplane.head_claim_words(v_claim, v_head_team);
            END IF;
        ELSE
            v_reason := v_reason || format('; behind job %s at the head of the queue', v_head_id);
            IF cardinality(v_claim) > 0 THEN
                v_reason := v_reason || ': ' || tuneplane.head_claim_words(v_claim, v_head_team);
            END IF;
        END IF;
        -- Within its team's guarantee (admission_verdict), a job may also reclaim GPUs lent to other teams.
        v_within := v_managed AND NOT v_borrow AND v_job.nodes * v_job.gpus_per_node > 0;
        IF v_searched
           OR (v_within AND NOT (v_shape || '/' || v_job.team_id || '/' || v_job.priority) = ANY (v_planned)) THEN
            -- Would preempting lower-priority work (or reclaiming lent GPUs) make it fit? One plan per shape
            -- and pass, and for a job that may reclaim one per shape, team and priority (a reclaim depends on
            -- them, not on the shape alone).
            IF v_within THEN
                v_planned := v_planned || (v_shape || '/' || v_job.team_id || '/' || v_job.priority);
            END IF;
            v_plan := tuneplane.plan_preemption(v_job, v_fresh, v_held_nodes,
                                                CASE WHEN v_within THEN t_used[v_t] END,
                                                CASE WHEN v_within THEN t_guar[v_t] END);
            IF v_plan IS NOT NULL THEN
                v_reason := v_reason || '; ' || v_plan;
            END IF;
        END IF;
        v_reason := v_reason || v_standing;
        -- Only a changed reason is written (the cursor's row is the job as this pass found it).
        IF v_job.state_reason IS DISTINCT FROM v_reason THEN
            PERFORM tuneplane.set_job_state(v_job.id, 'queued', v_reason);
        END IF;
    END LOOP;
    CLOSE v_queue;

    -- The head and its claim, kept for the next pass (written only when they change).
    IF v_head_id IS NULL THEN
        IF v_kept.job_id IS NOT NULL THEN
            DELETE FROM tuneplane.head_claims c WHERE c.fleet_id = p_fleet_id;
        END IF;
    ELSIF v_kept.job_id IS DISTINCT FROM v_head_id OR v_kept.node_ids IS DISTINCT FROM v_claim THEN
        INSERT INTO tuneplane.head_claims (fleet_id, job_id, node_ids) VALUES (p_fleet_id, v_head_id, v_claim)
        ON CONFLICT (fleet_id) DO UPDATE SET job_id = EXCLUDED.job_id, node_ids = EXCLUDED.node_ids,
                                             claimed_at = EXCLUDED.claimed_at;
    END IF;

    IF cardinality(p_job) = 0 THEN
        RETURN;
    END IF;

    WITH added AS (
        INSERT INTO tuneplane.attempts (job_id, number, fleet_id, reason, master_addr, master_port, borrowing)
        SELECT p.job_id, p.number, p_fleet_id, 'reserved', p.addr, p.port, p.borrowing
          FROM unnest(p_job, p_number, p_addr, p_port, p_borrow)
               WITH ORDINALITY AS p (job_id, number, addr, port, borrowing, i)
         ORDER BY p.i
        RETURNING id, attempts.job_id
    )
    SELECT array_agg(added.id ORDER BY p.i) INTO v_attempts
      FROM added JOIN unnest(p_job) WITH ORDINALITY AS p (job_id, i) ON p.job_id = added.job_id;

    -- The reservation instant of every member of this pass, taken after every lock the pass waited for: its
    -- GPU allocations and usage ledger rows (usage.sql) start at it.
    v_reserved_at := clock_timestamp();
    -- Members in rank order, each with the lowest free GPU indices of its node: members of this pass on
    -- one node take consecutive slices of that node's free indices, in placement order.
    WITH m AS (
        SELECT x.*, a.attempt_id, sum(x.gpus) OVER (PARTITION BY x.node_id ORDER BY x.i) - x.gpus AS before
          FROM unnest(m_job, m_rank, m_node, m_gpus, m_cpus, m_memory)
               WITH ORDINALITY AS x (job_id, rank, node_id, gpus, cpus, memory, i)
          JOIN unnest(p_job, v_attempts) AS a (job_id, attempt_id) ON a.job_id = x.job_id
    ), free AS (
        SELECT ng.node_id, ng.gpu_index, row_number() OVER (PARTITION BY ng.node_id ORDER BY ng.gpu_index) AS k
          FROM tuneplane.node_gpus ng
         WHERE ng.node_id IN (SELECT DISTINCT m.node_id FROM m)
           AND NOT EXISTS (SELECT 1 FROM tuneplane.gpu_allocations a
                            WHERE a.node_id = ng.node_id AND a.gpu_index = ng.gpu_index AND a.released_at IS NULL)
    ), picks AS (
        SELECT m.i, m.attempt_id, m.job_id, m.rank, m.node_id, m.gpus, m.cpus, m.memory,
               coalesce(array_agg(f.gpu_index ORDER BY f.gpu_index) FILTER (WHERE f.gpu_index IS NOT NULL),
                        '{}') AS gpu_indices
          FROM m LEFT JOIN free f ON f.node_id = m.node_id AND f.k > m.before AND f.k <= m.before + m.gpus
         GROUP BY m.i, m.attempt_id, m.job_id, m.rank, m.node_id, m.gpus, m.cpus, m.memory
    ), short AS (
        SELECT count(*) AS n FROM picks WHERE cardinality(picks.gpu_indices) < picks.gpus
    ), added AS (
        INSERT INTO tuneplane.members (attempt_id, job_id, rank, node_id, gpu_indices, cpus, memory_bytes)
        SELECT picks.attempt_id, picks.job_id, picks.rank, picks.node_id,
               picks.gpu_indices, picks.cpus, picks.memory
          FROM picks
         ORDER BY picks.i
        RETURNING id, node_id, gpu_indices
    ), allocated AS (
        INSERT INTO tuneplane.gpu_allocations (member_id, node_id, gpu_index, allocated_at)
        SELECT added.id, added.node_id, unnest(added.gpu_indices), v_reserved_at FROM added
    )
    SELECT short.n INTO v_short FROM short;  -- the INSERTs above run to completion either way
    IF v_short > 0 THEN
        RAISE EXCEPTION 'a node has fewer free GPUs than its usage row says' USING ERRCODE = 'TP500';
    END IF;
    -- The count of what each team holds here, in the transaction that reserved it (each member got exactly
    -- its gpus_per_node indices, or the exception above undid the pass).
    INSERT INTO tuneplane.team_fleet_held AS h (fleet_id, team_id, gpus, members)
    SELECT p_fleet_id, j.team_id, sum(x.gpus), count(*)
      FROM unnest(m_job, m_gpus) AS x (job_id, gpus) JOIN tuneplane.jobs j ON j.id = x.job_id
     GROUP BY j.team_id
    ON CONFLICT (fleet_id, team_id) DO UPDATE
       SET gpus = h.gpus + EXCLUDED.gpus, members = h.members + EXCLUDED.members;
    -- The usage ledger opens in the transaction that reserved the members (usage.sql).
    PERFORM tuneplane.open_usage(v_attempts, v_reserved_at);

    PERFORM tuneplane.preemptors_placed(p_job);
    -- The one writer of job state (each change is a job_events row with its detail).
    PERFORM tuneplane.set_job_state(r.job_id, 'reserved', r.reason, r.detail)
       FROM unnest(p_job, p_reason, p_detail) AS r (job_id, reason, detail);

    -- Same transaction as the reservations (commit together or not at all); the dedupe key makes each one once;
    -- one statement, so pgqueuer's statement-level NOTIFY trigger fires once per pass.
    INSERT INTO public.pgqueuer (priority, status, entrypoint, payload, dedupe_key)
    SELECT q.prio, 'queued', 'launch', convert_to(jsonb_build_object('attempt_id', q.attempt)::text, 'UTF8'),
           'launch:' || q.attempt
      FROM unnest(v_attempts, p_prio) AS q (attempt, prio)
    ON CONFLICT DO NOTHING;

    RETURN QUERY SELECT r.job_id, r.attempt_id FROM unnest(p_job, v_attempts) AS r (job_id, attempt_id);
END;
$$;

-- placement_fit_now: the "best fit now" figures for a queued job's request, computed when read (placement
-- keeps them out of the stored reason so that a pass does not rewrite every waiting job when capacity
-- moves): how many eligible nodes could take one member now, and the roomiest eligible node.
CREATE OR REPLACE FUNCTION tuneplane.placement_fit_now(p_job_id bigint)
RETURNS text
LANGUAGE sql STABLE AS $$
    WITH j AS (SELECT * FROM tuneplane.jobs WHERE id = p_job_id),
    eligible AS (
        SELECT u.node_id, n.name, u.free_gpus, n.cpus - u.used_cpus AS free_cpus,
               n.memory_bytes - u.used_memory AS free_memory
          FROM j JOIN tuneplane.node_usage u ON u.fleet_id = j.fleet_id
          JOIN tuneplane.nodes n ON n.id = u.node_id
         WHERE tuneplane.node_is_connected(n, (SELECT tuneplane.node_fresh_since()))
    )
    -- A CPU-only job is told of the largest free CPUs and memory; a GPU job of the largest free GPUs.
    SELECT format('best fit now: %s node%s can take a member (%s)', fit, CASE WHEN fit = 1 THEN '' ELSE 's' END,
                  coalesce(CASE WHEN (SELECT j.gpus_per_node FROM j) = 0
                                THEN (SELECT format('largest free: %s CPUs, %s memory on %s', e.free_cpus,
                                                    pg_size_pretty(e.free_memory), e.name)
                                        FROM eligible e ORDER BY e.free_cpus DESC, e.free_memory DESC, e.node_id
                                       LIMIT 1)
                                ELSE (SELECT format('largest free: %s GPUs, %s CPUs on %s', e.free_gpus,
                                                    e.free_cpus, e.name)
                                        FROM eligible e ORDER BY e.free_gpus DESC, e.free_cpus DESC, e.node_id
                                       LIMIT 1) END,
                           'no schedulable connected node in the fleet'))
      FROM (SELECT count(*) AS fit FROM eligible e, j
             WHERE e.free_gpus >= j.gpus_per_node AND e.free_cpus >= j.cpus_per_node
               AND e.free_memory >= j.memory_per_node) c;
$$;

-- release_member: give back a member's GPUs, CPUs and memory (idempotent). Called by the lifecycle
-- functions once the member's node has confirmed it stopped, or when nothing ever started. Writes the
-- member, its gpu_allocations and usage ledger rows, its node_usage row, and a team_fleet_held_changes row
-- (an insert: the count of what its team holds on the fleet).
CREATE OR REPLACE FUNCTION tuneplane.release_member(p_member_id bigint)
RETURNS boolean
LANGUAGE plpgsql AS $$
DECLARE
    m tuneplane.members;
    v_gpus integer;
    v_fleet bigint;
BEGIN
    UPDATE tuneplane.members SET released_at = clock_timestamp(), updated_at = clock_timestamp()
     WHERE id = p_member_id AND released_at IS NULL
    RETURNING * INTO m;
    IF m.id IS NULL THEN
        RETURN false;
    END IF;
    -- One instant for the member and its GPUs (the usage ledger closes at the same one).
    UPDATE tuneplane.gpu_allocations SET released_at = m.released_at
     WHERE member_id = m.id AND released_at IS NULL;
    GET DIAGNOSTICS v_gpus = ROW_COUNT;
    PERFORM tuneplane.close_usage(m);
    UPDATE tuneplane.node_usage
       SET used_gpus = used_gpus - v_gpus, used_cpus = used_cpus - m.cpus, used_memory = used_memory - m.memory_bytes
     WHERE node_id = m.node_id;
    SELECT n.fleet_id INTO v_fleet FROM tuneplane.nodes n WHERE n.id = m.node_id;
    -- Its team holds this much less on the fleet: a change row (an insert, no lock waited for), folded into
    -- team_fleet_held by the fleet's next pass.
    INSERT INTO tuneplane.team_fleet_held_changes (fleet_id, team_id, gpus, members)
    SELECT v_fleet, j.team_id, -coalesce(cardinality(m.gpu_indices), 0), -1 FROM tuneplane.jobs j WHERE j.id = m.job_id;
    -- Capacity came free: wake the schedulers (debounced by NOTIFY's per-transaction de-duplication).
    PERFORM pg_notify('tuneplane_placement', v_fleet::text);
    RETURN true;
END;
$$;

-- Operators: the queue with positions, and live reservations. position: the order reserve_next considers
-- the fleet's jobs in (admission_queue on a fleet with quotas; priority, then age otherwise);
-- team_position: the same order within the job's team.
CREATE OR REPLACE VIEW tuneplane.v_queue AS
WITH admission AS (
    SELECT a.job_id, a.ord FROM tuneplane.fleets f, LATERAL tuneplane.admission_queue(f.id) a
     WHERE tuneplane.fleet_has_quotas(f.id)
)
SELECT j.id AS job_id, f.name AS fleet, j.priority,
       row_number() OVER (PARTITION BY j.fleet_id ORDER BY a.ord, j.priority DESC, j.created_at, j.id) AS position,
       u.username AS owner, j.nodes, j.gpus_per_node, j.cpus_per_node, j.memory_per_node,
       j.created_at, now() - j.created_at AS waiting, j.state_reason, t.name AS team,
       row_number() OVER (PARTITION BY j.fleet_id, j.team_id ORDER BY a.ord, j.priority DESC, j.created_at, j.id)
           AS team_position
  FROM tuneplane.jobs j
  JOIN tuneplane.fleets f ON f.id = j.fleet_id
  JOIN tuneplane.users u ON u.id = j.owner_id
  JOIN tuneplane.teams t ON t.id = j.team_id
  LEFT JOIN admission a ON a.job_id = j.id
 WHERE j.state = 'queued';

CREATE OR REPLACE VIEW tuneplane.v_reservations AS
SELECT m.job_id, a.number AS attempt, a.state AS attempt_state, m.id AS member_id, m.rank, n.name AS node,
       m.gpu_indices, m.cpus, m.memory_bytes, m.state AS member_state, m.reason,
       tuneplane.node_connectivity(n.last_heartbeat_at) AS node_connectivity, a.created_at AS reserved_at
  FROM tuneplane.members m
  JOIN tuneplane.attempts a ON a.id = m.attempt_id
  JOIN tuneplane.nodes n ON n.id = m.node_id
 WHERE m.released_at IS NULL;

-- team_waiting_now: the figures of the moment behind a queued job's quota reason, computed when read
-- (the stored reason keeps stable words: team_standing): what its team holds now against its guarantee,
-- the fair-share standing of the fleet's teams (GPUs held ÷ weight, lowest first, at most 5 named), and
-- how many jobs of other teams are ahead of it in admission order. NULL on a fleet without quotas, and for a
-- job that asks no GPU (GPU quotas do not apply to it).
CREATE OR REPLACE FUNCTION tuneplane.team_waiting_now(p_job_id bigint)
RETURNS text
LANGUAGE sql STABLE AS $$
    WITH j AS (SELECT * FROM tuneplane.jobs WHERE id = p_job_id AND state = 'queued' AND gpus_per_node > 0),
    s AS (SELECT s.* FROM j, tuneplane.fleet_team_shares(j.fleet_id) s WHERE tuneplane.fleet_has_quotas(j.fleet_id)),
    q AS (SELECT a.job_id, a.ord, o.team_id FROM j, tuneplane.admission_queue(j.fleet_id) a
            JOIN tuneplane.jobs o ON o.id = a.job_id)
    SELECT format('team %s uses %s of its %s guaranteed GPU%s on fleet %s (limit %s, weight %s); this job asks %s; '
                  'fair share: %s; %s job%s of other teams ahead',
                  me.team, me.used_gpus, me.guaranteed_gpus, CASE WHEN me.guaranteed_gpus = 1 THEN '' ELSE 's' END,
                  f.name, coalesce(me.limit_gpus::text, 'none'), me.weight, j.nodes * j.gpus_per_node,
                  (SELECT string_agg(format('team %s holds %s GPU%s at weight %s', x.team, x.used_gpus,
                                            CASE WHEN x.used_gpus = 1 THEN '' ELSE 's' END, x.weight), ', '
                                     ORDER BY x.share_gpus / x.weight, x.team)
                     FROM (SELECT * FROM s ORDER BY s.share_gpus / s.weight, s.team LIMIT 5) x),
                  ahead.n, CASE WHEN ahead.n = 1 THEN '' ELSE 's' END)
      FROM j
      JOIN tuneplane.fleets f ON f.id = j.fleet_id
      JOIN s me ON me.team_id = j.team_id
      CROSS JOIN LATERAL (SELECT count(*) AS n FROM q
                           WHERE q.ord < (SELECT q2.ord FROM q q2 WHERE q2.job_id = j.id)
                             AND q.team_id <> j.team_id) ahead;
$$;
