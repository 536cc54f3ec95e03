"""The S3 blob store: any S3 API (AWS S3, MinIO, SeaweedFS) through boto3, plus what direct uploads need.

Trust model (docs/artifacts.md, docs/adr/0245-s3-store-trust.md): the server alone holds the store's
credentials. A node gets presigned URLs, each bound by SigV4 to one method, one key, one upload and part
and a few minutes; a part URL also signs the part's CRC32C (`x-amz-checksum-crc32c`), so the store refuses
a body that differs from the one the node checksummed (a flip in transit), and the node cannot send the
URL without that very header. The store
does not verify objects at rest (a ranged GET of a corrupted chunk returns wrong bytes with 206), so the
server side re-hashes each object once with `object_sha256` before an artifact may become `complete`.

Layout under the configured prefix: content-addressed blobs at `sha256/ab/abcdef…` (the BlobStore protocol
of app/blobstore.py: source archives, capsules), artifact files at whatever key the caller names (direct
delivery: `artifacts/<artifact id>/<file index>`, verified in place; tuneplane.artifact_object_key).
"""

from __future__ import annotations

import base64
import configparser
import contextlib
import hashlib
import os
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

from tuneplane.app.blobstore import _check, file_sha256, staged_file

ACCESS_KEY_ENV = "TUNEPLANE_S3_ACCESS_KEY_ID"
SECRET_KEY_ENV = "TUNEPLANE_S3_SECRET_ACCESS_KEY"
CREDENTIALS_FILE_ENV = "TUNEPLANE_S3_CREDENTIALS_FILE"
# The server's alone: a process that runs on a node (`tuneplane up`'s local agent) is started without them.
SERVER_ONLY_ENV = (ACCESS_KEY_ENV, SECRET_KEY_ENV, CREDENTIALS_FILE_ENV)
ADDRESSING_STYLES = ("path", "virtual", "auto")
# S3's own limits on multipart uploads: parts of 5 MiB..5 GiB except the last, at most 10,000 parts.
MIN_PART_SIZE = 5 * 1024 * 1024
MAX_PARTS = 10_000
# Whole-string patterns (fullmatch: `$` alone lets a trailing newline in), as set_fleet_storage checks.
_BUCKET = re.compile(r"[a-z0-9][a-z0-9.\-]{1,61}[a-z0-9]")
_ENDPOINT = re.compile(r"https?://[^\s/]+(/\S*)?")
_REGION = re.compile(r"[a-z0-9][a-z0-9-]{0,62}")


def _transport_allowed(endpoint: str) -> bool:
    from urllib.parse import urlsplit

    from tuneplane.app.client.transport import is_loopback_host

    parts = urlsplit(endpoint)
    return parts.scheme == "https" or is_loopback_host(parts.hostname or "")


class S3ConfigError(ValueError):
    """A bad store configuration; the message names the field."""


@dataclass(frozen=True)
class S3Location:
    """Where the bytes live; no secrets (this is what a fleet row and the Fleet page show)."""

    endpoint: str | None
    bucket: str
    prefix: str = ""
    region: str = "us-east-1"
    addressing_style: str = "path"

    def __post_init__(self) -> None:
        if not _BUCKET.fullmatch(self.bucket):
            raise S3ConfigError(f"bucket: {self.bucket!r} is not an S3 bucket name")
        if self.endpoint is not None and not _ENDPOINT.fullmatch(self.endpoint):
            raise S3ConfigError(f"endpoint: {self.endpoint!r} is not an http(s) URL")
        if self.endpoint is not None and not _transport_allowed(self.endpoint):
            # Nodes fetch capsules, inputs and resume checkpoints from the store and refuse plain HTTP to
            # anything but loopback (check_transport): such a fleet could upload but never launch or resume.
            raise S3ConfigError(
                f"endpoint: {self.endpoint!r}: plain http:// only to a loopback address (nodes refuse it "
                "elsewhere); use https://"
            )
        if not _REGION.fullmatch(self.region):
            raise S3ConfigError(f"region: {self.region!r} is not a region name (a-z, 0-9, -)")
        if self.addressing_style not in ADDRESSING_STYLES:
            raise S3ConfigError(f"addressing_style: must be one of {', '.join(ADDRESSING_STYLES)}")
        if self.prefix.startswith("/") or ".." in self.prefix.split("/"):
            raise S3ConfigError(f"prefix: {self.prefix!r} must be relative, without '..'")

    @classmethod
    def parse(cls, url: str, endpoint: str | None = None, **kwargs: Any) -> S3Location:
        """`s3://bucket/some/prefix` (as `tuneplane fleet create --storage` takes it)."""
        match = re.match(r"^s3://([^/]+)/?(.*)$", url)
        if not match:
            raise S3ConfigError(f"storage: {url!r} is not s3://bucket[/prefix]")
        return cls(endpoint=endpoint, bucket=match.group(1), prefix=match.group(2).strip("/"), **kwargs)

    @property
    def url(self) -> str:
        return f"s3://{self.bucket}/{self.prefix}".rstrip("/")


@dataclass(frozen=True)
class S3Credentials:
    access_key_id: str
    secret_access_key: str

    def __repr__(self) -> str:  # never print a secret in a log or a traceback
        return f"S3Credentials(access_key_id={self.access_key_id!r}, secret_access_key=***)"


def load_credentials(env: Mapping[str, str] | None = None) -> S3Credentials:
    """The server's store credentials: TUNEPLANE_S3_ACCESS_KEY_ID and TUNEPLANE_S3_SECRET_ACCESS_KEY, or an
    AWS-style credentials file named by TUNEPLANE_S3_CREDENTIALS_FILE (section [default], keys
    aws_access_key_id / aws_secret_access_key). Never stored in the database, a job, or sent to a node."""
    env = os.environ if env is None else env
    key, secret = env.get(ACCESS_KEY_ENV), env.get(SECRET_KEY_ENV)
    if key and secret:
        return S3Credentials(key, secret)
    path = env.get(CREDENTIALS_FILE_ENV)
    if not path:
        raise S3ConfigError(
            f"credentials: set {ACCESS_KEY_ENV} and {SECRET_KEY_ENV}, or {CREDENTIALS_FILE_ENV}"
        )
    parser = configparser.ConfigParser()
    if not parser.read(path):
        raise S3ConfigError(f"credentials: cannot read {CREDENTIALS_FILE_ENV}={path}")
    section = parser["default"] if parser.has_section("default") else None
    if section is None or not section.get("aws_access_key_id") or not section.get("aws_secret_access_key"):
        raise S3ConfigError(
            f"credentials: {path} has no [default] aws_access_key_id and aws_secret_access_key"
        )
    return S3Credentials(section["aws_access_key_id"], section["aws_secret_access_key"])


CHECKSUM_HEADER = "x-amz-checksum-crc32c"
CONNECT_TIMEOUT_S = 5.0
READ_TIMEOUT_S = 20.0


def part_checksum(data: bytes) -> str:
    """A part's CRC32C as S3 checks it (`x-amz-checksum-crc32c`: base64 of the big-endian 32-bit value).
    CRC32C, not MD5: it guards transit (the sha256 the verifier computes is the trust), and it costs the
    node ~0.1 s/GiB against MD5's ~2-3 s/GiB of CPU (measured here: bench/artifacts_s3.py)."""
    import google_crc32c

    return base64.b64encode(google_crc32c.value(data).to_bytes(4, "big")).decode()


@dataclass(frozen=True)
class PresignedPart:
    """One part's upload: PUT `url` with exactly `headers` and the part's bytes."""

    part_number: int
    url: str
    headers: dict[str, str]


class S3Store:
    """The BlobStore protocol on S3, and the operations of direct (presigned, multipart) transfers."""

    def __init__(self, location: S3Location, credentials: S3Credentials, *, client: Any = None) -> None:
        self.location = location
        self._client = client or self._make_client(location, credentials, attempts=3)
        # The verifier does not retry: a store that fails to serve an object (SeaweedFS answers 500 after
        # its own retries when a chunk's CRC fails, ~19 s) leaves it unverified, never complete.
        self._verify_client = client or self._make_client(location, credentials, attempts=1)

    @staticmethod
    def _make_client(location: S3Location, credentials: S3Credentials, attempts: int) -> Any:
        import boto3
        from botocore.config import Config

        config = Config(
            s3={"addressing_style": location.addressing_style},
            signature_version="s3v4",
            retries={"max_attempts": attempts, "mode": "standard"},
            # botocore's 60 s defaults, times three attempts, let a hung store (stopped, not dead) hold a
            # user's download or verify for minutes; a read timeout is between two reads, not per object.
            connect_timeout=CONNECT_TIMEOUT_S,
            read_timeout=READ_TIMEOUT_S,
            # Checksums are ours to choose (CRC32C on parts, sha256 re-hashed by the verifier):
            # botocore's default CRC headers are not supported by every S3 API.
            request_checksum_calculation="when_required",
            response_checksum_validation="when_required",
        )
        return boto3.client(
            "s3",
            endpoint_url=location.endpoint,
            region_name=location.region,
            aws_access_key_id=credentials.access_key_id,
            aws_secret_access_key=credentials.secret_access_key,
            config=config,
        )

    # -- keys -------------------------------------------------------------------------------------------
    def key(self, name: str) -> str:
        name = name.lstrip("/")
        if not name or ".." in name.split("/"):
            raise ValueError(f"not an object name: {name!r}")
        return f"{self.location.prefix}/{name}" if self.location.prefix else name

    def blob_key(self, sha256: str) -> str:
        digest = _check(sha256)
        return self.key(f"sha256/{digest[:2]}/{digest}")

    # -- BlobStore protocol -----------------------------------------------------------------------------
    def exists(self, sha256: str) -> bool:
        return self.object_size(self.blob_key(sha256)) is not None

    def open(self, sha256: str) -> BinaryIO:
        return self.open_key(self.blob_key(sha256))

    def stage(self) -> contextlib.AbstractContextManager[tuple[Path, BinaryIO]]:
        """A local temporary file to write; `commit_staged` hashes and uploads it."""
        return staged_file(None, "tp-s3-stage-")

    def commit_staged(self, staged: Path, sha256: str) -> bool:
        key = self.blob_key(sha256)
        if self.object_size(key) is not None:
            return False
        actual = file_sha256(staged)
        if actual != sha256:
            raise ValueError(f"staged blob has sha256 {actual}, not {sha256}")
        # upload_file splits large files into parts itself; the sha256 is re-checked by whoever reads it.
        self._client.upload_file(str(staged), self.location.bucket, key)
        return True

    # -- objects ----------------------------------------------------------------------------------------
    def object_size(self, key: str) -> int | None:
        from botocore.exceptions import ClientError

        try:
            return int(self._client.head_object(Bucket=self.location.bucket, Key=key)["ContentLength"])
        except ClientError as exc:
            if exc.response.get("Error", {}).get("Code") in ("404", "NoSuchKey", "NotFound"):
                return None
            raise

    def open_key(self, key: str) -> BinaryIO:
        return self._client.get_object(Bucket=self.location.bucket, Key=key)["Body"]

    def put_bytes(self, key: str, data: bytes) -> None:
        self._client.put_object(
            Bucket=self.location.bucket, Key=key, Body=data, ChecksumCRC32C=part_checksum(data)
        )

    def delete(self, key: str) -> None:
        self._client.delete_object(Bucket=self.location.bucket, Key=key)

    def list_keys(self, prefix: str) -> Iterator[str]:
        paginator = self._client.get_paginator("list_objects_v2")
        for page in paginator.paginate(Bucket=self.location.bucket, Prefix=self.key(prefix)):
            for item in page.get("Contents", []):
                yield item["Key"]

    def object_sha256(self, key: str, chunk: int = 1024 * 1024) -> tuple[str, int]:
        """Stream the object once and hash it here, off the node that wrote it: (sha256, size)."""
        digest, size = hashlib.sha256(), 0
        body = self._verify_client.get_object(Bucket=self.location.bucket, Key=key)["Body"]
        try:
            while block := body.read(chunk):
                digest.update(block)
                size += len(block)
        finally:
            body.close()
        return digest.hexdigest(), size

    def verify(self, key: str, sha256: str, size: int | None = None) -> bool:
        """True when the stored object's bytes hash to `sha256` (and have `size`, when given)."""
        from botocore.exceptions import BotoCoreError, ClientError

        try:
            actual, actual_size = self.object_sha256(key)
        except (ClientError, BotoCoreError):  # missing, or the store failed mid-stream (e.g. a chunk's CRC)
            return False
        return actual == sha256 and (size is None or actual_size == size)

    def presign_get(self, key: str, expires: int = 600) -> str:
        return self._client.generate_presigned_url(
            "get_object", Params={"Bucket": self.location.bucket, "Key": key}, ExpiresIn=expires
        )

    # -- multipart uploads ------------------------------------------------------------------------------
    def create_multipart(self, key: str) -> str:
        return self._client.create_multipart_upload(Bucket=self.location.bucket, Key=key)["UploadId"]

    def presign_part(
        self, key: str, upload_id: str, part_number: int, crc32c: str, expires: int = 600
    ) -> PresignedPart:
        """A URL for one part whose signature covers its CRC32C: the store refuses other bytes (400
        BadDigest) and a request without that header (403)."""
        if not 1 <= part_number <= MAX_PARTS:
            raise ValueError(f"part_number: must be 1..{MAX_PARTS}")
        if len(base64.b64decode(crc32c, validate=True)) != 4:
            raise ValueError("crc32c: not the base64 of a CRC32C value")
        url = self._client.generate_presigned_url(
            "upload_part",
            Params={
                "Bucket": self.location.bucket,
                "Key": key,
                "UploadId": upload_id,
                "PartNumber": part_number,
                "ChecksumCRC32C": crc32c,
            },
            ExpiresIn=expires,
        )
        return PresignedPart(part_number, url, {CHECKSUM_HEADER: crc32c})

    def list_parts(self, key: str, upload_id: str) -> list[dict[str, Any]]:
        """The parts already in the store ({PartNumber, ETag, Size}), one per number in order: what a
        resumed upload skips. SeaweedFS 4.x lists a part sent twice under one number twice (S3 keeps the
        last); when their ETags differ, which is the last cannot be told (times in whole seconds), so
        its ETag is None: that part proves nothing and cannot be completed (begin afresh)."""
        parts: dict[int, dict[str, Any]] = {}
        paginator = self._client.get_paginator("list_parts")
        for page in paginator.paginate(Bucket=self.location.bucket, Key=key, UploadId=upload_id):
            for p in page.get("Parts", []):
                seen = parts.setdefault(p["PartNumber"], {k: p[k] for k in ("PartNumber", "ETag", "Size")})
                if seen["ETag"] != p["ETag"]:
                    seen["ETag"] = None
        return [parts[number] for number in sorted(parts)]

    def complete_multipart(self, key: str, upload_id: str, parts: list[dict[str, Any]] | None = None) -> None:
        """Complete with the given parts, or with every part the store lists (the server's own view)."""
        listed = parts if parts is not None else self.list_parts(key, upload_id)
        ordered = sorted(({"PartNumber": p["PartNumber"], "ETag": p["ETag"]} for p in listed),
                         key=lambda p: p["PartNumber"])  # fmt: skip
        self._client.complete_multipart_upload(
            Bucket=self.location.bucket, Key=key, UploadId=upload_id, MultipartUpload={"Parts": ordered}
        )

    def abort_multipart(self, key: str, upload_id: str) -> None:
        from botocore.exceptions import ClientError

        try:
            self._client.abort_multipart_upload(Bucket=self.location.bucket, Key=key, UploadId=upload_id)
        except ClientError as exc:  # already completed or aborted: nothing left open
            if exc.response.get("Error", {}).get("Code") not in ("NoSuchUpload", "404"):
                raise

    def open_uploads(self, prefix: str = "") -> list[dict[str, Any]]:
        """Multipart uploads still open under `prefix` ({Key, UploadId, Initiated}), for GC."""
        found: list[dict[str, Any]] = []
        paginator = self._client.get_paginator("list_multipart_uploads")
        for page in paginator.paginate(Bucket=self.location.bucket, Prefix=self.key(prefix) if prefix else
                                       self.location.prefix):  # fmt: skip
            found.extend(
                {"Key": u["Key"], "UploadId": u["UploadId"], "Initiated": u.get("Initiated")}
                for u in page.get("Uploads", [])
            )
        return found

    def list_objects(self, prefix: str) -> Iterator[dict[str, Any]]:
        """Objects under `prefix` with their size and time ({Key, Size, LastModified}), for GC's age guard."""
        paginator = self._client.get_paginator("list_objects_v2")
        for page in paginator.paginate(Bucket=self.location.bucket, Prefix=self.key(prefix)):
            for item in page.get("Contents", []):
                yield {"Key": item["Key"], "Size": int(item["Size"]), "LastModified": item["LastModified"]}
