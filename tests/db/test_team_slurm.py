"""Slurm fleets and teams (docs/teams.md): a team's jobs are submitted under the team's Slurm account on
that fleet, and Slurm's association/QOS pending reasons are said in the words of TunePlane's own quota
reasons, naming the team, the fleet and the account. (The real cluster runs these in tests/e2e.)"""

from __future__ import annotations

from pathlib import Path

from tests.launch_fixtures import job, make_job, make_team, make_user
from tuneplane.app.db import Database
from tuneplane.workers.slurm.cli import SlurmCli
from tuneplane.workers.slurm.worker import FleetState, batch_script


def _slurm_fleet(db: Database) -> int:
    caps = '{"shared_path": "/shared"}'
    return db.call("create_slurm_fleet", "hpc", "gpu", None, caps, "fleet-acct", None)[0]["id"]


def test_a_teams_jobs_go_to_its_slurm_account_and_quota_reasons_use_tuneplanes_words(
    db: Database, tmp_path: Path
) -> None:
    fleet = _slurm_fleet(db)
    user = make_user(db, "vera")
    vision = make_team(db, user, "vision")
    db.fetch_all(
        """INSERT INTO fleet_team_access (fleet_id, team_id, slurm_account)
           VALUES (%s, %s, 'vision-acct') RETURNING 1""",
        (fleet, vision),
    )
    theirs = make_job(db, user, fleet, gpus_per_node=2, team_id=vision)
    mine = make_job(db, user, fleet, gpus_per_node=1)  # the personal team: no account of its own
    due = {d["job_id"]: d for d in db.call("slurm_submissions_due", fleet)}
    assert due[theirs]["account"] == "vision-acct" and due[mine]["account"] is None
    state = FleetState(fleet, "hpc", SlurmCli(None), "gpu", "fleet-acct", None, tmp_path)
    assert "#SBATCH --account=vision-acct" in batch_script(state, due[theirs], tmp_path, {})
    assert "#SBATCH --account=fleet-acct" in batch_script(state, due[mine], tmp_path, {})

    db.call("slurm_submitted", due[theirs]["attempt_id"], 4242)
    db.call("slurm_pending", due[theirs]["attempt_id"], "AssocGrpGRES", 3)
    assert job(db, theirs)["state_reason"] == (
        "team vision would go past its limit on fleet hpc; this job asks 2 GPUs (Slurm association limit of "
        "account vision-acct) (Slurm job 4242, reason AssocGrpGRES); 3 jobs ahead of it in partition gpu"
    )
    db.call("slurm_pending", due[theirs]["attempt_id"], "QOSMaxGRESPerUser", 3)
    assert job(db, theirs)["state_reason"].startswith(
        "team vision would go past what one user may hold on fleet hpc; this job asks 2 GPUs (Slurm QOS limit"
    )
    db.call("slurm_pending", due[theirs]["attempt_id"], "Resources", 0)
    assert job(db, theirs)["state_reason"].startswith(
        "waiting for resources: the partition has no free nodes"
    )
