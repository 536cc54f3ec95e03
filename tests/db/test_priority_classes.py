"""Priority classes and the preemptible flag (docs/preemption.md): named levels mapped to integers an
operator can re-map, preemptible by default for normal and below, pinned by the preview and kept on the
job at confirmation; bad values are refused naming the field."""

from __future__ import annotations

import uuid

import pytest

from tests.submission_setup import add_user, one_local_fleet
from tuneplane.app.db import Database
from tuneplane.app.errors import Refusal
from tuneplane.app.submission import service


def preview(db: Database, user: int, **spec) -> dict:
    return service.create_preview(db, user, {"recipe": {"name": "demo"}, **spec})


@pytest.mark.parametrize(
    ("priority", "value", "klass", "preemptible"),
    [
        (None, 0, "normal", True),
        ("scavenger", -100, "scavenger", True),
        ("low", -50, "low", True),
        ("high", 50, "high", False),
        ("urgent", 100, "urgent", False),
        (60, 60, "high", False),  # an integer takes the highest class at or below it
        (-999, -999, "scavenger", True),
    ],
)
def test_a_priority_resolves_to_its_integer_class_and_default_preemptibility(
    db: Database, priority, value: int, klass: str, preemptible: bool
) -> None:
    user = add_user(db, "alice")
    one_local_fleet(db)
    resolved = preview(db, user, **({"priority": priority} if priority is not None else {}))["resolved"]
    assert (resolved["priority"], resolved["priority_class"], resolved["preemptible"]) == (
        value,
        klass,
        preemptible,
    )
    assert resolved["preemption"] == {"grace_seconds": 120, "signal": "SIGTERM", "max_preemptions": 5}


def test_the_job_keeps_the_class_and_the_flag_and_the_summary_says_them(db: Database) -> None:
    user = add_user(db, "alice")
    one_local_fleet(db)
    shown = preview(db, user, priority="urgent", preemptible=True, preemption={"grace_seconds": 30})
    assert shown["summary"]["priority"] == "urgent (100)"
    assert "grace of 30 s" in shown["summary"]["preemption"]
    job_id = service.confirm(db, user, shown["id"], shown["digest"], str(uuid.uuid4()))["job_id"]
    job = db.fetch_one("SELECT priority, priority_class, preemptible FROM jobs WHERE id = %s", (job_id,))
    assert job == {"priority": 100, "priority_class": "urgent", "preemptible": True}


def test_an_operator_remaps_a_class(db: Database) -> None:
    user = add_user(db, "alice")
    one_local_fleet(db)
    with db.transaction() as conn:
        conn.execute("UPDATE priority_classes SET value = 500 WHERE name = 'urgent'")
    assert preview(db, user, priority="urgent")["resolved"]["priority"] == 500


@pytest.mark.parametrize(
    ("spec", "field"),
    [
        ({"priority": "highest"}, "priority"),
        ({"priority": "scavenger", "preemptible": False}, "preemptible"),
        ({"priority": 5000}, "priority"),
        ({"preemption": {"signal": "SIGKILL"}}, "preemption.signal"),
        ({"preemption": {"grace_seconds": -1}}, "preemption.grace_seconds"),
    ],
)
def test_bad_values_are_refused_naming_the_field(db: Database, spec: dict, field: str) -> None:
    user = add_user(db, "alice")
    one_local_fleet(db)
    with pytest.raises(Refusal) as refused:
        preview(db, user, **spec)
    assert refused.value.status == 422
    assert field in refused.value.fields, refused.value.fields
