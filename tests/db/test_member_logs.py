"""Member logs in SQL: chunks stored once by (member, stream, offset), resumable, bounded reads, refusals."""

from __future__ import annotations

import json
import threading

import pytest

from tests.launch_fixtures import make_fleet, make_job, make_node, make_user, run_to_running
from tuneplane.app.db import Database
from tuneplane.app.errors import Refusal


@pytest.fixture
def running(db: Database) -> dict:
    user = make_user(db)
    other = make_user(db, "mallory")
    admin = make_user(db, "root", "admin")
    fleet = make_fleet(db)
    nodes = [make_node(db, fleet, f"n{i}") for i in range(2)]
    job_id = make_job(db, user, fleet, nodes=2)
    db.call("reserve_next", fleet, 1000)
    members = run_to_running(db, job_id)
    return {"user": user, "other": other, "admin": admin, "job": job_id, "members": members, "nodes": nodes}


def ship(db: Database, member: dict, offset: int, text: str, stream: str = "stdout", **extra) -> dict:
    body = {"member_id": member["id"], "stream": stream, "offset": offset, "text": text, **extra}
    return db.call("member_log", member["node_id"], 0, json.dumps(body))[0]["member_log"]


def read(
    db: Database,
    s: dict,
    rank: int = 0,
    stream: str = "stdout",
    after: int = 0,
    limit: int = 65536,
    attempt: int | None = None,
    tail: int | None = None,
    actor: int | None = None,
) -> dict:
    row = db.call("job_member_log", actor or s["user"], s["job"], rank, stream, after, limit, attempt, tail)[
        0
    ]
    return row["job_member_log"]


def test_chunks_are_stored_once_and_read_back_in_order(db: Database, running: dict) -> None:
    m0 = running["members"][0]
    assert ship(db, m0, 0, "hello\n") == {"stored": True, "next_offset": 6}
    # The same report again (a resend after a lost answer) stores nothing and says where to go on.
    assert ship(db, m0, 0, "hello\n") == {"stored": False, "next_offset": 6, "why": "duplicate"}
    assert ship(db, m0, 6, "world\n")["next_offset"] == 12
    ship(db, m0, 0, "oops\n", stream="stderr")
    assert db.fetch_one("SELECT count(*) AS n FROM member_log_chunks")["n"] == 3
    got = read(db, running)
    assert "".join(c["text"] for c in got["chunks"]) == "hello\nworld\n"
    assert got["next"] == 12 and got["more"] is False and got["complete"] is False
    assert got["member_state"] == "running" and got["attempt"] == 1 and got["node"] == "n0"
    assert "".join(c["text"] for c in read(db, running, stream="stderr")["chunks"]) == "oops\n"
    assert read(db, running, rank=1)["chunks"] == []


def test_a_gap_stores_nothing_and_names_the_offset_to_resume_from(db: Database, running: dict) -> None:
    m0 = running["members"][0]
    ship(db, m0, 0, "abc")
    assert ship(db, m0, 10, "later") == {"stored": False, "next_offset": 3, "why": "gap"}
    assert ship(db, m0, 3, "defghij")["stored"] is True


def test_length_is_the_files_bytes_even_when_the_text_was_repaired(db: Database, running: dict) -> None:
    m0 = running["members"][0]
    # Two undecodable bytes became two U+FFFD (6 bytes of text); the file offset moves by 2.
    assert ship(db, m0, 0, "\ufffd\ufffd", length=2)["next_offset"] == 2
    with pytest.raises(Refusal) as err:
        ship(db, m0, 2, "x" * 100, length=2)
    assert err.value.status == 413 and err.value.field == "text"


def test_a_member_of_another_node_is_refused(db: Database, running: dict) -> None:
    m0, m1 = running["members"]
    body = {"member_id": m1["id"], "stream": "stdout", "offset": 0, "text": "x"}
    with pytest.raises(Refusal) as err:
        db.call("member_log", m0["node_id"], 0, json.dumps(body))
    assert err.value.status == 404 and err.value.field == "member_id"
    assert db.fetch_one("SELECT count(*) AS n FROM member_log_chunks")["n"] == 0


@pytest.mark.parametrize(
    ("change", "status", "field"),
    [
        ({"stream": "stdin"}, 400, "stream"),
        ({"offset": -1}, 400, "offset"),
        ({"offset": "7"}, 400, "offset"),
        ({"member_id": "x"}, 400, "member_id"),
        ({"text": 5}, 400, "text"),
        ({"text": ""}, 400, "length"),
        ({"text": "x" * 70000}, 413, "length"),
    ],
)
def test_bad_reports_are_refused_naming_the_field(
    db: Database, running: dict, change: dict, status: int, field: str
) -> None:
    m0 = running["members"][0]
    body = {"member_id": m0["id"], "stream": "stdout", "offset": 0, "text": "x", **change}
    with pytest.raises(Refusal) as err:
        db.call("member_log", m0["node_id"], 0, json.dumps(body))
    assert (err.value.status, err.value.field) == (status, field)


def test_a_stale_session_is_refused(db: Database, running: dict) -> None:
    m0 = running["members"][0]
    body = {"member_id": m0["id"], "stream": "stdout", "offset": 0, "text": "x"}
    with pytest.raises(Refusal) as err:
        db.call("member_log", m0["node_id"], 41, json.dumps(body))
    assert err.value.status == 409 and err.value.field == "epoch"


def test_past_the_stream_limit_output_is_counted_as_dropped(db: Database, running: dict) -> None:
    db.fetch_all("UPDATE member_log_settings SET max_stream_bytes = 10 RETURNING 1")
    m0 = running["members"][0]
    ship(db, m0, 0, "0123456789")
    assert ship(db, m0, 10, "more") == {"stored": False, "next_offset": 14, "why": "over the limit"}
    got = read(db, running)
    assert got["dropped_bytes"] == 4 and got["stored_to"] == 14 and got["next"] == 10


def test_reads_are_bounded_and_continue_from_next(db: Database, running: dict) -> None:
    m0 = running["members"][0]
    offset = 0
    for i in range(10):
        line = f"line {i}\n"
        offset = ship(db, m0, offset, line)["next_offset"]
    first = read(db, running, limit=14)  # two 7-byte lines
    assert [c["text"] for c in first["chunks"]] == ["line 0\n", "line 1\n"] and first["more"] is True
    second = read(db, running, after=first["next"], limit=14)
    assert second["chunks"][0]["text"] == "line 2\n"
    # A limit smaller than one chunk still returns that chunk (progress is always made).
    assert len(read(db, running, limit=1)["chunks"]) == 1
    # An offset inside a chunk returns that chunk whole, with its real offset.
    inside = read(db, running, after=3, limit=7)
    assert inside["chunks"][0]["offset"] == 0
    tail = read(db, running, tail=14)
    assert [c["text"] for c in tail["chunks"]] == ["line 8\n", "line 9\n"]


def test_complete_once_the_member_ended(db: Database, running: dict) -> None:
    m0, m1 = running["members"]
    ship(db, m0, 0, "done\n")
    for m in (m0, m1):
        db.call("member_exited", m["node_id"], 0, json.dumps({"member_id": m["id"], "exit_code": 0}))
    got = read(db, running)
    assert got["complete"] is True and got["job_state"] == "succeeded" and got["exit_code"] == 0


def test_another_user_cannot_read_logs_and_an_admin_can(db: Database, running: dict) -> None:
    ship(db, running["members"][0], 0, "secret\n")
    with pytest.raises(Refusal) as err:
        read(db, running, actor=running["other"])
    assert err.value.status == 404 and err.value.field == "job_id"
    assert read(db, running, actor=running["admin"])["chunks"][0]["text"] == "secret\n"


@pytest.mark.parametrize(
    ("kwargs", "status", "field"),
    [
        ({"after": -1}, 400, "after"),
        ({"tail": -5}, 400, "tail"),
        ({"limit": 0}, 400, "limit"),
        ({"limit": 10**8}, 400, "limit"),
        ({"stream": "both"}, 400, "stream"),
        ({"rank": 2}, 404, "member"),
        ({"rank": -1}, 404, "member"),
        ({"attempt": 9}, 404, "attempt"),
    ],
)
def test_bad_reads_are_refused_naming_the_field(
    db: Database, running: dict, kwargs: dict, status: int, field: str
) -> None:
    with pytest.raises(Refusal) as err:
        read(db, running, **kwargs)
    assert (err.value.status, err.value.field) == (status, field)


def test_a_queued_job_reads_as_no_member_yet(db: Database, running: dict) -> None:
    fleet = db.fetch_one("SELECT fleet_id FROM jobs WHERE id = %s", (running["job"],))["fleet_id"]
    queued = make_job(db, running["user"], fleet, nodes=2, gpus_per_node=8)
    got = read(db, {**running, "job": queued})
    assert got["member_id"] is None and got["chunks"] == [] and got["job_state"] == "queued"


def test_concurrent_resends_store_each_chunk_once(db: Database, running: dict) -> None:
    m0 = running["members"][0]
    results: list[dict] = []
    barrier = threading.Barrier(6)

    def sender() -> None:
        barrier.wait()
        results.append(ship(db, m0, 0, "once\n"))

    threads = [threading.Thread(target=sender) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(20)
    assert sum(r["stored"] for r in results) == 1
    assert db.fetch_one("SELECT next_offset, chunks FROM member_log_streams") == {
        "next_offset": 5,
        "chunks": 1,
    }
