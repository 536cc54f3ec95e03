-- sql/functions/member_logs.sql — the current definition of every member logs function, view and trigger.
-- Member logs: stdout/stderr chunks shipped by agents, bounded reads and clean-up.
--
-- Repeatable file (ADR 0012): `tuneplane db migrate` re-applies every file of sql/functions/ (in the order
-- of order.txt, one transaction) whenever one changes. Edit definitions here, never in a migration.
-- Tables, columns and data changes go in a new numbered migration. A changed signature or a view whose
-- columns change: add its DROP below (it runs before the new definition is created), e.g.
--   DROP FUNCTION IF EXISTS tuneplane.f(bigint, text);
--
-- Drops (signature changes):
-- job_member_log answers json (built as text: jsonb_agg of thousands of small chunks cost 4x as much).
DROP FUNCTION IF EXISTS tuneplane.job_member_log(bigint, bigint, integer, text, bigint, integer, integer, bigint);

-- member_log (report kind `member_log`): store one chunk of a member's stdout or stderr.
-- p_payload: {"member_id": 1, "stream": "stdout", "offset": 0, "length": 12, "text": "hello world\n"}
-- From nothing to a stored chunk; the stream's next_offset moves to offset + length. A chunk at an offset
-- other than next_offset (a duplicate, or a gap after a restart) stores nothing and answers the offset
-- the agent must resume from. Past max_stream_bytes the chunk is counted as dropped, not stored.
-- Refuses: a replaced session (409), a member not placed on this node (404 member_id), a bad stream,
-- offset or length (400), a chunk over max_chunk_bytes (413 length / text). Enqueues nothing.
CREATE OR REPLACE FUNCTION tuneplane.member_log(p_node_id bigint, p_epoch bigint, p_payload jsonb)
RETURNS jsonb
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM tuneplane.require_node_session(p_node_id, p_epoch);
    RETURN tuneplane.member_log_store(p_node_id, p_payload);
END;
$$;

-- member_log_store: member_log without the node session check, for a caller that already vouched for the
-- node (member_log; slurm_member_log, where the Slurm worker reads the member's log files itself).
CREATE OR REPLACE FUNCTION tuneplane.member_log_store(p_node_id bigint, p_payload jsonb)
RETURNS jsonb
LANGUAGE plpgsql AS $$
DECLARE
    v_settings tuneplane.member_log_settings;
    v_member   bigint;
    v_stream   text;
    v_offset   bigint;
    v_length   bigint;
    v_text     text;
    s          tuneplane.member_log_streams;
BEGIN
    SELECT * INTO v_settings FROM tuneplane.member_log_settings;
    IF jsonb_typeof(p_payload) IS DISTINCT FROM 'object' THEN
        RAISE EXCEPTION 'a member_log report is a JSON object' USING ERRCODE = 'TP400', COLUMN = 'payload';
    END IF;
    IF coalesce(p_payload ->> 'member_id', '') !~ '^[0-9]{1,18}$' THEN
        RAISE EXCEPTION 'member_id must be a member id' USING ERRCODE = 'TP400', COLUMN = 'member_id';
    END IF;
    v_stream := p_payload ->> 'stream';
    IF v_stream IS NULL OR v_stream NOT IN ('stdout', 'stderr') THEN
        RAISE EXCEPTION 'stream must be stdout or stderr' USING ERRCODE = 'TP400', COLUMN = 'stream';
    END IF;
    IF jsonb_typeof(p_payload -> 'offset') IS DISTINCT FROM 'number'
       OR p_payload ->> 'offset' !~ '^[0-9]{1,18}$' THEN
        RAISE EXCEPTION 'offset must be a byte offset (an integer, 0 or more)' USING ERRCODE = 'TP400',
            COLUMN = 'offset';
    END IF;
    IF jsonb_typeof(p_payload -> 'text') IS DISTINCT FROM 'string' THEN
        RAISE EXCEPTION 'text must be a string' USING ERRCODE = 'TP400', COLUMN = 'text';
    END IF;
    v_offset := (p_payload ->> 'offset')::bigint;
    v_text := p_payload ->> 'text';
    IF p_payload ? 'length' THEN
        IF jsonb_typeof(p_payload -> 'length') IS DISTINCT FROM 'number'
           OR p_payload ->> 'length' !~ '^[0-9]{1,18}$' THEN
            RAISE EXCEPTION 'length must be a byte count (an integer)' USING ERRCODE = 'TP400', COLUMN = 'length';
        END IF;
        v_length := (p_payload ->> 'length')::bigint;
    ELSE
        v_length := octet_length(v_text);
    END IF;
    IF v_length < 1 THEN
        RAISE EXCEPTION 'length must be at least 1 byte' USING ERRCODE = 'TP400', COLUMN = 'length';
    END IF;
    IF v_length > v_settings.max_chunk_bytes THEN
        RAISE EXCEPTION 'a log chunk may carry at most % bytes, not %', v_settings.max_chunk_bytes, v_length
            USING ERRCODE = 'TP413', COLUMN = 'length';
    END IF;
    -- Replacement characters may make the text up to three times the file's bytes; never more.
    IF octet_length(v_text) > 3 * v_length THEN
        RAISE EXCEPTION 'text is % bytes, more than the % bytes of the file it says it holds',
            octet_length(v_text), v_length USING ERRCODE = 'TP413', COLUMN = 'text';
    END IF;

    -- No row lock on members: log traffic must not queue behind (or block) lifecycle reports.
    SELECT m.id INTO v_member FROM tuneplane.members m
     WHERE m.id = (p_payload ->> 'member_id')::bigint AND m.node_id = p_node_id;
    IF v_member IS NULL THEN
        RAISE EXCEPTION 'member % is not placed on this node', p_payload ->> 'member_id'
            USING ERRCODE = 'TP404', COLUMN = 'member_id';
    END IF;

    INSERT INTO tuneplane.member_log_streams (member_id, stream) VALUES (v_member, v_stream)
    ON CONFLICT DO NOTHING;
    SELECT * INTO s FROM tuneplane.member_log_streams
     WHERE member_id = v_member AND stream = v_stream FOR UPDATE;
    IF v_offset <> s.next_offset THEN
        RETURN jsonb_build_object('stored', false, 'next_offset', s.next_offset,
                                  'why', CASE WHEN v_offset < s.next_offset THEN 'duplicate' ELSE 'gap' END);
    END IF;
    IF s.stored_bytes + v_length > v_settings.max_stream_bytes THEN
        UPDATE tuneplane.member_log_streams
           SET next_offset = next_offset + v_length, dropped_bytes = dropped_bytes + v_length,
               updated_at = clock_timestamp()
         WHERE member_id = v_member AND stream = v_stream;
        RETURN jsonb_build_object('stored', false, 'next_offset', v_offset + v_length, 'why', 'over the limit');
    END IF;
    INSERT INTO tuneplane.member_log_chunks (member_id, stream, start_offset, end_offset, text)
    VALUES (v_member, v_stream, v_offset, v_offset + v_length, v_text);
    UPDATE tuneplane.member_log_streams
       SET next_offset = next_offset + v_length, stored_bytes = stored_bytes + v_length, chunks = chunks + 1,
           updated_at = clock_timestamp()
     WHERE member_id = v_member AND stream = v_stream;
    RETURN jsonb_build_object('stored', true, 'next_offset', v_offset + v_length);
END;
$$;

-- job_member_log: a bounded read of one member's stdout or stderr for its job's owner or an admin.
-- The member is the given rank of the given attempt (default: the latest attempt). Returns the chunks
-- that end after p_after (the first may start before it when p_after is not a chunk boundary), at most
-- p_limit bytes but always at least one chunk, and `next`, the offset to ask for next. p_tail: start at
-- most that many bytes before the end of what is stored. While the job has no attempt yet the answer has
-- no member and no chunks. Refuses: a job that is not the actor's (404 job_id), a rank outside the
-- job's members (404 member), an attempt that does not exist (404 attempt), a bad stream (400 stream),
-- a negative after or tail (400), a limit outside 1..max_read_bytes (400 limit).
CREATE OR REPLACE FUNCTION tuneplane.job_member_log(p_actor_id bigint, p_job_id bigint, p_rank integer, p_stream text,
                                         p_after bigint DEFAULT 0, p_limit integer DEFAULT 65536,
                                         p_attempt integer DEFAULT NULL, p_tail bigint DEFAULT NULL)
RETURNS json
LANGUAGE plpgsql STABLE AS $$
DECLARE
    j          tuneplane.jobs;
    v_settings tuneplane.member_log_settings;
    m          record;
    s          tuneplane.member_log_streams;
    v_after    bigint := coalesce(p_after, 0);
    v_from     bigint;
    v_chunks   json;
    v_bytes    bigint;
    v_next     bigint;
    v_more     boolean;
BEGIN
    j := tuneplane.require_job_access(p_actor_id, p_job_id, 'read');
    SELECT * INTO v_settings FROM tuneplane.member_log_settings;
    IF p_stream IS NULL OR p_stream NOT IN ('stdout', 'stderr') THEN
        RAISE EXCEPTION 'stream must be stdout or stderr' USING ERRCODE = 'TP400', COLUMN = 'stream';
    END IF;
    IF v_after < 0 THEN
        RAISE EXCEPTION 'after must be a byte offset, 0 or more' USING ERRCODE = 'TP400', COLUMN = 'after';
    END IF;
    IF p_tail IS NOT NULL AND p_tail < 0 THEN
        RAISE EXCEPTION 'tail must be a byte count, 0 or more' USING ERRCODE = 'TP400', COLUMN = 'tail';
    END IF;
    IF p_limit IS NULL OR p_limit < 1 OR p_limit > v_settings.max_read_bytes THEN
        RAISE EXCEPTION 'limit must be between 1 and % bytes', v_settings.max_read_bytes
            USING ERRCODE = 'TP400', COLUMN = 'limit';
    END IF;
    IF p_rank IS NULL OR p_rank < 0 OR p_rank >= j.nodes THEN
        RAISE EXCEPTION 'job % has no member rank % (ranks 0 to %)', p_job_id, p_rank, j.nodes - 1
            USING ERRCODE = 'TP404', COLUMN = 'member';
    END IF;
    IF p_attempt IS NOT NULL
       AND NOT EXISTS (SELECT 1 FROM tuneplane.attempts a WHERE a.job_id = p_job_id AND a.number = p_attempt) THEN
        RAISE EXCEPTION 'job % has no attempt %', p_job_id, p_attempt USING ERRCODE = 'TP404', COLUMN = 'attempt';
    END IF;

    SELECT mm.id, mm.rank, mm.state, mm.exit_code, a.number AS attempt, n.name AS node,
           tuneplane.member_is_live(mm.state) AS live
      INTO m
      FROM tuneplane.members mm
      JOIN tuneplane.attempts a ON a.id = mm.attempt_id
      JOIN tuneplane.nodes n ON n.id = mm.node_id
     WHERE mm.job_id = p_job_id AND mm.rank = p_rank AND (p_attempt IS NULL OR a.number = p_attempt)
     ORDER BY a.number DESC
     LIMIT 1;
    IF m.id IS NULL THEN
        RETURN json_build_object('job_id', p_job_id, 'job_state', j.state, 'rank', p_rank, 'stream', p_stream,
                                 'attempt', NULL, 'member_id', NULL, 'after', v_after, 'next', v_after,
                                 'chunks', '[]'::json, 'bytes', 0, 'more', false,
                                 'complete', false, 'stored_to', 0, 'dropped_bytes', 0);
    END IF;

    SELECT * INTO s FROM tuneplane.member_log_streams WHERE member_id = m.id AND stream = p_stream;
    IF p_tail IS NOT NULL AND s.member_id IS NOT NULL THEN
        v_after := greatest(v_after, s.next_offset - p_tail);
    END IF;
    -- Start at the chunk that holds v_after (an index probe on the primary key, backwards).
    SELECT coalesce(max(ch.start_offset), 0) INTO v_from FROM (
        SELECT mc.start_offset FROM tuneplane.member_log_chunks mc
         WHERE mc.member_id = m.id AND mc.stream = p_stream AND mc.start_offset <= v_after
         ORDER BY mc.start_offset DESC LIMIT 1) ch;
    -- One set-based read (appending to a jsonb value in a loop copied it every time: O(n²) in chunks), built
    -- as json text (jsonb_agg of 16,384 small objects took 4x as long).
    -- Chunks are taken in offset order while their running byte total stays within p_limit (the first
    -- one, whose running total is its own length, always); every chunk is at least one byte, so p_limit + 1 chunks always reach past the limit and
    -- the scan never reads more than that.
    SELECT coalesce(json_agg(json_build_object('offset', t.start_offset, 'end', t.end_offset, 'text', t.text)
                             ORDER BY t.start_offset) FILTER (WHERE t.taken), '[]'::json),
           coalesce(sum(t.end_offset - t.start_offset) FILTER (WHERE t.taken), 0),
           coalesce(max(t.end_offset) FILTER (WHERE t.taken), v_after),
           coalesce(bool_or(NOT t.taken), false)
      INTO v_chunks, v_bytes, v_next, v_more
      FROM (SELECT w.*, w.upto = w.end_offset - w.start_offset OR w.upto <= p_limit AS taken
              FROM (SELECT l.*, sum(l.end_offset - l.start_offset) OVER (ORDER BY l.start_offset) AS upto
                      FROM (SELECT mc.start_offset, mc.end_offset, mc.text FROM tuneplane.member_log_chunks mc
                             WHERE mc.member_id = m.id AND mc.stream = p_stream AND mc.start_offset >= v_from
                               AND mc.end_offset > v_after
                             ORDER BY mc.start_offset
                             LIMIT p_limit::bigint + 1) l) w) t;
    RETURN json_build_object(
        'job_id', p_job_id, 'job_state', j.state, 'rank', m.rank, 'attempt', m.attempt, 'member_id', m.id,
        'node', m.node, 'member_state', m.state, 'exit_code', m.exit_code, 'stream', p_stream,
        'after', v_after, 'next', v_next, 'chunks', v_chunks, 'bytes', v_bytes, 'more', v_more,
        -- Nothing more will come: the member ended (its node drains the logs before reporting the end)
        -- and this read reached everything stored.
        'complete', NOT m.live AND NOT v_more,
        'stored_to', coalesce(s.next_offset, 0), 'dropped_bytes', coalesce(s.dropped_bytes, 0));
END;
$$;
