-- 0040 launch: attempts, members, GPU allocations, node usage, launch decisions.
--
-- A launch reservation is the set of members of one attempt, each holding its node, GPU indices, CPUs
-- and memory until released_at is set. The advisory lock in reserve_next (0041) serializes placement per
-- fleet for throughput; the partial unique index on gpu_allocations makes a double allocation of the
-- same GPU impossible even if that lock were bypassed, and node_usage's CHECKs keep CPU and memory
-- accounting from going negative. Decisions (commit/abort) are immutable rows: one per attempt, forever.

CREATE TABLE tuneplane.launch_settings (
    singleton        boolean  PRIMARY KEY DEFAULT true CHECK (singleton),
    -- How long every member may take to prepare before the attempt is aborted.
    prepare_timeout  interval NOT NULL DEFAULT interval '15 minutes' CHECK (prepare_timeout > interval '0'),
    -- SIGTERM → SIGKILL grace the agent gives a member on cancel.
    stop_grace       interval NOT NULL DEFAULT interval '10 seconds' CHECK (stop_grace >= interval '0'),
    -- First port of the rendezvous range (MASTER_PORT = base + attempt id mod span).
    rendezvous_port_base integer NOT NULL DEFAULT 29500,
    rendezvous_port_span integer NOT NULL DEFAULT 2000
);
INSERT INTO tuneplane.launch_settings DEFAULT VALUES;

ALTER TABLE tuneplane.nodes
    -- Set by fence_node: an operator declared the node dead. Its members are `lost`, its resources
    -- released, and it gets no new work until unfence_node.
    ADD COLUMN fenced_at     timestamptz,
    ADD COLUMN fenced_reason text,
    -- Last results of what the control connection cannot prove, reported with each prepare.
    ADD COLUMN last_peer_check    jsonb,
    ADD COLUMN last_storage_check jsonb,
    -- The TCP port the agent's peer-network probe listens on (PREPARE checks every peer can reach it).
    ADD COLUMN probe_port integer CHECK (probe_port BETWEEN 1 AND 65535);

CREATE TABLE tuneplane.attempts (
    id               bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    job_id           bigint      NOT NULL REFERENCES tuneplane.jobs (id),
    number           integer     NOT NULL CHECK (number >= 1),
    fleet_id         bigint      NOT NULL REFERENCES tuneplane.fleets (id),
    state            text        NOT NULL DEFAULT 'reserved'
                     CHECK (state IN ('reserved', 'preparing', 'running', 'stopping',
                                      'succeeded', 'failed', 'aborted', 'cancelled')),
    reason           text        NOT NULL DEFAULT '',
    -- Worker lease: claim_launch bumps the epoch; a call carrying an older epoch changes nothing.
    launch_epoch     bigint      NOT NULL DEFAULT 0,
    launch_owner     text,
    capsule_digest   text CHECK (capsule_digest ~ '^[0-9a-f]{64}$'),
    master_addr      text,
    master_port      integer,
    prepare_deadline timestamptz,
    cancel_requested_at timestamptz,
    created_at       timestamptz NOT NULL DEFAULT now(),
    committed_at     timestamptz,
    running_at       timestamptz,
    ended_at         timestamptz,
    UNIQUE (job_id, number)
);
-- At most one live attempt per job.
CREATE UNIQUE INDEX attempts_one_live ON tuneplane.attempts (job_id)
    WHERE state IN ('reserved', 'preparing', 'running', 'stopping');
CREATE INDEX attempts_preparing ON tuneplane.attempts (prepare_deadline) WHERE state = 'preparing';

CREATE TABLE tuneplane.members (
    id           bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    attempt_id   bigint      NOT NULL REFERENCES tuneplane.attempts (id),
    job_id       bigint      NOT NULL REFERENCES tuneplane.jobs (id),
    rank         integer     NOT NULL CHECK (rank >= 0),
    node_id      bigint      NOT NULL REFERENCES tuneplane.nodes (id),
    gpu_indices  integer[]   NOT NULL DEFAULT '{}',
    cpus         integer     NOT NULL CHECK (cpus >= 0),
    memory_bytes bigint      NOT NULL CHECK (memory_bytes >= 0),
    -- reserved → preparing → prepared → starting → running → exited | failed
    -- any live state → aborted (launch aborted) | cancelled | unknown (node lost contact) | lost (fenced)
    state        text        NOT NULL DEFAULT 'reserved'
                 CHECK (state IN ('reserved', 'preparing', 'prepared', 'starting', 'running', 'stopping',
                                  'exited', 'failed', 'aborted', 'cancelled', 'unknown', 'lost')),
    reason       text        NOT NULL DEFAULT '',
    exit_code    integer,
    pid          integer,
    updated_at   timestamptz NOT NULL DEFAULT now(),
    started_at   timestamptz,
    ended_at     timestamptz,
    -- Resources are held while released_at IS NULL (also while `unknown`: a lost connection is not proof).
    released_at  timestamptz,
    UNIQUE (attempt_id, rank)
);
CREATE INDEX members_node_held ON tuneplane.members (node_id) WHERE released_at IS NULL;
CREATE INDEX members_job ON tuneplane.members (job_id, attempt_id);

CREATE TABLE tuneplane.gpu_allocations (
    member_id    bigint      NOT NULL REFERENCES tuneplane.members (id),
    node_id      bigint      NOT NULL REFERENCES tuneplane.nodes (id),
    gpu_index    integer     NOT NULL,
    allocated_at timestamptz NOT NULL DEFAULT clock_timestamp(),
    released_at  timestamptz,
    PRIMARY KEY (member_id, gpu_index)
);
-- The truth behind "no GPU is ever handed out twice".
CREATE UNIQUE INDEX gpu_allocations_active ON tuneplane.gpu_allocations (node_id, gpu_index)
    WHERE released_at IS NULL;

-- Per-node totals kept in step by allocate/release, so placement reads one row per node instead of
-- summing allocations (the CHECKs refuse accounting that would go negative).
CREATE TABLE tuneplane.node_usage (
    node_id      bigint PRIMARY KEY REFERENCES tuneplane.nodes (id) ON DELETE CASCADE,
    fleet_id     bigint  NOT NULL,
    total_gpus   integer NOT NULL DEFAULT 0 CHECK (total_gpus >= 0),
    used_gpus    integer NOT NULL DEFAULT 0 CHECK (used_gpus >= 0),
    used_cpus    integer NOT NULL DEFAULT 0 CHECK (used_cpus >= 0),
    used_memory  bigint  NOT NULL DEFAULT 0 CHECK (used_memory >= 0),
    free_gpus    integer GENERATED ALWAYS AS (total_gpus - used_gpus) STORED
);
-- Best fit is "fewest free GPUs that still fit": an index range scan that stops after the first match.
CREATE INDEX node_usage_fit ON tuneplane.node_usage (fleet_id, free_gpus, node_id);
INSERT INTO tuneplane.node_usage (node_id, fleet_id, total_gpus)
SELECT n.id, n.fleet_id, (SELECT count(*) FROM tuneplane.node_gpus g WHERE g.node_id = n.id) FROM tuneplane.nodes n;

CREATE FUNCTION tuneplane.node_usage_follow_nodes() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO tuneplane.node_usage (node_id, fleet_id) VALUES (NEW.id, NEW.fleet_id) ON CONFLICT DO NOTHING;
    RETURN NULL;
END;
$$;
CREATE TRIGGER node_usage_on_node AFTER INSERT ON tuneplane.nodes
    FOR EACH ROW EXECUTE FUNCTION tuneplane.node_usage_follow_nodes();

CREATE FUNCTION tuneplane.node_usage_follow_gpus() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO tuneplane.node_usage AS u (node_id, fleet_id, total_gpus)
    SELECT d.node_id, (SELECT n.fleet_id FROM tuneplane.nodes n WHERE n.id = d.node_id),
           (SELECT count(*) FROM tuneplane.node_gpus g WHERE g.node_id = d.node_id)
      FROM (SELECT DISTINCT node_id FROM changed) d
     WHERE EXISTS (SELECT 1 FROM tuneplane.nodes n WHERE n.id = d.node_id)
    ON CONFLICT (node_id) DO UPDATE SET total_gpus = EXCLUDED.total_gpus;
    RETURN NULL;
END;
$$;
CREATE TRIGGER node_usage_on_gpu_insert AFTER INSERT ON tuneplane.node_gpus
    REFERENCING NEW TABLE AS changed FOR EACH STATEMENT EXECUTE FUNCTION tuneplane.node_usage_follow_gpus();
CREATE TRIGGER node_usage_on_gpu_delete AFTER DELETE ON tuneplane.node_gpus
    REFERENCING OLD TABLE AS changed FOR EACH STATEMENT EXECUTE FUNCTION tuneplane.node_usage_follow_gpus();

CREATE TABLE tuneplane.launch_decisions (
    attempt_id bigint PRIMARY KEY REFERENCES tuneplane.attempts (id),
    decision   text        NOT NULL CHECK (decision IN ('commit', 'abort')),
    reason     text        NOT NULL,
    decided_at timestamptz NOT NULL DEFAULT clock_timestamp()
);
CREATE TRIGGER launch_decisions_immutable
    BEFORE UPDATE OR DELETE ON tuneplane.launch_decisions
    FOR EACH ROW EXECUTE FUNCTION tuneplane.refuse_change();
