"""Issue 14 end to end on one `tuneplane up`, driven through the CLI as a user would:

- the demo with checkpoint_every publishes 3 checkpoints while it runs, each complete and verifying
  before the member ends; `--output ckpt=checkpoint` delivers the final one; the member's logs are an
  artifact that downloads and verifies;
- a fine-tune job takes the second checkpoint (`--input base=JOB/checkpoint.2`) and the final output
  (`--input final=JOB/ckpt`), starts from those weights, and publishes a checkpoint on request
  (`tuneplane artifacts checkpoint JOB`);
- a checkpoint directory (the plain-file marker convention) that changes while the agent reads it is
  refused with the reason, and no complete artifact holds its bytes.
"""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest

from tests.e2e.up_process import Up, tuneplane_up
from tests.helpers import wait_for
from tuneplane.app.db import Database

pytestmark = pytest.mark.e2e
SMALL = ("--cpus", "1", "--memory", "256M")

CHANGING_CHECKPOINT = textwrap.dedent(
    """
    import os, pathlib, random, time
    out = pathlib.Path(os.environ["TUNEPLANE_OUTPUT_DIR"]) / "ckpt" / "step-1"
    out.mkdir(parents=True)
    with open(out / "weights.bin", "wb") as handle:
        handle.write(os.urandom(32 * 1024 * 1024))
    (out / ".tuneplane-complete").write_text("")  # the completed-marker: the agent publishes it now
    print("checkpoint marked complete; rewriting it while the agent reads it", flush=True)
    end = time.time() + 8
    with open(out / "weights.bin", "r+b") as handle:
        while time.time() < end:
            handle.seek(random.randrange(32 * 1024 * 1024 - 4096))
            handle.write(os.urandom(4096))
            handle.flush()
            time.sleep(0.001)
    print("done", flush=True)
    """
)


def _submit(up: Up, *args: str) -> int:
    result = up.cli("submit", *args, *SMALL, "--yes", "--json")
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)["job_id"]


def _ended(db: Database, job_id: int) -> dict:
    def check() -> dict | None:
        row = db.fetch_one("SELECT state, state_reason FROM jobs WHERE id = %s", (job_id,))
        return row if row["state"] in ("succeeded", "failed", "cancelled") else None

    return wait_for(check, timeout=120, what=f"job {job_id} to end")


def _artifacts(db: Database, job_id: int) -> dict[str, dict]:
    return {a["name"]: a for a in db.fetch_all("SELECT * FROM artifacts WHERE job_id = %s", (job_id,))}


def test_checkpoints_while_running_logs_fine_tune_and_a_changing_checkpoint_refused(
    db_url: str, db: Database, tmp_path: Path
) -> None:
    with tuneplane_up(db_url, tmp_path, db) as up:
        base = _submit(
            up, "--recipe", "demo", "--param", "steps=30", "--param", "step_seconds=0.05",
            "--param", "checkpoint_every=10", "--output", "ckpt=checkpoint",
        )  # fmt: skip
        done = _ended(db, base)
        assert done["state"] == "succeeded", (done, up.out.text()[-3000:])
        (member,) = db.fetch_all("SELECT * FROM members WHERE job_id = %s", (base,))
        names = wait_for(
            lambda: (a := _artifacts(db, base)) and {"ckpt", "logs"} <= a.keys() and a,
            timeout=60,
            what="the final output and the logs",
        )
        checkpoints = sorted((a for a in names.values() if a["kind"] == "checkpoint"), key=lambda a: a["id"])
        assert [c["name"] for c in checkpoints] == ["checkpoint.1", "checkpoint.2", "checkpoint.3"]
        for checkpoint in checkpoints:
            assert checkpoint["state"] == "complete", checkpoint
            assert checkpoint["completed_at"] <= member["ended_at"], "published while the member ran"
            verified = up.cli("artifacts", "verify", str(base), checkpoint["name"])
            assert verified.returncode == 0, verified.stderr
        assert checkpoints[0]["manifest_digest"] != checkpoints[1]["manifest_digest"]

        # The member's logs: an artifact of the attempt, downloaded and verified like any other.
        logs = wait_for(lambda: _artifacts(db, base)["logs"]["state"] == "complete", timeout=60, what="logs")
        assert logs
        got = up.cli("artifacts", "download", str(base), "logs", str(tmp_path / "logs"), "--quiet")
        assert got.returncode == 0, got.stderr
        assert "done: 30 steps" in (tmp_path / "logs" / "stdout.log").read_text()
        checked = up.cli("artifacts", "verify", str(base), "logs", "--dir", str(tmp_path / "logs"))
        assert checked.returncode == 0, checked.stderr

        # A fine-tune from the second checkpoint by reference, asked for a checkpoint while it runs.
        tune = _submit(
            up, "--recipe", "demo", "--param", "steps=400", "--param", "step_seconds=0.02",
            "--param", "init_from=base/model.npz", "--input", f"base={base}/checkpoint.2",
            "--input", f"final={base}/ckpt",
        )  # fmt: skip
        wait_for(
            lambda: db.fetch_one("SELECT 1 FROM members WHERE job_id = %s AND state = 'running'", (tune,)),
            timeout=90,
            what="the fine-tune to run",
        )
        asked = up.cli("artifacts", "checkpoint", str(tune))
        assert asked.returncode == 0 and "asked member rank 0" in asked.stdout, asked.stderr
        done = _ended(db, tune)
        assert done["state"] == "succeeded", (done, up.out.text()[-3000:])
        spec = db.fetch_one("SELECT spec FROM jobs WHERE id = %s", (tune,))["spec"]
        pinned = {i["name"]: i for i in spec["inputs"]}
        assert pinned["base"]["manifest_digest"] == checkpoints[1]["manifest_digest"]
        assert pinned["final"]["manifest_digest"] == names["ckpt"]["manifest_digest"]
        on_request = _artifacts(db, tune).get("checkpoint.1")
        assert on_request is not None and on_request["state"] == "complete", on_request
        (tuned,) = db.fetch_all("SELECT id FROM members WHERE job_id = %s", (tune,))
        stdout = (
            up.data_dir / "node" / "work" / "members" / str(tuned["id"]) / "logs" / "stdout.log"
        ).read_text()
        assert "initialized from" in stdout and "base/model.npz" in stdout

        # A checkpoint directory rewritten while it is read: refused with the reason, never complete.
        source = tmp_path / "changing"
        source.mkdir()
        (source / "train.py").write_text(CHANGING_CHECKPOINT)
        changing = _submit(
            up, "--source", str(source), "--entrypoint", "python train.py", "--output", "ckpt=ckpt"
        )
        done = _ended(db, changing)
        assert done["state"] == "succeeded", (done, up.out.text()[-3000:])
        refused = wait_for(
            lambda: (a := _artifacts(db, changing).get("ckpt.1")) and a["state"] != "uploading" and a,
            timeout=60,
            what="the changing checkpoint to be refused",
        )
        assert refused["state"] == "failed", refused
        assert "changed while it was being read" in refused["reason"], refused["reason"]
        assert "weights.bin" in refused["reason"]
        assert not [
            a
            for a in _artifacts(db, changing).values()
            if a["kind"] == "checkpoint" and a["state"] == "complete"
        ]
