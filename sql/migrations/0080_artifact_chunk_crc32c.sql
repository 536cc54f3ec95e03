-- 0080 chunks proven by crc32c: an uploaded chunk may travel with the crc32c (Castagnoli) of its bytes
-- instead of their sha256. The whole file's sha256 — computed once by the server over the bytes it keeps
-- when the last chunk arrives — is what proves the file against the manifest; a chunk's own digest only
-- has to catch a chunk damaged in transit or on the server's disk, which crc32c does at a fraction of
-- sha256's cost (so the uploader and the server each hash every byte once, not twice).
-- Older agents keep sending sha256 per chunk; a chunk row carries one of the two
-- (record_artifact_chunk and artifact_file_chunks in sql/functions/artifacts.sql take and return both).
-- Also: new artifacts use 32 MiB chunks (fewer fsyncs and stored-function calls per byte) where the
-- operator kept the old 8 MiB default.

ALTER TABLE tuneplane.artifact_chunks
    ALTER COLUMN sha256 DROP NOT NULL,
    ADD COLUMN crc32c bigint CHECK (crc32c BETWEEN 0 AND 4294967295),
    ADD CONSTRAINT artifact_chunks_digest CHECK (sha256 IS NOT NULL OR crc32c IS NOT NULL);

ALTER TABLE tuneplane.artifact_settings ALTER COLUMN chunk_size SET DEFAULT 32 * 1024 * 1024;
UPDATE tuneplane.artifact_settings SET chunk_size = 32 * 1024 * 1024 WHERE chunk_size = 8 * 1024 * 1024;
