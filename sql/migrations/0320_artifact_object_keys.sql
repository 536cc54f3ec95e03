-- 0320: where an artifact file's bytes live in an S3 store (issue 32). The node's multipart upload goes
-- straight to a per-artifact key (`artifacts/<artifact id>/<file index>` under the store's prefix), which
-- the server verifies in place and records here, instead of copying every object to its content address
-- (a second write of every byte). A file may also name another artifact's verified object with the same
-- bytes (reuse_artifact_objects: dedup without an upload). NULL: the content address `sha256/ab/…` (the
-- server's own store, and S3 files recorded before 0320). Read it only through
-- tuneplane.artifact_object_key (sql/functions/artifacts.sql).
ALTER TABLE tuneplane.artifact_files ADD COLUMN object_key text
    CHECK (object_key ~ '^[A-Za-z0-9._-]+(/[A-Za-z0-9._-]+)*$' AND object_key !~ '(^|/)\.\.?(/|$)');
CREATE INDEX artifact_files_object_key ON tuneplane.artifact_files (object_key) WHERE object_key IS NOT NULL;
-- Dedup looks a verified file up by its bytes.
CREATE INDEX artifact_files_sha256 ON tuneplane.artifact_files (sha256) WHERE verified_at IS NOT NULL;
