"""`launch_latency.py --nodes N`: N agents on this machine, a 1-member and an N-member job in alternation.

Next to `tuneplane up` (whose local agent is the first node) it enrolls N-1 more `tuneplane node` agents into
the same fleet, each with its own state and work directory and the same telemetry gateway (so every member
has its collector). Runs alternate: a 1-member job, then an N-member job (one member per agent), so both
are measured under the same load. Printed per run and as medians, both from the database's and this
machine's clocks:
  stages      confirm → reserved → COMMIT → last START delivered → all running (attempts.running_at)
  skew        the spread of the members' recorded starts
  start       START delivered (node_commands.delivered_at) → the workload's process started (the keeper's
              `started_at` in exit_status.json): agent, runner and collector start, imports
  end         the workload's exit (exit_status.json `ended_at`) → the member recorded ended (members.ended_at)
  linger      the last member recorded ended → the agents have no child left (collectors exited)
  --trace     per run: each member's START, recorded start and workload start after COMMIT, and the CPU
              the agents, gateway, worker, PostgreSQL and standby runners spent until all were running
  cpu/member  CPU-seconds of everything the agents started (runner, keeper, collector, and the demo
              workload itself: NumPy, tensorboardX), from before the confirmation until every child is gone
              and waited for, per member; and apart, the agents' own CPU over the run (all 8 agents, idle
              ones included) per member
"""

from __future__ import annotations

import datetime as dt
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

from launch_latency import JOB, TERMINAL, percentile, poll, submit

CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
STAGES = [
    ("reserve", "created_at", "reserved_at"),
    ("commit", "reserved_at", "committed_at"),
    ("last START", "committed_at", "start_delivered_at"),
    ("running", "start_delivered_at", "running_at"),
]
TIMES = """
SELECT j.state, j.state_reason, j.created_at, a.id AS attempt_id, a.created_at AS reserved_at, a.committed_at,
       a.running_at,
       (SELECT max(c.delivered_at) FROM tuneplane.node_commands c
         WHERE c.kind = 'start' AND (c.payload ->> 'attempt_id')::bigint = a.id) AS start_delivered_at
  FROM tuneplane.jobs j LEFT JOIN tuneplane.attempts a ON a.job_id = j.id AND a.number = 1
 WHERE j.id = %s
"""
# What the bench polls for while the launch runs: one indexed row, every WAIT_POLL seconds. The stages are
# read from the database's timestamps once the run is over (TIMES), so how often this runs changes no
# figure, only how much the bench itself loads the machine it measures (TIMES every 10 ms was a query and a
# Python round trip on a 2-core machine busy starting eight members).
PROGRESS = """
SELECT j.state, a.running_at FROM tuneplane.jobs j
  LEFT JOIN tuneplane.attempts a ON a.job_id = j.id AND a.number = 1
 WHERE j.id = %s
"""
WAIT_POLL = 0.05
MEMBERS = """
SELECT m.id, n.name AS node, m.started_at, m.ended_at,
       (SELECT t.finished_at FROM tuneplane.telemetry_members t
         WHERE t.job_id = m.job_id AND t.attempt = 1 AND t.member_rank = m.rank) AS metrics_final_at,
       (SELECT max(x.completed_at) FROM tuneplane.artifacts x WHERE x.member_id = m.id) AS outputs_at,
       (SELECT c.delivered_at FROM tuneplane.node_commands c
         WHERE c.kind = 'start' AND c.node_id = m.node_id
           AND (c.payload ->> 'attempt_id')::bigint = m.attempt_id
         ORDER BY c.id LIMIT 1) AS start_delivered_at,
       (SELECT c.delivered_at FROM tuneplane.node_commands c
         WHERE c.kind = 'prepare' AND c.node_id = m.node_id
           AND (c.payload ->> 'attempt_id')::bigint = m.attempt_id
         ORDER BY c.id LIMIT 1) AS prepare_delivered_at,
       (n.last_peer_check ->> 'checked_at')::float AS peer_checked
  FROM tuneplane.members m JOIN tuneplane.nodes n ON n.id = m.node_id
 WHERE m.attempt_id = %s ORDER BY m.rank
"""


def _stat(pid: int) -> list[str] | None:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    except OSError:
        return None


def cpu_seconds(pids: list[int]) -> tuple[float, float]:
    """(cutime + cstime, utime + stime) of the agents, read while they have no child at all (zombies
    included): then everything they started has been waited for and is counted in their cutime/cstime
    (the runner waits for its keeper, the keeper for the workload). The second: the agents' own CPU, every
    agent's (heartbeats included), so only its difference between runs of the same size means much."""
    poll(lambda: children(pids, zombies=True) == 0, 30, 0.05)
    started = own = 0
    for pid in pids:
        fields = _stat(pid)
        if fields:
            own += int(fields[11]) + int(fields[12])
            started += int(fields[13]) + int(fields[14])
    return started / CLOCK_TICKS, own / CLOCK_TICKS


def processes() -> Iterator[tuple[int, bytes]]:
    """(pid, NUL-separated command line) of every process whose command line can be read."""
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                yield int(entry.name), (entry / "cmdline").read_bytes()
            except OSError:
                continue


def children(pids: list[int], zombies: bool = False) -> int:
    """The agents' children, their standby runners aside (kept started for the next member, ADR 0240)."""
    wanted = set(pids)
    count = 0
    for pid, argv in processes():
        fields = _stat(pid)
        if fields and int(fields[1]) in wanted and (zombies or fields[0] != "Z"):
            count += not argv.endswith(b"\0--standby\0")
    return count


def standbys_settled(pids: list[int]) -> bool:
    """Every agent has a standby runner and none of them used CPU over 30 ms: their interpreters are up and
    wait for a member. An agent refills its pool a second after a START (ADR 0240), and a job of the demo
    now ends sooner than that: without this wait, the refills' interpreter starts (0.1-0.2 CPU-s each) fell
    into the next run's launch, which is then not measured on an idle fleet."""

    def standby_ticks() -> dict[int, int]:
        found = {}
        for pid, argv in processes():
            fields = _stat(pid) if argv.endswith(b"\0--standby\0") else None
            if fields and int(fields[1]) in pids:
                found[pid] = int(fields[11]) + int(fields[12])
        return found

    before = standby_ticks()
    if len(before) < len(pids):
        return False
    time.sleep(0.03)
    return standby_ticks() == before


def agent_pids() -> list[int]:
    return [pid for pid, argv in processes() if b"\0node\0" in argv and b"\0--state-dir\0" in argv]


# --trace: the long-lived processes whose CPU between confirmation and "all running" is printed, by kind
# (what a process that ended meanwhile used is not seen: workloads and collectors are left out).
KINDS = (
    (b"--standby", "standby runners"),
    (b"node-gateway", "node gateway"),
    (b"worker\0--backend", "worker"),
    (b"tuneplane\0node\0", "agents"),
    (b"postgres", "PostgreSQL"),
)


def cpu_by_kind() -> dict[str, float]:
    found: dict[str, float] = {}
    for pid, argv in processes():
        kind = next((name for needle, name in KINDS if needle in argv), None)
        fields = _stat(pid) if kind else None
        if fields:
            found[kind] = found.get(kind, 0.0) + (int(fields[11]) + int(fields[12])) / CLOCK_TICKS
    return found


def member_files(work_dirs: dict[str, Path], member: dict) -> dict:
    try:
        return json.loads(
            (work_dirs[member["node"]] / "members" / str(member["id"]) / "exit_status.json").read_text()
        )
    except (OSError, ValueError, KeyError):
        return {}


def _ms(when: dt.datetime | None, since: float) -> str:
    return f"{(when.timestamp() - since) * 1000:.0f}" if when else "?"


def one_run(
    client, conn, key: str, nodes: int, timeout: float, work_dirs: dict[str, Path], pids: list[int],
    trace: bool,
):  # fmt: skip
    poll(lambda: standbys_settled(pids), 10, 0.02)
    before = cpu_seconds(pids)
    job = {**JOB, "resources": {**JOB["resources"], "nodes": nodes}}
    job_id = submit(client, key, job)

    def row() -> dict:
        return conn.execute(TIMES, (job_id,)).fetchone()

    def progress() -> dict:
        return conn.execute(PROGRESS, (job_id,)).fetchone()

    cpu_before = cpu_by_kind() if trace else {}
    # --trace reads the CPU spent until all run when it sees them running: it looks as often as before.
    until_running = 0.01 if trace else WAIT_POLL
    poll(
        lambda: (r := progress())["running_at"] is not None or r["state"] in TERMINAL,
        timeout,
        until_running,
    )
    current = row()
    if trace:
        cpu_after = cpu_by_kind()
        spent = ", ".join(f"{k} {(cpu_after.get(k, v) - v) * 1000:.0f}" for k, v in cpu_before.items())
        print(f"  CPU ms from confirmation to all running (±10 ms each): {spent}")
    if current["running_at"] is None:
        return {"ok": False, "job_id": job_id, "state": current["state"], "reason": current["state_reason"]}
    poll(lambda: progress()["state"] in TERMINAL, timeout, WAIT_POLL)
    members = conn.execute(MEMBERS, (current["attempt_id"],)).fetchall()
    last_end = max((m["ended_at"] for m in members if m["ended_at"]), default=None)
    gone = poll(lambda: children(pids) == 0, 30, 0.02)
    linger = (dt.datetime.now(dt.UTC) - last_end).total_seconds() if gone and last_end else float("nan")
    after = cpu_seconds(pids)
    result = {
        "ok": True,
        "job_id": job_id,
        "final": row()["state"],
        "latency": (current["running_at"] - current["created_at"]).total_seconds(),
        "skew": (
            max(m["started_at"] for m in members) - min(m["started_at"] for m in members)
        ).total_seconds(),
        "linger": linger,
        "cpu": (after[0] - before[0]) / nodes,
        "agent_cpu": (after[1] - before[1]) / nodes,
        "start": [],
        "end": [],
        "metrics_final": [],
        "outputs": [],
    }
    for label, start, stop in STAGES:
        result[label] = (current[stop] - current[start]).total_seconds()
    if trace:
        committed = current["committed_at"].timestamp()
        reserved = current["reserved_at"].timestamp()
        for m in members:
            print(
                f"  {m['node']:>8}: after the reservation, PREPARE delivered "
                f"+{_ms(m['prepare_delivered_at'], reserved)}, peers checked "
                f"+{(m['peer_checked'] - reserved) * 1000 if m['peer_checked'] else float('nan'):.0f} ms"
            )
        print(f"  COMMIT +{(committed - reserved) * 1000:.0f} ms after the reservation")
        for m in members:
            workload = member_files(work_dirs, m).get("started_at")
            print(
                f"  {m['node']:>8}: after COMMIT, START delivered +{_ms(m['start_delivered_at'], committed)},"
                f" recorded started +{_ms(m['started_at'], committed)}, workload started "
                f"+{(workload - committed) * 1000 if workload else float('nan'):.0f} ms"
            )
    for m in members:
        status = member_files(work_dirs, m)
        if "started_at" in status and m["start_delivered_at"]:
            result["start"].append(status["started_at"] - m["start_delivered_at"].timestamp())
        if "ended_at" in status and m["ended_at"]:
            result["end"].append(m["ended_at"].timestamp() - status["ended_at"])
            for key, column in (("metrics_final", "metrics_final_at"), ("outputs", "outputs_at")):
                if m[column]:
                    result[key].append(m[column].timestamp() - status["ended_at"])
    return result


def start_agents(inst, db_url: str, count: int) -> tuple[list[subprocess.Popen], dict[str, Path]]:
    import psycopg

    from tuneplane.app.node_gateway.local import local_node_dirs
    from tuneplane.app.security import new_token

    work_dirs = {"local": local_node_dirs(inst.root / "data")[1]}
    agents = []
    for i in range(1, count):
        name = f"bench{i}"
        plaintext, digest = new_token("tpe")
        with psycopg.connect(db_url, autocommit=True) as conn:
            conn.execute(
                "SELECT tuneplane.create_enrollment_token('local', %s, interval '1 hour', 'bench')", (digest,)
            )
        base = inst.root / "agents" / name
        work_dirs[name] = base / "work"
        env = {
            **inst.env,
            "TUNEPLANE_ENROLL_TOKEN": plaintext,
            "TUNEPLANE_TELEMETRY_URL": f"http://127.0.0.1:{inst.port + 2}",
        }
        log = open(inst.root / f"agent-{name}.log", "ab")  # noqa: SIM115 - the child's
        argv = [
            sys.executable,
            "-P",
            "-m",
            "tuneplane",
            "node",
            "--server",
            f"http://127.0.0.1:{inst.port + 1}",
        ]
        argv += ["--state-dir", str(base / "state"), "--work-dir", str(base / "work"), "--name", name]
        agents.append(
            subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        )
    return agents, work_dirs


def report(results: dict[int, list[dict]], nodes: int) -> None:
    one, many = results[1], results[nodes]
    print(
        f"\n{len(one)} runs of each, alternating 1-member and {nodes}-member jobs, "
        f"{nodes} agents on this machine:"
    )
    for label, runs in ((1, one), (nodes, many)):
        lat = [r["latency"] for r in runs]
        print(f"  {label}-member: confirm → all running median {statistics.median(lat):.3f} s, "
              f"p90 {percentile(lat, 0.9):.3f} s")  # fmt: skip
        medians = [f"{name} {statistics.median(r[name] for r in runs) * 1000:.0f}" for name, _a, _b in STAGES]
        print("    " + ", ".join(medians) + " ms (medians)")
        starts = [x for r in runs for x in r["start"]]
        ends = [x for r in runs for x in r["end"]]
        print(
            f"    start skew median {statistics.median(r['skew'] for r in runs) * 1000:.0f} ms; "
            f"START delivered → workload started median {statistics.median(starts) * 1000:.0f} ms"
            if starts else "    (no workload start times: exit_status.json has no started_at)"
        )  # fmt: skip
        if ends:
            print(f"    workload exit → member ended: median {statistics.median(ends) * 1000:.0f} ms, "
                  f"p90 {percentile(ends, 0.9) * 1000:.0f} ms")  # fmt: skip
            for key, what in (("metrics_final", "its final metrics batch stored"),
                              ("outputs", "its last artifact (checkpoint, logs) complete")):  # fmt: skip
                values = [x for r in runs for x in r[key]]
                if values:
                    print(
                        f"      of which: workload exit → {what}: "
                        f"median {statistics.median(values) * 1000:.0f} ms"
                    )
        lingers = [r["linger"] for r in runs if r["linger"] == r["linger"]]
        if lingers:
            print(f"    last member ended → no child left under the agents: "
                  f"median {statistics.median(lingers):.2f} s, max {max(lingers):.2f} s")  # fmt: skip
        print(f"    CPU-seconds per member of what the agent started (runner, keeper, collector, the demo "
              f"workload): median {statistics.median(r['cpu'] for r in runs):.3f}; the agents' own, "
              f"per member: {statistics.median(r['agent_cpu'] for r in runs):.3f}")  # fmt: skip
    ratio = statistics.median(r["latency"] for r in many) / statistics.median(r["latency"] for r in one)
    print(f"  ratio {nodes}-member / 1-member median: {ratio:.2f}× (target ≤ 4×)")
    print(f"  load average at the end: {Path('/proc/loadavg').read_text().split()[:3]}")


def run(args, inst, conn, client) -> bool:
    agents, work_dirs = start_agents(inst, inst.url, args.nodes)
    try:
        ready = poll(
            lambda: (
                conn.execute(
                    "SELECT count(*) AS n FROM tuneplane.nodes n JOIN tuneplane.fleets f ON f.id = n.fleet_id"
                    " WHERE f.name = 'local' AND n.cpus > 0 AND n.probe_port IS NOT NULL"
                    " AND tuneplane.node_connectivity(n.last_heartbeat_at) = 'connected'"
                ).fetchone()["n"]
                >= args.nodes
            ),
            120,
            0.2,
        )
        if not ready:
            print(f"only some of the {args.nodes} agents connected; see {inst.root}", flush=True)
            return False
        time.sleep(1.0)  # let the agents' own start-up finish before the first run is measured
        pids = agent_pids()
        results: dict[int, list[dict]] = {1: [], args.nodes: []}
        for i in range(args.warmup + args.runs):
            for size in (1, args.nodes):
                result = one_run(
                    client, conn, f"bench-{size}-{i}", size, args.timeout, work_dirs, pids, args.trace
                )
                if not result["ok"]:
                    print(
                        f"job {result['job_id']} never ran: {result['state']}: {result['reason']}", flush=True
                    )
                    return False
                label = "warmup" if i < args.warmup else f"run {i - args.warmup + 1:>3}"
                stages = ", ".join(f"{name} {result[name] * 1000:.0f}" for name, _a, _b in STAGES)
                ends = result["end"]
                print(
                    f"{label} {size}-member: running after {result['latency'] * 1000:6.0f} ms ({stages} ms; "
                    f"skew {result['skew'] * 1000:.0f} ms); exit → ended "
                    f"{(statistics.median(ends) * 1000 if ends else float('nan')):.0f} ms; linger "
                    f"{result['linger']:.2f} s; {result['cpu']:.3f} + agents {result['agent_cpu']:.3f} "
                    f"CPU-s/member; {result['final']}",
                    flush=True,
                )
                if i >= args.warmup:
                    results[size].append(result)
        report(results, args.nodes)
        return True
    finally:
        for agent in agents:
            agent.terminate()
        for agent in agents:
            try:
                agent.wait(30)
            except subprocess.TimeoutExpired:
                agent.kill()
