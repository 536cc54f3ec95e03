-- 0250: the coordinator's outage never counts against a node's heartbeat (issue 33). A node's heartbeat
-- is written by the node gateway into the database; while the database is away (a restart, a failover to
-- the standby) no heartbeat can be written, however alive the node. sweep_lost_nodes stamps swept_at on
-- every run; a run that finds the previous one older than node_settings.stale_after knows the coordinator
-- was away (the database, or every sweeper with it) and sets back_at: heartbeat silence is then counted
-- from back_at, not from the node's last heartbeat. NULL swept_at: no sweep ran yet (nothing to compare).
CREATE TABLE tuneplane.coordinator_clock (
    singleton boolean     PRIMARY KEY DEFAULT true CHECK (singleton),
    swept_at  timestamptz,
    back_at   timestamptz
);
INSERT INTO tuneplane.coordinator_clock DEFAULT VALUES;
