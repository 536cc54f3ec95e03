"""The artifacts CLI and the agent-side delivery as real processes against a real HTTP server."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.artifact_fixtures import api_token, make_member, serve_app, write_tree
from tests.helpers import OutputWatcher, wait_for
from tuneplane.app.db import Database
from tuneplane.app.web import create_app

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def env(db: Database, db_url: str, tmp_path: Path, port: int):
    db.fetch_one("UPDATE artifact_settings SET chunk_size = 4096 RETURNING chunk_size")
    blob_dir = tmp_path / "blobs"
    app = create_app(db_url, config={"SECRET_KEY": "t", "TP_BLOB_DIR": str(blob_dir)})
    with serve_app(app, port) as url:
        yield {"url": url, "blob_dir": blob_dir, "tmp": tmp_path}


def cli(env: dict, token: str, *args: str) -> subprocess.CompletedProcess:
    child_env = {
        **os.environ,
        "TUNEPLANE_SERVER": env["url"],
        "TUNEPLANE_TOKEN": token,
        "TUNEPLANE_CONFIG": str(env["tmp"] / "no-config.toml"),
    }
    return subprocess.run(
        [sys.executable, "-P", "-m", "tuneplane", "artifacts", *args],
        capture_output=True,
        text=True,
        env=child_env,
        cwd=REPO,
        timeout=60,
    )


def deliver_process(env: dict, setup, directory: Path, name: str) -> subprocess.Popen:
    child_env = {**os.environ, "TUNEPLANE_NODE_CREDENTIAL": setup.credential}
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "tuneplane.workers.artifacts.deliver",
            "--server",
            env["url"],
            "--member-id",
            str(setup.member["id"]),
            "--name",
            name,
            "--progress",
            str(directory),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        env=child_env,
        cwd=REPO,
        text=True,
    )


def blob_path(env: dict, data: bytes) -> Path:
    sha = hashlib.sha256(data).hexdigest()
    return env["blob_dir"] / "sha256" / sha[:2] / sha


def delivered(env: dict, setup, files: dict[str, bytes], name: str = "model") -> None:
    src = env["tmp"] / f"src-{name}"
    write_tree(src, files)
    proc = deliver_process(env, setup, src, name)
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 0, out
    assert json.loads(out.strip().splitlines()[-1])["state"] == "complete"


def test_list_download_and_verify_from_the_cli(db: Database, env) -> None:
    setup = make_member(db)
    files = {"w/weights.bin": os.urandom(30_000), "config.json": b'{"a": 1}', "empty": b""}
    delivered(env, setup, files)
    token = api_token(db, setup.user_id)

    listed = cli(env, token, "list", str(setup.job_id), "--json")
    assert listed.returncode == 0, listed.stderr
    assert [(a["name"], a["state"]) for a in json.loads(listed.stdout)] == [("model", "complete")]
    table = cli(env, token, "list", str(setup.job_id))
    assert "model@0" in table.stdout and "complete" in table.stdout

    dest = env["tmp"] / "download"
    got = cli(env, token, "download", str(setup.job_id), "model", str(dest))
    assert got.returncode == 0, got.stderr
    assert "every sha256 matches" in got.stdout
    for rel, data in files.items():
        assert (dest / rel).read_bytes() == data
    assert not (dest / ".tuneplane-partial").exists()

    ok = cli(env, token, "verify", str(setup.job_id), "model")
    assert ok.returncode == 0 and ok.stdout.startswith("ok: 3 files"), ok.stderr
    local = cli(env, token, "verify", str(setup.job_id), "model", "--dir", str(dest))
    assert local.returncode == 0, local.stderr


def test_verify_names_a_changed_file_and_a_deleted_one(db: Database, env) -> None:
    setup = make_member(db)
    files = {"w/weights.bin": os.urandom(30_000), "config.json": b'{"a": 1}', "tokenizer.txt": b"abc"}
    delivered(env, setup, files)
    token = api_token(db, setup.user_id)

    weights = blob_path(env, files["w/weights.bin"])
    data = bytearray(weights.read_bytes())
    data[12_345] ^= 0x01
    weights.write_bytes(bytes(data))
    changed = cli(env, token, "verify", str(setup.job_id), "model")
    assert changed.returncode == 1
    assert "mismatch: w/weights.bin" in changed.stderr and "config.json" not in changed.stderr

    blob_path(env, files["config.json"]).unlink()
    both = cli(env, token, "verify", str(setup.job_id), "model")
    assert both.returncode == 1
    assert "mismatch: w/weights.bin" in both.stderr and "missing: config.json" in both.stderr

    refused = cli(env, token, "download", str(setup.job_id), "model", str(env["tmp"] / "d2"))
    assert refused.returncode == 1
    assert "w/weights.bin" in refused.stderr and "config.json" in refused.stderr
    # The server's reason, not "server answered HTTP 410" (walking issue 32: a 503 lost its reason so).
    assert "config.json: the stored file is missing (run verify)" in refused.stderr
    assert (env["tmp"] / "d2" / "tokenizer.txt").read_bytes() == b"abc"
    # The server sent the damaged bytes as stored (the CLI verifies itself); the CLI kept none of them.
    assert not (env["tmp"] / "d2" / "w" / "weights.bin").exists()
    assert not (env["tmp"] / "d2" / "w" / "weights.bin").exists()


def test_verify_of_a_local_copy_names_changed_missing_and_extra_files(db: Database, env) -> None:
    setup = make_member(db)
    files = {"a.bin": os.urandom(5000), "b.txt": b"bee", "c.txt": b"sea"}
    delivered(env, setup, files)
    token = api_token(db, setup.user_id)
    dest = env["tmp"] / "copy"
    assert cli(env, token, "download", str(setup.job_id), "model", str(dest)).returncode == 0
    (dest / "b.txt").write_bytes(b"BEE")
    (dest / "c.txt").unlink()
    (dest / "stray").write_bytes(b"?")
    result = cli(env, token, "verify", str(setup.job_id), "model", "--dir", str(dest))
    assert result.returncode == 1
    assert "mismatch: b.txt" in result.stderr and "missing: c.txt" in result.stderr
    assert "extra: stray" in result.stderr and "a.bin" not in result.stderr


def test_kill_9_mid_upload_then_restart_resumes_and_never_completes_wrong_bytes(db: Database, env) -> None:
    setup = make_member(db)
    src = env["tmp"] / "src"
    files = {"big.bin": os.urandom(4096 * 600), "small.bin": os.urandom(100)}
    write_tree(src, files)
    proc = deliver_process(env, setup, src, "ckpt")
    watcher = OutputWatcher(proc)

    def chunks_held() -> int:
        row = db.fetch_one(
            "SELECT count(*) AS n FROM artifact_chunks c JOIN artifacts a ON a.id = c.artifact_id "
            "WHERE a.name = 'ckpt'"
        )
        return row["n"]

    wait_for(lambda: chunks_held() >= 100, timeout=60, what="100 chunks recorded")
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=10)
    assert proc.returncode == -signal.SIGKILL
    sent_before = sum(1 for line in watcher.lines if line.startswith("chunk "))
    state = db.fetch_one("SELECT id, state FROM artifacts WHERE name = 'ckpt'")
    assert state["state"] == "uploading" and sent_before < 601

    # The restarted agent registers the same manifest again, gets the same artifact and sends only what
    # the server does not hold; the server re-hashes every file before the artifact can be complete.
    held = chunks_held()
    assert held >= 100
    restarted = deliver_process(env, setup, src, "ckpt")
    out, _ = restarted.communicate(timeout=120)
    assert restarted.returncode == 0, out
    resent = sum(1 for line in out.splitlines() if line.startswith("chunk "))
    assert resent <= 601 - held, "the restart sent chunks the server already held"
    final = db.fetch_one("SELECT id, state FROM artifacts WHERE name = 'ckpt'")
    assert final == {"id": state["id"], "state": "complete"}
    for data in files.values():
        assert blob_path(env, data).read_bytes() == data


def test_list_is_in_natural_order_with_a_step_column(db: Database, env) -> None:
    """checkpoint.2 before checkpoint.10 (not text order), each with its step."""
    from tests.artifact_fixtures import recorded_complete

    setup = make_member(db)
    manifest = write_tree(env["tmp"] / "ckpt", {"w.bin": b"w"})
    for step in (1, 10, 11, 2):
        recorded_complete(db, setup, f"checkpoint.{step}", manifest, kind="checkpoint", step=step * 100)
    token = api_token(db, setup.user_id)
    table = cli(env, token, "list", str(setup.job_id))
    assert table.returncode == 0, table.stderr
    header, *lines = table.stdout.splitlines()
    assert header.split()[:4] == ["NAME", "ATTEMPT", "KIND", "STEP"]
    assert [line.split()[0] for line in lines] == [f"checkpoint.{n}@0" for n in (1, 2, 10, 11)]
    assert [line.split()[3] for line in lines] == ["100", "200", "1000", "1100"]


def test_a_closed_pipe_ends_a_command_quietly(db: Database, env) -> None:
    """`tuneplane artifacts list 5 | head -1`: the command exits 0 and writes no error (every command goes
    through the one handler in app/cli/__init__.py)."""
    from tests.artifact_fixtures import recorded_complete

    setup = make_member(db)
    manifest = write_tree(env["tmp"] / "ckpt", {"w.bin": b"w"})
    for step in range(1500):  # more than a pipe buffer (64 KiB) of table
        recorded_complete(db, setup, f"checkpoint.{step}", manifest, kind="checkpoint", step=step)
    token = api_token(db, setup.user_id)
    child_env = {
        **os.environ,
        "TUNEPLANE_SERVER": env["url"],
        "TUNEPLANE_TOKEN": token,
        "TUNEPLANE_CONFIG": str(env["tmp"] / "no-config.toml"),
    }
    for args in (["artifacts", "list", str(setup.job_id)], ["jobs", "show", str(setup.job_id)]):
        shell = (
            f'{sys.executable} -P -m tuneplane {" ".join(args)} | head -1; echo "status=${{PIPESTATUS[0]}}"'
        )
        done = subprocess.run(
            ["bash", "-c", shell], capture_output=True, text=True, env=child_env, cwd=REPO, timeout=120
        )
        assert done.stderr == "", done.stderr
        first, status = done.stdout.splitlines()
        assert first and status == "status=0", done.stdout


def test_the_job_pages_pruned_checkpoints_are_folded_into_one_line(db: Database, env) -> None:
    import httpx

    from tests.artifact_fixtures import recorded_complete

    setup = make_member(db)
    manifest = write_tree(env["tmp"] / "ckpt", {"w.bin": b"w"})
    for step in (1, 2, 3):
        recorded_complete(db, setup, f"checkpoint.{step}", manifest, kind="checkpoint", step=step)
    db.fetch_all(
        "UPDATE artifacts SET state = 'pruned', pruned_at = now()"
        " WHERE name IN ('checkpoint.1', 'checkpoint.2') RETURNING id"
    )
    token = api_token(db, setup.user_id)
    html = httpx.get(
        f"{env['url']}/jobs/{setup.job_id}/artifacts", headers={"Authorization": f"Bearer {token}"}
    ).text
    table, folded = html.split('<details class="pruned-artifacts">')
    assert "checkpoint.3" in table and "checkpoint.1" not in table and "checkpoint.2" not in table
    assert "<summary>2 pruned checkpoints" in folded and "checkpoint.1" in folded
