"""workers/artifacts/deliver.tls_context: the node's HTTP clients share one verifying TLS context per CA
bundle (building one parses every trusted certificate; a gang's end opened one per member), and a bundle
replaced on disk is read again."""

from __future__ import annotations

import os
import shutil
import ssl
from pathlib import Path

import certifi

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
    stat = bundle.stat()
    os.utime(bundle, (stat.st_atime, stat.st_mtime + 10))  # a rotated bundle
    assert tls_context(str(bundle)) is not first
    with node_http("http://127.0.0.1:1", "tpn_x", ca_bundle=str(bundle)) as http:
        assert http.headers["Authorization"] == "Node tpn_x"
