-- 0215 Slurm fleets take part in the checkpoint grace protocol (issue 21, docs/preemption.md): the worker
-- delivers a request to checkpoint and stop to the job's steps (`scancel --signal`) once, and records when.
-- NULL: not delivered (yet); request_preemption records the request on the attempt, as on node fleets.
ALTER TABLE tuneplane.slurm_jobs ADD COLUMN preempt_signalled_at timestamptz;
