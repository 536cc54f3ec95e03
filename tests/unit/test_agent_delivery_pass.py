"""The agent's delivery pass over a member's outputs (workers.agent.delivery), with a stand-in for the one
delivery try (`deliver_output`, named below): what is tested is how the pass schedules and records them."""

from __future__ import annotations

import asyncio
import json
import threading
from pathlib import Path

import pytest

from tuneplane.workers.agent import delivery as delivery_module
from tuneplane.workers.agent.delivery import Delivery, plan_deliveries
from tuneplane.workers.agent.member_records import MemberRecord, MemberStore
from tuneplane.workers.agent.outputs import Outcome


def ended_member(tmp_path: Path) -> tuple[MemberStore, Path]:
    directory = tmp_path / "members" / "5"
    (directory / "capsule").mkdir(parents=True)
    (directory / "capsule" / "spec.json").write_text(
        json.dumps({"outputs": [{"name": "model", "path": "m"}]})
    )
    store = MemberStore(tmp_path / "state")
    record = MemberRecord(5, 1, 3, 1, 0, state="ended")
    plan_deliveries(record, directory, 600)
    store.save(record)
    return store, directory


def test_one_pass_tries_a_members_outputs_side_by_side(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Issue 23: a member's end waits for this first pass; one output after the other, it took the sum of
    # their deliveries. Here each delivery waits until the other one has begun (one after the other, the
    # first would wait for the second for ever: the barrier breaks after 10 s and the outputs stay pending).
    both_began = threading.Barrier(2, timeout=10)
    tried: list[str] = []

    def deliver_output_stand_in(_access: object, _directory: Path, output: dict) -> Outcome:
        tried.append(output["name"])
        both_began.wait()
        return Outcome("complete", "", {"model": 41, "logs": 42}[output["name"]])

    monkeypatch.setattr(delivery_module, "deliver_output", deliver_output_stand_in)
    store, directory = ended_member(tmp_path)

    async def first_pass() -> None:
        delivery = Delivery(store, 5, directory, lambda: None, lambda _line: None)  # type: ignore[arg-type, return-value]
        await asyncio.wait_for(delivery.first_pass.wait(), 30)
        await asyncio.wait_for(delivery.task, 30)

    asyncio.run(first_pass())
    assert sorted(tried) == ["logs", "model"]
    saved = MemberStore(tmp_path / "state").get(5)  # what the next agent would read
    assert saved is not None
    assert {name: d["state"] for name, d in saved.deliveries.items()} == {
        "model": "complete",
        "logs": "complete",
    }
    assert {name: d["artifact_id"] for name, d in saved.deliveries.items()} == {"model": 41, "logs": 42}
