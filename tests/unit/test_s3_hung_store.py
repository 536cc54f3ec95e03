"""A store that hangs (stopped, not dead: its kernel still accepts connections, nothing answers) fails a
call in seconds, not after botocore's 60 s read timeout times three attempts: a user's download or verify
is answered 503 instead of hanging for minutes. A real listening socket on loopback that never answers."""

from __future__ import annotations

import socket
import time

import pytest

from tuneplane.app import s3store
from tuneplane.app.s3store import S3Credentials, S3Location, S3Store


def test_a_hung_store_fails_a_call_within_the_read_timeout(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(s3store, "READ_TIMEOUT_S", 0.5)
    with socket.socket() as hung:
        hung.bind(("127.0.0.1", 0))
        hung.listen(16)  # connections complete in the kernel's backlog; nobody reads or answers
        endpoint = f"http://127.0.0.1:{hung.getsockname()[1]}"
        store = S3Store(S3Location(endpoint, "ckpt", "p"), S3Credentials("k", "s"))
        started = time.monotonic()
        with pytest.raises(Exception, match=r"(?i)timeout|timed out"):
            store.object_size(store.key("artifacts/1/0"))
        assert time.monotonic() - started < 20  # three attempts of 0.5 s and back-off, not of 60 s
