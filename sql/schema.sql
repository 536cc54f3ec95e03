-- sql/schema.sql — GENERATED, do not edit. The `tuneplane` schema of a freshly migrated database:
-- tables, constraints, indexes, sequences, views, triggers. Functions live in sql/functions/.
-- Regenerate after adding a migration or changing a view or trigger:
--     PYTHONPATH=$PWD python -m tuneplane db schema
-- (tests/db/test_schema_file.py fails while this file differs from what the migrations produce).
-- Rendered from PostgreSQL 18.

-- Tables
CREATE TABLE tuneplane.api_token_teams (
    token_id bigint NOT NULL,
    team_id bigint NOT NULL,
    CONSTRAINT api_token_teams_pkey PRIMARY KEY (token_id, team_id),
    CONSTRAINT api_token_teams_team_id_fkey FOREIGN KEY (team_id) REFERENCES tuneplane.teams(id),
    CONSTRAINT api_token_teams_token_id_fkey FOREIGN KEY (token_id) REFERENCES tuneplane.api_tokens(id)
);

CREATE TABLE tuneplane.api_tokens (
    id bigint GENERATED ALWAYS AS IDENTITY NOT NULL,
    user_id bigint NOT NULL,
    name text NOT NULL,
    token_hash text NOT NULL,
    scopes text[] DEFAULT ARRAY['api'::text] NOT NULL,
    created_at timestamp with time zone DEFAULT now() NOT NULL,
    expires_at timestamp with time zone,
    revoked_at timestamp with time zone,
    last_used_at timestamp with time zone,
    read_only boolean DEFAULT false NOT NULL,
    CONSTRAINT api_tokens_pkey PRIMARY KEY (id),
    CONSTRAINT api_tokens_token_hash_key UNIQUE (token_hash),
    CONSTRAINT api_tokens_user_id_fkey FOREIGN KEY (user_id) REFERENCES tuneplane.users(id)
);
CREATE INDEX api_tokens_user ON tuneplane.api_tokens USING btree (user_id);

CREATE TABLE tuneplane.artifact_chunks (
    artifact_id bigint NOT NULL,
    file_index integer NOT NULL,
    chunk_index integer NOT NULL,
    size integer NOT NULL,
    sha256 text,
    recorded_at timestamp with time zone DEFAULT now() NOT NULL,
    crc32c bigint,
    CONSTRAINT artifact_chunks_pkey PRIMARY KEY (artifact_id, file_index, chunk_index),
    CONSTRAINT artifact_chunks_artifact_id_file_index_fkey FOREIGN KEY (artifact_id, file_index) REFERENCES tuneplane.artifact_files(artifact_id, file_index) ON DELETE CASCADE,
    CONSTRAINT artifact_chunks_chunk_index_check CHECK (chunk_index >= 0),
    CONSTRAINT artifact_chunks_crc32c_check CHECK (crc32c >= 0 AND crc32c <= '4294967295'::bigint),
    CONSTRAINT artifact_chunks_digest CHECK (sha256 IS NOT NULL OR crc32c IS NOT NULL),
    CONSTRAINT artifact_chunks_sha256_check CHECK (sha256 ~ '^[0-9a-f]{64}$'::text),
    CONSTRAINT artifact_chunks_size_check CHECK (size > 0)
);

CREATE TABLE tuneplane.artifact_corruptions (
    artifact_id bigint NOT NULL,
    at timestamp with time zone DEFAULT clock_timestamp() NOT NULL,
    reason text NOT NULL,
    found_by text NOT NULL,
    CONSTRAINT artifact_corruptions_pkey PRIMARY KEY (artifact_id),
    CONSTRAINT artifact_corruptions_artifact_id_fkey FOREIGN KEY (artifact_id) REFERENCES tuneplane.artifacts(id),
    CONSTRAINT artifact_corruptions_found_by_check CHECK (found_by <> ''::text),
    CONSTRAINT artifact_corruptions_reason_check CHECK (reason <> ''::text)
);

CREATE TABLE tuneplane.artifact_files (
    artifact_id bigint NOT NULL,
    file_index integer NOT NULL,
    path text NOT NULL,
    size bigint NOT NULL,
    sha256 text NOT NULL,
    verified_at timestamp with time zone,
    object_key text,
    CONSTRAINT artifact_files_pkey PRIMARY KEY (artifact_id, file_index),
    CONSTRAINT artifact_files_artifact_id_path_key UNIQUE (artifact_id, path),
    CONSTRAINT artifact_files_artifact_id_fkey FOREIGN KEY (artifact_id) REFERENCES tuneplane.artifacts(id),
    CONSTRAINT artifact_files_file_index_check CHECK (file_index >= 0),
    CONSTRAINT artifact_files_object_key_check CHECK (object_key ~ '^[A-Za-z0-9._-]+(/[A-Za-z0-9._-]+)*$'::text AND object_key !~ '(^|/)\.\.?(/|$)'::text),
    CONSTRAINT artifact_files_sha256_check CHECK (sha256 ~ '^[0-9a-f]{64}$'::text),
    CONSTRAINT artifact_files_size_check CHECK (size >= 0)
);
CREATE INDEX artifact_files_object_key ON tuneplane.artifact_files USING btree (object_key) WHERE (object_key IS NOT NULL);
CREATE INDEX artifact_files_sha256 ON tuneplane.artifact_files USING btree (sha256) WHERE (verified_at IS NOT NULL);

CREATE TABLE tuneplane.artifact_settings (
    singleton boolean DEFAULT true NOT NULL,
    chunk_size integer DEFAULT ((32 * 1024) * 1024) NOT NULL,
    max_files integer DEFAULT 100000 NOT NULL,
    max_total_bytes bigint DEFAULT ((((1024)::bigint * 1024) * 1024) * 1024) NOT NULL,
    keep_checkpoints integer DEFAULT 5 NOT NULL,
    CONSTRAINT artifact_settings_pkey PRIMARY KEY (singleton),
    CONSTRAINT artifact_settings_chunk_size_check CHECK (chunk_size >= 4096 AND chunk_size <= (256 * 1024 * 1024)),
    CONSTRAINT artifact_settings_keep_checkpoints_check CHECK (keep_checkpoints >= 1),
    CONSTRAINT artifact_settings_max_files_check CHECK (max_files >= 1),
    CONSTRAINT artifact_settings_max_total_bytes_check CHECK (max_total_bytes >= 0),
    CONSTRAINT artifact_settings_singleton_check CHECK (singleton)
);

CREATE TABLE tuneplane.artifact_verifications (
    id bigint GENERATED ALWAYS AS IDENTITY NOT NULL,
    artifact_id bigint NOT NULL,
    at timestamp with time zone DEFAULT clock_timestamp() NOT NULL,
    ok boolean NOT NULL,
    checked integer DEFAULT 0 NOT NULL,
    problems jsonb DEFAULT '[]'::jsonb NOT NULL,
    requested_by text NOT NULL,
    CONSTRAINT artifact_verifications_pkey PRIMARY KEY (id),
    CONSTRAINT artifact_verifications_artifact_id_fkey FOREIGN KEY (artifact_id) REFERENCES tuneplane.artifacts(id)
);
CREATE INDEX artifact_verifications_artifact ON tuneplane.artifact_verifications USING btree (artifact_id, id DESC);

CREATE TABLE tuneplane.artifacts (
    id bigint GENERATED ALWAYS AS IDENTITY NOT NULL,
    job_id bigint NOT NULL,
    attempt_id bigint NOT NULL,
    member_id bigint NOT NULL,
    rank integer NOT NULL,
    name text NOT NULL,
    kind text DEFAULT 'output'::text NOT NULL,
    state text DEFAULT 'uploading'::text NOT NULL,
    reason text DEFAULT ''::text NOT NULL,
    delivery text NOT NULL,
    shared_path text,
    manifest jsonb NOT NULL,
    manifest_digest text NOT NULL,
    file_count integer NOT NULL,
    total_bytes bigint NOT NULL,
    chunk_size integer NOT NULL,
    registered_by text NOT NULL,
    created_at timestamp with time zone DEFAULT now() NOT NULL,
    updated_at timestamp with time zone DEFAULT now() NOT NULL,
    completed_at timestamp with time zone,
    pruned_at timestamp with time zone,
    step bigint,
    CONSTRAINT artifacts_pkey PRIMARY KEY (id),
    CONSTRAINT artifacts_member_id_name_key UNIQUE (member_id, name),
    CONSTRAINT artifacts_attempt_id_fkey FOREIGN KEY (attempt_id) REFERENCES tuneplane.attempts(id),
    CONSTRAINT artifacts_job_id_fkey FOREIGN KEY (job_id) REFERENCES tuneplane.jobs(id),
    CONSTRAINT artifacts_member_id_fkey FOREIGN KEY (member_id) REFERENCES tuneplane.members(id),
    CONSTRAINT artifacts_check CHECK ((delivery = 'shared'::text) = (shared_path IS NOT NULL)),
    CONSTRAINT artifacts_chunk_size_check CHECK (chunk_size > 0),
    CONSTRAINT artifacts_completed_at CHECK ((state = ANY (ARRAY['complete'::text, 'pruned'::text])) = (completed_at IS NOT NULL)),
    CONSTRAINT artifacts_delivery_check CHECK (delivery = ANY (ARRAY['object'::text, 'shared'::text])),
    CONSTRAINT artifacts_file_count_check CHECK (file_count >= 0),
    CONSTRAINT artifacts_kind_check CHECK (kind = ANY (ARRAY['output'::text, 'checkpoint'::text, 'logs'::text])),
    CONSTRAINT artifacts_manifest_digest_check CHECK (manifest_digest ~ '^[0-9a-f]{64}$'::text),
    CONSTRAINT artifacts_name_check CHECK (name ~ '^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$'::text),
    CONSTRAINT artifacts_pruned_at CHECK ((state = 'pruned'::text) = (pruned_at IS NOT NULL)),
    CONSTRAINT artifacts_pruned_kind CHECK (state <> 'pruned'::text OR kind = 'checkpoint'::text),
    CONSTRAINT artifacts_state_check CHECK (state = ANY (ARRAY['uploading'::text, 'complete'::text, 'failed'::text, 'pruned'::text])),
    CONSTRAINT artifacts_step_check CHECK (step IS NULL OR step >= 0 AND kind = 'checkpoint'::text),
    CONSTRAINT artifacts_total_bytes_check CHECK (total_bytes >= 0)
);
CREATE INDEX artifacts_digest ON tuneplane.artifacts USING btree (manifest_digest) WHERE (state = 'complete'::text);
CREATE INDEX artifacts_job ON tuneplane.artifacts USING btree (job_id, name, attempt_id);

CREATE TABLE tuneplane.attempts (
    id bigint GENERATED ALWAYS AS IDENTITY NOT NULL,
    job_id bigint NOT NULL,
    number integer NOT NULL,
    fleet_id bigint NOT NULL,
    state text DEFAULT 'reserved'::text NOT NULL,
    reason text DEFAULT ''::text NOT NULL,
    launch_epoch bigint DEFAULT 0 NOT NULL,
    launch_owner text,
    capsule_digest text,
    master_addr text,
    master_port integer,
    prepare_deadline timestamp with time zone,
    cancel_requested_at timestamp with time zone,
    created_at timestamp with time zone DEFAULT now() NOT NULL,
    committed_at timestamp with time zone,
    running_at timestamp with time zone,
    ended_at timestamp with time zone,
    borrowing boolean DEFAULT false NOT NULL,
    resume_artifact_id bigint,
    stop_kind text,
    stop_cause text,
    stop_requested_at timestamp with time zone,
    grace_deadline timestamp with time zone,
    preempted_by_job_id bigint,
    end_checkpoint_id bigint,
    lost_seconds double precision,
    lost_gpu_seconds double precision,
    CONSTRAINT attempts_pkey PRIMARY KEY (id),
    CONSTRAINT attempts_job_id_number_key UNIQUE (job_id, number),
    CONSTRAINT attempts_end_checkpoint_id_fkey FOREIGN KEY (end_checkpoint_id) REFERENCES tuneplane.artifacts(id),
    CONSTRAINT attempts_fleet_id_fkey FOREIGN KEY (fleet_id) REFERENCES tuneplane.fleets(id),
    CONSTRAINT attempts_job_id_fkey FOREIGN KEY (job_id) REFERENCES tuneplane.jobs(id),
    CONSTRAINT attempts_preempted_by_job_id_fkey FOREIGN KEY (preempted_by_job_id) REFERENCES tuneplane.jobs(id),
    CONSTRAINT attempts_resume_artifact_id_fkey FOREIGN KEY (resume_artifact_id) REFERENCES tuneplane.artifacts(id),
    CONSTRAINT attempts_capsule_digest_check CHECK (capsule_digest ~ '^[0-9a-f]{64}$'::text),
    CONSTRAINT attempts_lost_gpu_seconds_check CHECK (lost_gpu_seconds >= 0::double precision),
    CONSTRAINT attempts_lost_seconds_check CHECK (lost_seconds >= 0::double precision),
    CONSTRAINT attempts_number_check CHECK (number >= 1),
    CONSTRAINT attempts_state_check CHECK (state = ANY (ARRAY['reserved'::text, 'preparing'::text, 'running'::text, 'stopping'::text, 'succeeded'::text, 'failed'::text, 'aborted'::text, 'cancelled'::text, 'preempted'::text, 'timed_out'::text])),
    CONSTRAINT attempts_stop_kind_check CHECK (stop_kind = ANY (ARRAY['preempted'::text, 'timed_out'::text])),
    CONSTRAINT attempts_stop_request_whole CHECK ((stop_kind IS NULL) = (stop_requested_at IS NULL) AND (stop_kind IS NULL) = (grace_deadline IS NULL) AND (stop_kind IS NULL) = (stop_cause IS NULL))
);
CREATE INDEX attempts_in_grace ON tuneplane.attempts USING btree (grace_deadline) WHERE ((stop_kind IS NOT NULL) AND (state = ANY (ARRAY['reserved'::text, 'preparing'::text, 'running'::text, 'stopping'::text])));
CREATE UNIQUE INDEX attempts_one_live ON tuneplane.attempts USING btree (job_id) WHERE (state = ANY (ARRAY['reserved'::text, 'preparing'::text, 'running'::text, 'stopping'::text]));
CREATE INDEX attempts_preparing ON tuneplane.attempts USING btree (prepare_deadline) WHERE (state = 'preparing'::text);
CREATE UNIQUE INDEX attempts_rendezvous_live ON tuneplane.attempts USING btree (master_addr, master_port) WHERE (state = ANY (ARRAY['reserved'::text, 'preparing'::text, 'running'::text, 'stopping'::text]));
CREATE INDEX attempts_resume_artifact ON tuneplane.attempts USING btree (resume_artifact_id) WHERE (resume_artifact_id IS NOT NULL);

CREATE TABLE tuneplane.confirmations (
    owner_id bigint NOT NULL,
    retry_key text NOT NULL,
    preview_id uuid NOT NULL,
    digest text NOT NULL,
    job_id bigint NOT NULL,
    created_at timestamp with time zone DEFAULT now() NOT NULL,
    CONSTRAINT confirmations_pkey PRIMARY KEY (owner_id, retry_key),
    CONSTRAINT confirmations_job_id_fkey FOREIGN KEY (job_id) REFERENCES tuneplane.jobs(id) DEFERRABLE INITIALLY DEFERRED,
    CONSTRAINT confirmations_owner_id_fkey FOREIGN KEY (owner_id) REFERENCES tuneplane.users(id),
    CONSTRAINT confirmations_preview_id_fkey FOREIGN KEY (preview_id) REFERENCES tuneplane.previews(id),
    CONSTRAINT confirmations_retry_key_check CHECK (retry_key ~ '^[A-Za-z0-9._:-]{1,200}$'::text)
);
CREATE INDEX confirmations_job ON tuneplane.confirmations USING btree (job_id);

CREATE TABLE tuneplane.coordinator_clock (
    singleton boolean DEFAULT true NOT NULL,
    swept_at timestamp with time zone,
    back_at timestamp with time zone,
    CONSTRAINT coordinator_clock_pkey PRIMARY KEY (singleton),
    CONSTRAINT coordinator_clock_singleton_check CHECK (singleton)
);

CREATE TABLE tuneplane.enrollment_tokens (
    id bigint GENERATED ALWAYS AS IDENTITY NOT NULL,
    fleet_id bigint NOT NULL,
    token_hash text NOT NULL,
    created_at timestamp with time zone DEFAULT now() NOT NULL,
    created_by text NOT NULL,
    expires_at timestamp with time zone NOT NULL,
    used_at timestamp with time zone,
    used_by_node bigint,
    CONSTRAINT enrollment_tokens_pkey PRIMARY KEY (id),
    CONSTRAINT enrollment_tokens_token_hash_key UNIQUE (token_hash),
    CONSTRAINT enrollment_tokens_fleet_id_fkey FOREIGN KEY (fleet_id) REFERENCES tuneplane.fleets(id),
    CONSTRAINT enrollment_tokens_used_by_node_fkey FOREIGN KEY (used_by_node) REFERENCES tuneplane.nodes(id),
    CONSTRAINT enrollment_tokens_token_hash_check CHECK (token_hash ~ '^[0-9a-f]{64}$'::text)
);

CREATE TABLE tuneplane.fleet_team_access (
    fleet_id bigint NOT NULL,
    team_id bigint NOT NULL,
    slurm_account text,
    granted_at timestamp with time zone DEFAULT now() NOT NULL,
    granted_by bigint,
    CONSTRAINT fleet_team_access_pkey PRIMARY KEY (fleet_id, team_id),
    CONSTRAINT fleet_team_access_fleet_id_fkey FOREIGN KEY (fleet_id) REFERENCES tuneplane.fleets(id),
    CONSTRAINT fleet_team_access_granted_by_fkey FOREIGN KEY (granted_by) REFERENCES tuneplane.users(id),
    CONSTRAINT fleet_team_access_team_id_fkey FOREIGN KEY (team_id) REFERENCES tuneplane.teams(id),
    CONSTRAINT fleet_team_access_slurm_account_check CHECK (slurm_account ~ '^[A-Za-z0-9_.-]{1,64}$'::text)
);
CREATE INDEX fleet_team_access_team ON tuneplane.fleet_team_access USING btree (team_id);

CREATE TABLE tuneplane.fleets (
    id bigint GENERATED ALWAYS AS IDENTITY NOT NULL,
    name text NOT NULL,
    backend text NOT NULL,
    capabilities jsonb DEFAULT '{}'::jsonb NOT NULL,
    created_at timestamp with time zone DEFAULT now() NOT NULL,
    created_by bigint,
    team_access text DEFAULT 'open'::text NOT NULL,
    usage_half_life interval,
    max_preemption_grace interval,
    storage jsonb,
    CONSTRAINT fleets_pkey PRIMARY KEY (id),
    CONSTRAINT fleets_name_key UNIQUE (name),
    CONSTRAINT fleets_created_by_fkey FOREIGN KEY (created_by) REFERENCES tuneplane.users(id),
    CONSTRAINT fleets_max_preemption_grace_check CHECK (max_preemption_grace >= '00:00:00'::interval),
    CONSTRAINT fleets_name_check CHECK (name ~ '^[a-z0-9][a-z0-9-]{0,62}$'::text),
    CONSTRAINT fleets_storage_check CHECK (storage IS NULL OR jsonb_typeof(storage) = 'object'::text AND ((storage ->> 'kind'::text) = ANY (ARRAY['filesystem'::text, 's3'::text]))),
    CONSTRAINT fleets_team_access_check CHECK (team_access = ANY (ARRAY['open'::text, 'listed'::text])),
    CONSTRAINT fleets_usage_half_life_check CHECK (usage_half_life > '00:00:00'::interval)
);

CREATE TABLE tuneplane.gpu_allocations (
    member_id bigint NOT NULL,
    node_id bigint NOT NULL,
    gpu_index integer NOT NULL,
    allocated_at timestamp with time zone DEFAULT clock_timestamp() NOT NULL,
    released_at timestamp with time zone,
    CONSTRAINT gpu_allocations_pkey PRIMARY KEY (member_id, gpu_index),
    CONSTRAINT gpu_allocations_member_id_fkey FOREIGN KEY (member_id) REFERENCES tuneplane.members(id),
    CONSTRAINT gpu_allocations_node_id_fkey FOREIGN KEY (node_id) REFERENCES tuneplane.nodes(id)
);
CREATE UNIQUE INDEX gpu_allocations_active ON tuneplane.gpu_allocations USING btree (node_id, gpu_index) WHERE (released_at IS NULL);

CREATE TABLE tuneplane.head_claims (
    fleet_id bigint NOT NULL,
    job_id bigint NOT NULL,
    node_ids bigint[] NOT NULL,
    claimed_at timestamp with time zone DEFAULT now() NOT NULL,
    CONSTRAINT head_claims_pkey PRIMARY KEY (fleet_id)
);

CREATE TABLE tuneplane.idle_policies (
    id bigint GENERATED ALWAYS AS IDENTITY NOT NULL,
    fleet_id bigint NOT NULL,
    team_id bigint,
    idle_after interval,
    utilization_below double precision,
    power_below double precision,
    action text,
    idle_grace interval,
    updated_at timestamp with time zone DEFAULT now() NOT NULL,
    updated_by bigint,
    CONSTRAINT idle_policies_pkey PRIMARY KEY (id),
    CONSTRAINT idle_policies_fleet_id_fkey FOREIGN KEY (fleet_id) REFERENCES tuneplane.fleets(id) ON DELETE CASCADE,
    CONSTRAINT idle_policies_team_id_fkey FOREIGN KEY (team_id) REFERENCES tuneplane.teams(id) ON DELETE CASCADE,
    CONSTRAINT idle_policies_updated_by_fkey FOREIGN KEY (updated_by) REFERENCES tuneplane.users(id),
    CONSTRAINT idle_policies_action_check CHECK (action = ANY (ARRAY['off'::text, 'warn'::text, 'reclaim'::text])),
    CONSTRAINT idle_policies_idle_after_check CHECK (idle_after > '00:00:00'::interval),
    CONSTRAINT idle_policies_idle_grace_check CHECK (idle_grace >= '00:00:00'::interval),
    CONSTRAINT idle_policies_power_below_check CHECK (power_below >= 0::double precision AND power_below <= 1::double precision),
    CONSTRAINT idle_policies_utilization_below_check CHECK (utilization_below > 0::double precision AND utilization_below <= 100::double precision)
);
CREATE UNIQUE INDEX idle_policies_scope ON tuneplane.idle_policies USING btree (fleet_id, COALESCE(team_id, (0)::bigint));

CREATE TABLE tuneplane.idle_settings (
    singleton boolean DEFAULT true NOT NULL,
    max_sample_gap interval DEFAULT '00:02:00'::interval NOT NULL,
    check_every interval DEFAULT '00:01:00'::interval NOT NULL,
    CONSTRAINT idle_settings_pkey PRIMARY KEY (singleton),
    CONSTRAINT idle_settings_check_every_check CHECK (check_every >= '00:00:00'::interval),
    CONSTRAINT idle_settings_max_sample_gap_check CHECK (max_sample_gap > '00:00:00'::interval),
    CONSTRAINT idle_settings_singleton_check CHECK (singleton)
);

CREATE TABLE tuneplane.job_events (
    id bigint GENERATED ALWAYS AS IDENTITY NOT NULL,
    job_id bigint NOT NULL,
    at timestamp with time zone DEFAULT clock_timestamp() NOT NULL,
    from_state text,
    to_state text NOT NULL,
    reason text NOT NULL,
    detail jsonb DEFAULT '{}'::jsonb NOT NULL,
    CONSTRAINT job_events_pkey PRIMARY KEY (id),
    CONSTRAINT job_events_job_id_fkey FOREIGN KEY (job_id) REFERENCES tuneplane.jobs(id)
);
CREATE INDEX job_events_job ON tuneplane.job_events USING btree (job_id, id);

CREATE TABLE tuneplane.job_idle (
    job_id bigint NOT NULL,
    attempt_id bigint,
    status text DEFAULT 'unknown'::text NOT NULL,
    idle_since timestamp with time zone,
    warned_at timestamp with time zone,
    warning text,
    deadline timestamp with time zone,
    reclaimed_at timestamp with time zone,
    checked_at timestamp with time zone,
    evaluation jsonb DEFAULT '{}'::jsonb NOT NULL,
    idle_gpu_seconds double precision DEFAULT 0 NOT NULL,
    exempt_at timestamp with time zone,
    exempt_by bigint,
    exempt_reason text,
    watching boolean DEFAULT false NOT NULL,
    CONSTRAINT job_idle_pkey PRIMARY KEY (job_id),
    CONSTRAINT job_idle_attempt_id_fkey FOREIGN KEY (attempt_id) REFERENCES tuneplane.attempts(id),
    CONSTRAINT job_idle_exempt_by_fkey FOREIGN KEY (exempt_by) REFERENCES tuneplane.users(id),
    CONSTRAINT job_idle_job_id_fkey FOREIGN KEY (job_id) REFERENCES tuneplane.jobs(id),
    CONSTRAINT job_idle_deadline_after_warning CHECK (deadline IS NULL OR warned_at IS NOT NULL),
    CONSTRAINT job_idle_exempt_has_reason CHECK ((exempt_at IS NULL) = (exempt_reason IS NULL)),
    CONSTRAINT job_idle_idle_gpu_seconds_check CHECK (idle_gpu_seconds >= 0::double precision),
    CONSTRAINT job_idle_status_check CHECK (status = ANY (ARRAY['unknown'::text, 'busy'::text, 'idle'::text]))
);
CREATE INDEX job_idle_checked ON tuneplane.job_idle USING btree (checked_at);
CREATE INDEX job_idle_due ON tuneplane.job_idle USING btree (checked_at NULLS FIRST, job_id) WHERE watching;
CREATE INDEX job_idle_warned ON tuneplane.job_idle USING btree (job_id) WHERE ((warned_at IS NOT NULL) AND (reclaimed_at IS NULL));

CREATE TABLE tuneplane.jobs (
    id bigint GENERATED BY DEFAULT AS IDENTITY NOT NULL,
    owner_id bigint NOT NULL,
    preview_id uuid NOT NULL,
    fleet_id bigint NOT NULL,
    state text DEFAULT 'queued'::text NOT NULL,
    state_reason text NOT NULL,
    priority integer DEFAULT 0 NOT NULL,
    nodes integer NOT NULL,
    gpus_per_node integer NOT NULL,
    cpus_per_node integer NOT NULL,
    memory_per_node bigint NOT NULL,
    max_attempts integer NOT NULL,
    spec jsonb NOT NULL,
    created_at timestamp with time zone DEFAULT now() NOT NULL,
    updated_at timestamp with time zone DEFAULT now() NOT NULL,
    free_relaunches_used integer DEFAULT 0 NOT NULL,
    team_id bigint NOT NULL,
    preemptible boolean DEFAULT false NOT NULL,
    preemptions_used integer DEFAULT 0 NOT NULL,
    priority_class text,
    corrupt_resumes_used integer DEFAULT 0 NOT NULL,
    CONSTRAINT jobs_pkey PRIMARY KEY (id),
    CONSTRAINT jobs_preview_id_key UNIQUE (preview_id),
    CONSTRAINT jobs_fleet_id_fkey FOREIGN KEY (fleet_id) REFERENCES tuneplane.fleets(id),
    CONSTRAINT jobs_owner_id_fkey FOREIGN KEY (owner_id) REFERENCES tuneplane.users(id),
    CONSTRAINT jobs_preview_id_fkey FOREIGN KEY (preview_id) REFERENCES tuneplane.previews(id),
    CONSTRAINT jobs_team_id_fkey FOREIGN KEY (team_id) REFERENCES tuneplane.teams(id),
    CONSTRAINT jobs_corrupt_resumes_used_check CHECK (corrupt_resumes_used >= 0),
    CONSTRAINT jobs_cpus_per_node_check CHECK (cpus_per_node >= 1),
    CONSTRAINT jobs_free_relaunches_used_check CHECK (free_relaunches_used >= 0),
    CONSTRAINT jobs_gpus_per_node_check CHECK (gpus_per_node >= 0),
    CONSTRAINT jobs_max_attempts_check CHECK (max_attempts >= 1),
    CONSTRAINT jobs_memory_per_node_check CHECK (memory_per_node >= 0),
    CONSTRAINT jobs_nodes_check CHECK (nodes >= 1),
    CONSTRAINT jobs_preemptions_used_check CHECK (preemptions_used >= 0),
    CONSTRAINT jobs_state_check CHECK (state = ANY (ARRAY['queued'::text, 'reserved'::text, 'preparing'::text, 'running'::text, 'succeeded'::text, 'failed'::text, 'cancelled'::text])),
    CONSTRAINT jobs_state_reason_check CHECK (state_reason <> ''::text)
);
CREATE INDEX jobs_owner ON tuneplane.jobs USING btree (owner_id, id DESC);
CREATE INDEX jobs_queued ON tuneplane.jobs USING btree (fleet_id, priority DESC, id) WHERE (state = 'queued'::text);
CREATE INDEX jobs_state ON tuneplane.jobs USING btree (state, id DESC);
CREATE INDEX jobs_team ON tuneplane.jobs USING btree (team_id, id DESC);

CREATE TABLE tuneplane.launch_decisions (
    attempt_id bigint NOT NULL,
    decision text NOT NULL,
    reason text NOT NULL,
    decided_at timestamp with time zone DEFAULT clock_timestamp() NOT NULL,
    CONSTRAINT launch_decisions_pkey PRIMARY KEY (attempt_id),
    CONSTRAINT launch_decisions_attempt_id_fkey FOREIGN KEY (attempt_id) REFERENCES tuneplane.attempts(id),
    CONSTRAINT launch_decisions_decision_check CHECK (decision = ANY (ARRAY['commit'::text, 'abort'::text]))
);

CREATE TABLE tuneplane.launch_settings (
    singleton boolean DEFAULT true NOT NULL,
    prepare_timeout interval DEFAULT '00:15:00'::interval NOT NULL,
    stop_grace interval DEFAULT '00:00:10'::interval NOT NULL,
    rendezvous_port_base integer DEFAULT 29500 NOT NULL,
    rendezvous_port_span integer DEFAULT 2000 NOT NULL,
    start_timeout interval DEFAULT '00:05:00'::interval NOT NULL,
    stop_timeout interval DEFAULT '00:01:00'::interval NOT NULL,
    free_relaunches integer DEFAULT 2 NOT NULL,
    CONSTRAINT launch_settings_pkey PRIMARY KEY (singleton),
    CONSTRAINT launch_settings_free_relaunches_check CHECK (free_relaunches >= 0 AND free_relaunches <= 20),
    CONSTRAINT launch_settings_prepare_timeout_check CHECK (prepare_timeout > '00:00:00'::interval),
    CONSTRAINT launch_settings_singleton_check CHECK (singleton),
    CONSTRAINT launch_settings_start_timeout_check CHECK (start_timeout > '00:00:00'::interval),
    CONSTRAINT launch_settings_stop_grace_check CHECK (stop_grace >= '00:00:00'::interval),
    CONSTRAINT launch_settings_stop_timeout_check CHECK (stop_timeout > '00:00:00'::interval)
);

CREATE TABLE tuneplane.member_log_chunks (
    member_id bigint NOT NULL,
    stream text NOT NULL,
    start_offset bigint NOT NULL,
    end_offset bigint NOT NULL,
    text text NOT NULL,
    received_at timestamp with time zone DEFAULT clock_timestamp() NOT NULL,
    CONSTRAINT member_log_chunks_pkey PRIMARY KEY (member_id, stream, start_offset),
    CONSTRAINT member_log_chunks_member_id_stream_fkey FOREIGN KEY (member_id, stream) REFERENCES tuneplane.member_log_streams(member_id, stream),
    CONSTRAINT member_log_chunks_check CHECK (end_offset > start_offset),
    CONSTRAINT member_log_chunks_start_offset_check CHECK (start_offset >= 0)
);

CREATE TABLE tuneplane.member_log_settings (
    singleton boolean DEFAULT true NOT NULL,
    max_chunk_bytes integer DEFAULT 65536 NOT NULL,
    max_stream_bytes bigint DEFAULT 67108864 NOT NULL,
    max_read_bytes integer DEFAULT 1048576 NOT NULL,
    CONSTRAINT member_log_settings_pkey PRIMARY KEY (singleton),
    CONSTRAINT member_log_settings_max_chunk_bytes_check CHECK (max_chunk_bytes >= 1024 AND max_chunk_bytes <= 1048576),
    CONSTRAINT member_log_settings_max_read_bytes_check CHECK (max_read_bytes >= 1024),
    CONSTRAINT member_log_settings_max_stream_bytes_check CHECK (max_stream_bytes >= 0),
    CONSTRAINT member_log_settings_singleton_check CHECK (singleton)
);

CREATE TABLE tuneplane.member_log_streams (
    member_id bigint NOT NULL,
    stream text NOT NULL,
    next_offset bigint DEFAULT 0 NOT NULL,
    stored_bytes bigint DEFAULT 0 NOT NULL,
    dropped_bytes bigint DEFAULT 0 NOT NULL,
    chunks integer DEFAULT 0 NOT NULL,
    updated_at timestamp with time zone DEFAULT clock_timestamp() NOT NULL,
    CONSTRAINT member_log_streams_pkey PRIMARY KEY (member_id, stream),
    CONSTRAINT member_log_streams_member_id_fkey FOREIGN KEY (member_id) REFERENCES tuneplane.members(id),
    CONSTRAINT member_log_streams_chunks_check CHECK (chunks >= 0),
    CONSTRAINT member_log_streams_dropped_bytes_check CHECK (dropped_bytes >= 0),
    CONSTRAINT member_log_streams_next_offset_check CHECK (next_offset >= 0),
    CONSTRAINT member_log_streams_stored_bytes_check CHECK (stored_bytes >= 0),
    CONSTRAINT member_log_streams_stream_check CHECK (stream = ANY (ARRAY['stdout'::text, 'stderr'::text]))
);

CREATE TABLE tuneplane.members (
    id bigint GENERATED ALWAYS AS IDENTITY NOT NULL,
    attempt_id bigint NOT NULL,
    job_id bigint NOT NULL,
    rank integer NOT NULL,
    node_id bigint NOT NULL,
    gpu_indices integer[] DEFAULT '{}'::integer[] NOT NULL,
    cpus integer NOT NULL,
    memory_bytes bigint NOT NULL,
    state text DEFAULT 'reserved'::text NOT NULL,
    reason text DEFAULT ''::text NOT NULL,
    exit_code integer,
    pid integer,
    updated_at timestamp with time zone DEFAULT now() NOT NULL,
    started_at timestamp with time zone,
    ended_at timestamp with time zone,
    released_at timestamp with time zone,
    contact_lost_at timestamp with time zone,
    started_epoch bigint,
    kill_requested_at timestamp with time zone,
    telemetry_token_hash text,
    CONSTRAINT members_pkey PRIMARY KEY (id),
    CONSTRAINT members_attempt_id_rank_key UNIQUE (attempt_id, rank),
    CONSTRAINT members_attempt_id_fkey FOREIGN KEY (attempt_id) REFERENCES tuneplane.attempts(id),
    CONSTRAINT members_job_id_fkey FOREIGN KEY (job_id) REFERENCES tuneplane.jobs(id),
    CONSTRAINT members_node_id_fkey FOREIGN KEY (node_id) REFERENCES tuneplane.nodes(id),
    CONSTRAINT members_cpus_check CHECK (cpus >= 0),
    CONSTRAINT members_memory_bytes_check CHECK (memory_bytes >= 0),
    CONSTRAINT members_rank_check CHECK (rank >= 0),
    CONSTRAINT members_state_check CHECK (state = ANY (ARRAY['reserved'::text, 'preparing'::text, 'prepared'::text, 'starting'::text, 'running'::text, 'stopping'::text, 'exited'::text, 'failed'::text, 'aborted'::text, 'cancelled'::text, 'lost'::text])),
    CONSTRAINT members_telemetry_token_hash_check CHECK (telemetry_token_hash ~ '^[0-9a-f]{64}$'::text)
);
CREATE INDEX members_contact_lost ON tuneplane.members USING btree (node_id) WHERE (contact_lost_at IS NOT NULL);
CREATE INDEX members_job ON tuneplane.members USING btree (job_id, attempt_id);
CREATE INDEX members_node_held ON tuneplane.members USING btree (node_id) WHERE (released_at IS NULL);

CREATE TABLE tuneplane.node_commands (
    id bigint GENERATED ALWAYS AS IDENTITY NOT NULL,
    node_id bigint NOT NULL,
    kind text NOT NULL,
    payload jsonb DEFAULT '{}'::jsonb NOT NULL,
    created_at timestamp with time zone DEFAULT clock_timestamp() NOT NULL,
    created_by text NOT NULL,
    claimed_epoch bigint,
    delivered_at timestamp with time zone,
    delivery_count integer DEFAULT 0 NOT NULL,
    acked_at timestamp with time zone,
    result jsonb,
    error text,
    CONSTRAINT node_commands_pkey PRIMARY KEY (id),
    CONSTRAINT node_commands_node_id_fkey FOREIGN KEY (node_id) REFERENCES tuneplane.nodes(id),
    CONSTRAINT node_commands_kind_check CHECK (kind ~ '^[a-z][a-z0-9_.-]{0,62}$'::text)
);
CREATE INDEX node_commands_pending ON tuneplane.node_commands USING btree (node_id, id) WHERE (acked_at IS NULL);

CREATE TABLE tuneplane.node_credentials (
    id bigint GENERATED ALWAYS AS IDENTITY NOT NULL,
    node_id bigint NOT NULL,
    credential_hash text NOT NULL,
    issued_at timestamp with time zone DEFAULT now() NOT NULL,
    first_used_at timestamp with time zone,
    superseded_at timestamp with time zone,
    grace_until timestamp with time zone,
    revoked_at timestamp with time zone,
    revoked_reason text,
    CONSTRAINT node_credentials_pkey PRIMARY KEY (id),
    CONSTRAINT node_credentials_credential_hash_key UNIQUE (credential_hash),
    CONSTRAINT node_credentials_node_id_fkey FOREIGN KEY (node_id) REFERENCES tuneplane.nodes(id),
    CONSTRAINT node_credentials_credential_hash_check CHECK (credential_hash ~ '^[0-9a-f]{64}$'::text)
);
CREATE INDEX node_credentials_node ON tuneplane.node_credentials USING btree (node_id, id);

CREATE TABLE tuneplane.node_events (
    id bigint GENERATED ALWAYS AS IDENTITY NOT NULL,
    at timestamp with time zone DEFAULT clock_timestamp() NOT NULL,
    fleet_id bigint,
    node_id bigint,
    kind text NOT NULL,
    actor text NOT NULL,
    reason text DEFAULT ''::text NOT NULL,
    details jsonb DEFAULT '{}'::jsonb NOT NULL,
    CONSTRAINT node_events_pkey PRIMARY KEY (id),
    CONSTRAINT node_events_fleet_id_fkey FOREIGN KEY (fleet_id) REFERENCES tuneplane.fleets(id),
    CONSTRAINT node_events_node_id_fkey FOREIGN KEY (node_id) REFERENCES tuneplane.nodes(id)
);
CREATE INDEX node_events_fleet ON tuneplane.node_events USING btree (fleet_id, id);
CREATE INDEX node_events_node ON tuneplane.node_events USING btree (node_id, id);

CREATE TABLE tuneplane.node_gpus (
    node_id bigint NOT NULL,
    gpu_index integer NOT NULL,
    model text NOT NULL,
    memory_bytes bigint DEFAULT 0 NOT NULL,
    simulated boolean DEFAULT false NOT NULL,
    CONSTRAINT node_gpus_pkey PRIMARY KEY (node_id, gpu_index),
    CONSTRAINT node_gpus_node_id_fkey FOREIGN KEY (node_id) REFERENCES tuneplane.nodes(id) ON DELETE CASCADE,
    CONSTRAINT node_gpus_gpu_index_check CHECK (gpu_index >= 0)
);

CREATE TABLE tuneplane.node_settings (
    singleton boolean DEFAULT true NOT NULL,
    heartbeat_interval interval DEFAULT '00:00:10'::interval NOT NULL,
    stale_after interval DEFAULT '00:00:30'::interval NOT NULL,
    lost_after interval DEFAULT '00:01:30'::interval NOT NULL,
    credential_rotate_after interval DEFAULT '24:00:00'::interval NOT NULL,
    credential_grace interval DEFAULT '00:10:00'::interval NOT NULL,
    enrollment_token_max_ttl interval DEFAULT '30 days'::interval NOT NULL,
    CONSTRAINT node_settings_pkey PRIMARY KEY (singleton),
    CONSTRAINT node_settings_check CHECK (stale_after > heartbeat_interval),
    CONSTRAINT node_settings_check1 CHECK (lost_after > stale_after),
    CONSTRAINT node_settings_credential_grace_check CHECK (credential_grace > '00:00:00'::interval),
    CONSTRAINT node_settings_credential_rotate_after_check CHECK (credential_rotate_after > '00:00:00'::interval),
    CONSTRAINT node_settings_heartbeat_interval_check CHECK (heartbeat_interval > '00:00:00'::interval),
    CONSTRAINT node_settings_singleton_check CHECK (singleton)
);

CREATE TABLE tuneplane.node_usage (
    node_id bigint NOT NULL,
    fleet_id bigint NOT NULL,
    total_gpus integer DEFAULT 0 NOT NULL,
    used_gpus integer DEFAULT 0 NOT NULL,
    used_cpus integer DEFAULT 0 NOT NULL,
    used_memory bigint DEFAULT 0 NOT NULL,
    free_gpus integer GENERATED ALWAYS AS ((total_gpus - used_gpus)) STORED,
    CONSTRAINT node_usage_pkey PRIMARY KEY (node_id),
    CONSTRAINT node_usage_node_id_fkey FOREIGN KEY (node_id) REFERENCES tuneplane.nodes(id) ON DELETE CASCADE,
    CONSTRAINT node_usage_total_gpus_check CHECK (total_gpus >= 0),
    CONSTRAINT node_usage_used_cpus_check CHECK (used_cpus >= 0),
    CONSTRAINT node_usage_used_gpus_check CHECK (used_gpus >= 0),
    CONSTRAINT node_usage_used_memory_check CHECK (used_memory >= 0)
);
CREATE INDEX node_usage_fit ON tuneplane.node_usage USING btree (fleet_id, free_gpus, node_id);

CREATE TABLE tuneplane.nodes (
    id bigint GENERATED ALWAYS AS IDENTITY NOT NULL,
    fleet_id bigint NOT NULL,
    name text NOT NULL,
    scheduling_state text DEFAULT 'active'::text NOT NULL,
    last_heartbeat_at timestamp with time zone,
    cpus integer DEFAULT 0 NOT NULL,
    memory_bytes bigint DEFAULT 0 NOT NULL,
    agent_version text,
    container_runtimes text[] DEFAULT '{}'::text[] NOT NULL,
    address text,
    enrolled_at timestamp with time zone DEFAULT now() NOT NULL,
    session_epoch bigint DEFAULT 0 NOT NULL,
    session_opened_at timestamp with time zone,
    session_closed_at timestamp with time zone,
    hostname text,
    reported_running jsonb DEFAULT '[]'::jsonb NOT NULL,
    connectivity_noted text DEFAULT 'lost'::text NOT NULL,
    fenced_at timestamp with time zone,
    fenced_reason text,
    last_peer_check jsonb,
    last_storage_check jsonb,
    probe_port integer,
    session_reconciled_epoch bigint DEFAULT 0 NOT NULL,
    caches jsonb DEFAULT '{}'::jsonb NOT NULL,
    caches_reported_at timestamp with time zone,
    CONSTRAINT nodes_pkey PRIMARY KEY (id),
    CONSTRAINT nodes_fleet_id_name_key UNIQUE (fleet_id, name),
    CONSTRAINT nodes_fleet_id_fkey FOREIGN KEY (fleet_id) REFERENCES tuneplane.fleets(id),
    CONSTRAINT nodes_cpus_check CHECK (cpus >= 0),
    CONSTRAINT nodes_memory_bytes_check CHECK (memory_bytes >= 0),
    CONSTRAINT nodes_probe_port_check CHECK (probe_port >= 1 AND probe_port <= 65535),
    CONSTRAINT nodes_scheduling_state_check CHECK (scheduling_state = ANY (ARRAY['active'::text, 'cordoned'::text, 'draining'::text, 'retired'::text]))
);

CREATE TABLE tuneplane.preemption_settings (
    singleton boolean DEFAULT true NOT NULL,
    default_grace interval DEFAULT '00:02:00'::interval NOT NULL,
    max_grace interval DEFAULT '00:30:00'::interval NOT NULL,
    min_runtime interval DEFAULT '00:05:00'::interval NOT NULL,
    backoff interval DEFAULT '00:10:00'::interval NOT NULL,
    max_preemptions integer DEFAULT 5 NOT NULL,
    CONSTRAINT preemption_settings_pkey PRIMARY KEY (singleton),
    CONSTRAINT preemption_settings_backoff_check CHECK (backoff >= '00:00:00'::interval),
    CONSTRAINT preemption_settings_default_grace_check CHECK (default_grace >= '00:00:00'::interval),
    CONSTRAINT preemption_settings_max_grace_check CHECK (max_grace >= '00:00:00'::interval),
    CONSTRAINT preemption_settings_max_preemptions_check CHECK (max_preemptions >= 0),
    CONSTRAINT preemption_settings_min_runtime_check CHECK (min_runtime >= '00:00:00'::interval),
    CONSTRAINT preemption_settings_singleton_check CHECK (singleton)
);

CREATE TABLE tuneplane.preemption_victims (
    preemption_id bigint NOT NULL,
    attempt_id bigint NOT NULL,
    job_id bigint NOT NULL,
    priority integer NOT NULL,
    gpus integer NOT NULL,
    expected_lost_gpu_seconds double precision NOT NULL,
    CONSTRAINT preemption_victims_pkey PRIMARY KEY (preemption_id, attempt_id),
    CONSTRAINT preemption_victims_attempt_id_fkey FOREIGN KEY (attempt_id) REFERENCES tuneplane.attempts(id),
    CONSTRAINT preemption_victims_job_id_fkey FOREIGN KEY (job_id) REFERENCES tuneplane.jobs(id),
    CONSTRAINT preemption_victims_preemption_id_fkey FOREIGN KEY (preemption_id) REFERENCES tuneplane.preemptions(id)
);
CREATE INDEX preemption_victims_job ON tuneplane.preemption_victims USING btree (job_id);

CREATE TABLE tuneplane.preemptions (
    id bigint GENERATED ALWAYS AS IDENTITY NOT NULL,
    fleet_id bigint NOT NULL,
    preemptor_job_id bigint,
    rule text NOT NULL,
    state text DEFAULT 'holding'::text NOT NULL,
    held_node_ids bigint[] DEFAULT '{}'::bigint[] NOT NULL,
    reason text NOT NULL,
    numbers jsonb DEFAULT '{}'::jsonb NOT NULL,
    actor text,
    created_at timestamp with time zone DEFAULT now() NOT NULL,
    resolved_at timestamp with time zone,
    CONSTRAINT preemptions_pkey PRIMARY KEY (id),
    CONSTRAINT preemptions_fleet_id_fkey FOREIGN KEY (fleet_id) REFERENCES tuneplane.fleets(id),
    CONSTRAINT preemptions_preemptor_job_id_fkey FOREIGN KEY (preemptor_job_id) REFERENCES tuneplane.jobs(id),
    CONSTRAINT preemptions_check CHECK ((state = 'holding'::text) = (resolved_at IS NULL)),
    CONSTRAINT preemptions_rule_check CHECK (rule = ANY (ARRAY['priority'::text, 'borrowed'::text, 'reclaim'::text, 'admin'::text, 'time_limit'::text, 'idle'::text])),
    CONSTRAINT preemptions_state_check CHECK (state = ANY (ARRAY['holding'::text, 'done'::text, 'dropped'::text]))
);
CREATE INDEX preemptions_holding ON tuneplane.preemptions USING btree (fleet_id) WHERE (state = 'holding'::text);
CREATE INDEX preemptions_preemptor ON tuneplane.preemptions USING btree (preemptor_job_id);

CREATE TABLE tuneplane.previews (
    id uuid DEFAULT gen_random_uuid() NOT NULL,
    owner_id bigint NOT NULL,
    fleet_id bigint NOT NULL,
    spec jsonb NOT NULL,
    resolved jsonb NOT NULL,
    canonical text NOT NULL,
    digest text NOT NULL,
    observed jsonb DEFAULT '{}'::jsonb NOT NULL,
    created_at timestamp with time zone DEFAULT now() NOT NULL,
    expires_at timestamp with time zone NOT NULL,
    team_id bigint,
    CONSTRAINT previews_pkey PRIMARY KEY (id),
    CONSTRAINT previews_owner_id_fkey FOREIGN KEY (owner_id) REFERENCES tuneplane.users(id),
    CONSTRAINT previews_check CHECK (expires_at >= created_at),
    CONSTRAINT previews_digest_check CHECK (digest ~ '^[0-9a-f]{64}$'::text)
);
CREATE INDEX previews_owner ON tuneplane.previews USING btree (owner_id, created_at DESC);

CREATE TABLE tuneplane.priority_classes (
    name text NOT NULL,
    value integer NOT NULL,
    preemptible_by_default boolean NOT NULL,
    scavenger boolean DEFAULT false NOT NULL,
    CONSTRAINT priority_classes_pkey PRIMARY KEY (name),
    CONSTRAINT priority_classes_value_key UNIQUE (value),
    CONSTRAINT priority_classes_name_check CHECK (name ~ '^[a-z][a-z0-9_-]{0,31}$'::text),
    CONSTRAINT priority_classes_value_check CHECK (value >= '-1000'::integer AND value <= 1000)
);

CREATE TABLE tuneplane.schema_components (
    name text NOT NULL,
    version text NOT NULL,
    checksum text NOT NULL,
    applied_at timestamp with time zone DEFAULT now() NOT NULL,
    CONSTRAINT schema_components_pkey PRIMARY KEY (name)
);

CREATE TABLE tuneplane.schema_migrations (
    version integer NOT NULL,
    name text NOT NULL,
    checksum text NOT NULL,
    applied_at timestamp with time zone DEFAULT now() NOT NULL,
    CONSTRAINT schema_migrations_pkey PRIMARY KEY (version)
);

CREATE TABLE tuneplane.schema_repeatables (
    name text NOT NULL,
    checksum text NOT NULL,
    applied_at timestamp with time zone DEFAULT now() NOT NULL,
    CONSTRAINT schema_repeatables_pkey PRIMARY KEY (name)
);

CREATE TABLE tuneplane.server_secrets (
    name text NOT NULL,
    value text NOT NULL,
    created_at timestamp with time zone DEFAULT now() NOT NULL,
    CONSTRAINT server_secrets_pkey PRIMARY KEY (name)
);

CREATE TABLE tuneplane.slurm_fleets (
    fleet_id bigint NOT NULL,
    slurm_conf text,
    partition text NOT NULL,
    account text,
    qos text,
    version text,
    reachable boolean DEFAULT false NOT NULL,
    last_error text,
    checked_at timestamp with time zone,
    reached_at timestamp with time zone,
    max_nodes integer,
    max_time_minutes integer,
    CONSTRAINT slurm_fleets_pkey PRIMARY KEY (fleet_id),
    CONSTRAINT slurm_fleets_fleet_id_fkey FOREIGN KEY (fleet_id) REFERENCES tuneplane.fleets(id),
    CONSTRAINT slurm_fleets_account_check CHECK (account ~ '^[A-Za-z0-9_.-]{1,64}$'::text),
    CONSTRAINT slurm_fleets_partition_check CHECK (partition ~ '^[A-Za-z0-9_.-]{1,64}$'::text),
    CONSTRAINT slurm_fleets_qos_check CHECK (qos ~ '^[A-Za-z0-9_.-]{1,64}$'::text)
);

CREATE TABLE tuneplane.slurm_jobs (
    attempt_id bigint NOT NULL,
    job_id bigint NOT NULL,
    fleet_id bigint NOT NULL,
    slurm_job_id bigint,
    slurm_state text,
    slurm_reason text,
    jobs_ahead integer,
    node_list text[],
    submitted_at timestamp with time zone,
    started_at timestamp with time zone,
    scancel_at timestamp with time zone,
    gone_at timestamp with time zone,
    created_at timestamp with time zone DEFAULT now() NOT NULL,
    preempt_signalled_at timestamp with time zone,
    CONSTRAINT slurm_jobs_pkey PRIMARY KEY (attempt_id),
    CONSTRAINT slurm_jobs_attempt_id_fkey FOREIGN KEY (attempt_id) REFERENCES tuneplane.attempts(id),
    CONSTRAINT slurm_jobs_fleet_id_fkey FOREIGN KEY (fleet_id) REFERENCES tuneplane.fleets(id),
    CONSTRAINT slurm_jobs_job_id_fkey FOREIGN KEY (job_id) REFERENCES tuneplane.jobs(id)
);
CREATE INDEX slurm_jobs_followed ON tuneplane.slurm_jobs USING btree (fleet_id) WHERE (gone_at IS NULL);
CREATE UNIQUE INDEX slurm_jobs_slurm_id ON tuneplane.slurm_jobs USING btree (fleet_id, slurm_job_id);

CREATE TABLE tuneplane.slurm_nodes (
    node_id bigint NOT NULL,
    slurm_state text NOT NULL,
    reason text,
    updated_at timestamp with time zone DEFAULT now() NOT NULL,
    CONSTRAINT slurm_nodes_pkey PRIMARY KEY (node_id),
    CONSTRAINT slurm_nodes_node_id_fkey FOREIGN KEY (node_id) REFERENCES tuneplane.nodes(id) ON DELETE CASCADE
);

CREATE TABLE tuneplane.source_archive_uploads (
    sha256 text NOT NULL,
    user_id bigint NOT NULL,
    first_uploaded_at timestamp with time zone DEFAULT now() NOT NULL,
    CONSTRAINT source_archive_uploads_pkey PRIMARY KEY (user_id, sha256),
    CONSTRAINT source_archive_uploads_sha256_fkey FOREIGN KEY (sha256) REFERENCES tuneplane.source_archives(sha256),
    CONSTRAINT source_archive_uploads_user_id_fkey FOREIGN KEY (user_id) REFERENCES tuneplane.users(id)
);

CREATE TABLE tuneplane.source_archives (
    sha256 text NOT NULL,
    size_bytes bigint NOT NULL,
    member_count integer NOT NULL,
    unpacked_bytes bigint NOT NULL,
    created_at timestamp with time zone DEFAULT now() NOT NULL,
    CONSTRAINT source_archives_pkey PRIMARY KEY (sha256),
    CONSTRAINT source_archives_member_count_check CHECK (member_count >= 0),
    CONSTRAINT source_archives_sha256_check CHECK (sha256 ~ '^[0-9a-f]{64}$'::text),
    CONSTRAINT source_archives_size_bytes_check CHECK (size_bytes > 0),
    CONSTRAINT source_archives_unpacked_bytes_check CHECK (unpacked_bytes >= 0)
);

CREATE TABLE tuneplane.state_transitions (
    entity text NOT NULL,
    from_state text NOT NULL,
    to_state text NOT NULL,
    writers text[] NOT NULL,
    CONSTRAINT state_transitions_pkey PRIMARY KEY (entity, from_state, to_state),
    CONSTRAINT state_transitions_entity_check CHECK (entity = ANY (ARRAY['job'::text, 'attempt'::text, 'member'::text]))
);

CREATE TABLE tuneplane.submission_settings (
    name text NOT NULL,
    value bigint NOT NULL,
    description text NOT NULL,
    CONSTRAINT submission_settings_pkey PRIMARY KEY (name),
    CONSTRAINT submission_settings_value_check CHECK (value >= 0)
);

CREATE TABLE tuneplane.team_event_attempts (
    delivery_id bigint NOT NULL,
    attempt integer NOT NULL,
    at timestamp with time zone DEFAULT clock_timestamp() NOT NULL,
    status integer,
    error text,
    duration_ms integer,
    CONSTRAINT team_event_attempts_pkey PRIMARY KEY (delivery_id, attempt),
    CONSTRAINT team_event_attempts_delivery_id_fkey FOREIGN KEY (delivery_id) REFERENCES tuneplane.team_event_deliveries(id) ON DELETE CASCADE,
    CONSTRAINT team_event_attempts_attempt_check CHECK (attempt >= 1),
    CONSTRAINT team_event_attempts_duration_ms_check CHECK (duration_ms >= 0)
);

CREATE TABLE tuneplane.team_event_deliveries (
    id bigint GENERATED ALWAYS AS IDENTITY NOT NULL,
    event_id uuid NOT NULL,
    webhook_id bigint NOT NULL,
    team_id bigint NOT NULL,
    job_id bigint,
    kind text NOT NULL,
    body jsonb NOT NULL,
    created_at timestamp with time zone DEFAULT clock_timestamp() NOT NULL,
    state text DEFAULT 'pending'::text NOT NULL,
    attempts integer DEFAULT 0 NOT NULL,
    next_attempt_at timestamp with time zone DEFAULT clock_timestamp() NOT NULL,
    claimed_by text,
    claimed_until timestamp with time zone,
    delivered_at timestamp with time zone,
    last_status integer,
    last_error text,
    CONSTRAINT team_event_deliveries_pkey PRIMARY KEY (id),
    CONSTRAINT team_event_deliveries_event_id_webhook_id_key UNIQUE (event_id, webhook_id),
    CONSTRAINT team_event_deliveries_team_id_fkey FOREIGN KEY (team_id) REFERENCES tuneplane.teams(id),
    CONSTRAINT team_event_deliveries_webhook_id_fkey FOREIGN KEY (webhook_id) REFERENCES tuneplane.team_webhooks(id),
    CONSTRAINT team_event_delivered_at CHECK ((state = 'delivered'::text) = (delivered_at IS NOT NULL)),
    CONSTRAINT team_event_deliveries_attempts_check CHECK (attempts >= 0),
    CONSTRAINT team_event_deliveries_kind_check CHECK (kind ~ '^[a-z]+\.[a-z_]{1,60}$'::text),
    CONSTRAINT team_event_deliveries_state_check CHECK (state = ANY (ARRAY['pending'::text, 'delivered'::text, 'gave_up'::text]))
);
CREATE INDEX team_event_deliveries_due ON tuneplane.team_event_deliveries USING btree (next_attempt_at) WHERE (state = 'pending'::text);
CREATE INDEX team_event_deliveries_ended ON tuneplane.team_event_deliveries USING btree (created_at) WHERE (state <> 'pending'::text);
CREATE INDEX team_event_deliveries_team ON tuneplane.team_event_deliveries USING btree (team_id, id DESC);

CREATE TABLE tuneplane.team_fleet_held (
    fleet_id bigint NOT NULL,
    team_id bigint NOT NULL,
    gpus integer NOT NULL,
    members integer NOT NULL,
    CONSTRAINT team_fleet_held_pkey PRIMARY KEY (fleet_id, team_id),
    CONSTRAINT team_fleet_held_fleet_id_fkey FOREIGN KEY (fleet_id) REFERENCES tuneplane.fleets(id),
    CONSTRAINT team_fleet_held_team_id_fkey FOREIGN KEY (team_id) REFERENCES tuneplane.teams(id),
    CONSTRAINT team_fleet_held_gpus_check CHECK (gpus >= 0),
    CONSTRAINT team_fleet_held_members_check CHECK (members >= 0)
);

CREATE TABLE tuneplane.team_fleet_held_built (
    fleet_id bigint NOT NULL,
    built_at timestamp with time zone DEFAULT now() NOT NULL,
    CONSTRAINT team_fleet_held_built_pkey PRIMARY KEY (fleet_id),
    CONSTRAINT team_fleet_held_built_fleet_id_fkey FOREIGN KEY (fleet_id) REFERENCES tuneplane.fleets(id)
);

CREATE TABLE tuneplane.team_fleet_held_changes (
    id bigint GENERATED ALWAYS AS IDENTITY NOT NULL,
    fleet_id bigint NOT NULL,
    team_id bigint NOT NULL,
    gpus integer NOT NULL,
    members integer NOT NULL,
    CONSTRAINT team_fleet_held_changes_pkey PRIMARY KEY (id)
);
CREATE INDEX team_fleet_held_changes_fleet ON tuneplane.team_fleet_held_changes USING btree (fleet_id);

CREATE TABLE tuneplane.team_fleet_usage (
    team_id bigint NOT NULL,
    fleet_id bigint NOT NULL,
    decayed_gpu_secs double precision DEFAULT 0 NOT NULL,
    decayed_at timestamp with time zone DEFAULT now() NOT NULL,
    CONSTRAINT team_fleet_usage_pkey PRIMARY KEY (fleet_id, team_id),
    CONSTRAINT team_fleet_usage_fleet_id_fkey FOREIGN KEY (fleet_id) REFERENCES tuneplane.fleets(id),
    CONSTRAINT team_fleet_usage_team_id_fkey FOREIGN KEY (team_id) REFERENCES tuneplane.teams(id),
    CONSTRAINT team_fleet_usage_decayed_gpu_secs_check CHECK (decayed_gpu_secs >= 0::double precision)
);

CREATE TABLE tuneplane.team_members (
    team_id bigint NOT NULL,
    user_id bigint NOT NULL,
    role text NOT NULL,
    added_at timestamp with time zone DEFAULT now() NOT NULL,
    added_by bigint,
    CONSTRAINT team_members_pkey PRIMARY KEY (team_id, user_id),
    CONSTRAINT team_members_added_by_fkey FOREIGN KEY (added_by) REFERENCES tuneplane.users(id),
    CONSTRAINT team_members_team_id_fkey FOREIGN KEY (team_id) REFERENCES tuneplane.teams(id),
    CONSTRAINT team_members_user_id_fkey FOREIGN KEY (user_id) REFERENCES tuneplane.users(id),
    CONSTRAINT team_members_role_check CHECK (role = ANY (ARRAY['admin'::text, 'member'::text, 'viewer'::text]))
);
CREATE INDEX team_members_user ON tuneplane.team_members USING btree (user_id, team_id);

CREATE TABLE tuneplane.team_priority_grants (
    team_id bigint NOT NULL,
    fleet_id bigint,
    max_class text NOT NULL,
    granted_by bigint,
    granted_at timestamp with time zone DEFAULT now() NOT NULL,
    CONSTRAINT team_priority_grants_fleet_id_fkey FOREIGN KEY (fleet_id) REFERENCES tuneplane.fleets(id) ON DELETE CASCADE,
    CONSTRAINT team_priority_grants_granted_by_fkey FOREIGN KEY (granted_by) REFERENCES tuneplane.users(id),
    CONSTRAINT team_priority_grants_max_class_fkey FOREIGN KEY (max_class) REFERENCES tuneplane.priority_classes(name) ON UPDATE CASCADE,
    CONSTRAINT team_priority_grants_team_id_fkey FOREIGN KEY (team_id) REFERENCES tuneplane.teams(id) ON DELETE CASCADE
);
CREATE UNIQUE INDEX team_priority_grants_team_fleet ON tuneplane.team_priority_grants USING btree (team_id, COALESCE(fleet_id, (0)::bigint));

CREATE TABLE tuneplane.team_quotas (
    team_id bigint NOT NULL,
    fleet_id bigint NOT NULL,
    gpu_model text DEFAULT ''::text NOT NULL,
    guaranteed_gpus integer DEFAULT 0 NOT NULL,
    limit_gpus integer,
    weight double precision DEFAULT 1 NOT NULL,
    overcommit boolean DEFAULT false NOT NULL,
    updated_at timestamp with time zone DEFAULT now() NOT NULL,
    updated_by bigint,
    CONSTRAINT team_quotas_pkey PRIMARY KEY (team_id, fleet_id, gpu_model),
    CONSTRAINT team_quotas_fleet_id_fkey FOREIGN KEY (fleet_id) REFERENCES tuneplane.fleets(id),
    CONSTRAINT team_quotas_team_id_fkey FOREIGN KEY (team_id) REFERENCES tuneplane.teams(id),
    CONSTRAINT team_quotas_updated_by_fkey FOREIGN KEY (updated_by) REFERENCES tuneplane.users(id),
    CONSTRAINT team_quotas_check CHECK (limit_gpus >= guaranteed_gpus),
    CONSTRAINT team_quotas_gpu_model_check CHECK (length(gpu_model) <= 200),
    CONSTRAINT team_quotas_guaranteed_gpus_check CHECK (guaranteed_gpus >= 0),
    CONSTRAINT team_quotas_weight_check CHECK (weight > 0::double precision AND weight <= 1000000::double precision)
);
CREATE INDEX team_quotas_fleet ON tuneplane.team_quotas USING btree (fleet_id);

CREATE TABLE tuneplane.team_webhooks (
    id bigint GENERATED ALWAYS AS IDENTITY NOT NULL,
    team_id bigint NOT NULL,
    url text NOT NULL,
    secret text NOT NULL,
    kinds text[],
    created_at timestamp with time zone DEFAULT now() NOT NULL,
    created_by bigint,
    removed_at timestamp with time zone,
    CONSTRAINT team_webhooks_pkey PRIMARY KEY (id),
    CONSTRAINT team_webhooks_created_by_fkey FOREIGN KEY (created_by) REFERENCES tuneplane.users(id),
    CONSTRAINT team_webhooks_team_id_fkey FOREIGN KEY (team_id) REFERENCES tuneplane.teams(id),
    CONSTRAINT team_webhooks_kinds_check CHECK (kinds IS NULL OR cardinality(kinds) > 0),
    CONSTRAINT team_webhooks_secret_check CHECK (length(secret) >= 16 AND length(secret) <= 200),
    CONSTRAINT team_webhooks_url_check CHECK (length(url) <= 2000 AND (url ~ '^https://[^/?#\s]+([/?#]\S*)?$'::text OR url ~ '^http://(localhost|127\.[0-9]{1,3}\.[0-9]{1,3}\.[0-9]{1,3}|\[::1\])(:[0-9]{1,5})?([/?#]\S*)?$'::text))
);
CREATE INDEX team_webhooks_team ON tuneplane.team_webhooks USING btree (team_id) WHERE (removed_at IS NULL);

CREATE TABLE tuneplane.teams (
    id bigint GENERATED ALWAYS AS IDENTITY NOT NULL,
    name text NOT NULL,
    personal_of bigint,
    created_at timestamp with time zone DEFAULT now() NOT NULL,
    created_by bigint,
    CONSTRAINT teams_pkey PRIMARY KEY (id),
    CONSTRAINT teams_name_key UNIQUE (name),
    CONSTRAINT teams_personal_of_key UNIQUE (personal_of),
    CONSTRAINT teams_created_by_fkey FOREIGN KEY (created_by) REFERENCES tuneplane.users(id),
    CONSTRAINT teams_personal_of_fkey FOREIGN KEY (personal_of) REFERENCES tuneplane.users(id),
    CONSTRAINT teams_name_check CHECK (name ~ '^[a-z0-9][a-z0-9_.-]{1,62}$'::text)
);

CREATE TABLE tuneplane.telemetry_batches (
    collector_id text NOT NULL,
    seq bigint NOT NULL,
    token_id bigint NOT NULL,
    digest text NOT NULL,
    points integer NOT NULL,
    received_at timestamp with time zone DEFAULT now() NOT NULL,
    job_id bigint NOT NULL,
    attempt integer NOT NULL,
    member_rank integer NOT NULL,
    CONSTRAINT telemetry_batches_pkey PRIMARY KEY (job_id, attempt, member_rank, collector_id, seq)
);
CREATE INDEX telemetry_batches_received ON tuneplane.telemetry_batches USING btree (received_at);

CREATE TABLE tuneplane.telemetry_canonical_rules (
    priority integer NOT NULL,
    pattern text NOT NULL,
    canonical text NOT NULL,
    CONSTRAINT telemetry_canonical_rules_pkey PRIMARY KEY (priority),
    CONSTRAINT telemetry_canonical_rules_canonical_check CHECK (canonical = ANY (ARRAY['loss'::text, 'eval_loss'::text, 'learning_rate'::text, 'throughput'::text, 'grad_norm'::text, 'gpu_utilization'::text, 'gpu_memory'::text, 'gpu_power'::text, 'cpu_utilization'::text, 'memory_rss'::text]))
);

CREATE TABLE tuneplane.telemetry_collectors (
    collector_id text NOT NULL,
    job_id bigint NOT NULL,
    attempt integer NOT NULL,
    member_rank integer NOT NULL,
    batches bigint DEFAULT 0 NOT NULL,
    points bigint DEFAULT 0 NOT NULL,
    duplicates bigint DEFAULT 0 NOT NULL,
    health jsonb DEFAULT '{}'::jsonb NOT NULL,
    first_seen_at timestamp with time zone DEFAULT now() NOT NULL,
    last_batch_at timestamp with time zone,
    CONSTRAINT telemetry_collectors_pkey PRIMARY KEY (job_id, attempt, member_rank, collector_id)
);

CREATE TABLE tuneplane.telemetry_damage (
    id bigint GENERATED ALWAYS AS IDENTITY NOT NULL,
    job_id bigint NOT NULL,
    attempt integer NOT NULL,
    member_rank integer NOT NULL,
    source text NOT NULL,
    file text NOT NULL,
    file_offset bigint NOT NULL,
    bytes bigint NOT NULL,
    reason text NOT NULL,
    recorded_at timestamp with time zone DEFAULT now() NOT NULL,
    CONSTRAINT telemetry_damage_pkey PRIMARY KEY (id),
    CONSTRAINT telemetry_damage_job_id_attempt_member_rank_file_file_offse_key UNIQUE (job_id, attempt, member_rank, file, file_offset),
    CONSTRAINT telemetry_damage_bytes_check CHECK (bytes > 0),
    CONSTRAINT telemetry_damage_file_offset_check CHECK (file_offset >= 0)
);

CREATE TABLE tuneplane.telemetry_members (
    job_id bigint NOT NULL,
    attempt integer NOT NULL,
    member_rank integer NOT NULL,
    state text DEFAULT 'collecting'::text NOT NULL,
    reason text DEFAULT ''::text NOT NULL,
    series integer DEFAULT 0 NOT NULL,
    refused_points bigint DEFAULT 0 NOT NULL,
    damaged_regions bigint DEFAULT 0 NOT NULL,
    member_ended_at timestamp with time zone,
    finished_at timestamp with time zone,
    updated_at timestamp with time zone DEFAULT now() NOT NULL,
    CONSTRAINT telemetry_members_pkey PRIMARY KEY (job_id, attempt, member_rank),
    CONSTRAINT telemetry_members_state_check CHECK (state = ANY (ARRAY['collecting'::text, 'complete'::text, 'incomplete'::text]))
);

CREATE TABLE tuneplane.telemetry_points (
    series_id bigint NOT NULL,
    step bigint NOT NULL,
    value double precision NOT NULL,
    wall_time double precision NOT NULL
);
CREATE INDEX telemetry_points_series_step ON tuneplane.telemetry_points USING btree (series_id, step);

CREATE TABLE tuneplane.telemetry_refusals (
    job_id bigint NOT NULL,
    attempt integer NOT NULL,
    member_rank integer NOT NULL,
    source text NOT NULL,
    name text NOT NULL,
    reason text NOT NULL,
    count bigint NOT NULL,
    first_at timestamp with time zone DEFAULT now() NOT NULL,
    last_at timestamp with time zone DEFAULT now() NOT NULL,
    CONSTRAINT telemetry_refusals_pkey PRIMARY KEY (job_id, attempt, member_rank, source, name, reason),
    CONSTRAINT telemetry_refusals_count_check CHECK (count > 0)
);

CREATE TABLE tuneplane.telemetry_rollups (
    series_id bigint NOT NULL,
    width integer NOT NULL,
    bucket bigint NOT NULL,
    n bigint NOT NULL,
    sum double precision NOT NULL,
    min double precision,
    max double precision,
    first_step bigint NOT NULL,
    last_step bigint NOT NULL,
    last_value double precision NOT NULL,
    last_wall double precision,
    CONSTRAINT telemetry_rollups_pkey PRIMARY KEY (series_id, width, bucket)
);

CREATE TABLE tuneplane.telemetry_series (
    id bigint GENERATED ALWAYS AS IDENTITY NOT NULL,
    job_id bigint NOT NULL,
    attempt integer NOT NULL,
    member_rank integer NOT NULL,
    source text NOT NULL,
    name text NOT NULL,
    canonical text,
    point_count bigint DEFAULT 0 NOT NULL,
    min_step bigint,
    max_step bigint,
    last_step bigint,
    last_value double precision,
    created_at timestamp with time zone DEFAULT now() NOT NULL,
    last_at timestamp with time zone,
    CONSTRAINT telemetry_series_pkey PRIMARY KEY (id),
    CONSTRAINT telemetry_series_job_id_attempt_member_rank_source_name_key UNIQUE (job_id, attempt, member_rank, source, name)
);
CREATE INDEX telemetry_series_canonical ON tuneplane.telemetry_series USING btree (job_id, canonical);
CREATE INDEX telemetry_series_last_at ON tuneplane.telemetry_series USING btree (last_at);

CREATE TABLE tuneplane.telemetry_settings (
    singleton boolean DEFAULT true NOT NULL,
    retention interval DEFAULT '180 days'::interval NOT NULL,
    token_ttl interval DEFAULT '30 days'::interval NOT NULL,
    max_batch_points integer DEFAULT 200000 NOT NULL,
    drain_grace interval DEFAULT '00:02:00'::interval NOT NULL,
    max_series_per_member integer DEFAULT 2000 NOT NULL,
    CONSTRAINT telemetry_settings_pkey PRIMARY KEY (singleton),
    CONSTRAINT telemetry_settings_drain_grace_check CHECK (drain_grace >= '00:00:00'::interval),
    CONSTRAINT telemetry_settings_max_batch_points_check CHECK (max_batch_points > 0),
    CONSTRAINT telemetry_settings_max_series_per_member_check CHECK (max_series_per_member > 0),
    CONSTRAINT telemetry_settings_retention_check CHECK (retention > '00:00:00'::interval),
    CONSTRAINT telemetry_settings_singleton_check CHECK (singleton),
    CONSTRAINT telemetry_settings_token_ttl_check CHECK (token_ttl > '00:00:00'::interval)
);

CREATE TABLE tuneplane.telemetry_tokens (
    id bigint GENERATED ALWAYS AS IDENTITY NOT NULL,
    token_hash text NOT NULL,
    job_id bigint NOT NULL,
    attempt integer NOT NULL,
    member_rank integer NOT NULL,
    created_at timestamp with time zone DEFAULT now() NOT NULL,
    expires_at timestamp with time zone NOT NULL,
    revoked_at timestamp with time zone,
    CONSTRAINT telemetry_tokens_pkey PRIMARY KEY (id),
    CONSTRAINT telemetry_tokens_token_hash_key UNIQUE (token_hash),
    CONSTRAINT telemetry_tokens_attempt_check CHECK (attempt >= 1),
    CONSTRAINT telemetry_tokens_member_rank_check CHECK (member_rank >= 0),
    CONSTRAINT telemetry_tokens_token_hash_check CHECK (token_hash ~ '^[0-9a-f]{64}$'::text)
);
CREATE INDEX telemetry_tokens_scope ON tuneplane.telemetry_tokens USING btree (job_id, attempt, member_rank);

CREATE TABLE tuneplane.usage_ledger (
    member_id bigint NOT NULL,
    job_id bigint NOT NULL,
    attempt_id bigint NOT NULL,
    attempt integer NOT NULL,
    rank integer NOT NULL,
    team_id bigint NOT NULL,
    user_id bigint NOT NULL,
    fleet_id bigint NOT NULL,
    node_id bigint NOT NULL,
    node_name text NOT NULL,
    gpu_model text,
    gpus integer NOT NULL,
    cpus integer NOT NULL,
    memory_bytes bigint NOT NULL,
    started_at timestamp with time zone NOT NULL,
    ended_at timestamp with time zone,
    ended_how text,
    end_reason text,
    gpu_seconds numeric GENERATED ALWAYS AS (((gpus)::numeric * EXTRACT(epoch FROM (ended_at - started_at)))) STORED,
    lost_gpu_seconds numeric DEFAULT 0 NOT NULL,
    idle_gpu_seconds numeric DEFAULT 0 NOT NULL,
    charge_factor numeric DEFAULT 1 NOT NULL,
    CONSTRAINT usage_ledger_pkey PRIMARY KEY (member_id),
    CONSTRAINT usage_ledger_fleet_id_fkey FOREIGN KEY (fleet_id) REFERENCES tuneplane.fleets(id),
    CONSTRAINT usage_ledger_team_id_fkey FOREIGN KEY (team_id) REFERENCES tuneplane.teams(id),
    CONSTRAINT usage_ledger_user_id_fkey FOREIGN KEY (user_id) REFERENCES tuneplane.users(id),
    CONSTRAINT usage_ledger_attempt_check CHECK (attempt >= 1),
    CONSTRAINT usage_ledger_charge_factor_check CHECK (charge_factor >= 0::numeric),
    CONSTRAINT usage_ledger_cpus_check CHECK (cpus >= 0),
    CONSTRAINT usage_ledger_ended_together CHECK ((ended_at IS NULL) = (ended_how IS NULL)),
    CONSTRAINT usage_ledger_ends_after_start CHECK (ended_at >= started_at),
    CONSTRAINT usage_ledger_gpus_check CHECK (gpus >= 0),
    CONSTRAINT usage_ledger_idle_gpu_seconds_check CHECK (idle_gpu_seconds >= 0::numeric),
    CONSTRAINT usage_ledger_lost_gpu_seconds_check CHECK (lost_gpu_seconds >= 0::numeric),
    CONSTRAINT usage_ledger_memory_bytes_check CHECK (memory_bytes >= 0),
    CONSTRAINT usage_ledger_rank_check CHECK (rank >= 0)
);
CREATE INDEX usage_ledger_job ON tuneplane.usage_ledger USING btree (job_id);
CREATE INDEX usage_ledger_open ON tuneplane.usage_ledger USING btree (fleet_id) WHERE (ended_at IS NULL);
CREATE INDEX usage_ledger_started ON tuneplane.usage_ledger USING btree (started_at);
CREATE INDEX usage_ledger_team ON tuneplane.usage_ledger USING btree (team_id, started_at);

CREATE TABLE tuneplane.usage_prices (
    id bigint GENERATED ALWAYS AS IDENTITY NOT NULL,
    fleet_id bigint NOT NULL,
    gpu_model text,
    price_per_gpu_hour numeric NOT NULL,
    currency text DEFAULT 'USD'::text NOT NULL,
    updated_at timestamp with time zone DEFAULT now() NOT NULL,
    CONSTRAINT usage_prices_pkey PRIMARY KEY (id),
    CONSTRAINT usage_prices_fleet_id_fkey FOREIGN KEY (fleet_id) REFERENCES tuneplane.fleets(id),
    CONSTRAINT usage_prices_currency_check CHECK (currency ~ '^[A-Z]{3}$'::text),
    CONSTRAINT usage_prices_gpu_model_check CHECK (gpu_model <> ''::text),
    CONSTRAINT usage_prices_price_per_gpu_hour_check CHECK (price_per_gpu_hour >= 0::numeric)
);
CREATE UNIQUE INDEX usage_prices_one ON tuneplane.usage_prices USING btree (fleet_id, COALESCE(gpu_model, ''::text));

CREATE TABLE tuneplane.user_limits (
    user_id bigint NOT NULL,
    max_gpus_per_job integer,
    max_nodes_per_job integer,
    updated_at timestamp with time zone DEFAULT now() NOT NULL,
    CONSTRAINT user_limits_pkey PRIMARY KEY (user_id),
    CONSTRAINT user_limits_user_id_fkey FOREIGN KEY (user_id) REFERENCES tuneplane.users(id),
    CONSTRAINT user_limits_max_gpus_per_job_check CHECK (max_gpus_per_job >= 0),
    CONSTRAINT user_limits_max_nodes_per_job_check CHECK (max_nodes_per_job >= 1)
);

CREATE TABLE tuneplane.users (
    id bigint GENERATED ALWAYS AS IDENTITY NOT NULL,
    username text NOT NULL,
    password_hash text,
    role text NOT NULL,
    created_at timestamp with time zone DEFAULT now() NOT NULL,
    disabled_at timestamp with time zone,
    default_team_id bigint,
    CONSTRAINT users_pkey PRIMARY KEY (id),
    CONSTRAINT users_username_key UNIQUE (username),
    CONSTRAINT users_default_team_id_fkey FOREIGN KEY (default_team_id) REFERENCES tuneplane.teams(id),
    CONSTRAINT users_role_check CHECK (role = ANY (ARRAY['admin'::text, 'user'::text]))
);

CREATE TABLE tuneplane.webhook_settings (
    singleton boolean DEFAULT true NOT NULL,
    backoff_base interval DEFAULT '00:00:05'::interval NOT NULL,
    backoff_max interval DEFAULT '01:00:00'::interval NOT NULL,
    max_attempts integer DEFAULT 25 NOT NULL,
    request_timeout interval DEFAULT '00:00:10'::interval NOT NULL,
    keep_for interval DEFAULT '14 days'::interval NOT NULL,
    CONSTRAINT webhook_settings_pkey PRIMARY KEY (singleton),
    CONSTRAINT webhook_settings_backoff_base_check CHECK (backoff_base > '00:00:00'::interval),
    CONSTRAINT webhook_settings_check CHECK (backoff_max >= backoff_base),
    CONSTRAINT webhook_settings_keep_for_check CHECK (keep_for > '00:00:00'::interval),
    CONSTRAINT webhook_settings_max_attempts_check CHECK (max_attempts >= 1 AND max_attempts <= 1000),
    CONSTRAINT webhook_settings_request_timeout_check CHECK (request_timeout > '00:00:00'::interval),
    CONSTRAINT webhook_settings_singleton_check CHECK (singleton)
);

-- Views (defined in sql/functions/)
CREATE VIEW tuneplane.v_artifacts AS
 SELECT a.id,
    a.job_id,
    at.number AS attempt,
    a.rank,
    a.name,
    a.kind,
    a.state,
    a.reason,
    a.delivery,
    a.shared_path,
    a.manifest_digest,
    a.file_count,
    a.total_bytes,
    ( SELECT count(*) AS count
           FROM tuneplane.artifact_files f
          WHERE f.artifact_id = a.id AND f.verified_at IS NOT NULL) AS files_verified,
    ( SELECT count(*) AS count
           FROM tuneplane.artifact_chunks c
          WHERE c.artifact_id = a.id) AS chunks_held,
    a.created_at,
    a.updated_at,
    a.completed_at
   FROM tuneplane.artifacts a
     JOIN tuneplane.attempts at ON at.id = a.attempt_id;

CREATE VIEW tuneplane.v_fleet AS
 SELECT f.id AS fleet_id,
    f.name AS fleet,
    f.backend,
    f.capabilities,
    count(v.node_id) FILTER (WHERE v.scheduling_state <> 'retired'::text)::integer AS nodes,
    count(*) FILTER (WHERE v.connectivity = 'connected'::text AND v.scheduling_state <> 'retired'::text)::integer AS connected,
    count(*) FILTER (WHERE v.connectivity = 'stale'::text AND v.scheduling_state <> 'retired'::text)::integer AS stale,
    count(*) FILTER (WHERE v.connectivity = 'lost'::text AND v.scheduling_state <> 'retired'::text)::integer AS lost,
    count(*) FILTER (WHERE v.scheduling_state = 'active'::text)::integer AS active,
    count(*) FILTER (WHERE v.scheduling_state = 'cordoned'::text)::integer AS cordoned,
    count(*) FILTER (WHERE v.scheduling_state = 'draining'::text)::integer AS draining,
    count(*) FILTER (WHERE v.scheduling_state = 'retired'::text)::integer AS retired,
    COALESCE(sum(v.gpus) FILTER (WHERE v.scheduling_state <> 'retired'::text), 0::bigint)::integer AS gpus,
    COALESCE(sum(v.simulated_gpus) FILTER (WHERE v.scheduling_state <> 'retired'::text), 0::bigint)::integer AS simulated_gpus,
    COALESCE(sum(v.gpus) FILTER (WHERE v.scheduling_state = 'active'::text AND v.connectivity = 'connected'::text AND v.fenced_at IS NULL), 0::bigint)::integer AS schedulable_gpus,
    COALESCE(sum(v.allocated_gpus), 0::bigint)::integer AS allocated_gpus,
    COALESCE(sum(v.cpus) FILTER (WHERE v.scheduling_state <> 'retired'::text), 0::bigint)::integer AS cpus,
    COALESCE(sum(v.memory_bytes) FILTER (WHERE v.scheduling_state <> 'retired'::text), 0::numeric)::bigint AS memory_bytes,
    f.created_at,
    count(*) FILTER (WHERE v.fenced_at IS NOT NULL AND v.scheduling_state <> 'retired'::text)::integer AS fenced,
    f.storage,
    GREATEST(COALESCE(sum(v.gpus) FILTER (WHERE v.scheduling_state = 'active'::text AND v.connectivity = 'connected'::text AND v.fenced_at IS NULL), 0::bigint) - COALESCE(sum(v.allocated_gpus), 0::bigint), 0::bigint)::integer AS free_gpus,
    (( SELECT count(*) AS count
           FROM tuneplane.jobs j
          WHERE j.fleet_id = f.id AND (j.state = ANY (ARRAY['reserved'::text, 'preparing'::text, 'running'::text]))))::integer AS running_jobs,
    (( SELECT count(*) AS count
           FROM tuneplane.jobs j
          WHERE j.fleet_id = f.id AND j.state = 'queued'::text))::integer AS waiting_jobs
   FROM tuneplane.fleets f
     LEFT JOIN tuneplane.v_nodes v ON v.fleet_id = f.id
  GROUP BY f.id;

CREATE VIEW tuneplane.v_idle_jobs AS
 SELECT w.job_id,
    j.state,
    f.name AS fleet,
    w.status,
    w.idle_since,
    w.warned_at,
    w.warning,
    w.deadline,
    w.reclaimed_at,
    w.exempt_reason,
    round(w.idle_gpu_seconds) AS idle_gpu_seconds,
    w.checked_at,
    w.evaluation
   FROM tuneplane.job_idle w
     JOIN tuneplane.jobs j ON j.id = w.job_id
     JOIN tuneplane.fleets f ON f.id = j.fleet_id
  WHERE j.state <> ALL (ARRAY['succeeded'::text, 'failed'::text, 'cancelled'::text]);

CREATE VIEW tuneplane.v_in_grace AS
 SELECT t.job_id,
    t.number AS attempt,
    f.name AS fleet,
    t.stop_kind,
    t.stop_cause,
    t.preempted_by_job_id,
    t.stop_requested_at,
    t.grace_deadline,
    GREATEST(EXTRACT(epoch FROM t.grace_deadline - now()), 0::numeric)::integer AS seconds_left,
    ( SELECT string_agg(DISTINCT n.name, ', '::text) AS string_agg
           FROM tuneplane.members m
             JOIN tuneplane.nodes n ON n.id = m.node_id
          WHERE m.attempt_id = t.id) AS nodes
   FROM tuneplane.attempts t
     JOIN tuneplane.fleets f ON f.id = t.fleet_id
  WHERE t.stop_kind IS NOT NULL AND (t.state = ANY (ARRAY['running'::text, 'stopping'::text]));

CREATE VIEW tuneplane.v_jobs AS
 SELECT j.id,
    j.owner_id,
    u.username AS owner,
    j.preview_id,
    p.digest,
    c.retry_key,
    j.fleet_id,
    f.name AS fleet,
    f.backend,
    j.state,
    j.state_reason,
    j.priority,
    j.nodes,
    j.gpus_per_node,
    j.nodes * j.gpus_per_node AS total_gpus,
    j.cpus_per_node,
    j.memory_per_node,
    j.max_attempts,
    (j.spec -> 'input'::text) ->> 'kind'::text AS input_kind,
        CASE (j.spec -> 'input'::text) ->> 'kind'::text
            WHEN 'recipe'::text THEN 'recipe '::text || ((j.spec -> 'input'::text) ->> 'name'::text)
            WHEN 'source'::text THEN (('source '::text || "left"(((j.spec -> 'input'::text) -> 'archive'::text) ->> 'sha256'::text, 12)) || ': '::text) || ((j.spec -> 'input'::text) ->> 'entrypoint'::text)
            WHEN 'image'::text THEN (((j.spec -> 'input'::text) ->> 'image'::text) || ': '::text) || ((j.spec -> 'input'::text) ->> 'command'::text)
            ELSE NULL::text
        END AS input_summary,
    j.spec,
    j.created_at,
    j.updated_at,
    t.name AS team
   FROM tuneplane.jobs j
     JOIN tuneplane.users u ON u.id = j.owner_id
     JOIN tuneplane.teams t ON t.id = j.team_id
     JOIN tuneplane.fleets f ON f.id = j.fleet_id
     JOIN tuneplane.previews p ON p.id = j.preview_id
     LEFT JOIN tuneplane.confirmations c ON c.job_id = j.id;

CREATE VIEW tuneplane.v_launches AS
 SELECT a.job_id,
    a.number AS attempt,
    a.id AS attempt_id,
    a.state,
    a.reason,
    a.launch_owner,
    a.launch_epoch,
    a.capsule_digest,
    d.decision,
    d.reason AS decision_reason,
    a.prepare_deadline,
    a.created_at,
    a.committed_at,
    a.running_at
   FROM tuneplane.attempts a
     LEFT JOIN tuneplane.launch_decisions d ON d.attempt_id = a.id
  WHERE a.state = ANY (ARRAY['reserved'::text, 'preparing'::text, 'running'::text, 'stopping'::text]);

CREATE VIEW tuneplane.v_node_commands_pending AS
 SELECT c.id,
    f.name AS fleet,
    n.name AS node,
    c.node_id,
    c.kind,
    c.created_at,
    c.created_by,
    c.delivery_count,
    c.delivered_at,
    c.claimed_epoch,
    n.session_epoch,
    round(EXTRACT(epoch FROM now() - c.created_at), 1) AS age_s
   FROM tuneplane.node_commands c
     JOIN tuneplane.nodes n ON n.id = c.node_id
     JOIN tuneplane.fleets f ON f.id = n.fleet_id
  WHERE c.acked_at IS NULL;

CREATE VIEW tuneplane.v_node_events AS
 SELECT e.id,
    e.at,
    f.name AS fleet,
    n.name AS node,
    e.node_id,
    e.kind,
    e.actor,
    e.reason,
    e.details
   FROM tuneplane.node_events e
     LEFT JOIN tuneplane.fleets f ON f.id = e.fleet_id
     LEFT JOIN tuneplane.nodes n ON n.id = e.node_id;

CREATE VIEW tuneplane.v_nodes AS
 SELECT f.name AS fleet,
    n.id AS node_id,
    n.name AS node,
    n.scheduling_state,
    tuneplane.node_connectivity(n.last_heartbeat_at) AS connectivity,
    round(EXTRACT(epoch FROM now() - n.last_heartbeat_at), 1) AS heartbeat_age_s,
    n.last_heartbeat_at,
    n.cpus,
    n.memory_bytes,
    COALESCE(g.gpus, 0) AS gpus,
    COALESCE(g.models, ''::text) AS gpu_models,
    COALESCE(g.gpu_memory_bytes, 0::bigint) AS gpu_memory_bytes,
    COALESCE(g.simulated, 0) AS simulated_gpus,
    a.gpus AS allocated_gpus,
    a.cpus AS allocated_cpus,
    a.memory_bytes AS allocated_memory_bytes,
    n.agent_version,
    n.container_runtimes,
    n.hostname,
    n.address,
    jsonb_array_length(n.reported_running) AS running,
    n.session_epoch,
    n.session_closed_at IS NULL AND n.session_opened_at IS NOT NULL AS session_open,
    n.enrolled_at,
    n.fleet_id,
    n.fenced_at,
    n.fenced_reason,
    n.last_peer_check,
    n.last_storage_check,
    n.caches,
    n.caches_reported_at
   FROM tuneplane.nodes n
     JOIN tuneplane.fleets f ON f.id = n.fleet_id
     LEFT JOIN LATERAL ( SELECT count(*)::integer AS gpus,
            string_agg(DISTINCT gg.model ||
                CASE
                    WHEN gg.simulated THEN ' (simulated)'::text
                    ELSE ''::text
                END, ', '::text) AS models,
            sum(gg.memory_bytes)::bigint AS gpu_memory_bytes,
            count(*) FILTER (WHERE gg.simulated)::integer AS simulated
           FROM tuneplane.node_gpus gg
          WHERE gg.node_id = n.id) g ON true
     CROSS JOIN LATERAL tuneplane.node_allocation(n.id) a(gpus, cpus, memory_bytes);

CREATE VIEW tuneplane.v_queue AS
 WITH admission AS (
         SELECT a_1.job_id,
            a_1.ord
           FROM tuneplane.fleets f_1,
            LATERAL tuneplane.admission_queue(f_1.id) a_1(job_id, ord)
          WHERE tuneplane.fleet_has_quotas(f_1.id)
        )
 SELECT j.id AS job_id,
    f.name AS fleet,
    j.priority,
    row_number() OVER (PARTITION BY j.fleet_id ORDER BY a.ord, j.priority DESC, j.created_at, j.id) AS "position",
    u.username AS owner,
    j.nodes,
    j.gpus_per_node,
    j.cpus_per_node,
    j.memory_per_node,
    j.created_at,
    now() - j.created_at AS waiting,
    j.state_reason,
    t.name AS team,
    row_number() OVER (PARTITION BY j.fleet_id, j.team_id ORDER BY a.ord, j.priority DESC, j.created_at, j.id) AS team_position
   FROM tuneplane.jobs j
     JOIN tuneplane.fleets f ON f.id = j.fleet_id
     JOIN tuneplane.users u ON u.id = j.owner_id
     JOIN tuneplane.teams t ON t.id = j.team_id
     LEFT JOIN admission a ON a.job_id = j.id
  WHERE j.state = 'queued'::text;

CREATE VIEW tuneplane.v_reservations AS
 SELECT m.job_id,
    a.number AS attempt,
    a.state AS attempt_state,
    m.id AS member_id,
    m.rank,
    n.name AS node,
    m.gpu_indices,
    m.cpus,
    m.memory_bytes,
    m.state AS member_state,
    m.reason,
    tuneplane.node_connectivity(n.last_heartbeat_at) AS node_connectivity,
    a.created_at AS reserved_at
   FROM tuneplane.members m
     JOIN tuneplane.attempts a ON a.id = m.attempt_id
     JOIN tuneplane.nodes n ON n.id = m.node_id
  WHERE m.released_at IS NULL;

CREATE VIEW tuneplane.v_telemetry_collectors AS
 SELECT collector_id,
    job_id,
    attempt,
    member_rank,
    batches,
    points,
    duplicates,
    last_batch_at,
    now() - last_batch_at AS silent_for,
    health
   FROM tuneplane.telemetry_collectors c;

CREATE VIEW tuneplane.v_telemetry_series AS
 SELECT id,
    job_id,
    attempt,
    member_rank,
    source,
    name,
    canonical,
    point_count,
    min_step,
    max_step,
    last_value,
    last_at
   FROM tuneplane.telemetry_series s;

CREATE VIEW tuneplane.v_uncertain AS
 SELECT m.job_id,
    a.number AS attempt,
    m.id AS member_id,
    m.rank,
    n.name AS node,
    m.state,
    m.reason,
    n.last_heartbeat_at,
    tuneplane.node_connectivity(n.last_heartbeat_at) AS connectivity,
    m.gpu_indices,
    m.updated_at,
    m.contact_lost_at
   FROM tuneplane.members m
     JOIN tuneplane.attempts a ON a.id = m.attempt_id
     JOIN tuneplane.nodes n ON n.id = m.node_id
  WHERE m.contact_lost_at IS NOT NULL AND m.released_at IS NULL;

CREATE VIEW tuneplane.v_usage AS
 SELECT l.member_id,
    l.job_id,
    l.attempt,
    l.rank,
    t.name AS team,
    u.username AS "user",
    f.name AS fleet,
    l.node_name AS node,
    l.gpu_model,
    l.gpus,
    l.cpus,
    l.started_at,
    l.ended_at,
    l.ended_how,
    l.end_reason,
    COALESCE(l.gpu_seconds, l.gpus::numeric * EXTRACT(epoch FROM now() - l.started_at)) AS gpu_seconds,
    l.ended_at IS NULL AS holding,
    l.lost_gpu_seconds,
    l.idle_gpu_seconds,
    l.charge_factor
   FROM tuneplane.usage_ledger l
     JOIN tuneplane.users u ON u.id = l.user_id
     JOIN tuneplane.fleets f ON f.id = l.fleet_id
     JOIN tuneplane.teams t ON t.id = l.team_id;

-- Triggers (their functions are in sql/functions/)
CREATE TRIGGER artifact_files_guard_change BEFORE DELETE OR UPDATE ON tuneplane.artifact_files FOR EACH ROW EXECUTE FUNCTION tuneplane.artifact_files_guard_change();
CREATE TRIGGER artifact_files_no_truncate BEFORE TRUNCATE ON tuneplane.artifact_files FOR EACH STATEMENT EXECUTE FUNCTION tuneplane.refuse_change();
CREATE TRIGGER artifacts_guard_change BEFORE DELETE OR UPDATE ON tuneplane.artifacts FOR EACH ROW EXECUTE FUNCTION tuneplane.artifacts_guard_change();
CREATE TRIGGER artifacts_no_truncate BEFORE TRUNCATE ON tuneplane.artifacts FOR EACH STATEMENT EXECUTE FUNCTION tuneplane.refuse_change();
CREATE TRIGGER attempts_state_transition BEFORE UPDATE OF state ON tuneplane.attempts FOR EACH ROW EXECUTE FUNCTION tuneplane.guard_state_transition();
CREATE TRIGGER jobs_default_team BEFORE INSERT ON tuneplane.jobs FOR EACH ROW EXECUTE FUNCTION tuneplane.jobs_default_team();
CREATE TRIGGER jobs_event_on_change AFTER UPDATE OF state, state_reason ON tuneplane.jobs FOR EACH ROW WHEN (old.state IS DISTINCT FROM new.state OR old.state_reason IS DISTINCT FROM new.state_reason) EXECUTE FUNCTION tuneplane.jobs_record_event();
CREATE TRIGGER jobs_event_on_insert AFTER INSERT ON tuneplane.jobs FOR EACH ROW EXECUTE FUNCTION tuneplane.jobs_record_event();
CREATE TRIGGER jobs_guard_change BEFORE UPDATE ON tuneplane.jobs FOR EACH ROW EXECUTE FUNCTION tuneplane.jobs_guard_change();
CREATE TRIGGER jobs_idle_watch AFTER UPDATE OF state ON tuneplane.jobs FOR EACH ROW WHEN (old.state IS DISTINCT FROM new.state AND (old.state = 'running'::text OR new.state = 'running'::text)) EXECUTE FUNCTION tuneplane.jobs_idle_watch();
CREATE TRIGGER jobs_state_transition BEFORE UPDATE OF state ON tuneplane.jobs FOR EACH ROW EXECUTE FUNCTION tuneplane.guard_state_transition();
CREATE TRIGGER jobs_team_event AFTER UPDATE OF state ON tuneplane.jobs FOR EACH ROW WHEN (old.state IS DISTINCT FROM new.state) EXECUTE FUNCTION tuneplane.jobs_team_event();
CREATE TRIGGER launch_decisions_immutable BEFORE DELETE OR UPDATE ON tuneplane.launch_decisions FOR EACH ROW EXECUTE FUNCTION tuneplane.refuse_change();
CREATE TRIGGER launch_decisions_no_truncate BEFORE TRUNCATE ON tuneplane.launch_decisions FOR EACH STATEMENT EXECUTE FUNCTION tuneplane.refuse_change();
CREATE TRIGGER artifacts_of_lost_member AFTER UPDATE OF state ON tuneplane.members FOR EACH ROW WHEN (new.state = 'lost'::text AND old.state IS DISTINCT FROM 'lost'::text) EXECUTE FUNCTION tuneplane.artifacts_of_lost_member();
CREATE TRIGGER members_state_transition BEFORE UPDATE OF state ON tuneplane.members FOR EACH ROW EXECUTE FUNCTION tuneplane.guard_state_transition();
CREATE TRIGGER telemetry_member_ended AFTER UPDATE OF state ON tuneplane.members FOR EACH ROW EXECUTE FUNCTION tuneplane.telemetry_member_ended();
CREATE TRIGGER node_usage_on_gpu_delete AFTER DELETE ON tuneplane.node_gpus REFERENCING OLD TABLE AS changed FOR EACH STATEMENT EXECUTE FUNCTION tuneplane.node_usage_follow_gpus();
CREATE TRIGGER node_usage_on_gpu_insert AFTER INSERT ON tuneplane.node_gpus REFERENCING NEW TABLE AS changed FOR EACH STATEMENT EXECUTE FUNCTION tuneplane.node_usage_follow_gpus();
CREATE TRIGGER node_usage_on_node AFTER INSERT ON tuneplane.nodes FOR EACH ROW EXECUTE FUNCTION tuneplane.node_usage_follow_nodes();
CREATE TRIGGER telemetry_node_fenced AFTER UPDATE OF fenced_at ON tuneplane.nodes FOR EACH ROW EXECUTE FUNCTION tuneplane.telemetry_node_fenced();
CREATE TRIGGER previews_immutable BEFORE DELETE OR UPDATE ON tuneplane.previews FOR EACH ROW EXECUTE FUNCTION tuneplane.refuse_change();
CREATE TRIGGER previews_no_truncate BEFORE TRUNCATE ON tuneplane.previews FOR EACH STATEMENT EXECUTE FUNCTION tuneplane.refuse_change();
CREATE TRIGGER users_personal_team AFTER INSERT ON tuneplane.users FOR EACH ROW EXECUTE FUNCTION tuneplane.users_personal_team();
