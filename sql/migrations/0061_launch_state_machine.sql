-- 0061 launch state machine (issue 10): the transition table, contact loss as a mark instead of a state,
-- the session/reconcile fence, START/STOP deadlines and kill tracking. The rules themselves (the rows of
-- state_transitions, the functions, the triggers) live in sql/functions/launch.sql.

-- Which state changes are legal, and which lifecycle functions may make each (any of them on the call
-- stack). The rows are written by sql/functions/launch.sql on every re-apply.
CREATE TABLE tuneplane.state_transitions (
    entity     text   NOT NULL CHECK (entity IN ('job', 'attempt', 'member')),
    from_state text   NOT NULL,
    to_state   text   NOT NULL,
    writers    text[] NOT NULL,
    PRIMARY KEY (entity, from_state, to_state)
);

ALTER TABLE tuneplane.members
    -- Set when the member's node lost contact (sweep_lost_nodes); cleared when the node reconciles. The
    -- member keeps its real state: contact loss is not a state of the workload.
    ADD COLUMN contact_lost_at   timestamptz,
    -- The control session in which the node reported the member started (reconcile never releases a
    -- member started in the session it reconciles).
    ADD COLUMN started_epoch     bigint,
    -- When the control plane last sent KILL for this member (START/STOP deadlines, fence, reconcile).
    ADD COLUMN kill_requested_at timestamptz;

UPDATE tuneplane.members
   SET state = CASE WHEN started_at IS NULL THEN 'starting' ELSE 'running' END,
       contact_lost_at = coalesce(contact_lost_at, updated_at)
 WHERE state = 'unknown';
ALTER TABLE tuneplane.members DROP CONSTRAINT members_state_check;
ALTER TABLE tuneplane.members ADD CONSTRAINT members_state_check
    CHECK (state IN ('reserved', 'preparing', 'prepared', 'starting', 'running', 'stopping',
                     'exited', 'failed', 'aborted', 'cancelled', 'lost'));
CREATE INDEX members_contact_lost ON tuneplane.members (node_id) WHERE contact_lost_at IS NOT NULL;

ALTER TABLE tuneplane.nodes
    -- The session epoch whose reconcile the database accepted: commands are delivered to a session only
    -- after it reconciled (a START must never race the reconcile list that predates it).
    ADD COLUMN session_reconciled_epoch bigint NOT NULL DEFAULT 0;

ALTER TABLE tuneplane.launch_settings
    -- A delivered START not acknowledged or reported within this time gets KILL (the member is failed
    -- only once the node confirms).
    ADD COLUMN start_timeout interval NOT NULL DEFAULT interval '5 minutes' CHECK (start_timeout > interval '0'),
    -- A member still stopping this long after stop_grace gets KILL.
    ADD COLUMN stop_timeout  interval NOT NULL DEFAULT interval '1 minute' CHECK (stop_timeout > interval '0');
