"""Backend workers (`tuneplane worker --backend node`): build Job Capsules, start prepare/commit, and run
the placement loop. Modules: `capsule_build` (the capsule from a job's spec), `node_worker` (the pgqueuer
consumer and the scheduler loop)."""
