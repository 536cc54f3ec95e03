-- 0280: a complete artifact found corrupt (issue 35): its stored bytes no longer match its manifest, seen
-- when a node's materialisation read them (the node gateway re-hashes what it serves) or when a user ran
-- `tuneplane artifacts verify`. The artifact itself stays as it was (a complete artifact is immutable,
-- artifacts_guard_change); this row marks it, once, with when, why and who found it. Resume never picks a
-- marked checkpoint again (resume_checkpoint_of, sql/functions/preemption.sql). Written only by
-- mark_artifact_corrupt (sql/functions/artifacts.sql).
CREATE TABLE tuneplane.artifact_corruptions (
    artifact_id bigint PRIMARY KEY REFERENCES tuneplane.artifacts (id),
    at timestamptz NOT NULL DEFAULT clock_timestamp(),
    reason text NOT NULL CHECK (reason <> ''),
    found_by text NOT NULL CHECK (found_by <> '')
);

-- Attempts aborted because the checkpoint they were to resume from was found corrupt while their members
-- prepared: queued again from the previous checkpoint without counting against max_attempts (nor using a
-- free re-launch): the job did nothing wrong (finish_attempt_if_done, sql/functions/launch.sql).
ALTER TABLE tuneplane.jobs ADD COLUMN corrupt_resumes_used integer NOT NULL DEFAULT 0
    CHECK (corrupt_resumes_used >= 0);
