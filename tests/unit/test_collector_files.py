"""JSONL tailing, file identity, rotation and the network-filesystem refusal."""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path

import pytest

from tuneplane.workers.collector.fs_check import NetworkFilesystemError, check_local, mount_of
from tuneplane.workers.collector.sources import OutputTracker


def _points(tracker: OutputTracker) -> list:
    return [p for chunk in tracker.read(10_000) for p in chunk.points]


def test_jsonl_torn_last_line_is_waited_for_not_parsed(tmp_path: Path) -> None:
    path = tmp_path / "metrics.jsonl"
    path.write_bytes(b'{"step": 1, "loss": 0.5, "lr": 0.1}\n{"step": 2, "lo')
    tracker = OutputTracker(tmp_path)
    tracker.discover()
    first = _points(tracker)
    state = next(iter(tracker.states.values()))
    assert [(p.name, p.step, p.value) for p in first] == [("loss", 1, 0.5), ("lr", 1, 0.1)]
    assert state.offset == len(b'{"step": 1, "loss": 0.5, "lr": 0.1}\n') and state.bad_records == 0
    with open(path, "ab") as handle:
        handle.write(b'ss": 0.25, "eval": {"loss": 0.75}, "time": 1234.5}\n')
    second = _points(tracker)
    tracker.close()
    assert [(p.name, p.step, p.value, p.wall_time) for p in second] == [
        ("loss", 2, 0.25, 1234.5),
        ("eval/loss", 2, 0.75, 1234.5),
    ]
    assert {p.source for p in first + second} == {"jsonl:metrics.jsonl"}


def test_jsonl_lines_without_a_step_are_skipped_and_counted(tmp_path: Path) -> None:
    (tmp_path / "m.jsonl").write_text('{"loss": 1}\nnot json\n[1,2]\n{"step": 3, "loss": 2, "ok": true}\n')
    tracker = OutputTracker(tmp_path)
    tracker.discover()
    chunks = list(tracker.read(10_000))
    state = next(iter(tracker.states.values()))
    tracker.close()
    assert [(p.name, p.step) for c in chunks for p in c.points] == [("loss", 3)]
    assert state.bad_records == 4
    refused: dict = {}
    for chunk in chunks:
        for key, n in chunk.refused.items():
            refused[key] = refused.get(key, 0) + n
    assert refused == {
        ("", "line has no integer step"): 1,
        ("", "line is not a JSON object"): 2,
        ("ok", "value is not a number"): 1,
    }


def test_jsonl_bad_values_are_refused_one_by_one_and_the_rest_is_read(tmp_path: Path) -> None:
    lines = [
        '{"step": 1, "loss": 0.5}',
        '{"step": 9223372036854775808, "loss": 0.1}',  # 2^63
        '{"step": 2, "loss": 1' + "0" * 400 + "}",  # an integer no float64 holds
        '{"step": 3, "bad\\u0000key": 1.0, "loss": 0.25}',
        '{"step": 4, "' + "k" * 600 + '": 1.0, "loss": 0.125}',
        '{"step": 5, "loss": NaN, "up": Infinity, "down": -Infinity}',
        '{"step": 6, "loss": "high", "lr": 0.1}',
        '{"step": 7, "loss": 0.0625}',
    ]
    (tmp_path / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    tracker = OutputTracker(tmp_path)
    tracker.discover()
    chunks = list(tracker.read(10_000))
    tracker.close()
    points = [(p.name, p.step, p.value) for c in chunks for p in c.points]
    finite = [(n, s, v) for n, s, v in points if v == v and abs(v) != float("inf")]
    assert sorted(finite) == [
        ("loss", 1, 0.5),
        ("loss", 3, 0.25),
        ("loss", 4, 0.125),
        ("loss", 7, 0.0625),
        ("lr", 6, 0.1),
    ]
    odd = sorted((n, s, str(v)) for n, s, v in points if (n, s, v) not in finite)
    assert odd == [("down", 5, "-inf"), ("loss", 5, "nan"), ("up", 5, "inf")]
    refused = {key: n for c in chunks for key, n in c.refused.items()}
    assert refused == {
        ("loss", "step outside ±(2^53-1)"): 1,
        ("loss", "number too large for a float64"): 1,
        ("", "name holds a NUL or control character"): 1,
        ("", "name longer than 512 characters"): 1,
        ("loss", "value is not a number"): 1,
    }


def test_jsonl_last_line_without_newline_is_read_once_the_member_ended(tmp_path: Path) -> None:
    (tmp_path / "m.jsonl").write_bytes(b'{"step": 1, "loss": 0.5}\n{"step": 2, "loss": 0.25}')
    tracker = OutputTracker(tmp_path)
    tracker.discover()
    assert [p.step for c in tracker.read(100) for p in c.points] == [1]
    assert tracker.unread()
    assert [p.step for c in tracker.read(100, final=True) for p in c.points] == [2]
    assert not tracker.unread()
    tracker.close()


def test_rotated_file_keeps_its_offset_and_the_new_file_starts_at_zero(tmp_path: Path) -> None:
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"step": 1, "loss": 1}\n')
    tracker = OutputTracker(tmp_path)
    tracker.discover()
    assert [p.step for p in _points(tracker)] == [1]
    with open(path, "a") as handle:
        handle.write('{"step": 2, "loss": 2}\n')
    os.rename(path, tmp_path / "metrics.jsonl.1")  # rotated before the collector read step 2
    path.write_text('{"step": 3, "loss": 3}\n')
    tracker.discover()
    later = _points(tracker)
    sources = {p.step: p.source for p in later}
    tracker.close()
    assert sorted(sources) == [2, 3]
    assert set(sources.values()) == {"jsonl:metrics.jsonl"}


def _lines(steps: range, **values: float) -> str:
    return "".join(json.dumps({"step": step, **values}) + "\n" for step in steps)


def test_a_file_rewritten_in_place_longer_is_read_again_from_the_start(tmp_path: Path) -> None:
    """The same inode with other first bytes and more of them (a script that writes its whole history
    again; copytruncate with the writer already past the old position): before, reading went on at the
    old position, in the middle of a line of the new text (steps 0-6 lost, one line refused)."""
    path = tmp_path / "metrics.jsonl"
    path.write_text(_lines(range(10), loss=1.0))
    tracker = OutputTracker(tmp_path)
    tracker.discover()
    assert [p.step for p in _points(tracker)] == list(range(10))
    inode = path.stat().st_ino
    path.write_text(_lines(range(20), loss=2.0, lr=0.5))  # truncated and written again, longer
    assert path.stat().st_ino == inode
    chunks = list(tracker.read(10_000))
    assert sorted((p.name, p.step, p.value) for c in chunks for p in c.points) == sorted(
        [("loss", step, 2.0) for step in range(20)] + [("lr", step, 0.5) for step in range(20)]
    )
    assert not any(c.refused for c in chunks)
    # Copytruncate: emptied, then the writer goes on appending past the old position before the next read.
    with open(path, "r+") as handle:
        handle.truncate(0)
    with open(path, "a") as handle:
        handle.write(_lines(range(20, 60), loss=3.0))
    assert [p.step for p in _points(tracker)] == list(range(20, 60))
    tracker.close()


def test_deleted_file_is_read_to_its_end_then_forgotten(tmp_path: Path) -> None:
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"step": 1, "loss": 1}\n')
    tracker = OutputTracker(tmp_path)
    tracker.discover()
    with open(path, "a") as handle:
        handle.write('{"step": 2, "loss": 2}\n')
    path.unlink()
    assert [p.step for p in _points(tracker)] == [1, 2]
    _points(tracker)
    assert tracker.states == {}
    tracker.close()


def test_recycled_inode_with_other_content_is_a_new_file(tmp_path: Path) -> None:
    from tuneplane.workers.collector.file_identity import FileIdentity
    from tuneplane.workers.collector.sources import FileState

    path = tmp_path / "metrics.jsonl"
    path.write_text('{"step": 5, "loss": 5}\n{"step": 6, "loss": 6}\n')
    st = path.stat()
    # A checkpoint for the same (device, inode) whose first bytes were different: another file.
    stale = FileState(
        FileIdentity(st.st_dev, st.st_ino, 23, "0" * 64),
        "jsonl",
        "jsonl:metrics.jsonl",
        "metrics.jsonl",
        offset=24,
    )
    tracker = OutputTracker(tmp_path, {(st.st_dev, st.st_ino): stale})
    tracker.discover()
    steps = [p.step for p in _points(tracker)]
    tracker.close()
    assert steps == [5, 6]


def test_short_file_identity_widens_to_64_bytes_as_it_grows(tmp_path: Path) -> None:
    path = tmp_path / "m.jsonl"
    path.write_text('{"step": 1, "a": 1}\n')
    tracker = OutputTracker(tmp_path)
    tracker.discover()
    _points(tracker)
    state = next(iter(tracker.states.values()))
    assert state.identity.prefix_len == 20
    with open(path, "a") as handle:
        handle.write('{"step": 2, "a": 2}\n' * 5)
    assert [p.step for p in _points(tracker)] == [2] * 5
    assert state.identity.prefix_len == 64
    tracker.close()


MOUNTS = """\
/dev/sda1 / ext4 rw,relatime 0 0
server:/export /mnt/shared nfs4 rw,relatime 0 0
//host/share /mnt/smb cifs rw 0 0
user@h:/x /mnt/ssh fuse.sshfs rw 0 0
/dev/sdb1 /mnt/shared/local\\040disk xfs rw 0 0
"""


@pytest.mark.parametrize(
    ("path", "fstype"),
    [
        ("/var/spool/tp", "ext4"),
        ("/mnt/shared/x", "nfs4"),
        ("/mnt/smb", "cifs"),
        ("/mnt/ssh/a/b", "fuse.sshfs"),
        ("/mnt/shared/local disk/spool", "xfs"),
        ("/mnt/sharedother", "ext4"),
    ],
)
def test_mount_of_picks_the_longest_mount_point(path: str, fstype: str) -> None:
    assert mount_of(Path(path), MOUNTS)[1] == fstype


def test_spool_on_a_network_filesystem_is_refused(tmp_path: Path) -> None:
    mounts = tmp_path / "mounts"
    mounts.write_text(f"/dev/sda1 / ext4 rw 0 0\nsrv:/e {tmp_path} nfs rw 0 0\n")
    with pytest.raises(NetworkFilesystemError, match="network filesystem"):
        check_local(tmp_path / "spool", str(mounts))
    assert check_local(tmp_path / "spool") not in ("nfs", "nfs4")


@pytest.mark.parametrize(
    "raw",
    [
        b'  {"step": 1, "a": 2}  ',
        b'\xef\xbb\xbf{"step": 1, "a": 2}',  # a UTF-8 byte-order mark on the file's first line
        b'{"step": 1, "a": NaN}',
        b'{"step": 1} {"step": 2}',
        b'{"step": 1, "a": 2',
        b"\xff\xfe",
        b"[1, 2]",
    ],
)
def test_fast_line_decoder_agrees_with_json_loads(raw: bytes) -> None:
    import json

    from tuneplane.workers.collector.jsonl import _loads

    try:
        expected = json.loads(raw)
    except ValueError:
        with pytest.raises(ValueError):
            _loads(raw)
        return
    got = _loads(raw)
    assert json.dumps(got) == json.dumps(expected)


def test_a_fifo_named_like_a_metrics_file_is_skipped_not_opened(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / "metrics.jsonl")  # opening it for reading would wait for a writer for ever
    (tmp_path / "train.jsonl").write_text('{"step": 1, "loss": 0.5}\n')
    tracker = OutputTracker(tmp_path)
    seen: list = []
    worker = threading.Thread(target=lambda: (tracker.discover(), seen.extend(_points(tracker))), daemon=True)
    worker.start()
    worker.join(timeout=10)
    alive = worker.is_alive()
    if alive:  # unblock the open so the thread can end
        os.close(os.open(tmp_path / "metrics.jsonl", os.O_WRONLY | os.O_NONBLOCK))
    assert not alive, "discover blocked on the FIFO"
    assert [(p.source, p.name, p.step) for p in seen] == [("jsonl:train.jsonl", "loss", 1)]
    tracker.close()


class _CountedStates(dict):
    """The tracker's file states, counting how often all of them are gone through."""

    walks = 0

    def values(self):  # type: ignore[override]
        _CountedStates.walks += 1
        return super().values()


def test_health_is_summed_once_per_poll_not_once_per_batch_and_names_the_batchs_own_file(
    tmp_path: Path,
) -> None:
    """One batch per file with news: the health summary went through every file for every batch, so a poll
    of 5,000 trial files took 3.4 s (2.7 s in the summary). It is summed once per poll; each batch's own
    file is brought up to date in it."""
    from tuneplane.app.telemetry import wire
    from tuneplane.workers.collector.collector import Collector, CollectorConfig

    out = tmp_path / "out"
    for i in range(300):
        (out / f"t{i:03d}").mkdir(parents=True)
        (out / f"t{i:03d}" / "m.jsonl").write_text('{"step": 1, "loss": 1}\nnot json\n')
    config = CollectorConfig(out, tmp_path / "spool", "http://127.0.0.1:9", "t", sample_interval=0)
    collector = Collector(config)
    collector.tracker.states = _CountedStates(collector.tracker.states)
    _CountedStates.walks = 0
    assert collector.poll_once() == 300
    assert _CountedStates.walks <= 4
    records = []
    while (record := collector.spool.next_pending(0)) is not None:
        records.append(record)
    health = wire.decode(collector.spool.read(records[-1])).health
    assert health["refused_or_damaged"]["t299/m.jsonl"] == 1  # this batch's own file
    collector.tracker.close()
    collector.spool.close()
