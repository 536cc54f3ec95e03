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


def grant(db: Database, team: str, max_class: str = "urgent", fleet: str | None = None) -> None:
    """An installation admin grants `team` the classes up to `max_class` (issue 38: priority is granted)."""
    row = db.fetch_one("SELECT id FROM users WHERE username = 'grantor'")
    admin = row["id"] if row else add_user(db, "grantor", "admin")
    db.call("set_team_priority_grant", admin, team, fleet, max_class)


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
    grant(db, "alice")
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
    grant(db, "alice", fleet="local")
    shown = preview(db, user, priority="urgent", preemptible=True, preemption={"grace_seconds": 30})
    assert shown["summary"]["priority"] == "urgent (100)"
    assert "grace of 30 s" in shown["summary"]["preemption"]
    job_id = service.confirm(db, user, shown["id"], shown["digest"], str(uuid.uuid4()))["job_id"]
    job = db.fetch_one("SELECT priority, priority_class, preemptible FROM jobs WHERE id = %s", (job_id,))
    assert job == {"priority": 100, "priority_class": "urgent", "preemptible": True}


def test_an_operator_remaps_a_class(db: Database) -> None:
    user = add_user(db, "alice")
    one_local_fleet(db)
    grant(db, "alice")
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


def test_a_class_above_the_teams_grant_is_refused_with_its_limit_and_the_command(db: Database) -> None:
    user = add_user(db, "alice")
    one_local_fleet(db)
    assert preview(db, user, priority="normal")["resolved"]["priority_class"] == "normal"
    with pytest.raises(Refusal) as refused:
        preview(db, user, priority="urgent")
    assert refused.value.status == 403 and "priority" in refused.value.fields
    assert "up to normal" in refused.value.message
    assert "tuneplane teams priority alice --max urgent --fleet local" in refused.value.message
    grant(db, "alice", "high")  # every fleet: high, not urgent
    assert preview(db, user, priority=60)["resolved"]["priority_class"] == "high"
    with pytest.raises(Refusal):
        preview(db, user, priority="urgent")
    grant(db, "alice", "urgent", fleet="local")  # the fleet's own grant wins
    assert preview(db, user, priority="urgent")["resolved"]["priority_class"] == "urgent"
    admin = db.fetch_one("SELECT id FROM users WHERE username = 'grantor'")["id"]
    db.call("set_team_priority_grant", admin, "alice", "local", None)  # removed: back to high
    with pytest.raises(Refusal):
        preview(db, user, priority="urgent")
    assert preview(db, admin, priority="urgent", team="grantor")["resolved"]["priority_class"] == "urgent"


def test_only_installation_admins_grant_and_unknown_names_are_404(db: Database) -> None:
    user = add_user(db, "alice")
    one_local_fleet(db)
    with pytest.raises(Refusal) as refused:
        db.call("set_team_priority_grant", user, "alice", None, "urgent")
    assert refused.value.status == 403
    admin = add_user(db, "grantor", "admin")
    for team, fleet, klass, field in (("nope", None, "high", "team"), ("alice", "nope", "high", "fleet"),
                                      ("alice", None, "mega", "max_class")):  # fmt: skip
        with pytest.raises(Refusal) as refused:
            db.call("set_team_priority_grant", admin, team, fleet, klass)
        assert refused.value.status == 404 and field in refused.value.fields


def test_a_grace_above_the_fleets_cap_is_refused_at_preview(db: Database) -> None:
    user = add_user(db, "alice")
    one_local_fleet(db)
    with pytest.raises(Refusal) as refused:
        preview(db, user, preemption={"grace_seconds": 1801})
    assert refused.value.status == 422 and "preemption.grace_seconds" in refused.value.fields
    assert "at most 1800 on fleet local" in refused.value.message
    assert (
        preview(db, user, preemption={"grace_seconds": 1800})["resolved"]["preemption"]["grace_seconds"]
        == 1800
    )
    db.fetch_all("UPDATE fleets SET max_preemption_grace = interval '60 seconds' RETURNING 1")
    with pytest.raises(Refusal) as refused:
        preview(db, user, preemption={"grace_seconds": 61})
    assert "at most 60 on fleet local" in refused.value.message


def test_a_grace_above_the_fleets_cap_is_refused_at_preview_and_the_cap_never_passes_the_installations(
    db: Database,
) -> None:
    """The preview pins what was asked or refuses it (docs/preemption.md): a grace above the fleet's cap is
    a 422 naming preemption.grace_seconds and the cap; a fleet's max_preemption_grace above the
    installation's max_grace (30 min) does not raise the cap (preemption_grace_cap)."""
    user = add_user(db, "alice")
    fleet = one_local_fleet(db)
    with db.transaction() as conn:
        conn.execute("UPDATE fleets SET max_preemption_grace = interval '90 seconds' WHERE id = %s", (fleet,))
    assert (
        preview(db, user, preemption={"grace_seconds": 90})["resolved"]["preemption"]["grace_seconds"] == 90
    )
    with pytest.raises(Refusal) as refused:
        preview(db, user, preemption={"grace_seconds": 91})
    assert refused.value.status == 422
    assert refused.value.fields["preemption.grace_seconds"].startswith(
        "preemption.grace_seconds must be at most 90 on fleet local (its cap), not 91"
    )
    with db.transaction() as conn:
        conn.execute("UPDATE fleets SET max_preemption_grace = interval '2 hours' WHERE id = %s", (fleet,))
    with pytest.raises(Refusal) as refused:
        preview(db, user, preemption={"grace_seconds": 3600})
    assert "must be at most 1800 on fleet local" in refused.value.fields["preemption.grace_seconds"]
