-- 0245: where a fleet's artifact bytes live (issue 32). NULL: the installation's default store (the
-- filesystem store of `tuneplane up`). {"kind": "s3", "bucket", "prefix", "endpoint", "region",
-- "addressing_style"}: an S3 API (docs/artifacts.md "Object storage"). Never credentials: the server holds
-- those (app/s3store.py). Written only by set_fleet_storage (sql/functions/nodes.sql), which checks each field.
ALTER TABLE tuneplane.fleets ADD COLUMN storage jsonb
    CHECK (storage IS NULL OR (jsonb_typeof(storage) = 'object' AND storage ->> 'kind' IN ('filesystem', 's3')));
