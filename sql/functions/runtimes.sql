-- sql/functions/runtimes.sql — job environments and images on nodes (docs/runtimes.md).
--
-- Repeatable file (ADR 0012): `tuneplane db migrate` re-applies every file of sql/functions/ (in the order
-- of order.txt, one transaction) whenever one changes. Edit definitions here, never in a migration.
-- A changed signature: add its DROP below, e.g.
--   DROP FUNCTION IF EXISTS tuneplane.f(bigint, text);
--
-- Drops (signature changes): none yet.

-- member_prepare_progress (report kind `member_prepare_progress`): a step of a member's PREPARE that takes
-- time (an environment being built or reused, an image pulled) as a job event, so `tuneplane jobs show`
-- and the job page show it while it happens. Changes no state. Follows the lock order through
-- member_of_node (job → attempt → member). Idempotent on the agent's `seq` (a report can arrive twice);
-- ignored once the member is past PREPARE. Refuses a replaced session (409) and another node's member (404).
-- p_payload: {"member_id": 1, "seq": "…", "step": "installing", "message": "…", …more detail}
CREATE OR REPLACE FUNCTION tuneplane.member_prepare_progress(p_node_id bigint, p_epoch bigint, p_payload jsonb)
RETURNS jsonb
LANGUAGE plpgsql AS $$
DECLARE
    m tuneplane.members;
    j tuneplane.jobs;
    v_node text;
    v_seq text := left(coalesce(p_payload ->> 'seq', ''), 80);
    v_message text := left(coalesce(nullif(p_payload ->> 'message', ''), p_payload ->> 'step', 'preparing'), 500);
BEGIN
    PERFORM tuneplane.require_node_session(p_node_id, p_epoch);
    IF jsonb_typeof(p_payload -> 'member_id') IS DISTINCT FROM 'number' OR v_seq = '' THEN
        RAISE EXCEPTION 'a progress report needs member_id and seq' USING ERRCODE = 'TP400', COLUMN = 'member_id';
    END IF;
    m := tuneplane.member_of_node(p_node_id, (p_payload ->> 'member_id')::bigint);
    IF m.state NOT IN ('reserved', 'preparing', 'prepared') THEN
        RETURN jsonb_build_object('ignored', true, 'state', m.state);
    END IF;
    SELECT * INTO j FROM tuneplane.jobs WHERE id = (SELECT job_id FROM tuneplane.attempts WHERE id = m.attempt_id);
    IF EXISTS (SELECT 1 FROM tuneplane.job_events
                WHERE job_id = j.id AND detail ->> 'kind' = 'prepare'
                  AND detail ->> 'member_id' = m.id::text AND detail ->> 'seq' = v_seq) THEN
        RETURN jsonb_build_object('duplicate', true);
    END IF;
    SELECT name INTO v_node FROM tuneplane.nodes WHERE id = p_node_id;
    INSERT INTO tuneplane.job_events (job_id, from_state, to_state, reason, detail)
    VALUES (j.id, j.state, j.state, format('rank %s on %s: %s', m.rank, v_node, v_message),
            (p_payload - 'member_id' - 'seq' - 'message')
              || jsonb_build_object('kind', 'prepare', 'member_id', m.id::text, 'rank', m.rank, 'seq', v_seq));
    RETURN jsonb_build_object('recorded', true);
END;
$$;

-- report_node_caches (report kind `node_caches`): the sizes of the node's environment and capsule caches
-- after its last LRU clean-up (docs/runtimes.md). Touches only the node row. Refuses a replaced session
-- (409) and a payload that is not {"environments": {"count", "bytes"}, "capsules": {"count", "bytes"}} (400).
CREATE OR REPLACE FUNCTION tuneplane.report_node_caches(p_node_id bigint, p_epoch bigint, p_payload jsonb)
RETURNS jsonb
LANGUAGE plpgsql AS $$
DECLARE
    v_cache text;
BEGIN
    PERFORM tuneplane.require_node_session(p_node_id, p_epoch);
    FOREACH v_cache IN ARRAY ARRAY['environments', 'capsules'] LOOP
        IF jsonb_typeof(p_payload -> v_cache -> 'count') IS DISTINCT FROM 'number'
           OR jsonb_typeof(p_payload -> v_cache -> 'bytes') IS DISTINCT FROM 'number' THEN
            RAISE EXCEPTION 'a caches report needs %.count and %.bytes as numbers', v_cache, v_cache
                USING ERRCODE = 'TP400', COLUMN = v_cache;
        END IF;
    END LOOP;
    UPDATE tuneplane.nodes
       SET caches = jsonb_build_object(
               'environments', jsonb_build_object('count', (p_payload -> 'environments' ->> 'count')::bigint,
                                                  'bytes', (p_payload -> 'environments' ->> 'bytes')::bigint),
               'capsules', jsonb_build_object('count', (p_payload -> 'capsules' ->> 'count')::bigint,
                                              'bytes', (p_payload -> 'capsules' ->> 'bytes')::bigint)),
           caches_reported_at = now()
     WHERE id = p_node_id;
    RETURN jsonb_build_object('recorded', true);
END;
$$;
