"""The spool on a disk that fills up (a real 1 MiB tmpfs; skipped where mounting is not allowed)."""

from __future__ import annotations

from pathlib import Path

from tests.small_fs import fill_up, small_tmpfs
from tuneplane.app.telemetry import wire
from tuneplane.workers.collector.spool import RESERVE, RESERVE_BYTES, Spool


def _big_batch(seq: int) -> bytes:
    """About 48 KiB: a full batch of points, larger than one free page."""
    n = 2000
    return wire.encode("c", seq, [("jsonl:m", "loss", n)], list(range(n)), [0.5] * n, [1.0] * n)


def test_acks_received_while_the_disk_was_full_free_the_segments_while_it_is_full(tmp_path: Path) -> None:
    """The collector filled its spool's disk while the gateway was down and was restarted on the full disk;
    the gateway came back and acknowledged every batch while no byte was free. Before, the ack ledger was
    written through a temporary file and a rename, which needs a free block: no ack was recorded, so no
    segment could be deleted, and once a page was free again the new segment took it, the ledger still had
    no room, and every later write failed for good (the collector stayed paused for ever: a CI run timed
    out waiting for its points). Now the ledger is overwritten in place and the spool frees its
    acknowledged segments."""
    with small_tmpfs(tmp_path / "small", "1m") as disk:
        spool_dir = disk / "spool"
        first = Spool(spool_dir, fsync_interval=0).open()
        written = 0
        try:
            while True:
                first.append(_big_batch(written + 1), {"1:2": {"offset": written}})
                written += 1
        except OSError:
            pass
        first.close()
        assert written >= 10
        fill_up(disk)

        second = Spool(spool_dir, fsync_interval=0).open()  # no room for a new segment: appends to the last
        while (record := second.next_pending(0)) is not None:
            second.ack(record.seq)
        assert second.pending_count() == 0

        seq = second.append(_big_batch(0), {"1:2": {"offset": written}})
        assert seq == written + 1
        assert len(second.segments()) == 1  # the acknowledged segment is gone, the new one holds the batch
        second.close()

        third = Spool(spool_dir).open()
        assert [third.next_pending(0).seq] == [written + 1]  # type: ignore[union-attr]
        assert third.file_states["1:2"]["offset"] == written


def test_a_full_disk_whose_only_segment_is_acknowledged_starts_a_new_one_from_the_reserve(
    tmp_path: Path,
) -> None:
    """The last segment is never deleted (it is the one written to), and a new one needs a free block: on a
    disk with none, a spool whose every batch was acknowledged could free nothing and stayed full for good.
    The reserve the spool holds back while there is room is let go for the new segment."""
    with small_tmpfs(tmp_path / "small", "1m") as disk:
        spool = Spool(disk / "spool", fsync_interval=0).open()
        assert (disk / "spool" / RESERVE).stat().st_size == RESERVE_BYTES
        for seq in range(1, 6):
            spool.append(_big_batch(seq), {"1:2": {"offset": seq}})
        fill_up(disk)
        while (record := spool.next_pending(0)) is not None:
            spool.ack(record.seq)
        assert len(spool.segments()) == 1
        assert spool.append(_big_batch(6), {"1:2": {"offset": 6}}) == 6
        assert len(spool.segments()) == 1  # the acknowledged one is gone
        assert (disk / "spool" / RESERVE).exists()  # held back again once there was room
        spool.close()
        again = Spool(disk / "spool").open()
        assert again.next_pending(0).seq == 6  # type: ignore[union-attr]
        assert again.file_states["1:2"]["offset"] == 6
