"""CLI progress bars: drawn on a terminal, absent when standard error is not one or with --quiet."""

from __future__ import annotations

import io

import pytest

from tuneplane.app.cli.progress import byte_progress


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_a_bar_is_drawn_on_a_terminal_and_not_otherwise(monkeypatch: pytest.MonkeyPatch) -> None:
    terminal = Terminal()
    monkeypatch.setattr("sys.stderr", terminal)
    with byte_progress("ckpt of job 3", 2048) as advance:
        advance(1024)
        advance(1024)
    assert "ckpt of job 3" in terminal.getvalue()

    quiet = Terminal()
    monkeypatch.setattr("sys.stderr", quiet)
    with byte_progress("quiet", 2048, quiet=True) as advance:
        advance(2048)
    assert quiet.getvalue() == ""

    piped = io.StringIO()
    monkeypatch.setattr("sys.stderr", piped)
    with byte_progress("piped", 2048) as advance:
        advance(2048)
    assert piped.getvalue() == ""
