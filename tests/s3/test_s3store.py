"""The S3 store against a real SeaweedFS (tests/seaweed_store.py): objects, the BlobStore protocol, presigned
multipart parts bound to one key and one body, and the verifier that finds bytes changed at rest."""

from __future__ import annotations

import hashlib
import os
import secrets
from pathlib import Path

import httpx
import pytest

from tests.seaweed_store import ACCESS_KEY, BUCKET, SECRET_KEY
from tuneplane.app.s3store import (
    CHECKSUM_HEADER,
    S3ConfigError,
    S3Credentials,
    S3Location,
    S3Store,
    load_credentials,
    part_checksum,
)

MiB = 1024 * 1024


@pytest.fixture
def store(seaweed) -> S3Store:
    # A prefix per test: tests share the session's bucket.
    prefix = f"t/{secrets.token_hex(4)}"
    return S3Store(S3Location(seaweed.endpoint, BUCKET, prefix), S3Credentials(ACCESS_KEY, SECRET_KEY))


def test_blobstore_protocol_put_get_verify(store: S3Store) -> None:
    data = secrets.token_bytes(3 * MiB + 17)
    digest = hashlib.sha256(data).hexdigest()
    assert not store.exists(digest)
    with store.stage() as (path, handle):
        handle.write(data)
        handle.flush()
        assert store.commit_staged(path, digest) is True
        assert store.commit_staged(path, digest) is False  # already there
    assert store.exists(digest)
    with store.open(digest) as body:
        assert body.read() == data
    assert store.object_sha256(store.blob_key(digest)) == (digest, len(data))
    assert store.verify(store.blob_key(digest), digest, len(data))
    assert not store.verify(store.blob_key(digest), "0" * 64)
    assert not store.verify(store.key("missing"), digest)
    with store.stage() as (path, handle):
        handle.write(b"other bytes")
        handle.flush()
        with pytest.raises(ValueError, match="staged blob has sha256"):
            store.commit_staged(path, "1" * 64)


def _upload_part(url: str, headers: dict[str, str], body: bytes) -> httpx.Response:
    return httpx.put(url, content=body, headers=headers, timeout=30)


def test_presigned_multipart_upload_resume_and_complete(store: S3Store) -> None:
    key = store.key("artifacts/1/model.bin")
    parts = [secrets.token_bytes(5 * MiB), secrets.token_bytes(5 * MiB), secrets.token_bytes(123)]
    upload_id = store.create_multipart(key)
    for number, body in enumerate(parts[:2], start=1):  # a node uploads two parts, then "restarts"
        part = store.presign_part(key, upload_id, number, part_checksum(body))
        assert _upload_part(part.url, part.headers, body).status_code == 200
    listed = store.list_parts(key, upload_id)
    assert [p["PartNumber"] for p in listed] == [1, 2]  # resume: only part 3 is left to send
    part = store.presign_part(key, upload_id, 3, part_checksum(parts[2]))
    assert _upload_part(part.url, part.headers, parts[2]).status_code == 200
    assert [u["UploadId"] for u in store.open_uploads()] == [upload_id]
    store.complete_multipart(key, upload_id)
    assert store.open_uploads() == []
    whole = b"".join(parts)
    assert store.verify(key, hashlib.sha256(whole).hexdigest(), len(whole))
    get = httpx.get(store.presign_get(key), timeout=30)
    assert get.status_code == 200 and get.content == whole


def test_presigned_part_url_is_bound_to_its_key_and_body(store: S3Store, seaweed) -> None:
    key = store.key("artifacts/2/a.bin")
    body = secrets.token_bytes(MiB)
    upload_id = store.create_multipart(key)
    part = store.presign_part(key, upload_id, 1, part_checksum(body))
    other = part.url.replace("/artifacts/2/a.bin", "/artifacts/3/a.bin")
    assert other != part.url
    assert _upload_part(other, part.headers, body).status_code == 403  # another key: refused
    assert httpx.get(part.url, timeout=30).status_code == 403  # another method: refused
    corrupted = bytes([body[0] ^ 1]) + body[1:]
    refused = _upload_part(part.url, part.headers, corrupted)  # a flipped bit in transit
    assert refused.status_code == 400 and "BadDigest" in refused.text
    # ...and the node cannot re-sign for bytes of its choosing: the CRC32C is part of the signature.
    assert _upload_part(part.url, {CHECKSUM_HEADER: part_checksum(corrupted)}, corrupted).status_code == 403
    assert _upload_part(part.url, {}, body).status_code == 403
    assert store.list_parts(key, upload_id) == []
    unsigned = httpx.put(f"{seaweed.endpoint}/{BUCKET}/{key}", content=body, timeout=30)
    assert unsigned.status_code == 403
    store.abort_multipart(key, upload_id)
    store.abort_multipart(key, upload_id)  # twice: nothing left open, no error
    assert store.open_uploads() == []


def _flip_one_byte_on_disk(root: Path, needle: bytes) -> None:
    """Flip a byte of an object where SeaweedFS keeps it (a volume's .dat file): damage at rest."""
    for dat in (root / "data").rglob("*.dat"):
        content = dat.read_bytes()
        at = content.find(needle)
        if at >= 0:
            with open(dat, "r+b") as handle:
                handle.seek(at + len(needle) // 2)
                handle.write(bytes([content[at + len(needle) // 2] ^ 0xFF]))
                handle.flush()
                os.fsync(handle.fileno())
            return
    raise AssertionError("object bytes not found in any volume file")


def test_verifier_finds_a_flipped_byte_at_rest(store: S3Store, seaweed) -> None:
    data = secrets.token_bytes(256 * 1024)  # random: weed stores it uncompressed
    key = store.key("artifacts/4/weights.bin")
    store.put_bytes(key, data)
    digest = hashlib.sha256(data).hexdigest()
    assert store.verify(key, digest, len(data))
    _flip_one_byte_on_disk(seaweed.root, data[1000:1064])
    assert not store.verify(key, digest, len(data))


def test_location_and_credentials_are_checked() -> None:
    location = S3Location.parse("s3://my-bucket/ckpt/team-a/", endpoint="http://127.0.0.1:9000")
    assert (location.bucket, location.prefix, location.url) == (
        "my-bucket",
        "ckpt/team-a",
        "s3://my-bucket/ckpt/team-a",
    )
    for url, field in (("file:///x", "storage"), ("s3://B_ad/x", "bucket"), ("s3://bucket/../x", "prefix")):
        with pytest.raises(S3ConfigError, match=field):
            S3Location.parse(url)
    with pytest.raises(S3ConfigError, match="endpoint"):
        S3Location.parse("s3://bucket", endpoint="ftp://x")
    with pytest.raises(S3ConfigError, match="addressing_style"):
        S3Location.parse("s3://bucket", addressing_style="dns")
    creds = load_credentials({"TUNEPLANE_S3_ACCESS_KEY_ID": "AK", "TUNEPLANE_S3_SECRET_ACCESS_KEY": "SK"})
    assert creds.secret_access_key == "SK" and "SK" not in repr(creds)
    with pytest.raises(S3ConfigError, match="credentials"):
        load_credentials({})


def test_credentials_file(tmp_path: Path) -> None:
    path = tmp_path / "credentials"
    path.write_text("[default]\naws_access_key_id = AK2\naws_secret_access_key = SK2\n")
    creds = load_credentials({"TUNEPLANE_S3_CREDENTIALS_FILE": str(path)})
    assert (creds.access_key_id, creds.secret_access_key) == ("AK2", "SK2")
    path.write_text("[other]\naws_access_key_id = AK2\n")
    with pytest.raises(S3ConfigError, match="no \\[default\\]"):
        load_credentials({"TUNEPLANE_S3_CREDENTIALS_FILE": str(path)})


@pytest.mark.parametrize(
    ("fields", "named"),
    [
        ({"bucket": "bucket\n"}, "bucket"),
        ({"bucket": "ok-bucket", "endpoint": "http://127.0.0.1:9000/\n"}, "endpoint"),
        ({"bucket": "ok-bucket", "region": "us-east-1\n"}, "region"),
        ({"bucket": "ok-bucket", "region": "US East"}, "region"),
    ],
)
def test_a_location_is_checked_whole_string(fields: dict, named: str) -> None:
    """`$` alone lets a trailing newline through; every field is matched as a whole, as set_fleet_storage's
    checks are."""
    with pytest.raises(S3ConfigError, match=f"^{named}:"):
        S3Location(**{"endpoint": None, **fields})
