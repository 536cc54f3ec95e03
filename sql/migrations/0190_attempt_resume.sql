-- 0190: every attempt records the checkpoint it resumes from (docs/preemption.md, "Resume").
-- begin_prepare (sql/functions/launch.sql) fills it from resume_checkpoint_of (sql/functions/preemption.sql):
-- the job's newest complete checkpoint, the one its JobSpec pinned, or none (`resume: none`); PREPARE
-- carries it and the agent materializes it as $TUNEPLANE_RESUME_DIR before the member starts.
ALTER TABLE tuneplane.attempts
    ADD COLUMN resume_artifact_id bigint REFERENCES tuneplane.artifacts (id);
CREATE INDEX attempts_resume_artifact ON tuneplane.attempts (resume_artifact_id)
    WHERE resume_artifact_id IS NOT NULL;
