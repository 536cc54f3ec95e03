-- 0220: a checkpoint records the training step it holds (issue 21, "What the user sees": "checkpoint ckpt.3
-- (step 1200) verified 38 s into a 120 s grace", "resumed from ckpt.2 (step 1000)"). The workload says it
-- (sdk.checkpoint(path, name, step=N): the request file's "step"); the agent passes it to
-- register_artifact (sql/functions/artifacts.sql). NULL: the workload did not say; the words then name the
-- checkpoint alone, as before. Only a checkpoint has a step.
ALTER TABLE tuneplane.artifacts
    ADD COLUMN step bigint,
    ADD CONSTRAINT artifacts_step_check CHECK (step IS NULL OR (step >= 0 AND kind = 'checkpoint'));
