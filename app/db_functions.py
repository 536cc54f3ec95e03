"""The stored-function registry: every stored function Python calls, with the PostgreSQL types of the
arguments its callers pass, in order.

Call sites name a function through this module (`db.call(fn.get_job, user_id, job_id)` after
`from tuneplane.app import db_functions as fn`), never as a bare string, so the list below is complete
by construction; raw SQL that calls one (`SELECT * FROM tuneplane.telemetry_begin_batch(…)`, a hot path
written out by hand) names a function registered here too. tests/db/test_db_functions.py checks, against a
freshly migrated database (pg_proc), that each exists in schema `tuneplane` with these argument types
(and accepts every argument count a call site passes), and scans app/, workers/ and tuneplane/ for a call
that bypasses the registry. A renamed or re-typed function fails that test, not a run in production.

A new function Python calls: add one line here (alphabetical), call it as `fn.<name>`; if the test fails,
it prints the signatures the database has. Why a Python module and not a `queries.sql` file
(Procrastinate's way): every call here is `SELECT * FROM f(args)` with no query text of its own, so the
registry needs only names and types, and an attribute (`fn.get_job`) is checked by ruff and the
interpreter at import, where a string key into a file would be checked only when it runs.
"""

from __future__ import annotations

import logging

from tuneplane.app.errors import Refusal

log = logging.getLogger("tuneplane.db")


class StoredFunction(str):
    """A stored function's name (a `str`, so it goes wherever a function name went) and the argument
    types its callers pass."""

    args: tuple[str, ...]

    def __new__(cls, name: str, *args: str) -> StoredFunction:
        self = super().__new__(cls, name)
        self.args = args
        return self


# The integer types a registered argument may have, and the values each can take.
_INT_RANGES = {
    "smallint": (-(2**15), 2**15 - 1),
    "integer": (-(2**31), 2**31 - 1),
    "bigint": (-(2**63), 2**63 - 1),
}


def check_args(function: str, args: tuple) -> None:
    """The last guard before a call: an integer beyond its registered SQL type never reaches PostgreSQL
    (it would be sent as a wider type, and the function would not be found: a 500). The request layer
    declares every range (app/input_limits.py); a value that still gets here is the client's 400,
    logged as a gap."""
    types = getattr(function, "args", ())
    for index, (value, sql_type) in enumerate(zip(args, types, strict=False)):
        bounds = _INT_RANGES.get(sql_type)
        if bounds is None or isinstance(value, bool) or not isinstance(value, int):
            continue
        if not bounds[0] <= value <= bounds[1]:
            log.warning(
                "%s: argument %d (%s) out of range reached the database layer", function, index + 1, sql_type
            )
            raise Refusal(f"a value is out of range: {value} is not a PostgreSQL {sql_type}", 400, "value")


REPORT = (
    "bigint",
    "bigint",
    "jsonb",
)  # a node report: (p_node_id, p_epoch, p_payload), app/node_gateway/reports.py

abort_launch = StoredFunction("abort_launch", "bigint", "bigint", "text")
ack_node_command = StoredFunction("ack_node_command", "bigint", "bigint", "bigint", "jsonb", "text")
admin_preempt_job = StoredFunction("admin_preempt_job", "bigint", "bigint", "integer")
artifact_file_chunks = StoredFunction("artifact_file_chunks", "text", "bigint", "integer")
artifact_file_list = StoredFunction("artifact_file_list", "bigint")
artifact_file_state = StoredFunction("artifact_file_state", "text", "bigint", "integer")
artifact_for_user = StoredFunction("artifact_for_user", "bigint", "bigint")
artifact_input_for_node = StoredFunction("artifact_input_for_node", "text", "bigint")
artifact_object_references = StoredFunction("artifact_object_references")
artifact_storage = StoredFunction("artifact_storage", "bigint")
artifact_storage_for_node = StoredFunction("artifact_storage_for_node", "text", "bigint")
artifact_to_verify = StoredFunction("artifact_to_verify", "bigint", "bigint")
artifact_upload_status = StoredFunction("artifact_upload_status", "text", "bigint")
artifact_upload_target = StoredFunction(
    "artifact_upload_target",
    "text",
    "bigint",
    "integer",
    "integer",
    "bigint",
)
attempt_storage = StoredFunction("attempt_storage", "bigint")
authenticate_api_token = StoredFunction("authenticate_api_token", "text", "text")
authenticate_node_credential = StoredFunction("authenticate_node_credential", "text")
authenticate_telemetry_token = StoredFunction("authenticate_telemetry_token", "text")
begin_prepare = StoredFunction("begin_prepare", "bigint", "bigint", "text")
blob_references = StoredFunction("blob_references")
cancel_job = StoredFunction("cancel_job", "bigint", "bigint", "text")
change_node_scheduling = StoredFunction("change_node_scheduling", "text", "text", "text", "text")
checkpoint_numbers = StoredFunction("checkpoint_numbers", "bigint", "integer")
claim_launch = StoredFunction("claim_launch", "bigint", "text")
claim_sessions_commands = StoredFunction("claim_sessions_commands", "bigint[]", "bigint[]", "integer")
claim_team_event_deliveries = StoredFunction("claim_team_event_deliveries", "text", "integer")
complete_artifacts_of = StoredFunction("complete_artifacts_of", "bigint", "integer")
confirm_node_credential = StoredFunction("confirm_node_credential", "bigint", "bigint")
confirm_preview = StoredFunction("confirm_preview", "bigint", "uuid", "text", "text")
create_enrollment_token = StoredFunction("create_enrollment_token", "text", "text", "interval", "text")
create_first_admin = StoredFunction("create_first_admin", "text", "text")
create_fleet = StoredFunction("create_fleet", "text", "text", "jsonb", "bigint")
create_preview = StoredFunction("create_preview", "bigint", "jsonb", "jsonb")
create_team = StoredFunction("create_team", "bigint", "text")
create_team_webhook = StoredFunction("create_team_webhook", "bigint", "text", "text", "text", "text[]")
create_user = StoredFunction("create_user", "text", "text", "text")
decide_abort = StoredFunction("decide_abort", "bigint", "text")
discard_artifact_chunks = StoredFunction(
    "discard_artifact_chunks",
    "text",
    "bigint",
    "integer",
    "integer[]",
    "text",
)
enroll_node = StoredFunction("enroll_node", "text", "text", "text", "text")
exempt_job_idle = StoredFunction("exempt_job_idle", "bigint", "bigint", "text")
expire_grace_deadlines = StoredFunction("expire_grace_deadlines")
expire_member_deadlines = StoredFunction("expire_member_deadlines")
expire_prepare_deadlines = StoredFunction("expire_prepare_deadlines")
expire_time_limits = StoredFunction("expire_time_limits")
fail_artifact = StoredFunction("fail_artifact", "text", "bigint", "text")
fence_node = StoredFunction("fence_node", "text", "text", "text")
find_artifact = StoredFunction("find_artifact", "bigint", "bigint", "text", "integer", "integer")
finish_artifact = StoredFunction("finish_artifact", "text", "bigint")
fleet_gpus = StoredFunction("fleet_gpus", "text")
fleet_storage = StoredFunction("fleet_storage", "text")
fleet_team_access_of = StoredFunction("fleet_team_access_of", "bigint", "text", "text")
fleet_team_share_of = StoredFunction("fleet_team_share_of", "text")
get_job = StoredFunction("get_job", "bigint", "bigint")
get_preview = StoredFunction("get_preview", "bigint", "uuid")
idle_policies_of = StoredFunction("idle_policies_of", "text")
idle_warnings_of = StoredFunction("idle_warnings_of", "bigint")
issue_api_token = StoredFunction("issue_api_token", "bigint", "text", "text", "interval")
issue_member_telemetry_token = StoredFunction("issue_member_telemetry_token", *REPORT)
issue_scoped_api_token = StoredFunction(
    "issue_scoped_api_token", "bigint", "text", "text", "interval", "text[]", "boolean"
)
issue_telemetry_token = StoredFunction(
    "issue_telemetry_token",
    "bigint",
    "integer",
    "integer",
    "text",
    "interval",
)
job_artifacts = StoredFunction("job_artifacts", "bigint", "bigint")
job_attempt_preemption_of = StoredFunction("job_attempt_preemption_of", "bigint", "bigint")
job_attempts_of = StoredFunction("job_attempts_of", "bigint", "bigint")
job_events_of = StoredFunction("job_events_of", "bigint", "bigint")
job_idle_of = StoredFunction("job_idle_of", "bigint", "bigint")
job_member_log = StoredFunction(
    "job_member_log",
    "bigint",
    "bigint",
    "integer",
    "text",
    "bigint",
    "integer",
    "integer",
    "bigint",
)
job_members_of = StoredFunction("job_members_of", "bigint", "bigint")
job_owners_visible = StoredFunction("job_owners_visible", "bigint")
job_preemptions_of = StoredFunction("job_preemptions_of", "bigint", "bigint")
job_queue_position = StoredFunction("job_queue_position", "bigint", "bigint")
list_jobs = StoredFunction("list_jobs", "bigint", "text", "integer", "bigint", "text", "text", "text")
mark_artifact_corrupt = StoredFunction("mark_artifact_corrupt", "bigint", "text", "text")
member_exited = StoredFunction("member_exited", *REPORT)
member_log = StoredFunction("member_log", *REPORT)
member_prepare_failed = StoredFunction("member_prepare_failed", *REPORT)
member_prepare_progress = StoredFunction("member_prepare_progress", *REPORT)
member_prepared = StoredFunction("member_prepared", *REPORT)
member_reports = StoredFunction("member_reports", "text", "jsonb")
member_started = StoredFunction("member_started", *REPORT)
node_capsule_storage = StoredFunction("node_capsule_storage", "bigint", "text")
node_heartbeats = StoredFunction("node_heartbeats", "jsonb")
node_may_read_capsule = StoredFunction("node_may_read_capsule", "bigint", "text")
node_session_closed = StoredFunction("node_session_closed", "bigint", "bigint", "text")
node_session_opened = StoredFunction("node_session_opened", "bigint", "text", "text")
nodes_with_pending_commands = StoredFunction("nodes_with_pending_commands", "bigint[]")
note_connectivity_changes = StoredFunction("note_connectivity_changes")
placement_fit_now = StoredFunction("placement_fit_now", "bigint")
placement_fleets = StoredFunction("placement_fleets", "text")
preview_quota_effect = StoredFunction("preview_quota_effect", "bigint", "uuid")
prune_node_commands = StoredFunction("prune_node_commands")
prune_team_event_deliveries = StoredFunction("prune_team_event_deliveries")
reconcile_node = StoredFunction("reconcile_node", *REPORT)
record_artifact_chunk = StoredFunction(
    "record_artifact_chunk",
    "text",
    "bigint",
    "integer",
    "integer",
    "integer",
    "text",
    "bigint",
)
record_artifact_file = StoredFunction("record_artifact_file", "text", "bigint", "integer", "text", "bigint")
record_artifact_object = StoredFunction(
    "record_artifact_object", "text", "bigint", "integer", "text", "bigint", "text"
)
record_artifact_verification = StoredFunction(
    "record_artifact_verification",
    "bigint",
    "bigint",
    "boolean",
    "integer",
    "jsonb",
)
record_node_note = StoredFunction("record_node_note", *REPORT)
record_node_refusal = StoredFunction("record_node_refusal", "text", "text", "text", "text", "jsonb")
record_source_archive = StoredFunction(
    "record_source_archive",
    "bigint",
    "text",
    "bigint",
    "integer",
    "bigint",
)
refuse_artifact = StoredFunction("refuse_artifact", "text", "bigint", "text", "text", "text")
register_artifact = StoredFunction(
    "register_artifact",
    "text",
    "bigint",
    "text",
    "text",
    "text",
    "jsonb",
    "text",
    "text",
    "bigint",
)
remove_team_webhook = StoredFunction("remove_team_webhook", "bigint", "text", "bigint")
report_node_caches = StoredFunction("report_node_caches", *REPORT)
report_node_capacity = StoredFunction("report_node_capacity", *REPORT)
report_node_probe = StoredFunction("report_node_probe", *REPORT)
request_checkpoint = StoredFunction("request_checkpoint", "bigint", "bigint", "integer")
requeue_stalled_launches = StoredFunction("requeue_stalled_launches")
require_admin = StoredFunction("require_admin", "bigint", "text")
require_fleet_for_user = StoredFunction("require_fleet_for_user", "bigint", "text")
require_token_write = StoredFunction("require_token_write", "text", "text", "bigint")
reserve_next = StoredFunction("reserve_next", "bigint", "integer")
resolve_node = StoredFunction("resolve_node", "text")
resume_pin = StoredFunction("resume_pin", "bigint")
reuse_artifact_objects = StoredFunction("reuse_artifact_objects", "text", "bigint")
revoke_api_token = StoredFunction("revoke_api_token", "bigint", "bigint")
rotate_node_credential = StoredFunction("rotate_node_credential", "bigint", "bigint", "text")
server_secret = StoredFunction("server_secret", "text", "text")
set_fleet_access_mode = StoredFunction("set_fleet_access_mode", "bigint", "text", "text")
set_fleet_team_access = StoredFunction("set_fleet_team_access", "bigint", "text", "text", "boolean", "text")
set_fleet_storage = StoredFunction("set_fleet_storage", "text", "jsonb", "text")
set_idle_policy = StoredFunction(
    "set_idle_policy",
    "bigint",
    "text",
    "bigint",
    "interval",
    "double precision",
    "double precision",
    "text",
    "interval",
)
set_team_member_by_name = StoredFunction("set_team_member_by_name", "bigint", "text", "text", "text")
set_team_priority_grant = StoredFunction("set_team_priority_grant", "bigint", "text", "text", "text")
set_team_quota = StoredFunction(
    "set_team_quota",
    "bigint",
    "bigint",
    "bigint",
    "text",
    "integer",
    "integer",
    "double precision",
    "boolean",
)
set_usage_price = StoredFunction("set_usage_price", "bigint", "text", "text", "numeric", "text")
slurm_allocation_started = StoredFunction("slurm_allocation_started", "bigint", "text[]", "integer", "text")
slurm_controller_unreachable = StoredFunction("slurm_controller_unreachable", "bigint", "text")
slurm_followed = StoredFunction("slurm_followed", "bigint")
slurm_job_ended = StoredFunction("slurm_job_ended", "bigint", "text", "text")
slurm_member_exited = StoredFunction(
    "slurm_member_exited",
    "bigint",
    "integer",
    "integer",
    "text",
    "boolean",
    "text",
    "double precision",
)
slurm_member_log = StoredFunction("slurm_member_log", "bigint", "integer", "jsonb")
slurm_member_prepare_failed = StoredFunction("slurm_member_prepare_failed", "bigint", "integer", "text")
slurm_member_prepared = StoredFunction("slurm_member_prepared", "bigint", "integer")
slurm_member_started = StoredFunction("slurm_member_started", "bigint", "integer", "integer")
slurm_node_credential = StoredFunction("slurm_node_credential", "bigint", "text")
slurm_pending = StoredFunction("slurm_pending", "bigint", "text", "integer")
slurm_preemption_signalled = StoredFunction("slurm_preemption_signalled", "bigint", "text", "integer")
slurm_preemptions_due = StoredFunction("slurm_preemptions_due", "bigint")
slurm_scancel_due = StoredFunction("slurm_scancel_due", "bigint")
slurm_submissions_due = StoredFunction("slurm_submissions_due", "bigint")
slurm_submitted = StoredFunction("slurm_submitted", "bigint", "bigint")
slurm_sync_fleet = StoredFunction("slurm_sync_fleet", "bigint", "jsonb")
sweep_idle_jobs = StoredFunction("sweep_idle_jobs")
sweep_lost_nodes = StoredFunction("sweep_lost_nodes")
team_event_deliveries_of = StoredFunction("team_event_deliveries_of", "bigint", "text", "integer")
team_event_delivery_result = StoredFunction(
    "team_event_delivery_result", "bigint", "integer", "integer", "text", "integer"
)
team_members_of = StoredFunction("team_members_of", "bigint", "text")
team_priority_grants_of = StoredFunction("team_priority_grants_of", "bigint")
team_queue_of = StoredFunction("team_queue_of", "bigint", "text")
team_quotas_of = StoredFunction("team_quotas_of", "bigint", "text")
team_read_of = StoredFunction("team_read_of", "bigint", "text")
team_webhooks_of = StoredFunction("team_webhooks_of", "bigint", "text")
teams_of = StoredFunction("teams_of", "bigint")
telemetry_begin_batch = StoredFunction(
    "telemetry_begin_batch",
    "text",
    "text",
    "bigint",
    "text",
    "integer",
    "jsonb",
    "text[]",
    "text[]",
)
telemetry_buckets = StoredFunction("telemetry_buckets", "bigint", "bigint", "integer", "bigint", "bigint")
telemetry_job_members = StoredFunction("telemetry_job_members", "bigint", "bigint")
telemetry_job_problems = StoredFunction("telemetry_job_problems", "bigint", "bigint", "integer")
telemetry_job_series = StoredFunction(
    "telemetry_job_series",
    "bigint",
    "bigint",
    "text",
    "integer",
    "integer",
    "text",
)
telemetry_merge_batch = StoredFunction(
    "telemetry_merge_batch",
    "text",
    "text",
    "bigint",
    "bigint[]",
    "integer[]",
    "bigint[]",
    "bigint[]",
    "double precision[]",
    "double precision[]",
    "double precision[]",
    "bigint[]",
    "bigint[]",
    "double precision[]",
    "double precision[]",
    "bigint[]",
    "bigint[]",
    "bigint[]",
    "bigint[]",
    "bigint[]",
    "double precision[]",
    "integer",
    "jsonb",
    "text[]",
    "text[]",
    "text[]",
    "bigint[]",
    "text[]",
    "text[]",
    "bigint[]",
    "bigint[]",
    "text[]",
    "boolean",
)
telemetry_prune = StoredFunction("telemetry_prune", "timestamp with time zone")
telemetry_raw_points = StoredFunction(
    "telemetry_raw_points",
    "bigint",
    "bigint",
    "bigint",
    "bigint",
    "integer",
    "integer",
)
telemetry_smoothed = StoredFunction("telemetry_smoothed", "bigint", "bigint", "bigint", "bigint[]")
tokens_of = StoredFunction("tokens_of", "bigint")
unfence_node = StoredFunction("unfence_node", "text", "text", "text")

usage_prices_list = StoredFunction("usage_prices_list")
usage_report = StoredFunction(
    "usage_report", "bigint", "text", "text", "timestamp with time zone", "timestamp with time zone"
)
usage_teams_of = StoredFunction("usage_teams_of", "bigint")

REGISTRY: dict[str, StoredFunction] = {
    value: value for value in list(globals().values()) if isinstance(value, StoredFunction)
}
