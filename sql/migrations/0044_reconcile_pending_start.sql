-- 0044 launch reconcile fix: a member whose node lost contact after COMMIT but before it handled START.
--
-- sweep_lost_nodes turns such a `starting` member into `unknown`. When the agent reconnects it does not
-- run it yet (START is still unacknowledged in its outbox), and 0042's reconcile_node recorded it as gone
-- (failed, resources released) while the pending START would then start it: a running workload on
-- released GPUs. Now reconcile_node puts such a member (never reported started, START unacknowledged)
-- back to `starting`; the START that follows starts it.

-- reconcile_node (report kind `reconcile`), replacing 0042's: the same rules, plus the case above.
CREATE OR REPLACE FUNCTION tuneplane.reconcile_node(p_node_id bigint, p_epoch bigint, p_payload jsonb)
RETURNS jsonb
LANGUAGE plpgsql AS $$
DECLARE
    n tuneplane.nodes;
    m tuneplane.members;
    v_running bigint[];
    v_exited jsonb;
    v_item jsonb;
    v_kill bigint[] := '{}';
    v_restored integer := 0;
    v_gone integer := 0;
    v_waiting integer := 0;
BEGIN
    n := tuneplane.require_node_session(p_node_id, p_epoch);
    SELECT coalesce(array_agg((e ->> 'member_id')::bigint), '{}') INTO v_running
      FROM jsonb_array_elements(coalesce(p_payload -> 'running', '[]'::jsonb)) e;
    v_exited := coalesce(p_payload -> 'exited', '[]'::jsonb);

    FOR v_item IN SELECT * FROM jsonb_array_elements(v_exited) LOOP
        SELECT * INTO m FROM tuneplane.members
         WHERE id = (v_item ->> 'member_id')::bigint AND node_id = p_node_id FOR UPDATE;
        IF m.id IS NOT NULL THEN
            PERFORM tuneplane.record_member_exit(m, (v_item ->> 'exit_code')::integer, v_item ->> 'reason');
        END IF;
    END LOOP;

    FOR m IN SELECT * FROM tuneplane.members
              WHERE node_id = p_node_id AND released_at IS NULL
                AND state IN ('running', 'stopping', 'unknown')
              FOR UPDATE LOOP
        IF m.id = ANY (v_running) AND n.fenced_at IS NULL THEN
            IF m.state = 'unknown' THEN
                PERFORM tuneplane.set_member_state(m.id, 'running', 'node reconnected; still running');
                PERFORM tuneplane.set_job_state(m.job_id, (SELECT state FROM tuneplane.jobs WHERE id = m.job_id),
                    format('node %s reconnected; member rank %s is still running', n.name, m.rank));
                v_restored := v_restored + 1;
            END IF;
        ELSIF m.state = 'unknown' AND m.started_at IS NULL AND n.fenced_at IS NULL AND EXISTS (
                SELECT 1 FROM tuneplane.node_commands c
                 WHERE c.node_id = p_node_id AND c.kind = 'start' AND c.acked_at IS NULL
                   AND (c.payload ->> 'member_id')::bigint = m.id) THEN
            -- Lost contact before its START was handled: not gone, not started yet. START is still in
            -- the outbox (delivered in order after this session opened), so it starts now.
            PERFORM tuneplane.set_member_state(m.id, 'starting', 'node reconnected; START not yet handled');
            v_waiting := v_waiting + 1;
        ELSIF NOT EXISTS (SELECT 1 FROM jsonb_array_elements(v_exited) e
                           WHERE (e ->> 'member_id')::bigint = m.id) THEN
            PERFORM tuneplane.record_member_exit(m, NULL,
                format('node %s reconnected and no longer runs it (exit status unknown)', n.name));
            v_gone := v_gone + 1;
        END IF;
    END LOOP;

    SELECT coalesce(array_agg(r), '{}') INTO v_kill
      FROM unnest(v_running) r
     WHERE n.fenced_at IS NOT NULL
        OR NOT EXISTS (SELECT 1 FROM tuneplane.members mm
                        WHERE mm.id = r AND mm.node_id = p_node_id AND mm.released_at IS NULL
                          AND mm.state IN ('starting', 'running', 'stopping', 'unknown'));
    IF array_length(v_kill, 1) > 0 THEN
        PERFORM tuneplane.enqueue_node_command(p_node_id, 'kill', jsonb_build_object(
            'member_ids', to_jsonb(v_kill),
            'reason', CASE WHEN n.fenced_at IS NOT NULL THEN 'node was fenced: ' || coalesce(n.fenced_reason, '')
                           ELSE 'the control plane does not consider these members live on this node' END));
    END IF;
    RETURN jsonb_build_object('restored', v_restored, 'gone', v_gone, 'starting', v_waiting,
                              'kill', to_jsonb(v_kill));
END;
$$;
