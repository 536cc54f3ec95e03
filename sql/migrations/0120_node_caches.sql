-- 0120: what a node's caches hold (job environments and capsules: count and bytes), reported by its agent
-- after every clean-up and on every control session (report kind `node_caches`, report_node_caches in
-- sql/functions/runtimes.sql), shown on the Fleet page and in v_nodes.
ALTER TABLE tuneplane.nodes
    ADD COLUMN caches jsonb NOT NULL DEFAULT '{}'::jsonb,
    ADD COLUMN caches_reported_at timestamptz;
