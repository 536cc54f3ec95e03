-- 0191: the checkpoint grace protocol and priority classes (docs/preemption.md, issue 21).
--
-- An attempt asked to stop (a preemption, its time limit, an idle reclaim) records why and until when it
-- may checkpoint (stop_kind, stop_cause, stop_requested_at, grace_deadline, preempted_by_job_id) and ends
-- in one of two new states, `preempted` or `timed_out`, never `succeeded` whatever its exit status, naming
-- the checkpoint the next attempt resumes from (end_checkpoint_id) and the work lost since it
-- (lost_seconds of wall time, lost_gpu_seconds = GPUs × lost_seconds). Preemptions have their own count
-- per job (jobs.preemptions_used), apart from max_attempts.
ALTER TABLE tuneplane.attempts DROP CONSTRAINT attempts_state_check;
ALTER TABLE tuneplane.attempts ADD CONSTRAINT attempts_state_check
    CHECK (state IN ('reserved', 'preparing', 'running', 'stopping',
                     'succeeded', 'failed', 'aborted', 'cancelled', 'preempted', 'timed_out'));
ALTER TABLE tuneplane.attempts
    ADD COLUMN stop_kind           text CHECK (stop_kind IN ('preempted', 'timed_out')),
    ADD COLUMN stop_cause          text,
    ADD COLUMN stop_requested_at   timestamptz,
    ADD COLUMN grace_deadline      timestamptz,
    ADD COLUMN preempted_by_job_id bigint REFERENCES tuneplane.jobs (id),
    ADD COLUMN end_checkpoint_id   bigint REFERENCES tuneplane.artifacts (id),
    ADD COLUMN lost_seconds        double precision CHECK (lost_seconds >= 0),
    ADD COLUMN lost_gpu_seconds    double precision CHECK (lost_gpu_seconds >= 0),
    ADD CONSTRAINT attempts_stop_request_whole
        CHECK ((stop_kind IS NULL) = (stop_requested_at IS NULL)
               AND (stop_kind IS NULL) = (grace_deadline IS NULL)
               AND (stop_kind IS NULL) = (stop_cause IS NULL));
-- The sweep that stops attempts whose grace ended, and the Fleet page's "in their grace".
CREATE INDEX attempts_in_grace ON tuneplane.attempts (grace_deadline)
    WHERE stop_kind IS NOT NULL AND state IN ('reserved', 'preparing', 'running', 'stopping');

ALTER TABLE tuneplane.jobs
    ADD COLUMN preemptions_used integer NOT NULL DEFAULT 0 CHECK (preemptions_used >= 0),
    -- The named priority level the preview resolved (jobs.priority holds its integer).
    ADD COLUMN priority_class text;

-- Installation-wide rules of the protocol and the planner; a fleet may lower the longest grace.
CREATE TABLE tuneplane.preemption_settings (
    singleton       boolean  PRIMARY KEY DEFAULT true CHECK (singleton),
    -- Grace of a job that names none (JobSpec preemption.grace_seconds), and the most any job gets.
    default_grace   interval NOT NULL DEFAULT interval '120 seconds' CHECK (default_grace >= interval '0'),
    max_grace       interval NOT NULL DEFAULT interval '30 minutes' CHECK (max_grace >= interval '0'),
    -- The planner never picks a victim that has run less than this (its first checkpoint may not exist).
    min_runtime     interval NOT NULL DEFAULT interval '5 minutes' CHECK (min_runtime >= interval '0'),
    -- After a preemption, the job is not placed where it would be preempted again for this long.
    backoff         interval NOT NULL DEFAULT interval '10 minutes' CHECK (backoff >= interval '0'),
    -- Preemptions a job accepts when its JobSpec names none; past it the planner never picks it.
    max_preemptions integer  NOT NULL DEFAULT 5 CHECK (max_preemptions >= 0)
);
INSERT INTO tuneplane.preemption_settings DEFAULT VALUES;
ALTER TABLE tuneplane.fleets ADD COLUMN max_preemption_grace interval CHECK (max_preemption_grace >= interval '0');

-- Priority classes: the names a JobSpec uses, each an integer an operator may re-map
-- (set_priority_class), and whether such a job is preemptible when its JobSpec does not say.
CREATE TABLE tuneplane.priority_classes (
    name                   text    PRIMARY KEY CHECK (name ~ '^[a-z][a-z0-9_-]{0,31}$'),
    value                  integer NOT NULL UNIQUE CHECK (value BETWEEN -1000 AND 1000),
    preemptible_by_default boolean NOT NULL,
    -- Runs on idle capacity only and is the first victim; the usage ledger charges it nothing.
    scavenger              boolean NOT NULL DEFAULT false
);
INSERT INTO tuneplane.priority_classes (name, value, preemptible_by_default, scavenger) VALUES
    ('scavenger', -100, true, true),
    ('low', -50, true, false),
    ('normal', 0, true, false),
    ('high', 50, false, false),
    ('urgent', 100, false, false);
