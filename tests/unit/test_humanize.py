"""Sizes and times for people (issue 15 point 11)."""

from __future__ import annotations

import datetime as dt

from tuneplane.app.humanize import ago, duration, size


def test_sizes_use_binary_units() -> None:
    assert [size(v) for v in (0, 512, 1536, 1024**3, 1073741824 * 1.5, 5 * 1024**5, None)] == [
        "0 B", "512 B", "1.5 KiB", "1.0 GiB", "1.5 GiB", "5.0 PiB", "-",
    ]  # fmt: skip


def test_durations_and_relative_times() -> None:
    assert [duration(s) for s in (0, 59, 60, 185, 3600, 7260, 90000)] == [
        "0 s", "59 s", "1 min", "3 min 5 s", "1 h", "2 h 1 min", "1 d 1 h",
    ]  # fmt: skip
    now = dt.datetime(2026, 12, 3, 12, 0, tzinfo=dt.UTC)
    assert ago(now - dt.timedelta(minutes=5), now) == "5 min ago"
    assert ago(now + dt.timedelta(hours=2), now) == "in 2 h"
    assert ago(now - dt.timedelta(seconds=2), now) == "just now"
    assert ago((now - dt.timedelta(days=30)).isoformat(), now) == "2026-11-03 12:00 UTC"
