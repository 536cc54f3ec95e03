-- Shared setup for the isolation specs (tests/db/test_isolation.py prepends it to each spec's setup):
-- iso_make(nodes, gpus_per_node, jobs, job_nodes, job_gpus) makes a fresh user, fleet, connected nodes and
-- queued jobs, and records the fleet in iso_ctx so every permutation works on its own fleet.
CREATE TABLE IF NOT EXISTS iso_ctx (fleet_id bigint, attempt_id bigint);
CREATE OR REPLACE FUNCTION iso_make(p_nodes int, p_gpus int, p_jobs int, p_job_nodes int, p_job_gpus int)
RETURNS bigint LANGUAGE plpgsql AS $$
DECLARE
    tag text := substr(md5(random()::text), 1, 10);
    u bigint; f bigint; n bigint; p uuid; i int;
BEGIN
    INSERT INTO tuneplane.users (username, role) VALUES ('iso' || tag, 'user') RETURNING id INTO u;
    INSERT INTO tuneplane.fleets (name, backend) VALUES ('iso' || tag, 'node') RETURNING id INTO f;
    FOR i IN 1 .. p_nodes LOOP
        INSERT INTO tuneplane.nodes (fleet_id, name, cpus, memory_bytes, address, last_heartbeat_at)
        VALUES (f, 'n' || i, 64, 1024::bigint ^ 4, '127.0.0.1', now()) RETURNING id INTO n;
        INSERT INTO tuneplane.node_gpus (node_id, gpu_index, model, simulated)
        SELECT n, g, 'Simulated GPU', true FROM generate_series(0, p_gpus - 1) g;
    END LOOP;
    FOR i IN 1 .. p_jobs LOOP
        INSERT INTO tuneplane.previews (owner_id, fleet_id, spec, resolved, canonical, digest, expires_at)
        VALUES (u, f, '{}', jsonb_build_object('i', i, 'tag', tag), tag || i, md5(tag || i) || md5(i || tag),
                now() + interval '1 hour')
        RETURNING id INTO p;
        INSERT INTO tuneplane.jobs (owner_id, preview_id, fleet_id, state_reason, nodes, gpus_per_node,
                                    cpus_per_node, memory_per_node, max_attempts, spec)
        VALUES (u, p, f, 'queued', p_job_nodes, p_job_gpus, 1, 0, 1, '{}');
    END LOOP;
    DELETE FROM iso_ctx;
    INSERT INTO iso_ctx (fleet_id) VALUES (f);
    RETURN f;
END $$;

-- iso_run_all(): every reserved attempt of the iso_ctx fleet driven to running, as worker and agents would
-- (claim, PREPARE, every member prepared → COMMIT, every member started; nodes in session 0). Returns how
-- many members run.
CREATE OR REPLACE FUNCTION iso_run_all() RETURNS integer LANGUAGE plpgsql AS $$
DECLARE
    a bigint; m tuneplane.members; n int := 0;
BEGIN
    FOR a IN SELECT id FROM tuneplane.attempts WHERE fleet_id = (SELECT fleet_id FROM iso_ctx)
              AND state = 'reserved' ORDER BY id LOOP
        PERFORM tuneplane.begin_prepare(a, (SELECT epoch FROM tuneplane.claim_launch(a, 'iso')), repeat('a', 64));
        FOR m IN SELECT * FROM tuneplane.members WHERE attempt_id = a ORDER BY id LOOP
            PERFORM tuneplane.member_prepared(m.node_id, 0, jsonb_build_object('member_id', m.id));
        END LOOP;
        FOR m IN SELECT * FROM tuneplane.members WHERE attempt_id = a ORDER BY id LOOP
            PERFORM tuneplane.member_started(m.node_id, 0, jsonb_build_object('member_id', m.id, 'pid', 4000 + m.id));
            n := n + 1;
        END LOOP;
    END LOOP;
    RETURN n;
END $$;

-- iso_node(name) / iso_job(k): the iso_ctx fleet's node of that name; its k-th job (by id).
CREATE OR REPLACE FUNCTION iso_node(p_name text) RETURNS bigint LANGUAGE sql AS
  $$ SELECT id FROM tuneplane.nodes WHERE fleet_id = (SELECT fleet_id FROM iso_ctx) AND name = p_name $$;
CREATE OR REPLACE FUNCTION iso_job(p_k int) RETURNS bigint LANGUAGE sql AS
  $$ SELECT id FROM tuneplane.jobs WHERE fleet_id = (SELECT fleet_id FROM iso_ctx) ORDER BY id OFFSET p_k - 1 LIMIT 1 $$;
-- iso_fence_check(): what a fence race must leave: per member its state, whether it still holds its
-- resources, whether a KILL for it is queued; per job its state.
CREATE OR REPLACE FUNCTION iso_fence_check()
RETURNS TABLE (job int, job_state text, rank int, node text, member text, held boolean, killed boolean, fenced boolean)
LANGUAGE sql AS $$
    SELECT (SELECT count(*) FROM tuneplane.jobs j2 WHERE j2.fleet_id = j.fleet_id AND j2.id <= j.id)::int,
           j.state, m.rank, n.name, m.state, m.released_at IS NULL,
           EXISTS (SELECT 1 FROM tuneplane.node_commands c WHERE c.node_id = m.node_id AND c.kind = 'kill'
                      AND c.payload -> 'member_ids' @> to_jsonb(m.id)),
           n.fenced_at IS NOT NULL
      FROM tuneplane.jobs j JOIN tuneplane.members m ON m.job_id = j.id JOIN tuneplane.nodes n ON n.id = m.node_id
     WHERE j.fleet_id = (SELECT fleet_id FROM iso_ctx)
     ORDER BY j.id, m.rank;
$$;
