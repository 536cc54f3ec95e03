"""The durable spool in the manner of the best disk buffers: torn tails, flipped bits, acks, segments."""

from __future__ import annotations

import json
import os
import shutil
import threading
from pathlib import Path

from tuneplane.app.telemetry import wire
from tuneplane.workers.collector.spool import Spool


def _batch(seq: int) -> bytes:
    return wire.encode("c", seq, [("jsonl:m", "loss", 2)], [seq, seq + 1], [0.5, 1.5], [1.0, 2.0])


def _fill(spool: Spool, n: int) -> list[int]:
    return [spool.append(_batch(i), {"1:2": {"offset": i * 10}}) for i in range(n)]


def _pending_seqs(spool: Spool) -> list[int]:
    seqs = []
    while (record := spool.next_pending(0)) is not None:  # each call takes the next one not in flight
        seqs.append(record.seq)
    return seqs


def test_records_survive_reopen_with_their_file_positions(tmp_path: Path) -> None:
    spool = Spool(tmp_path, fsync_interval=0).open()
    seqs = _fill(spool, 5)
    spool.ack(1)
    spool.ack(2)
    spool.close()
    again = Spool(tmp_path).open()
    record = again.next_pending(0)
    assert record is not None and record.seq == 3
    assert wire.decode(again.read(record)).steps.tolist() == [2, 3]
    assert again.file_states["1:2"]["offset"] == 40
    assert seqs == [1, 2, 3, 4, 5] and again.last_seq == 5


def test_torn_tail_is_truncated_on_start(tmp_path: Path) -> None:
    spool = Spool(tmp_path, fsync_interval=0).open()
    _fill(spool, 3)
    segment = spool.segments()[-1]
    spool.close()
    good_size = segment.stat().st_size
    with open(segment, "ab") as handle:
        # A frame header promising 1000 bytes, and only part of them: the writer died mid-frame.
        handle.write(b"TPS1" + (1000).to_bytes(4, "little") + b"\x00" * 8 + b"partial payload")
    again = Spool(tmp_path).open()
    assert segment.stat().st_size == good_size
    assert again.stats.truncated_bytes > 0 and again.stats.corrupt_records == 0
    assert _pending_seqs(again) == [1, 2, 3]
    assert again.next_pending(0) is None


def test_flipped_bit_in_a_record_is_detected_and_skipped(tmp_path: Path) -> None:
    spool = Spool(tmp_path, fsync_interval=0).open()
    _fill(spool, 3)
    second = spool._pending[2]
    spool.close()
    with open(second.segment, "r+b") as handle:
        handle.seek(second.offset + 20)
        byte = handle.read(1)
        handle.seek(second.offset + 20)
        handle.write(bytes([byte[0] ^ 0x10]))
    again = Spool(tmp_path).open()
    assert again.stats.corrupt_records == 1
    assert _pending_seqs(again) == [1, 3]


def test_crash_between_write_and_ack_resends_the_same_batch(tmp_path: Path) -> None:
    spool = Spool(tmp_path, fsync_interval=0).open()
    _fill(spool, 2)
    sent = spool.read(spool.next_pending(0))  # sent, and the process dies before the ack
    del spool  # no close: the ledger never heard of it
    again = Spool(tmp_path).open()
    record = again.next_pending(0)
    assert record.seq == 1 and again.read(record) == sent


def test_records_are_offered_only_once_durable(tmp_path: Path) -> None:
    spool = Spool(tmp_path, fsync_interval=3600).open()
    spool.append(_batch(0), {})
    assert spool.durable_seq == 0
    record = spool.next_pending(0)  # a sender with nothing durable makes the waiting record durable first
    assert record.seq == 1 and spool.durable_seq == 1


def test_fsync_waits_for_its_interval_unless_a_sender_is_starved(tmp_path: Path) -> None:
    spool = Spool(tmp_path, fsync_interval=3600).open()
    spool.append(_batch(0), {})
    spool.sync()  # nothing sendable: synced at once
    spool.append(_batch(1), {})
    spool.sync()  # batch 1 is still waiting to be sent: batch 2 waits for the interval
    assert spool.durable_seq == 1
    assert spool.next_pending(0).seq == 1
    # The only durable record is in flight: the next sender would starve, so it syncs batch 2 itself
    # (without waiting for the reader to finish its next chunk).
    assert spool.next_pending(0).seq == 2
    assert spool.durable_seq == 2
    assert spool.next_pending(0) is None


def test_segment_is_deleted_only_after_all_its_records_are_acked(tmp_path: Path) -> None:
    spool = Spool(tmp_path, segment_bytes=400, fsync_interval=0).open()
    _fill(spool, 12)
    segments = spool.segments()
    assert len(segments) > 3
    # Ack everything but the last record: all but the segment holding it (and the active one) go away.
    for seq in range(1, 12):
        spool.ack(seq)
    remaining = spool.segments()
    assert segments[-1] in remaining
    assert all(not p.exists() for p in segments if p not in remaining)
    assert int((tmp_path / "acked").read_text().split()[0]) == 11
    spool.close()
    again = Spool(tmp_path).open()
    assert _pending_seqs(again) == [12]
    assert again.file_states["1:2"]["offset"] == 110  # positions survive segment deletion


def test_damaged_ack_ledger_resends_instead_of_losing(tmp_path: Path) -> None:
    spool = Spool(tmp_path, fsync_interval=0).open()
    _fill(spool, 3)
    spool.ack(1)
    spool.close()
    (tmp_path / "acked").write_text("3 deadbeef\n")
    again = Spool(tmp_path).open()
    assert _pending_seqs(again) == [1, 2, 3]


def test_out_of_order_acks_advance_the_ledger_only_over_a_contiguous_prefix(tmp_path: Path) -> None:
    spool = Spool(tmp_path, fsync_interval=0).open()
    _fill(spool, 4)
    first, second, third = (spool.next_pending(0) for _ in range(3))
    spool.ack(third.seq)
    spool.ack(second.seq)
    assert spool.acked == 0  # batch 1 is still in flight
    spool.release(first)
    assert spool.next_pending(0).seq == 1  # a failed send is offered again
    spool.ack(1)
    assert spool.acked == 3
    spool.close()
    assert _pending_seqs(Spool(tmp_path).open()) == [4]


def test_rejected_batch_is_kept_aside_and_no_longer_pending(tmp_path: Path) -> None:
    spool = Spool(tmp_path, fsync_interval=0).open()
    _fill(spool, 2)
    spool.reject(spool.next_pending(0), "400 bad batch")
    assert spool.next_pending(0).seq == 2
    assert (tmp_path / "rejected" / f"{1:020d}.reason").read_text() == "400 bad batch\n"


def test_spool_directory_is_private(tmp_path: Path) -> None:
    Spool(tmp_path / "sp").open().close()
    assert os.stat(tmp_path / "sp").st_mode & 0o077 == 0


def test_a_spool_directory_removed_while_running_is_rebuilt_with_every_unacked_batch(tmp_path: Path) -> None:
    """Before, batches went on into unlinked files, pending ones could not be read (sent never), and the
    next start began an empty spool under a new id: every file read again, every point stored twice."""
    directory = tmp_path / "spool"
    spool = Spool(directory, fsync_interval=0, segment_bytes=600).open()  # several segments
    _fill(spool, 6)
    uuid = spool.collector_uuid
    spool.ack(1)
    spool.ack(2)
    shutil.rmtree(directory)
    assert spool.append(_batch(6), {"1:2": {"offset": 60}, "3:4": {"offset": 7}}) == 7
    sent = {}
    while (record := spool.next_pending(0)) is not None:
        sent[record.seq] = wire.decode(spool.read(record)).steps.tolist()
    assert sent == {seq: [seq - 1, seq] for seq in range(3, 8)}
    spool.ack(3)
    spool.close()
    again = Spool(directory).open()
    assert again.collector_uuid == uuid and again.last_seq == 7
    assert _pending_seqs(again) == [4, 5, 6, 7]
    assert again.file_states == {"1:2": {"offset": 60}, "3:4": {"offset": 7}}
    again.close()


def test_a_damaged_scope_file_does_not_stop_the_collector_from_starting(tmp_path: Path) -> None:
    """scope.json was rewritten in place at every start; one cut short by a crash made every later start
    die on a JSONDecodeError, so nothing spooled was ever sent."""
    from tuneplane.workers.collector.collector import Collector, CollectorConfig

    spool = tmp_path / "spool"
    spool.mkdir()
    (spool / "scope.json").write_text('{"job_id": 1, "att')
    scope = {"job_id": 1, "attempt": 1, "member": 0}
    collector = Collector(
        CollectorConfig(tmp_path / "out", spool, "http://127.0.0.1:9", "t", scope=scope, sample_interval=0)
    )
    collector.spool.close()
    assert json.loads((spool / "scope.json").read_text()) == scope


def test_waiting_for_every_ack_is_woken_by_the_last_one(tmp_path: Path) -> None:
    spool = Spool(tmp_path, fsync_interval=0).open()
    _fill(spool, 2)
    assert spool.wait_all_acked(0) is False
    spool.ack(1)
    waiting = threading.Event()
    result: list[bool] = []

    def waiter() -> None:
        waiting.set()
        result.append(spool.wait_all_acked(60))

    thread = threading.Thread(target=waiter)
    thread.start()
    waiting.wait(10)
    spool.ack(2)
    thread.join(30)
    assert result == [True] and not thread.is_alive()
    assert spool.wait_all_acked(0) is True
