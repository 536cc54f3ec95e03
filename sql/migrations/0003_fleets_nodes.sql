-- 0003 fleets and nodes: the core tables that submission (preview resolution), the node agents and
-- placement all read. Later migrations add credentials, heartbeats, events and allocations around them.

CREATE TABLE tuneplane.fleets (
    id           bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    name         text        NOT NULL UNIQUE CHECK (name ~ '^[a-z0-9][a-z0-9-]{0,62}$'),
    backend      text        NOT NULL,
    -- Declared capabilities, e.g. {"object_delivery": true, "shared_mounts": false, "shared_path": null}
    capabilities jsonb       NOT NULL DEFAULT '{}'::jsonb,
    created_at   timestamptz NOT NULL DEFAULT now(),
    created_by   bigint REFERENCES tuneplane.users (id)
);

CREATE TABLE tuneplane.nodes (
    id                 bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    fleet_id           bigint      NOT NULL REFERENCES tuneplane.fleets (id),
    name               text        NOT NULL,
    -- Scheduling state is changed only by operators (cordon, drain, retire); connectivity is derived
    -- from last_heartbeat_at and is never stored as a state.
    scheduling_state   text        NOT NULL DEFAULT 'active'
                       CHECK (scheduling_state IN ('active', 'cordoned', 'draining', 'retired')),
    last_heartbeat_at  timestamptz,
    cpus               integer     NOT NULL DEFAULT 0 CHECK (cpus >= 0),
    memory_bytes       bigint      NOT NULL DEFAULT 0 CHECK (memory_bytes >= 0),
    agent_version      text,
    container_runtimes text[]      NOT NULL DEFAULT '{}',
    -- Address other members of a job use to reach this node (rendezvous, peer networking).
    address            text,
    enrolled_at        timestamptz NOT NULL DEFAULT now(),
    UNIQUE (fleet_id, name)
);

CREATE TABLE tuneplane.node_gpus (
    node_id      bigint  NOT NULL REFERENCES tuneplane.nodes (id) ON DELETE CASCADE,
    gpu_index    integer NOT NULL CHECK (gpu_index >= 0),
    model        text    NOT NULL,
    memory_bytes bigint  NOT NULL DEFAULT 0,
    -- GPUs made up by `tuneplane node --simulate-gpus N` (tests and benchmarks); every listing says so.
    simulated    boolean NOT NULL DEFAULT false,
    PRIMARY KEY (node_id, gpu_index)
);
