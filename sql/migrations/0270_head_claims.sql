-- The head of a fleet's queue keeps its claim across placement passes (issue 34: fair share for mixed job
-- sizes). A pass used to choose the head and the nodes it claims afresh each time, so a large job's claim
-- moved to whichever node had the most free GPUs at that instant (the GPUs it had gathered elsewhere went
-- to smaller jobs), and a fair-share order that ranked another team first the next pass gave the claim to
-- that team's job. The rules live in sql/functions/placement.sql (reserve_next, head_claim_nodes);
-- docs/scheduling.md ("Backfill: the head-claim rule") and docs/teams.md ("Fairness guarantee") say why.
--
-- One row per fleet at most: the job the fleet's last pass kept room for and the nodes it claims. Written
-- only by reserve_next under the fleet's placement lock. No foreign keys (as team_fleet_held_changes): a
-- key-share lock on the job row would be one more lock the pass takes on a job it does not place; a row
-- whose job left the queue is ignored and replaced by the next pass.
CREATE TABLE tuneplane.head_claims (
    fleet_id   bigint      PRIMARY KEY,
    job_id     bigint      NOT NULL,
    node_ids   bigint[]    NOT NULL,
    claimed_at timestamptz NOT NULL DEFAULT now()
);
