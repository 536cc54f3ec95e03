-- 0230: a Node-backend member's telemetry token is registered at COMMIT (issue 23). The agent makes the
-- token while it prepares the member and sends only its sha256 with member_prepared; record_commit issues
-- it (issue_telemetry_token) for every member of the attempt in the COMMIT transaction and says so in the
-- member's START (`"telemetry_token": true`), so START no longer waits for a `telemetry_token` report
-- round trip, and the eight serialized report transactions of an 8-member start become none. NULL: the
-- agent sent no hash (an older agent, a node without a telemetry URL): START falls back to the report.
-- The hash of a launch that never commits is never issued (no token, no "incomplete" telemetry member).
ALTER TABLE tuneplane.members
    ADD COLUMN telemetry_token_hash text
        CONSTRAINT members_telemetry_token_hash_check CHECK (telemetry_token_hash ~ '^[0-9a-f]{64}$');
