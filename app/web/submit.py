"""Submission over HTTP: the console's dialog and the forms that are also the CLI's API.

    GET  /submit                      the submission dialog (a fresh retry key per dialog)
    POST /sources                     a tar.gz (raw body or multipart field `archive`) → 201 archive facts
    POST /previews                    a JobSpec (JSON) or the dialog's fields (form) → 201 preview
    GET  /previews/<id>               a preview (owner or admin)
    POST /previews/<id>/confirm       digest + retry_key → 201 receipt (200 when replayed)

Browsers get HTML (htmx requests get the partial that replaces the preview area), `Accept:
application/json` gets JSON. Refusals are 4xx naming each offending field in both forms.
"""

from __future__ import annotations

import secrets
from pathlib import Path
from typing import Any

from flask import Blueprint, Flask, current_app, redirect, render_template, request, url_for
from werkzeug.datastructures import FileStorage, MultiDict

from tuneplane.app import db_functions as fn
from tuneplane.app.blobstore import BlobStore, FilesystemBlobStore
from tuneplane.app.errors import Refusal
from tuneplane.app.settings import load_settings
from tuneplane.app.submission import archives, service
from tuneplane.app.submission.io_flags import parse_input, parse_output
from tuneplane.app.submission.jobspec import LAUNCHERS
from tuneplane.app.submission.pins import recipes
from tuneplane.app.web.artifacts import FLEET_STORES
from tuneplane.app.web.auth import current_user, login_required
from tuneplane.app.web.limits import refuse_unknown
from tuneplane.app.web.negotiate import json_response, wants_json
from tuneplane.app.web.state import get_db

bp = Blueprint("submit", __name__)

INPUT_KINDS = ("recipe", "source", "image")
# Input-artifact rows in the dialog (each: a name, one of the user's complete artifacts, an optional path).
INPUT_ROWS = 2


def init_app(app: Flask) -> None:
    data_dir = app.config.get("TP_DATA_DIR")
    blob_dir = Path(data_dir) / "blobs" if data_dir else load_settings().blob_dir
    app.extensions["tuneplane_blobstore"] = FilesystemBlobStore(blob_dir)


def get_blobstore() -> FilesystemBlobStore:
    return current_app.extensions["tuneplane_blobstore"]


def archive_store(fleet: str | None) -> BlobStore:
    """Where a source archive for `fleet` is kept: that fleet's S3 store (issue 32: its bytes never touch
    this server's disk; the capsule is built from it there), or else this server's own store."""
    if fleet:
        storage = get_db().call(fn.fleet_storage, fleet)[0]["fleet_storage"]
        if storage is not None:
            return FLEET_STORES.store(storage)
    return get_blobstore()


def archive_stores(fleet: str | None) -> list[BlobStore]:
    """Where a preview looks for its archive: the fleet's store, then this server's (an archive uploaded
    without naming the fleet)."""
    try:
        first = archive_store(fleet)
    except Refusal as refusal:
        if refusal.status != 503:
            raise
        # No store credentials here: a preview reads an archive only for a requirements file, so it goes
        # on without the fleet's store (a launch on that fleet then fails, naming the credentials).
        return [get_blobstore()]
    return [first] if first is get_blobstore() else [first, get_blobstore()]


def _is_htmx() -> bool:
    return request.headers.get("HX-Request") == "true"


def new_retry_key() -> str:
    return f"dialog-{secrets.token_urlsafe(12)}"


def _pairs(text: str, field: str) -> dict[str, str]:
    """`K=V` per line (blank lines and # comments ignored)."""
    result: dict[str, str] = {}
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        key, sep, value = line.partition("=")
        if not sep or not key.strip():
            raise Refusal(f"{field}: line {number} is not KEY=VALUE", status=422, field=field)
        result[key.strip()] = value.strip()
    return result


def _form_int(text: str, field: str) -> int:
    """A form field that the JobSpec takes as a number (the JSON API must send a number itself)."""
    if len(text) > 20 or not (text.isascii() and text.lstrip("+-").isdigit()):
        raise Refusal(f"invalid JobSpec: {field}: must be a whole number", status=422, field=field)
    return int(text)


def spec_from_form(form: MultiDict, files: MultiDict | None = None) -> dict[str, Any]:
    """The dialog's fields as a JobSpec document; empty fields take the JobSpec defaults."""

    def value(name: str) -> str:
        return (form.get(name) or "").strip()

    kind = value("input_kind") or "recipe"
    if kind not in INPUT_KINDS:
        raise Refusal("input_kind must be recipe, source or image", status=422, field="input_kind")
    spec: dict[str, Any] = {}
    if kind == "recipe":
        spec["recipe"] = {
            "name": value("recipe.name"),
            "params": _pairs(form.get("recipe.params", ""), "recipe.params"),
        }
    elif kind == "source":
        archive = value("source.archive")
        upload: FileStorage | None = files.get("archive_file") if files else None
        if upload is not None and upload.filename:
            archives.check_content_type(upload.mimetype)
            store = archive_store(value("fleet") or None)
            facts = archives.receive_archive(get_db(), store, current_user().id, upload.stream)
            archive = facts.sha256
        spec["source"] = {"archive": archive, "entrypoint": value("source.entrypoint")}
        if value("source.integration"):
            spec["source"]["integration"] = value("source.integration")
    else:
        spec["image"] = {"ref": value("image.ref"), "command": value("image.command")}
        if value("image.integration"):
            spec["image"]["integration"] = value("image.integration")
    resources: dict[str, Any] = {
        name: _form_int(value(f"resources.{name}"), f"resources.{name}")
        for name in ("nodes", "gpus_per_node", "cpus_per_node")
        if value(f"resources.{name}")
    }
    if value("resources.memory_per_node"):
        resources["memory_per_node"] = value("resources.memory_per_node")
    if resources:
        spec["resources"] = resources
    if value("fleet"):
        spec["fleet"] = value("fleet")
    if value("team"):
        spec["team"] = value("team")
    if value("preemptible_shown"):  # the dialog: the box's state, checked or not, is what is asked
        spec["preemptible"] = bool(value("preemptible"))
    elif value("preemptible"):
        spec["preemptible"] = True
    if value("max_attempts"):
        spec["max_attempts"] = _form_int(value("max_attempts"), "max_attempts")
    if value("priority"):
        # A class name (urgent, …) or a whole number.
        text = value("priority")
        spec["priority"] = _form_int(text, "priority") if text.lstrip("+-").isdigit() else text
    env = _pairs(form.get("env", ""), "env")
    if env:
        spec["env"] = env
    environment: dict[str, Any] = {}
    packages = [line.strip() for line in form.get("environment.packages", "").splitlines() if line.strip()]
    if packages:
        environment["packages"] = packages
    for name in ("requirements", "base", "python"):
        if value(f"environment.{name}"):
            environment[name] = value(f"environment.{name}")
    if environment:
        spec["environment"] = environment
    outputs = [line for line in form.get("outputs", "").splitlines() if line.strip()]
    inputs = [
        f"{value(f'inputs.{n}.name')}={value(f'inputs.{n}.artifact')}"
        + (f":{value(f'inputs.{n}.path')}" if value(f"inputs.{n}.path") else "")
        for n in range(INPUT_ROWS)
        if value(f"inputs.{n}.artifact")
    ]
    try:
        if outputs:
            spec["outputs"] = [parse_output(line) for line in outputs]
    except ValueError as exc:
        raise Refusal(f"outputs: {exc}", status=422, field="outputs") from None
    try:
        if inputs:
            spec["inputs"] = [parse_input(line) for line in inputs]
    except ValueError as exc:
        raise Refusal(f"inputs: {exc} (give each input a name)", status=422, field="inputs") from None
    return spec


def _dialog_context(form: MultiDict | None = None, **extra: Any) -> dict[str, Any]:
    fleets = get_db().fetch_all("SELECT name, backend FROM fleets ORDER BY name")
    values = {k: v for k, v in (form or MultiDict()).items() if k != "csrf_token"}
    return {
        "title": "Submit a job",
        "recipes": sorted(recipes(), key=lambda r: r.name),
        "launchers": LAUNCHERS,
        "fleets": fleets,
        "teams": get_db().call(fn.teams_of, current_user().id),
        "artifacts": get_db().call(fn.complete_artifacts_of, current_user().id, 200),
        "input_rows": range(INPUT_ROWS),
        "values": values,
        "retry_key": values.get("retry_key") or new_retry_key(),
        "preview": None,
        "refusal": None,
        **extra,
    }


@bp.get("/submit")
@login_required
def dialog():
    return render_template("submit/dialog.html", **_dialog_context())


def _with_quota_effect(user_id: int, preview: dict) -> dict:
    """The preview with what admitting it would do to its team's quota, in words (team_reads.sql), computed
    now: it is shown before confirmation and never part of the immutable preview."""
    rows = get_db().call(fn.preview_quota_effect, user_id, preview["id"])
    preview["quota_effect"] = rows[0]["preview_quota_effect"] if rows else None
    return preview


@bp.post("/previews")
@login_required
def create_preview():
    user = current_user()
    if request.is_json:
        body = request.get_json(silent=True)
        if not isinstance(body, dict):
            raise Refusal("the body must be a JobSpec JSON object", status=400, field="spec")
        fleet = body.get("fleet") if isinstance(body.get("fleet"), str) else None
        preview = service.create_preview(get_db(), user.id, body, archive_stores(fleet))
        return json_response(_with_quota_effect(user.id, preview), 201)
    try:
        preview = service.create_preview(
            get_db(), user.id, spec_from_form(request.form, request.files),
            archive_stores(request.form.get("fleet") or None),
        )  # fmt: skip
    except Refusal as refusal:
        if wants_json():
            raise
        retry_key = request.form.get("retry_key") or new_retry_key()
        if _is_htmx():
            return render_template(
                "submit/_refused.html", refusal=refusal, retry_key=retry_key
            ), refusal.status
        page = render_template("submit/dialog.html", **_dialog_context(request.form, refusal=refusal))
        return page, refusal.status
    _with_quota_effect(user.id, preview)
    if wants_json():
        return json_response(preview, 201)
    retry_key = request.form.get("retry_key") or new_retry_key()
    if _is_htmx():
        return render_template("submit/_preview.html", preview=preview, retry_key=retry_key), 201
    page = render_template("submit/dialog.html", **_dialog_context(request.form, preview=preview))
    return page, 201


@bp.get("/previews/<preview_id>")
@login_required
def show_preview(preview_id: str):
    preview = service.get_preview(get_db(), current_user().id, preview_id)
    if wants_json():
        return json_response(preview)
    return render_template(
        "submit/preview_page.html", title="Preview", preview=preview, retry_key=new_retry_key()
    )


@bp.post("/previews/<preview_id>/confirm")
@login_required
def confirm(preview_id: str):
    if request.is_json:
        body = request.get_json(silent=True)
        if not isinstance(body, dict):
            raise Refusal(
                "the body must be a JSON object with digest and retry_key", status=400, field="body"
            )
        refuse_unknown(body, ("digest", "retry_key"))
    else:
        body = request.form
    digest, retry_key = body.get("digest"), body.get("retry_key")
    if digest is not None and not isinstance(digest, str):
        raise Refusal("digest must be a string", status=400, field="digest")
    if retry_key is not None and not isinstance(retry_key, str):
        raise Refusal("retry_key must be a string", status=400, field="retry_key")
    receipt = service.confirm(get_db(), current_user().id, preview_id, digest, retry_key)
    status = 200 if receipt["replayed"] else 201
    if wants_json():
        return json_response(receipt, status)
    target = url_for("jobs.job_page", job_id=receipt["job_id"])
    if _is_htmx():
        response = current_app.response_class("", status=status)
        response.headers["HX-Redirect"] = target
        return response
    return redirect(target, code=303)


@bp.post("/sources")
@login_required
def upload_source():
    upload = request.files.get("archive") if request.mimetype == "multipart/form-data" else None
    if upload is None and request.mimetype == "multipart/form-data":
        raise Refusal("the multipart body has no `archive` file", status=400, field="archive")
    archives.check_content_type(upload.mimetype if upload is not None else request.mimetype or "")
    # A read-only token uploads nothing: asked before a byte is stored (record_source_archive asks again).
    get_db().call(fn.require_token_write, "uploading a source archive")
    stream = upload.stream if upload is not None else request.stream
    # `?fleet=NAME`: kept where that fleet's jobs will be built from (its S3 store, if it has one), only for
    # a user with a team that may use that fleet (nobody else's bytes go into its bucket).
    fleet = (request.args.get("fleet") or "").strip() or None
    if fleet is not None:
        get_db().call(fn.require_fleet_for_user, current_user().id, fleet)
    store = archive_store(fleet)
    facts = archives.receive_archive(get_db(), store, current_user().id, stream)
    if wants_json():
        return json_response(facts.as_json(), 201)
    return render_template("submit/source_uploaded.html", title="Source archive", facts=facts.as_json()), 201
