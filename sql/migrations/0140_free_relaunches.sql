-- 0140: a node fleet's launch aborted after PREPARE was sent and before anything started (a member failed
-- to prepare — e.g. rank 0 could not bind MASTER_PORT because something else held it —, or the prepare
-- deadline passed) does not use up one of the job's max_attempts: finish_attempt_if_done
-- (sql/functions/launch.sql) queues the job again, at most launch_settings.free_relaunches times per job
-- (counted in jobs.free_relaunches_used); after that an aborted launch counts like any failed attempt.
ALTER TABLE tuneplane.launch_settings
    ADD COLUMN free_relaunches integer NOT NULL DEFAULT 2 CHECK (free_relaunches BETWEEN 0 AND 20);
ALTER TABLE tuneplane.jobs
    ADD COLUMN free_relaunches_used integer NOT NULL DEFAULT 0 CHECK (free_relaunches_used >= 0);
