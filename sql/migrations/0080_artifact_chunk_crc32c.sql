-- 0080 chunks proven by crc32c: an uploaded chunk may travel with the crc32c (Castagnoli) of its bytes
-- instead of their sha256. The whole file's sha256 — computed once by the server over the bytes it keeps
-- when the last chunk arrives — is what proves the file against the manifest; a chunk's own digest only
-- has to catch a chunk damaged in transit or on the server's disk, which crc32c does at a fraction of
-- sha256's cost (so the uploader and the server each hash every byte once, not twice).
-- Older agents keep sending sha256 per chunk; a chunk row carries one of the two.
-- Also: new artifacts use 32 MiB chunks (fewer fsyncs and stored-function calls per byte) where the
-- operator kept the old 8 MiB default.

ALTER TABLE tuneplane.artifact_chunks
    ALTER COLUMN sha256 DROP NOT NULL,
    ADD COLUMN crc32c bigint CHECK (crc32c BETWEEN 0 AND 4294967295),
    ADD CONSTRAINT artifact_chunks_digest CHECK (sha256 IS NOT NULL OR crc32c IS NOT NULL);

ALTER TABLE tuneplane.artifact_settings ALTER COLUMN chunk_size SET DEFAULT 32 * 1024 * 1024;
UPDATE tuneplane.artifact_settings SET chunk_size = 32 * 1024 * 1024 WHERE chunk_size = 8 * 1024 * 1024;

-- record_artifact_chunk_v2: record_artifact_chunk with the chunk's digest as sha256 or crc32c (one of
-- the two). Same checks (artifact_upload_target: the node, the state, the index and the length), same
-- answer: whether the file is already verified and whether it now has all its chunks. Idempotent.
CREATE FUNCTION tuneplane.record_artifact_chunk_v2(p_credential_hash text, p_artifact_id bigint,
                                                   p_file_index integer, p_chunk_index integer, p_size integer,
                                                   p_sha256 text, p_crc32c bigint)
RETURNS TABLE (file_verified boolean, all_chunks boolean)
LANGUAGE plpgsql AS $$
DECLARE
    t record;
    held integer;
BEGIN
    IF p_sha256 IS NULL AND p_crc32c IS NULL THEN
        RAISE EXCEPTION 'a chunk needs its sha256 or its crc32c' USING ERRCODE = 'TP400', COLUMN = 'chunk';
    END IF;
    SELECT * INTO t FROM tuneplane.artifact_upload_target(p_credential_hash, p_artifact_id, p_file_index,
                                                           p_chunk_index, p_size);
    IF t.verified THEN
        RETURN QUERY SELECT true, true;
        RETURN;
    END IF;
    INSERT INTO tuneplane.artifact_chunks (artifact_id, file_index, chunk_index, size, sha256, crc32c)
    VALUES (p_artifact_id, p_file_index, p_chunk_index, p_size, p_sha256, p_crc32c)
    ON CONFLICT (artifact_id, file_index, chunk_index)
    DO UPDATE SET sha256 = EXCLUDED.sha256, crc32c = EXCLUDED.crc32c, size = EXCLUDED.size, recorded_at = now();
    SELECT count(*) INTO held FROM tuneplane.artifact_chunks c
     WHERE c.artifact_id = p_artifact_id AND c.file_index = p_file_index;
    RETURN QUERY SELECT false, held >= t.chunk_count;
END;
$$;

-- artifact_file_chunks_v2: the recorded chunks of one file in order, with whichever digest each carries
-- (what the server checks while it hashes the assembled file).
CREATE FUNCTION tuneplane.artifact_file_chunks_v2(p_credential_hash text, p_artifact_id bigint,
                                                  p_file_index integer)
RETURNS TABLE (chunk_index integer, size integer, sha256 text, crc32c bigint)
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM tuneplane.artifact_for_node(p_credential_hash, p_artifact_id);
    RETURN QUERY SELECT c.chunk_index, c.size, c.sha256, c.crc32c FROM tuneplane.artifact_chunks c
                  WHERE c.artifact_id = p_artifact_id AND c.file_index = p_file_index ORDER BY c.chunk_index;
END;
$$;
