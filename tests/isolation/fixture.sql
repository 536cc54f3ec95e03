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
