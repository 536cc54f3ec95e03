"""The words of "why it waits": ordinals and the queue-position line."""

from __future__ import annotations

import datetime as dt

import pytest

from tuneplane.app.web.jobs_launch import ordinal, waiting_text


@pytest.mark.parametrize(
    ("n", "word"),
    [
        (1, "1st"),
        (2, "2nd"),
        (3, "3rd"),
        (4, "4th"),
        (11, "11th"),
        (12, "12th"),
        (13, "13th"),
        (21, "21st"),
        (22, "22nd"),
        (23, "23rd"),
        (101, "101st"),
        (111, "111th"),
        (112, "112th"),
    ],
)
def test_ordinals(n: int, word: str) -> None:
    assert ordinal(n) == word


def test_waiting_text_names_the_head_only_when_someone_else_is_at_the_head() -> None:
    row = {
        "queue_position": 3,
        "fleet": "gpu",
        "queued_in_fleet": 5,
        "head_job_id": 41,
        "waiting": dt.timedelta(seconds=5),
        "state_reason": "waiting for resources: needs 2 nodes",
        "team": "vision",
        "team_position": 2,
        "queued_in_team": 3,
        "team_now": None,
    }
    assert waiting_text(row) == (
        "3rd in queue (fleet gpu, 5 waiting; job 41 is at the head; 2nd of team vision's 3); "
        "waiting for resources: needs 2 nodes"
    )
    head = {**row, "queue_position": 1}
    assert waiting_text(head).startswith("1st in queue (fleet gpu, 5 waiting; 2nd of team vision's 3); ")
    quota = {**row, "team_now": "team vision uses 6 of its 8 guaranteed GPUs on fleet gpu"}
    assert waiting_text(quota).endswith(
        "needs 2 nodes; team vision uses 6 of its 8 guaranteed GPUs on fleet gpu"
    )
