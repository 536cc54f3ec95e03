"""workers/artifacts/deliver.tls_context: the node's HTTP clients share one verifying TLS context per CA
bundle (building one parses every trusted certificate; a gang's end opened one per member), and a bundle
replaced on disk is read again."""

from __future__ import annotations

import os
import shutil
import ssl
from pathlib import Path

import certifi

from tuneplane.workers.artifacts import deliver
from tuneplane.workers.artifacts.deliver import node_http, tls_context


def test_one_verifying_context_per_bundle_and_a_changed_bundle_is_read_again(tmp_path: Path) -> None:
    bundle = tmp_path / "ca.pem"
    shutil.copy(certifi.where(), bundle)
    first = tls_context(str(bundle))
    assert tls_context(str(bundle)) is first
    assert (first.verify_mode, first.check_hostname) == (ssl.CERT_REQUIRED, True)
    system = tls_context(None)
    assert system is tls_context(None) and system is not first
    assert (system.verify_mode, system.check_hostname) == (ssl.CERT_REQUIRED, True)
    for seconds in range(1, 6):  # a bundle rotated again and again
        stat = bundle.stat()
        os.utime(bundle, (stat.st_atime, stat.st_mtime + seconds))
        assert tls_context(str(bundle)) is not first
    # Only the newest context of a bundle is kept: rotations do not grow the cache.
    assert [key for key in deliver._TLS_CONTEXTS if key[0] == str(bundle)] == [
        (str(bundle), bundle.stat().st_mtime)
    ]
    with node_http("http://127.0.0.1:1", "tpn_x", ca_bundle=str(bundle)) as http:
        assert http.headers["Authorization"] == "Node tpn_x"
