-- 0052 artifacts for operators: fail an abandoned upload from psql (no node credential needed).

-- operator_fail_artifact: uploading | failed → failed with the operator's reason, chunk records dropped.
-- Refuses an unknown artifact (404), a complete one (409: immutable) and an empty reason (400).
CREATE FUNCTION tuneplane.operator_fail_artifact(p_artifact_id bigint, p_reason text)
RETURNS tuneplane.artifacts
LANGUAGE plpgsql AS $$
DECLARE
    a tuneplane.artifacts;
BEGIN
    SELECT * INTO a FROM tuneplane.artifacts WHERE id = p_artifact_id FOR UPDATE;
    IF a.id IS NULL THEN
        RAISE EXCEPTION 'no artifact %', p_artifact_id USING ERRCODE = 'TP404', COLUMN = 'artifact_id';
    END IF;
    IF a.state = 'complete' THEN
        RAISE EXCEPTION 'artifact % is complete and cannot fail', a.id USING ERRCODE = 'TP409', COLUMN = 'state';
    END IF;
    IF coalesce(p_reason, '') = '' THEN
        RAISE EXCEPTION 'a failed artifact needs a reason' USING ERRCODE = 'TP400', COLUMN = 'reason';
    END IF;
    DELETE FROM tuneplane.artifact_chunks WHERE artifact_id = a.id;
    UPDATE tuneplane.artifacts SET state = 'failed', reason = left('operator: ' || p_reason, 2000)
     WHERE id = a.id RETURNING * INTO a;
    RETURN a;
END;
$$;
