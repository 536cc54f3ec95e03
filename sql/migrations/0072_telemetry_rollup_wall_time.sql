-- 0072 the wall time of each rollup bucket's last point, so that charts can put buckets on a wall-clock or
-- relative-time axis without reading raw points. Buckets stored before this have none (NULL).
ALTER TABLE tuneplane.telemetry_rollups ADD COLUMN last_wall double precision;
