-- 0071 canonical metric names: any `*/throughput`, tokens/samples per second (also per GPU, torchtune),
-- the peak-memory names of torchtune, and the host and GPU samples the collector takes per member
-- (GPU power, CPU utilisation, resident memory) as three new canonical names.

ALTER TABLE tuneplane.telemetry_canonical_rules DROP CONSTRAINT telemetry_canonical_rules_canonical_check;
ALTER TABLE tuneplane.telemetry_canonical_rules ADD CONSTRAINT telemetry_canonical_rules_canonical_check
    CHECK (canonical IN ('loss', 'eval_loss', 'learning_rate', 'throughput', 'grad_norm', 'gpu_utilization',
                         'gpu_memory', 'gpu_power', 'cpu_utilization', 'memory_rss'));

INSERT INTO tuneplane.telemetry_canonical_rules (priority, pattern, canonical) VALUES
    -- tokens/throughput, perf/throughput/tokens, train/throughput_samples
    (43, '^(.+[/_.-])?throughput([/_.-].*)?$', 'throughput'),
    -- tokens_per_second_per_gpu (torchtune), samples/s, train/tokens_per_s, steps_per_second (HF)
    (44, '^((train|training|perf|speed)[/_.-])?(tokens|samples|examples|images|sequences|steps)[/_.-]?'
         '(per[/_.-]?(sec|second|s)|/s)([/_.-]per[/_.-]?(gpu|device|rank))?$', 'throughput'),
    (65, '^((system|sys)[/_.-])?gpu.*power', 'gpu_power'),
    (73, '^peak[_.-]memory[_.-](active|alloc|allocated|reserved)$', 'gpu_memory'),
    (80, '^((system|sys)[/_.-])?(cpu|proc|process)[/_.-]?(util|utilization|percent|pct)', 'cpu_utilization'),
    (81, '^((system|sys)[/_.-])?((proc|process)[/_.-]?)?(memory[/_.-]?)?rss([/_.-]?bytes)?$', 'memory_rss');

UPDATE tuneplane.telemetry_series s SET canonical = r.canonical
  FROM (SELECT s2.id, (SELECT r2.canonical FROM tuneplane.telemetry_canonical_rules r2
                        WHERE lower(s2.name) ~ r2.pattern ORDER BY r2.priority LIMIT 1) AS canonical
          FROM tuneplane.telemetry_series s2) r
 WHERE r.id = s.id AND s.canonical IS DISTINCT FROM r.canonical;
