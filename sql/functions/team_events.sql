-- sql/functions/team_events.sql — team webhooks: events of a team's jobs, queued in the transaction that
-- made them and delivered by a worker outside it (issue 20; docs/teams.md "Webhooks"; migration 0181).
--
-- Contract
--   * enqueue_team_event(job, kind, payload) is the one way in: one team_event_deliveries row per live
--     webhook of the job's team that takes the kind, all with one event id, in the caller's transaction
--     (decision, state and enqueue commit together). A job state change enqueues `job.<new state>` by trigger (jobs_team_event);
--     preemption (issue 21) enqueues `job.preempted`, idle GPUs (issue 22) `job.idle_warning`.
--   * A delivery moves pending → delivered (a 2xx answer) | gave_up (webhook_settings.max_attempts tries, or
--     its webhook removed). Each try: claim_team_event_deliveries (attempts + 1, claimed for the request
--     timeout) → the worker POSTs → team_event_delivery_result (one team_event_attempts row; a claim that
--     was taken over reports into the log only). A failed try waits backoff_base × 2^(tries − 1), at most
--     backoff_max. At least once: a worker that dies after the POST leaves the claim to expire and the
--     event is sent again with the same event id.
--   * Team admins (and installation admins) create and remove webhooks and read their deliveries and tries;
--     anybody else is told there is no such team (404).
-- Locks: team_event_deliveries rows are leaf rows written under the locks the state change already holds;
-- the claim takes due rows FOR UPDATE SKIP LOCKED; a result locks its one delivery row.
--
-- Repeatable file (ADR 0012). Drops (signature changes):
DROP FUNCTION IF EXISTS tuneplane.team_admin_of(bigint, text);

-- team_admin_of: the team named p_team if the actor administers it (or is an installation admin) and the
-- request's API token (if any) reaches it for p_action ('read' or 'act'); 404 for a team the actor is not
-- in, 403 for a member or viewer, or a token that does not reach it.
CREATE OR REPLACE FUNCTION tuneplane.team_admin_of(p_actor_id bigint, p_team text, p_action text)
RETURNS tuneplane.teams
LANGUAGE plpgsql STABLE AS $$
DECLARE
    actor  tuneplane.users;
    t      tuneplane.teams;
    v_role text;
BEGIN
    SELECT * INTO actor FROM tuneplane.users WHERE id = p_actor_id AND disabled_at IS NULL;
    SELECT * INTO t FROM tuneplane.teams WHERE name = p_team;
    SELECT tm.role INTO v_role FROM tuneplane.team_members tm WHERE tm.team_id = t.id AND tm.user_id = actor.id;
    IF actor.id IS NULL OR t.id IS NULL OR (v_role IS NULL AND actor.role <> 'admin') THEN
        RAISE EXCEPTION 'no team % of yours', left(p_team, 100) USING ERRCODE = 'TP404', COLUMN = 'team';
    END IF;
    IF v_role IS DISTINCT FROM 'admin' AND actor.role <> 'admin' THEN
        RAISE EXCEPTION 'only an admin of team % manages its webhooks (you are %)', t.name, v_role
            USING ERRCODE = 'TP403', COLUMN = 'team';
    END IF;
    IF NOT tuneplane.token_allows(t.id, p_action) THEN
        RAISE EXCEPTION 'this API token may not % the webhooks of team % (read-only or scoped to other teams)',
            CASE p_action WHEN 'act' THEN 'change' ELSE 'read' END, t.name USING ERRCODE = 'TP403', COLUMN = 'team';
    END IF;
    RETURN t;
END;
$$;

-- enqueue_team_event: queue an event of a job for every live webhook of its team that takes p_kind
-- (`job.<state>`, `job.preempted`, `job.idle_warning` …). The body says the event id, kind, time, team and
-- the job as it is now; p_payload goes under "data". Returns how many deliveries were queued. Wakes the
-- deliverers (NOTIFY tuneplane_team_events) only when it queued something.
CREATE OR REPLACE FUNCTION tuneplane.enqueue_team_event(p_job_id bigint, p_kind text, p_payload jsonb)
RETURNS integer
LANGUAGE plpgsql AS $$
DECLARE
    j       tuneplane.jobs;
    v_event uuid;
    v_count integer;
BEGIN
    IF p_kind IS NULL OR p_kind !~ '^[a-z]+\.[a-z_]{1,60}$' THEN
        RAISE EXCEPTION 'an event kind is a word, a dot and a name (job.succeeded), not %', left(p_kind, 100)
            USING ERRCODE = 'TP400', COLUMN = 'kind';
    END IF;
    SELECT * INTO j FROM tuneplane.jobs WHERE id = p_job_id;
    IF j.id IS NULL THEN
        RAISE EXCEPTION 'no job %', p_job_id USING ERRCODE = 'TP404', COLUMN = 'job';
    END IF;
    -- The common case (a team without webhooks) costs one index probe.
    IF NOT EXISTS (SELECT 1 FROM tuneplane.team_webhooks w WHERE w.team_id = j.team_id AND w.removed_at IS NULL)
    THEN
        RETURN 0;
    END IF;
    v_event := gen_random_uuid();
    INSERT INTO tuneplane.team_event_deliveries (event_id, webhook_id, team_id, job_id, kind, body)
    SELECT v_event, w.id, j.team_id, j.id, p_kind,
           jsonb_build_object(
               'id', v_event, 'kind', p_kind, 'at', clock_timestamp(),
               'team', (SELECT t.name FROM tuneplane.teams t WHERE t.id = j.team_id),
               'job', jsonb_build_object('id', j.id, 'state', j.state, 'reason', j.state_reason,
                                         'owner', (SELECT u.username FROM tuneplane.users u WHERE u.id = j.owner_id),
                                         'fleet', (SELECT f.name FROM tuneplane.fleets f WHERE f.id = j.fleet_id),
                                         'attempt', (SELECT max(a.number) FROM tuneplane.attempts a
                                                      WHERE a.job_id = j.id)),
               'data', coalesce(p_payload, '{}'::jsonb))
      FROM tuneplane.team_webhooks w
     WHERE w.team_id = j.team_id AND w.removed_at IS NULL AND (w.kinds IS NULL OR p_kind = ANY (w.kinds))
     ORDER BY w.id;
    GET DIAGNOSTICS v_count = ROW_COUNT;
    IF v_count > 0 THEN
        PERFORM pg_notify('tuneplane_team_events', '');
    END IF;
    RETURN v_count;
END;
$$;

-- jobs_team_event: every change of a job's state is an event `job.<new state>` for the team's webhooks, in
-- the transaction that made it.
CREATE OR REPLACE FUNCTION tuneplane.jobs_team_event() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM tuneplane.enqueue_team_event(NEW.id, 'job.' || NEW.state,
                                         jsonb_build_object('from', OLD.state, 'to', NEW.state));
    RETURN NULL;
END;
$$;

CREATE OR REPLACE TRIGGER jobs_team_event AFTER UPDATE OF state ON tuneplane.jobs
    FOR EACH ROW WHEN (OLD.state IS DISTINCT FROM NEW.state) EXECUTE FUNCTION tuneplane.jobs_team_event();

-- team_event_kinds: every kind of event a webhook may take (a job's states, preemption, idle GPUs).
CREATE OR REPLACE FUNCTION tuneplane.team_event_kinds()
RETURNS text[]
LANGUAGE sql IMMUTABLE AS $$
    SELECT ARRAY['job.queued', 'job.reserved', 'job.preparing', 'job.running', 'job.succeeded', 'job.failed',
                 'job.cancelled', 'job.preempted', 'job.idle_warning', 'job.idle_reclaimed', 'job.idle_withdrawn'];
$$;

-- team_event_error_class: what a team admin sees of a failed try without an HTTP status: only a coarse
-- class (app/webhook_targets.py names them), never an exception's text, which would map what the
-- worker's host can reach. Anything else (older rows' raw text included) reads as 'connection failed'.
CREATE OR REPLACE FUNCTION tuneplane.team_event_error_class(p_error text)
RETURNS text
LANGUAGE sql IMMUTABLE AS $$
    SELECT CASE WHEN p_error IS NULL THEN NULL
                WHEN p_error IN ('refused by policy', 'connection failed', 'TLS failed', 'timeout', 'webhook removed')
                THEN p_error
                ELSE 'connection failed' END;
$$;

-- create_team_webhook: a team admin registers a URL (HTTPS, or plain HTTP to loopback; no credentials in
-- it; a port 1–65535) with its secret (16–200 characters) and the kinds it takes (NULL: every kind; else a
-- non-empty list of known kinds, stored once each). Refuses a bad URL, secret or kind (400, naming the
-- field). Where the URL's host may point is the target policy's (app/webhook_targets.py), checked by the
-- console at registration and by the worker at every connect. Returns the webhook (its secret included:
-- the caller shows a generated one once).
CREATE OR REPLACE FUNCTION tuneplane.create_team_webhook(p_actor_id bigint, p_team text, p_url text,
                                                         p_secret text, p_kinds text[] DEFAULT NULL)
RETURNS tuneplane.team_webhooks
LANGUAGE plpgsql AS $$
DECLARE
    t      tuneplane.teams := tuneplane.team_admin_of(p_actor_id, p_team, 'act');
    v_port text;
    v_kinds text[];
    result tuneplane.team_webhooks;
BEGIN
    IF p_url IS NULL OR length(p_url) > 2000 OR NOT (
           p_url ~ '^https://[^/?#@\s]+([/?#]\S*)?$'
           OR p_url ~ '^http://(localhost|127\.[0-9]{1,3}\.[0-9]{1,3}\.[0-9]{1,3}|\[::1\])(:[0-9]{1,5})?([/?#]\S*)?$')
    THEN
        RAISE EXCEPTION 'url must be https://… (plain http:// only to a loopback address), without credentials, at most 2000 characters'
            USING ERRCODE = 'TP400', COLUMN = 'url';
    END IF;
    v_port := substring(p_url FROM '^https?://(?:[^/?#]*\]|[^/?#:]*):([^/?#]*)');
    IF v_port IS NOT NULL AND (v_port !~ '^[0-9]{1,5}$' OR v_port::integer NOT BETWEEN 1 AND 65535) THEN
        RAISE EXCEPTION 'url: the port must be 1 to 65535' USING ERRCODE = 'TP400', COLUMN = 'url';
    END IF;
    IF p_secret IS NULL OR length(p_secret) NOT BETWEEN 16 AND 200 THEN
        RAISE EXCEPTION 'secret must be 16 to 200 characters' USING ERRCODE = 'TP400', COLUMN = 'secret';
    END IF;
    IF p_kinds IS NOT NULL THEN
        IF cardinality(p_kinds) = 0 OR cardinality(p_kinds) > 1000 OR EXISTS (
                SELECT 1 FROM unnest(p_kinds) k WHERE k IS NULL OR k <> ALL (tuneplane.team_event_kinds())) THEN
            RAISE EXCEPTION 'kinds must be a non-empty list of event kinds: %',
                array_to_string(tuneplane.team_event_kinds(), ', ') USING ERRCODE = 'TP400', COLUMN = 'kinds';
        END IF;
        SELECT array_agg(DISTINCT k ORDER BY k) INTO v_kinds FROM unnest(p_kinds) k;
    END IF;
    INSERT INTO tuneplane.team_webhooks (team_id, url, secret, kinds, created_by)
    VALUES (t.id, p_url, p_secret, v_kinds, p_actor_id)
    RETURNING * INTO result;
    RETURN result;
END;
$$;

-- remove_team_webhook: a team admin removes a webhook; its pending deliveries are given up. 404 for a
-- webhook that is not the team's.
CREATE OR REPLACE FUNCTION tuneplane.remove_team_webhook(p_actor_id bigint, p_team text, p_webhook_id bigint)
RETURNS boolean
LANGUAGE plpgsql AS $$
DECLARE
    t tuneplane.teams := tuneplane.team_admin_of(p_actor_id, p_team, 'act');
BEGIN
    UPDATE tuneplane.team_webhooks SET removed_at = clock_timestamp()
     WHERE id = p_webhook_id AND team_id = t.id AND removed_at IS NULL;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'no webhook % of team %', p_webhook_id, t.name USING ERRCODE = 'TP404', COLUMN = 'webhook';
    END IF;
    UPDATE tuneplane.team_event_deliveries SET state = 'gave_up', last_error = 'webhook removed',
                                               claimed_by = NULL, claimed_until = NULL
     WHERE webhook_id = p_webhook_id AND state = 'pending';
    RETURN true;
END;
$$;

-- claim_team_event_deliveries: up to p_limit due deliveries for one worker's tries (oldest due first), each
-- with its URL, secret and body; counts the try and holds the row for the request timeout plus a margin.
CREATE OR REPLACE FUNCTION tuneplane.claim_team_event_deliveries(p_owner text, p_limit integer)
RETURNS TABLE (delivery_id bigint, event_id uuid, kind text, attempt integer, url text, secret text, body jsonb,
               timeout_s double precision)
LANGUAGE sql AS $$
    WITH s AS (SELECT * FROM tuneplane.webhook_settings),
    due AS (
        SELECT d.id FROM tuneplane.team_event_deliveries d
         WHERE d.state = 'pending' AND d.next_attempt_at <= clock_timestamp()
           AND (d.claimed_until IS NULL OR d.claimed_until < clock_timestamp())
         ORDER BY d.next_attempt_at, d.id
         LIMIT p_limit
         FOR UPDATE SKIP LOCKED
    ), claimed AS (
        UPDATE tuneplane.team_event_deliveries d
           SET attempts = d.attempts + 1, claimed_by = p_owner,
               claimed_until = clock_timestamp() + (SELECT request_timeout * 2 + interval '5 seconds' FROM s)
          FROM due WHERE d.id = due.id
        RETURNING d.*
    )
    SELECT c.id, c.event_id, c.kind, c.attempts, w.url, w.secret, c.body,
           extract(epoch FROM (SELECT request_timeout FROM s))::double precision
      FROM claimed c JOIN tuneplane.team_webhooks w ON w.id = c.webhook_id
     ORDER BY c.next_attempt_at, c.id;
$$;

-- team_event_delivery_result: what try p_attempt of a delivery met: an HTTP status (2xx: delivered) or an
-- error without one. Logs the try once (a repeated report changes nothing); only the try that holds the
-- claim moves the delivery (a try whose claim expired and was taken over is logged, not obeyed). Returns
-- the delivery's state.
CREATE OR REPLACE FUNCTION tuneplane.team_event_delivery_result(p_delivery_id bigint, p_attempt integer,
                                                                p_status integer, p_error text,
                                                                p_duration_ms integer)
RETURNS text
LANGUAGE plpgsql AS $$
DECLARE
    d tuneplane.team_event_deliveries;
    s tuneplane.webhook_settings;
    v_ok boolean := p_status BETWEEN 200 AND 299;
BEGIN
    SELECT * INTO s FROM tuneplane.webhook_settings;
    SELECT * INTO d FROM tuneplane.team_event_deliveries WHERE id = p_delivery_id FOR UPDATE;
    IF d.id IS NULL THEN
        RAISE EXCEPTION 'no delivery %', p_delivery_id USING ERRCODE = 'TP404', COLUMN = 'delivery';
    END IF;
    INSERT INTO tuneplane.team_event_attempts (delivery_id, attempt, status, error, duration_ms)
    VALUES (d.id, p_attempt, p_status, tuneplane.team_event_error_class(p_error), greatest(p_duration_ms, 0))
    ON CONFLICT (delivery_id, attempt) DO NOTHING;
    IF d.state <> 'pending' OR d.attempts <> p_attempt THEN
        RETURN d.state;
    END IF;
    UPDATE tuneplane.team_event_deliveries
       SET state = CASE WHEN v_ok THEN 'delivered' WHEN d.attempts >= s.max_attempts THEN 'gave_up'
                        ELSE 'pending' END,
           delivered_at = CASE WHEN v_ok THEN clock_timestamp() END,
           next_attempt_at = CASE WHEN v_ok THEN next_attempt_at
                                  ELSE clock_timestamp() + least(s.backoff_base * power(2, d.attempts - 1),
                                                                 s.backoff_max) END,
           claimed_by = NULL, claimed_until = NULL,
           last_status = p_status,
           last_error = CASE WHEN v_ok THEN NULL
                             ELSE coalesce(tuneplane.team_event_error_class(p_error),
                                           format('answered HTTP %s', p_status)) END
     WHERE id = d.id
    RETURNING state INTO d.state;
    RETURN d.state;
END;
$$;

-- prune_team_event_deliveries: delivered and given-up deliveries (and their tries) older than
-- webhook_settings.keep_for go. Returns how many.
CREATE OR REPLACE FUNCTION tuneplane.prune_team_event_deliveries()
RETURNS integer
LANGUAGE sql AS $$
    WITH gone AS (
        DELETE FROM tuneplane.team_event_deliveries d
         WHERE d.state <> 'pending'
           AND d.created_at < clock_timestamp() - (SELECT keep_for FROM tuneplane.webhook_settings)
        RETURNING 1
    )
    SELECT count(*)::integer FROM gone;
$$;

-- team_webhooks_of: a team's webhooks (without their secrets) for its admins, with how their deliveries
-- stand.
CREATE OR REPLACE FUNCTION tuneplane.team_webhooks_of(p_actor_id bigint, p_team text)
RETURNS TABLE (id bigint, url text, kinds text[], created_at timestamptz, pending bigint, delivered bigint,
               gave_up bigint, last_error text)
LANGUAGE sql STABLE AS $$
    SELECT w.id, w.url, w.kinds, w.created_at,
           count(*) FILTER (WHERE d.state = 'pending'), count(*) FILTER (WHERE d.state = 'delivered'),
           count(*) FILTER (WHERE d.state = 'gave_up'),
           (SELECT CASE WHEN x.last_error ~ '^answered HTTP [0-9]+$' THEN x.last_error
                        ELSE tuneplane.team_event_error_class(x.last_error) END
              FROM tuneplane.team_event_deliveries x
             WHERE x.webhook_id = w.id AND x.last_error IS NOT NULL ORDER BY x.id DESC LIMIT 1)
      FROM tuneplane.team_webhooks w
      LEFT JOIN tuneplane.team_event_deliveries d ON d.webhook_id = w.id
     WHERE w.team_id = (tuneplane.team_admin_of(p_actor_id, p_team, 'read')).id AND w.removed_at IS NULL
     GROUP BY w.id
     ORDER BY w.id;
$$;

-- team_event_deliveries_of: a team's newest deliveries with every try, for its admins.
CREATE OR REPLACE FUNCTION tuneplane.team_event_deliveries_of(p_actor_id bigint, p_team text, p_limit integer)
RETURNS TABLE (id bigint, event_id uuid, webhook_id bigint, job_id bigint, kind text, state text,
               attempts integer, created_at timestamptz, next_attempt_at timestamptz, delivered_at timestamptz,
               tries jsonb)
LANGUAGE sql STABLE AS $$
    SELECT d.id, d.event_id, d.webhook_id, d.job_id, d.kind, d.state, d.attempts, d.created_at,
           d.next_attempt_at, d.delivered_at,
           coalesce((SELECT jsonb_agg(jsonb_build_object('attempt', x.attempt, 'at', x.at, 'status', x.status,
                                                         'error', tuneplane.team_event_error_class(x.error),
                                                         'duration_ms', x.duration_ms)
                                      ORDER BY x.attempt)
                       FROM tuneplane.team_event_attempts x WHERE x.delivery_id = d.id), '[]'::jsonb)
      FROM tuneplane.team_event_deliveries d
     WHERE d.team_id = (tuneplane.team_admin_of(p_actor_id, p_team, 'read')).id
     ORDER BY d.id DESC
     LIMIT least(greatest(coalesce(p_limit, 50), 1), 500);
$$;
