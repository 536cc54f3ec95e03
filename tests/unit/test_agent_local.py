"""The agent's local pieces: capacity probing, the state/work directory rule, the credential file, backoff."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from tuneplane.workers.agent import capacity
from tuneplane.workers.agent.credential import FileCredentialStore, StoredCredential
from tuneplane.workers.agent.directories import AgentPaths, StateError
from tuneplane.workers.agent.main import AgentError, backoff_delay, client_ssl

NVIDIA_SMI_OUTPUT = "0, NVIDIA H200, 143771\n1, NVIDIA A100-SXM4-80GB, 81920\n2, Tesla T4, Rev. B, 15360\n"


def _fake_binary(directory: Path, name: str, script: str) -> None:
    path = directory / name
    path.write_text(f"#!/bin/sh\n{script}\n")
    path.chmod(0o755)


def test_nvidia_smi_rows_become_gpus_even_with_commas_in_the_model() -> None:
    gpus = capacity.parse_nvidia_smi(NVIDIA_SMI_OUTPUT)
    assert [(g["index"], g["model"], g["memory_bytes"]) for g in gpus] == [
        (0, "NVIDIA H200", 143771 * 1024 * 1024),
        (1, "NVIDIA A100-SXM4-80GB", 81920 * 1024 * 1024),
        (2, "Tesla T4, Rev. B", 15360 * 1024 * 1024),
    ]
    assert not any(g["simulated"] for g in gpus)


def test_an_agent_told_which_gpus_offers_only_those_and_says_a_bad_setting(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _fake_binary(tmp_path, "nvidia-smi", f"printf '{NVIDIA_SMI_OUTPUT}'")
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setenv(capacity.NODE_GPUS_VARIABLE, "0, 2")
    gpus, problem = capacity.detect_gpus()
    assert problem is None and [(g["index"], g["model"]) for g in gpus] == [
        (0, "NVIDIA H200"),
        (2, "Tesla T4, Rev. B"),
    ]
    monkeypatch.setenv(capacity.NODE_GPUS_VARIABLE, "1,5")
    gpus, problem = capacity.detect_gpus()
    assert gpus == [] and "names GPU(s) [5] this machine does not have" in problem
    monkeypatch.setenv(capacity.NODE_GPUS_VARIABLE, "one")
    assert "must be GPU indices" in capacity.detect_gpus()[1]


def test_gpus_are_detected_through_nvidia_smi_on_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A fake nvidia-smi (no NVIDIA driver on this machine), printing what the real one prints.
    _fake_binary(tmp_path, "nvidia-smi", f"printf '{NVIDIA_SMI_OUTPUT}'")
    _fake_binary(tmp_path, "podman", "exit 0")
    monkeypatch.setenv("PATH", str(tmp_path))
    found, problem = capacity.detect(None, "1.2.3")
    assert problem is None and [g["model"] for g in found["gpus"]][:2] == [
        "NVIDIA H200",
        "NVIDIA A100-SXM4-80GB",
    ]
    assert found["container_runtimes"] == ["podman"] and found["agent_version"] == "1.2.3"
    assert found["cpus"] >= 1 and found["memory_bytes"] > 0


def test_a_failing_nvidia_smi_is_a_reported_problem_not_a_crash(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _fake_binary(tmp_path, "nvidia-smi", "echo 'NVIDIA-SMI has failed' >&2; exit 9")
    monkeypatch.setenv("PATH", str(tmp_path))
    found, problem = capacity.detect(None)
    assert found["gpus"] == [] and "exited 9" in problem and found["container_runtimes"] == []


def test_no_driver_means_no_gpus_and_no_problem(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    found, problem = capacity.detect(None)
    assert found["gpus"] == [] and problem is None


def test_simulated_gpus_replace_detection_and_say_so(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _fake_binary(tmp_path, "nvidia-smi", f"printf '{NVIDIA_SMI_OUTPUT}'")
    monkeypatch.setenv("PATH", str(tmp_path))
    found, _ = capacity.detect(3)
    assert [g["index"] for g in found["gpus"]] == [0, 1, 2]
    assert all(g["simulated"] and g["model"] == "Simulated GPU" for g in found["gpus"])


def test_state_dir_and_work_dir_may_not_contain_each_other(tmp_path: Path) -> None:
    with pytest.raises(StateError, match="never be under a directory given to workloads"):
        AgentPaths.prepare(tmp_path / "work" / "state", tmp_path / "work")
    with pytest.raises(StateError, match="inside the state directory"):
        AgentPaths.prepare(tmp_path / "state", tmp_path / "state" / "work")
    with pytest.raises(StateError):
        AgentPaths.prepare(tmp_path / "same", tmp_path / "same")
    # Through a symlink too: the check is on resolved paths.
    (tmp_path / "w").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "w")
    with pytest.raises(StateError):
        AgentPaths.prepare(tmp_path / "w" / "state", tmp_path / "link")


def test_default_work_dir_is_a_sibling_and_workload_dirs_stay_inside_it(tmp_path: Path) -> None:
    paths = AgentPaths.prepare(tmp_path / "node")
    assert paths.work_dir == tmp_path / "node-work"
    assert stat.S_IMODE(os.stat(paths.state_dir).st_mode) == 0o700
    assert paths.workload_dir("job-7", "rank-0") == tmp_path / "node-work" / "job-7" / "rank-0"
    with pytest.raises(StateError):
        paths.workload_dir("..", "node")


def test_credential_file_is_0600_and_a_readable_one_is_refused(tmp_path: Path) -> None:
    old_umask = os.umask(0)
    try:
        paths = AgentPaths.prepare(tmp_path / "s")
        store = FileCredentialStore(paths.credential_path)
        store.save(StoredCredential(1, "n", "f", "tpn_secret"))
    finally:
        os.umask(old_umask)
    assert stat.S_IMODE(os.stat(paths.credential_path).st_mode) == 0o600
    assert store.load().credential == "tpn_secret"
    os.chmod(paths.credential_path, 0o644)
    with pytest.raises(StateError, match="chmod 600"):
        store.load()


def test_backoff_grows_to_the_cap_with_jitter() -> None:
    first = [backoff_delay(0, 30) for _ in range(200)]
    late = [backoff_delay(20, 30) for _ in range(200)]
    assert all(0.25 <= d <= 0.5 for d in first)
    assert all(15 <= d <= 30 for d in late) and len(set(late)) > 100


def test_tls_settings_never_disable_verification(tmp_path: Path) -> None:
    context = client_ssl("https://gw.example:8081", None)
    assert context.verify_mode.name == "CERT_REQUIRED" and context.check_hostname
    assert client_ssl("http://127.0.0.1:8081", None) is False
    with pytest.raises(AgentError):
        client_ssl("http://127.0.0.1:8081", str(tmp_path / "ca.pem"))
    with pytest.raises(AgentError, match="cannot use CA bundle"):
        client_ssl("https://gw.example:8081", str(tmp_path / "missing.pem"))
