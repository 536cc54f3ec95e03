"""A JobSpec's `environment` is resolved at preview by uv (against the real package index) to a hashed
lock whose digest is pinned; an unknown package or an impossible constraint is refused naming it."""

from __future__ import annotations

import hashlib
import subprocess
from pathlib import Path

import pytest

from tests.archive_builders import build, file
from tests.submission_setup import add_user, one_local_fleet
from tuneplane.app.blobstore import FilesystemBlobStore
from tuneplane.app.db import Database
from tuneplane.app.errors import Refusal
from tuneplane.app.submission import service
from tuneplane.app.uvtool import uv_binary, uv_environment

SOURCE = "sha256:" + "ab" * 32


def source_spec(sha: str, **environment: object) -> dict:
    return {
        "source": {"archive": f"sha256:{sha}", "entrypoint": "python main.py"},
        "environment": environment,
    }


def upload(db: Database, blobs: FilesystemBlobStore, user: int, data: bytes) -> str:
    sha = hashlib.sha256(data).hexdigest()
    with blobs.stage() as (staged, handle):
        handle.write(data)
        handle.flush()
        blobs.commit_staged(staged, sha)
    db.call("record_source_archive", user, sha, len(data), 2, 100)
    return sha


def refused(db: Database, user: int, spec: dict, blobs: FilesystemBlobStore | None = None) -> Refusal:
    before = db.fetch_one("SELECT count(*) AS n FROM previews")["n"]
    with pytest.raises(Refusal) as err:
        service.create_preview(db, user, spec, blobs)
    assert db.fetch_one("SELECT count(*) AS n FROM previews")["n"] == before, "a refusal stores nothing"
    return err.value


def test_packages_resolve_to_a_hashed_lock_pinned_by_digest(db: Database, tmp_path: Path) -> None:
    user = add_user(db, "alice")
    one_local_fleet(db)
    blobs = FilesystemBlobStore(tmp_path)
    sha = upload(db, blobs, user, build([file("main.py", b"print(1)\n")]))
    first = service.create_preview(db, user, source_spec(sha, packages=["six==1.16.0", "tqdm"]), blobs)
    env = first["resolved"]["runtime"]["environment"]
    assert env["base"] == "isolated" and env["packages"]["six"] == "1.16.0" and "tqdm" in env["packages"]
    assert "six==1.16.0" in env["lock"] and "--hash=sha256:" in env["lock"]
    assert len(env["digest"]) == 64 and env["requested"] == ["six==1.16.0", "tqdm"]
    assert "six 1.16.0" in first["summary"]["runtime"] and env["digest"][:12] in first["summary"]["runtime"]
    # Another lock, another digest; the same request, the same digest (the preview's digest covers it).
    other = service.create_preview(db, user, source_spec(sha, packages=["six==1.15.0"]), blobs)
    assert other["resolved"]["runtime"]["environment"]["digest"] != env["digest"]
    again = service.create_preview(db, user, source_spec(sha, packages=["six==1.16.0", "tqdm"]), blobs)
    assert again["digest"] == first["digest"]


def test_unknown_package_and_impossible_constraint_are_refused_naming_them(db: Database) -> None:
    user = add_user(db, "alice")
    one_local_fleet(db)
    db.call("record_source_archive", user, "ab" * 32, 100, 3, 300)
    spec = source_spec("ab" * 32, packages=["six", "tuneplane-no-such-package-xyz"])
    err = refused(db, user, spec)
    assert err.status == 422 and err.field == "environment.packages.1"
    assert "tuneplane-no-such-package-xyz" in err.message
    err = refused(db, user, source_spec("ab" * 32, packages=["six>=99"]))
    assert err.field == "environment.packages.0" and "six" in err.message
    # Options, URLs and paths never reach uv.
    err = refused(db, user, source_spec("ab" * 32, packages=["--index-url=http://x/"]))
    assert err.field == "environment.packages" and err.status == 422


def test_base_node_never_locks_torch(db: Database) -> None:
    """accelerate depends on torch; on base: node the node's torch is used, so torch is not in the lock."""
    user = add_user(db, "alice")
    one_local_fleet(db)
    db.call("record_source_archive", user, "ab" * 32, 100, 3, 300)
    preview = service.create_preview(
        db, user, source_spec("ab" * 32, base="node", packages=["accelerate==1.0.1"])
    )
    env = preview["resolved"]["runtime"]["environment"]
    assert env["base"] == "node" and env["packages"]["accelerate"] == "1.0.1"
    assert not any(name.startswith(("torch", "nvidia", "triton")) for name in env["packages"]), env[
        "packages"
    ]


def test_requirements_file_in_the_source_archive(db: Database, tmp_path: Path) -> None:
    user = add_user(db, "alice")
    one_local_fleet(db)
    blobs = FilesystemBlobStore(tmp_path)
    sha = upload(db, blobs, user, build([file("main.py"), file("env/requirements.txt", b"six==1.16.0\n")]))
    preview = service.create_preview(db, user, source_spec(sha, requirements="env/requirements.txt"), blobs)
    assert preview["resolved"]["runtime"]["environment"]["packages"] == {"six": "1.16.0"}
    err = refused(db, user, source_spec(sha, requirements="missing.txt"), blobs)
    assert err.field == "environment.requirements" and "missing.txt" in err.message


def test_torchrun_needs_base_node(db: Database) -> None:
    user = add_user(db, "alice")
    one_local_fleet(db)
    db.call("record_source_archive", user, "ab" * 32, 100, 3, 300)
    spec = source_spec("ab" * 32, packages=["six"])
    spec["source"]["integration"] = "torchrun"
    err = refused(db, user, spec)
    assert err.field == "environment.base" and "torch" in err.message


def test_pyproject_with_its_uv_lock_is_exported_exactly(db: Database, tmp_path: Path) -> None:
    """A project's own uv.lock (made here by `uv lock`) is taken as locked: the preview pins its versions."""
    project = tmp_path / "project"
    project.mkdir()
    (project / "pyproject.toml").write_text(
        '[project]\nname = "trainer"\nversion = "0.1.0"\nrequires-python = ">=3.11"\n'
        'dependencies = ["six==1.16.0"]\n'
    )
    subprocess.run([uv_binary(), "lock", "--quiet"], cwd=project, env=uv_environment(), check=True)
    user = add_user(db, "alice")
    one_local_fleet(db)
    blobs = FilesystemBlobStore(tmp_path / "blobs")
    files = [file(f"app/{name}", (project / name).read_bytes()) for name in ("pyproject.toml", "uv.lock")]
    sha = upload(db, blobs, user, build([file("main.py"), *files]))
    preview = service.create_preview(db, user, source_spec(sha, requirements="app/pyproject.toml"), blobs)
    env = preview["resolved"]["runtime"]["environment"]
    assert env["packages"] == {"six": "1.16.0"} and "--hash=sha256:" in env["lock"]
    # Without its uv.lock a pyproject.toml is refused (it is not resolved afresh).
    sha = upload(db, blobs, user, build([file("main.py"), files[0]]))
    err = refused(db, user, source_spec(sha, requirements="app/pyproject.toml"), blobs)
    assert err.field == "environment.requirements" and "uv.lock" in err.message
