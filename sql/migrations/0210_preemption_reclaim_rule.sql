-- 0210: the planner's `reclaim` rule (docs/preemption.md, "The planner"; docs/teams.md, "Reclaiming a
-- lent guarantee"): a queued job within its team's guarantee preempts attempts of other teams that run on
-- GPUs their team borrows above its own guarantee. Its decisions are recorded with rule 'reclaim'.
ALTER TABLE tuneplane.preemptions DROP CONSTRAINT preemptions_rule_check;
ALTER TABLE tuneplane.preemptions ADD CONSTRAINT preemptions_rule_check
    CHECK (rule IN ('priority', 'borrowed', 'reclaim', 'admin', 'time_limit', 'idle'));
