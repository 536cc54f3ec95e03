-- 0181: team webhooks (issue 20, docs/teams.md "Webhooks"). A team registers URLs with a secret; every state
-- change of the team's jobs (and the events later issues add: preempted, idle warnings) becomes one
-- delivery row per webhook in the transaction that changed the state (enqueue_team_event,
-- sql/functions/team_events.sql). A worker outside that transaction claims due rows, POSTs the event
-- signed with HMAC-SHA256 and reports the answer: delivered on 2xx, otherwise tried again with a back-off
-- that doubles, until max_attempts. At least once: a receiver de-duplicates by the event id. Every try is a
-- row of team_event_attempts, which team admins see.

CREATE TABLE tuneplane.team_webhooks (
    id          bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    team_id     bigint      NOT NULL REFERENCES tuneplane.teams (id),
    -- HTTPS, or plain HTTP to a loopback address only (DESIGN.md §5: TLS everywhere but loopback).
    url         text        NOT NULL CHECK (length(url) <= 2000 AND (
                    url ~ '^https://[^/?#\s]+([/?#]\S*)?$'
                    OR url ~ '^http://(localhost|127\.[0-9]{1,3}\.[0-9]{1,3}\.[0-9]{1,3}|\[::1\])(:[0-9]{1,5})?([/?#]\S*)?$')),
    -- The HMAC key. Kept in clear because signing needs it; shown once, when the webhook is made.
    secret      text        NOT NULL CHECK (length(secret) BETWEEN 16 AND 200),
    -- The event kinds it receives (e.g. {job.succeeded,job.failed}); NULL: every kind.
    kinds       text[]      CHECK (kinds IS NULL OR cardinality(kinds) > 0),
    created_at  timestamptz NOT NULL DEFAULT now(),
    created_by  bigint      REFERENCES tuneplane.users (id),
    removed_at  timestamptz
);
CREATE INDEX team_webhooks_team ON tuneplane.team_webhooks (team_id) WHERE removed_at IS NULL;

CREATE TABLE tuneplane.webhook_settings (
    singleton        boolean  PRIMARY KEY DEFAULT true CHECK (singleton),
    -- Pause before the second try; each later one doubles, up to backoff_max.
    backoff_base     interval NOT NULL DEFAULT interval '5 seconds' CHECK (backoff_base > interval '0'),
    backoff_max      interval NOT NULL DEFAULT interval '1 hour' CHECK (backoff_max >= backoff_base),
    -- Tries before a delivery is given up (5 s doubling to 1 h: about 20 hours with 25 tries).
    max_attempts     integer  NOT NULL DEFAULT 25 CHECK (max_attempts BETWEEN 1 AND 1000),
    -- How long one try may take (the worker's HTTP timeout) and how long its claim holds the row.
    request_timeout  interval NOT NULL DEFAULT interval '10 seconds' CHECK (request_timeout > interval '0'),
    -- Delivered and given-up rows (and their tries) are pruned after this long.
    keep_for         interval NOT NULL DEFAULT interval '14 days' CHECK (keep_for > interval '0')
);
INSERT INTO tuneplane.webhook_settings DEFAULT VALUES;

-- The queue: one row per (event, webhook). body is the JSON posted, the same at every try.
CREATE TABLE tuneplane.team_event_deliveries (
    id              bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    event_id        uuid        NOT NULL,
    webhook_id      bigint      NOT NULL REFERENCES tuneplane.team_webhooks (id),
    team_id         bigint      NOT NULL REFERENCES tuneplane.teams (id),
    job_id          bigint,
    kind            text        NOT NULL CHECK (kind ~ '^[a-z]+\.[a-z_]{1,60}$'),
    body            jsonb       NOT NULL,
    created_at      timestamptz NOT NULL DEFAULT clock_timestamp(),
    state           text        NOT NULL DEFAULT 'pending' CHECK (state IN ('pending', 'delivered', 'gave_up')),
    attempts        integer     NOT NULL DEFAULT 0 CHECK (attempts >= 0),
    next_attempt_at timestamptz NOT NULL DEFAULT clock_timestamp(),
    -- A worker's claim on a try in flight; a claim past claimed_until is taken over by another worker.
    claimed_by      text,
    claimed_until   timestamptz,
    delivered_at    timestamptz,
    last_status     integer,
    last_error      text,
    UNIQUE (event_id, webhook_id),
    CONSTRAINT team_event_delivered_at CHECK ((state = 'delivered') = (delivered_at IS NOT NULL))
);
CREATE INDEX team_event_deliveries_due ON tuneplane.team_event_deliveries (next_attempt_at) WHERE state = 'pending';
CREATE INDEX team_event_deliveries_team ON tuneplane.team_event_deliveries (team_id, id DESC);
CREATE INDEX team_event_deliveries_ended ON tuneplane.team_event_deliveries (created_at) WHERE state <> 'pending';

CREATE TABLE tuneplane.team_event_attempts (
    delivery_id bigint      NOT NULL REFERENCES tuneplane.team_event_deliveries (id) ON DELETE CASCADE,
    attempt     integer     NOT NULL CHECK (attempt >= 1),
    at          timestamptz NOT NULL DEFAULT clock_timestamp(),
    -- The HTTP status the receiver answered; NULL when it answered none (refused, timed out …: see error).
    status      integer,
    error       text,
    duration_ms integer     CHECK (duration_ms >= 0),
    PRIMARY KEY (delivery_id, attempt)
);
