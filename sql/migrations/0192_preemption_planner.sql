-- 0192: the preemption planner's decisions (docs/preemption.md, "The planner").
--
-- One `preemptions` row per decision: who preempts (the preemptor job; NULL for an admin's or a
-- sweep's request), the rule (priority, borrowed, admin, time_limit, idle), the numbers and the words;
-- one `preemption_victims` row per attempt asked to stop, with what it was expected to lose. While a
-- decision is `holding`, the nodes it frees (held_node_ids) are kept for its preemptor: no other job is
-- placed there until the preemptor is reserved (the decision becomes `done`), leaves the queue or the
-- victims are gone without making room (`dropped`).
CREATE TABLE tuneplane.preemptions (
    id               bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    fleet_id         bigint      NOT NULL REFERENCES tuneplane.fleets (id),
    preemptor_job_id bigint      REFERENCES tuneplane.jobs (id),
    rule             text        NOT NULL CHECK (rule IN ('priority', 'borrowed', 'admin', 'time_limit', 'idle')),
    state            text        NOT NULL DEFAULT 'holding' CHECK (state IN ('holding', 'done', 'dropped')),
    held_node_ids    bigint[]    NOT NULL DEFAULT '{}',
    reason           text        NOT NULL,
    numbers          jsonb       NOT NULL DEFAULT '{}'::jsonb,
    actor            text,
    created_at       timestamptz NOT NULL DEFAULT now(),
    resolved_at      timestamptz,
    CHECK ((state = 'holding') = (resolved_at IS NULL))
);
CREATE INDEX preemptions_holding ON tuneplane.preemptions (fleet_id) WHERE state = 'holding';
CREATE INDEX preemptions_preemptor ON tuneplane.preemptions (preemptor_job_id);

CREATE TABLE tuneplane.preemption_victims (
    preemption_id   bigint  NOT NULL REFERENCES tuneplane.preemptions (id),
    attempt_id      bigint  NOT NULL REFERENCES tuneplane.attempts (id),
    job_id          bigint  NOT NULL REFERENCES tuneplane.jobs (id),
    priority        integer NOT NULL,
    gpus            integer NOT NULL,
    -- GPU-seconds since its last verified checkpoint when it was chosen (what the planner minimised).
    expected_lost_gpu_seconds double precision NOT NULL,
    PRIMARY KEY (preemption_id, attempt_id)
);
CREATE INDEX preemption_victims_job ON tuneplane.preemption_victims (job_id);
