-- sql/functions/preemption.sql — the current definition of every preemption and resume function.
-- Resume: the checkpoint each new attempt starts from (docs/preemption.md).
--
-- Repeatable file (ADR 0012): `tuneplane db migrate` re-applies every file of sql/functions/ (in the order
-- of order.txt, one transaction) whenever one changes. Edit definitions here, never in a migration.
--
-- Lock order: the launch contract's (sql/functions/launch.sql): the fleet's placement lock, jobs, attempts,
-- members, leaf rows. The reads below lock nothing.

-- resume_checkpoint_of: the checkpoint a new attempt of the job starts from, or NULL:
--   spec.resume.mode 'none'    → never (the job asked to start from scratch every time);
--   spec.resume.mode 'pinned'  → the checkpoint the preview pinned (spec.resume.artifact_id), while complete;
--   otherwise ('latest')       → the job's newest complete (server-verified) checkpoint, any attempt or rank.
-- A checkpoint still uploading or failed is never chosen: only bytes the server re-hashed are resumed from.
CREATE OR REPLACE FUNCTION tuneplane.resume_checkpoint_of(p_job_id bigint)
RETURNS tuneplane.artifacts
LANGUAGE sql STABLE AS $$
    SELECT a.*
      FROM tuneplane.jobs j
      JOIN tuneplane.artifacts a ON a.state = 'complete' AND a.kind = 'checkpoint'
     WHERE j.id = p_job_id
       AND coalesce(j.spec -> 'resume' ->> 'mode', 'latest') <> 'none'
       AND CASE WHEN j.spec -> 'resume' ->> 'mode' = 'pinned'
                THEN a.id = (j.spec -> 'resume' ->> 'artifact_id')::bigint
                ELSE a.job_id = j.id END
     ORDER BY a.completed_at DESC, a.id DESC
     LIMIT 1;
$$;

-- resume_pin: what PREPARE tells a member to materialize as $TUNEPLANE_RESUME_DIR (NULL: start fresh).
CREATE OR REPLACE FUNCTION tuneplane.resume_pin(p_attempt_id bigint)
RETURNS jsonb
LANGUAGE sql STABLE AS $$
    SELECT jsonb_build_object('name', a.name, 'artifact_id', a.id, 'manifest_digest', a.manifest_digest,
                              'job_id', a.job_id, 'attempt', src.number, 'rank', a.rank,
                              'delivery', a.delivery, 'shared_path', a.shared_path)
      FROM tuneplane.attempts t
      JOIN tuneplane.artifacts a ON a.id = t.resume_artifact_id
      LEFT JOIN tuneplane.attempts src ON src.id = a.attempt_id
     WHERE t.id = p_attempt_id;
$$;

-- resume_words: how the job's timeline says where an attempt starts ('' when it starts fresh).
CREATE OR REPLACE FUNCTION tuneplane.resume_words(p_attempt_id bigint)
RETURNS text
LANGUAGE sql STABLE AS $$
    SELECT coalesce((
        SELECT format('; resumes from %s%s (verified %s)', a.name,
                      CASE WHEN a.job_id <> t.job_id THEN format(' of job %s', a.job_id) ELSE '' END,
                      to_char(a.completed_at, 'HH24:MI:SS'))
          FROM tuneplane.attempts t JOIN tuneplane.artifacts a ON a.id = t.resume_artifact_id
         WHERE t.id = p_attempt_id), '');
$$;
