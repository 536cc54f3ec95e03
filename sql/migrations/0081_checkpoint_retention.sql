-- 0081 checkpoints taken while a member runs: each is its own artifact (kind checkpoint, named
-- <output>.<n>); a retention setting keeps the newest keep_checkpoints complete ones per job and marks
-- older ones `pruned` (complete → pruned is the only change a complete artifact allows: its manifest and
-- files stay as they were, but it can no longer be downloaded or pinned, and blob garbage collection may
-- remove its bytes). A checkpoint pinned as an input by a job that has not ended is never pruned.

ALTER TABLE tuneplane.artifacts
    DROP CONSTRAINT artifacts_state_check,
    ADD CONSTRAINT artifacts_state_check CHECK (state IN ('uploading', 'complete', 'failed', 'pruned')),
    DROP CONSTRAINT artifacts_check1,
    ADD CONSTRAINT artifacts_completed_at CHECK ((state IN ('complete', 'pruned')) = (completed_at IS NOT NULL)),
    ADD COLUMN pruned_at timestamptz,
    ADD CONSTRAINT artifacts_pruned_at CHECK ((state = 'pruned') = (pruned_at IS NOT NULL)),
    ADD CONSTRAINT artifacts_pruned_kind CHECK (state <> 'pruned' OR kind = 'checkpoint');

ALTER TABLE tuneplane.artifact_settings
    ADD COLUMN keep_checkpoints integer NOT NULL DEFAULT 5 CHECK (keep_checkpoints >= 1);
