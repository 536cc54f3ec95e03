-- 0201 idle GPUs: the sweep finds the jobs it watches through an index, not by reading every running job.
-- job_idle.watching is true while the job is running and holds GPUs (kept by the trigger jobs_idle_watch,
-- sql/functions/idle.sql); the partial index orders the watched jobs by when they were last evaluated, so
-- one sweep call reads only the rows it evaluates, whatever the number of running jobs or of jobs ever run.
ALTER TABLE tuneplane.job_idle ADD COLUMN watching boolean NOT NULL DEFAULT false;
CREATE INDEX job_idle_due ON tuneplane.job_idle (checked_at NULLS FIRST, job_id) WHERE watching;

INSERT INTO tuneplane.job_idle (job_id, watching)
SELECT j.id, true FROM tuneplane.jobs j WHERE j.state = 'running' AND j.gpus_per_node > 0
ON CONFLICT (job_id) DO UPDATE SET watching = true;
