#!/usr/bin/env bash
# bench/gpu_check.sh — TunePlane's GPU path on a real NVIDIA machine (issue 22; docs/operations.md).
#
# No arguments. On a machine without an NVIDIA GPU (no nvidia-smi, or one that lists no GPU) it prints
# "no NVIDIA GPU: skipped" and exits 0. Otherwise, in a fresh temporary directory:
#   venv        a venv with this checkout installed, nvidia-ml-py and the registry's CUDA build of torch
#               (torch.cuda must see every GPU)
#   up          `tuneplane up` (embedded PostgreSQL, every component, the local node); with 2+ GPUs the
#               local node offers all but the last GPU and a second agent on this machine the last one
#               (TUNEPLANE_NODE_GPUS), so a 2-member job (one member per node) gets two different GPUs
#   inventory   the agents reported every GPU nvidia-smi lists, with its model and memory, none simulated
#   1-gpu job   a 1-GPU torch job multiplying matrices for 60 s succeeds; utilization, memory and power
#               samples were stored for exactly the GPU it was given, utilization reached 50 %, and its
#               CUDA_VISIBLE_DEVICES (and the device's UUID, where torch says it) is that GPU
#   2-member    with 2+ GPUs: the same for a job of 2 members × 1 GPU, each member its own GPU
#   idle        an idle job (allocates 2 GiB, then sleeps) under a shortened idle policy (2 min, warn)
#               is warned by the idle sweep within 5 minutes, the warning saying the numbers
# and prints one summary table. A failing step exits non-zero naming the step (and its evidence).
# Environment (optional): PYTHON (default python3, 3.11+); TORCH_SPEC (default torch; `preinstalled` uses
# the CUDA torch $PYTHON already has); WHEELHOUSE=DIR to install offline from the wheels in DIR; KEEP=1 to keep
# the work directory; LOGS=DIR to leave a tarball of the logs (up, agents, pip, jobs) there at the end.
set -uo pipefail

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
STEP="start"
ROWS=()
STARTED=$(date +%s)

if ! command -v nvidia-smi >/dev/null 2>&1 || ! nvidia-smi -L 2>/dev/null | grep -q '^GPU '; then
    echo "no NVIDIA GPU: skipped"
    exit 0
fi

WORK=$(mktemp -d "${TMPDIR:-/tmp}/tuneplane-gpu-check.XXXXXX")
PIDS=()

summary() {
    printf '\n%-12s %-6s %s\n' "step" "result" "detail"
    printf '%-12s %-6s %s\n' "----" "------" "------"
    local row
    for row in "${ROWS[@]}"; do
        IFS='|' read -r name result detail <<<"$row"
        printf '%-12s %-6s %s\n' "$name" "$result" "$detail"
    done
    printf '%s\n' "GPUs: $(nvidia-smi --query-gpu=name --format=csv,noheader | sort | uniq -c | xargs)," \
        "driver $(nvidia-smi --query-gpu=driver_version --format=csv,noheader | head -1)," \
        "$(date -u +%Y-%m-%d), $(($(date +%s) - STARTED)) s"
}

cleanup() {
    local pid
    for pid in "${PIDS[@]}"; do
        kill -TERM -- "-$pid" 2>/dev/null || kill -TERM "$pid" 2>/dev/null
    done
    for pid in "${PIDS[@]}"; do
        wait "$pid" 2>/dev/null
    done
    if [ -n "${LOGS:-}" ]; then
        mkdir -p "$LOGS" && (cd "$WORK" && find . -name '*.log' -size -20M -print0 |
            tar czf "$LOGS/gpu_check_logs.tar.gz" --null -T -) &&
            echo "gpu_check: logs in $LOGS/gpu_check_logs.tar.gz" >&2
    fi
    if [ "${KEEP:-0}" = 1 ]; then
        echo "gpu_check: work directory kept: $WORK" >&2
    else
        rm -rf "$WORK"
    fi
}
trap cleanup EXIT

step() {
    STEP="$1"
    echo "gpu_check: $1" >&2
}
ok() { ROWS+=("$STEP|ok|$1"); }
# A job step that fails is recorded and the next step still runs (one run of this script on a borrowed
# machine then says everything it can); the script exits 1 at the end.
FAILED=0
soft_fail() {
    ROWS+=("$STEP|FAILED|$1")
    FAILED=1
    echo "gpu_check: FAILED at step '$STEP': $1" >&2
}
fail() {
    ROWS+=("$STEP|FAILED|$1")
    echo "gpu_check: FAILED at step '$STEP': $1" >&2
    summary
    exit 1
}

# ---- venv -------------------------------------------------------------------------------------------------
step venv
PYTHON=${PYTHON:-python3}
"$PYTHON" -c 'import sys; sys.exit(sys.version_info < (3, 11))' || fail "$PYTHON is older than 3.11"
# TORCH_SPEC=preinstalled: the venv also sees $PYTHON's own packages (its CUDA torch and anything else it
# has), through --system-site-packages and, where $PYTHON is itself a venv, a .pth naming its site-packages;
# pip then installs only what is missing. WHEELHOUSE=DIR: nothing is fetched (--no-index); the project's
# dependencies and its build backend come from the wheels in DIR (a machine that reaches no registry).
VENV_ARGS=()
[ "${TORCH_SPEC:-torch}" = preinstalled ] && VENV_ARGS+=(--system-site-packages)
VPY="$WORK/venv/bin/python"
TP="$WORK/venv/bin/tuneplane"
PIP=("$VPY" -m pip)
if ! "$PYTHON" -m venv "${VENV_ARGS[@]}" "$WORK/venv" >"$WORK/pip.log" 2>&1; then
    # An interpreter without ensurepip (Debian's without python3-venv, some images): a venv without pip,
    # filled by $PYTHON's own pip (`--python`, pip 22.3+).
    rm -rf "$WORK/venv"
    "$PYTHON" -m venv "${VENV_ARGS[@]}" --without-pip "$WORK/venv" >>"$WORK/pip.log" 2>&1 &&
        "$PYTHON" -m pip --version >>"$WORK/pip.log" 2>&1 ||
        fail "python -m venv failed: $(tail -2 "$WORK/pip.log" | xargs)"
    PIP=("$PYTHON" -m pip --python "$VPY")
fi
PIP_SOURCE=()
if [ -n "${WHEELHOUSE:-}" ]; then
    [ -d "$WHEELHOUSE" ] || fail "WHEELHOUSE $WHEELHOUSE is not a directory"
    PIP_SOURCE=(--no-index --find-links "$(cd "$WHEELHOUSE" && pwd)")
else
    "${PIP[@]}" install -q --upgrade pip >>"$WORK/pip.log" 2>&1 || fail "pip upgrade failed (see $WORK/pip.log)"
fi
WANTED=("$REPO" nvidia-ml-py)
if [ "${TORCH_SPEC:-torch}" = preinstalled ]; then
    "$PYTHON" -c 'import sys, sysconfig
if sys.prefix != sys.base_prefix:
    print("\n".join(dict.fromkeys((sysconfig.get_path("purelib"), sysconfig.get_path("platlib")))))' \
        >"$("$VPY" -c 'import sysconfig; print(sysconfig.get_path("purelib"))')/gpu-check-base.pth" ||
        fail "cannot read $PYTHON's site-packages"
else
    WANTED+=("${TORCH_SPEC:-torch}")
fi
"${PIP[@]}" install -q "${PIP_SOURCE[@]}" "${WANTED[@]}" >>"$WORK/pip.log" 2>&1 ||
    fail "pip install of ${WANTED[*]} failed: $({ grep -m1 -E '^\s*ERROR' "$WORK/pip.log" || tail -3 "$WORK/pip.log"; } | xargs)"
NGPU=$(nvidia-smi -L | grep -c '^GPU ')
TORCH=$("$VPY" -c "
import torch
assert torch.version.cuda, 'this torch has no CUDA (a CPU build): set TORCH_SPEC or the index'
assert torch.cuda.is_available(), 'torch.cuda is not available'
assert torch.cuda.device_count() == $NGPU, f'torch sees {torch.cuda.device_count()} GPUs, nvidia-smi $NGPU'
print(f'torch {torch.__version__} (CUDA {torch.version.cuda})')
" 2>&1) || fail "torch: $(echo "$TORCH" | tail -1)"
ok "$TORCH, nvidia-ml-py $("$VPY" -c 'import importlib.metadata as m; print(m.version("nvidia-ml-py"))')"

# ---- checks against the database (the same stored rows the console shows) --------------------------------
cat >"$WORK/check.py" <<'PYEOF'
"""gpu_check's checks: python check.py DATABASE_URL WHAT [ARGS]; prints one line, exits 1 with the reason."""
import json
import subprocess
import sys
import time

import psycopg
from psycopg.rows import dict_row

url, what, *args = sys.argv[1:]
conn = psycopg.connect(url, autocommit=True, row_factory=dict_row, options="-c search_path=tuneplane,public")


def smi() -> dict[int, dict]:
    out = subprocess.run(["nvidia-smi", "--query-gpu=index,name,memory.total,uuid", "--format=csv,noheader,nounits"],
                         capture_output=True, text=True, check=True).stdout
    gpus = {}
    for line in out.splitlines():
        parts = [p.strip() for p in line.split(",")]
        gpus[int(parts[0])] = {"name": ", ".join(parts[1:-2]), "mib": int(float(parts[-2])), "uuid": parts[-1]}
    return gpus


def die(message: str) -> None:
    print(message)
    sys.exit(1)


if what == "inventory":
    expected, deadline = smi(), time.time() + 120
    while True:
        rows = conn.execute("SELECT n.name AS node, g.gpu_index, g.model, g.memory_bytes, g.simulated"
                            " FROM node_gpus g JOIN nodes n ON n.id = g.node_id ORDER BY g.gpu_index").fetchall()
        if len(rows) >= len(expected) or time.time() > deadline:
            break
        time.sleep(2)
    seen = {r["gpu_index"]: r for r in rows}
    if sorted(seen) != sorted(expected) or len(rows) != len(expected):
        die(f"agents reported GPUs {[(r['node'], r['gpu_index']) for r in rows]}, nvidia-smi lists {sorted(expected)}")
    for index, gpu in expected.items():
        row = seen[index]
        if row["simulated"] or row["model"] != gpu["name"]:
            die(f"GPU {index}: reported {row['model']!r} (simulated={row['simulated']}), nvidia-smi says {gpu['name']!r}")
        if abs(row["memory_bytes"] - gpu["mib"] * 2**20) > 2**20 * 64:
            die(f"GPU {index}: reported {row['memory_bytes']} bytes, nvidia-smi {gpu['mib']} MiB")
    nodes = sorted({r["node"] for r in rows})
    print(f"{len(rows)} GPU(s) with model and memory from NVML on {', '.join(nodes)}")

elif what == "policy":
    admin = conn.execute("SELECT id FROM users WHERE role = 'admin' ORDER BY id LIMIT 1").fetchone()["id"]
    conn.execute("UPDATE idle_settings SET check_every = interval '10 seconds', max_sample_gap = interval '1 minute'")
    conn.execute("SELECT * FROM set_idle_policy(%s, 'local', NULL, interval '2 minutes', 5, 0.2, 'warn', NULL)",
                 (admin,))
    print("idle policy of fleet local: 2 min, utilization < 5 % or power < 20 %, warn")

elif what == "samples":
    job_id, mode, logs_file = int(args[0]), args[1], args[2]
    members = conn.execute("SELECT m.rank, m.gpu_indices, n.name AS node FROM members m JOIN nodes n ON n.id = m.node_id"
                           " WHERE m.job_id = %s ORDER BY m.rank", (job_id,)).fetchall()
    logs = open(logs_file).read().splitlines()
    expected = smi()
    said = []
    for m in members:
        rows = conn.execute(
            "SELECT s.name, count(p.*) AS n, max(p.value) AS top FROM telemetry_series s"
            " LEFT JOIN telemetry_points p ON p.series_id = s.id"
            " WHERE s.job_id = %s AND s.member_rank = %s AND s.source = 'system' AND s.name LIKE 'system/gpu.%%'"
            " GROUP BY s.name", (job_id, m["rank"])).fetchall()
        by_name = {r["name"]: r for r in rows}
        sampled = sorted({int(name.split(".")[1]) for name in by_name})
        if sampled != sorted(m["gpu_indices"]):
            die(f"rank {m['rank']} was given GPUs {m['gpu_indices']} but samples are stored for GPUs {sampled}")
        for gpu in m["gpu_indices"]:
            for reading in ("utilization", "memory_used", "power_watts"):
                row = by_name.get(f"system/gpu.{gpu}.{reading}")
                if row is None or row["n"] < 3:
                    die(f"rank {m['rank']} GPU {gpu}: {reading}: {row['n'] if row else 0} sample(s) stored")
            top = by_name[f"system/gpu.{gpu}.utilization"]["top"]
            if mode == "matmul" and top < 50:
                die(f"rank {m['rank']} GPU {gpu}: utilization never reached 50 % (highest {top})")
        mine = [json.loads(line.split("GPUCHECK ", 1)[1]) for line in logs
                if line.startswith((f"[rank {m['rank']}] GPUCHECK {{", "GPUCHECK {"))]
        if not mine:
            die(f"rank {m['rank']}: the job's log has no GPUCHECK line")
        info = mine[0]
        wanted = ",".join(str(g) for g in m["gpu_indices"])
        if info["cuda_visible_devices"] != wanted:
            die(f"rank {m['rank']}: CUDA_VISIBLE_DEVICES={info['cuda_visible_devices']}, given GPUs {wanted}")
        uuid = expected[m["gpu_indices"][0]]["uuid"]
        if info.get("uuid") and info["uuid"].lower().removeprefix("gpu-") != uuid.lower().removeprefix("gpu-"):
            die(f"rank {m['rank']}: torch's device 0 is {info['uuid']}, GPU {wanted} is {uuid}")
        top = by_name["system/gpu.%d.utilization" % m["gpu_indices"][0]]["top"]
        said.append(f"rank {m['rank']} on {m['node']} GPU {wanted} ({info['name']}, utilization up to {top:.0f} %)")
    print("; ".join(said))

elif what == "idle":
    job_id, deadline = int(args[0]), time.time() + 300
    while time.time() < deadline:
        row = conn.execute("SELECT w.status, w.warned_at, w.evaluation, j.state_reason FROM job_idle w"
                           " JOIN jobs j ON j.id = w.job_id WHERE w.job_id = %s", (job_id,)).fetchone()
        if row and row["warned_at"]:
            if not row["state_reason"].startswith("GPUs idle for"):
                die(f"warned, but the reason says {row['state_reason']!r}")
            print(f"warned after {row['evaluation'].get('idle_after_s', 0):.0f} s window: {row['state_reason']}")
            sys.exit(0)
        time.sleep(5)
    die(f"not warned within 5 minutes; last verdict: {dict(row) if row else 'never evaluated'}")
else:
    die(f"unknown check {what}")
PYEOF

check() { "$VPY" "$WORK/check.py" "$DB_URL" "$@"; }

# ---- up (and a second agent with 2+ GPUs) ------------------------------------------------------------------
step up
export TUNEPLANE_CONFIG="$WORK/cli.toml"
# The members run on the node's interpreter (no job environment): `python` in their entrypoint must be the
# venv's, which has torch.
export PATH="$WORK/venv/bin:$PATH"
PORT=$("$VPY" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
LOCAL_GPUS=""
if [ "$NGPU" -ge 2 ]; then
    LOCAL_GPUS=$(seq -s, 0 $((NGPU - 2)))
fi
TUNEPLANE_NODE_GPUS="$LOCAL_GPUS" setsid "$TP" up --data-dir "$WORK/data" --port "$PORT" \
    --node-gateway-port $((PORT + 1)) --telemetry-gateway-port $((PORT + 2)) >"$WORK/up.log" 2>&1 &
PIDS+=($!)
for _ in $(seq 1 180); do
    grep -q "TunePlane is up" "$WORK/up.log" && break
    kill -0 "${PIDS[0]}" 2>/dev/null || fail "tuneplane up exited: $(tail -5 "$WORK/up.log" | xargs)"
    sleep 1
done
grep -q "TunePlane is up" "$WORK/up.log" || fail "tuneplane up not ready after 180 s: $(tail -3 "$WORK/up.log" | xargs)"
DB_URL=$(cat "$WORK/data/run/postgres.url" 2>/dev/null) || fail "no $WORK/data/run/postgres.url"
if [ "$NGPU" -ge 2 ]; then
    TOKEN=$("$TP" fleet enroll-token local --ttl 15m 2>/dev/null) || fail "no enrollment token for a second agent"
    TUNEPLANE_NODE_GPUS=$((NGPU - 1)) setsid "$TP" node --server "http://127.0.0.1:$((PORT + 1))" \
        --telemetry-url "http://127.0.0.1:$((PORT + 2))" --state-dir "$WORK/node2/state" \
        --work-dir "$WORK/node2/work" --name gpu-check-2 \
        --enroll-token "$TOKEN" >"$WORK/node2.log" 2>&1 &
    PIDS+=($!)
    ok "console on port $PORT; local node GPUs $LOCAL_GPUS, agent gpu-check-2 GPU $((NGPU - 1))"
else
    ok "console on port $PORT; local node with the machine's 1 GPU"
fi

# ---- inventory ---------------------------------------------------------------------------------------------
step inventory
said=$(check inventory) || fail "$said"
ok "$said"
step policy
said=$(check policy) || fail "$said"
ok "$said"

# ---- jobs ----------------------------------------------------------------------------------------------------
mkdir -p "$WORK/job"
cat >"$WORK/job/check_gpu.py" <<'PYEOF'
import json
import os
import time

import torch

props = torch.cuda.get_device_properties(0)
info = {
    "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
    "device_order": os.environ.get("CUDA_DEVICE_ORDER"),
    "count": torch.cuda.device_count(),
    "name": props.name,
    "uuid": str(getattr(props, "uuid", "") or ""),
}
print("GPUCHECK " + json.dumps(info), flush=True)
seconds = float(os.environ.get("RUN_SECONDS", "60"))
if os.environ.get("MODE", "matmul") == "matmul":
    a = torch.randn(8192, 8192, device="cuda")
    b = torch.randn(8192, 8192, device="cuda")
    end, n = time.time() + seconds, 0
    while time.time() < end:
        c = a @ b
        n += 1
        if n % 20 == 0:
            torch.cuda.synchronize()
    torch.cuda.synchronize()
    print(f"GPUCHECK-DONE {n} matmuls of 8192x8192 in {seconds:.0f} s", flush=True)
else:
    held = torch.empty(2 * 2**30, dtype=torch.uint8, device="cuda")
    torch.cuda.synchronize()
    time.sleep(seconds)
PYEOF

# submit NODES MODE SECONDS: prints the job id
submit() {
    "$TP" submit --source "$WORK/job" --entrypoint "python check_gpu.py" --nodes "$1" --gpus-per-node 1 \
        --env "MODE=$2" --env "RUN_SECONDS=$3" --max-attempts 1 --yes --json 2>"$WORK/submit.err" |
        "$VPY" -c 'import json, sys; print(json.load(sys.stdin)["job_id"])'
}

# wait_state JOB STATE SECONDS
wait_state() {
    local state="" i
    for i in $(seq 1 "$(($3 / 5))"); do
        state=$("$TP" jobs show "$1" --json 2>/dev/null | "$VPY" -c 'import json, sys; print(json.load(sys.stdin)["state"])')
        [ "$state" = "$2" ] && return 0
        case "$state" in succeeded | failed | cancelled) break ;; esac
        sleep 5
    done
    echo "job $1 is $state, not $2: $("$TP" jobs show "$1" 2>&1 | head -1); stderr: $("$TP" jobs logs "$1" --stream stderr 2>&1 | tail -3 | xargs)"
    return 1
}

# gpu_job NODES: a matmul job of NODES members × 1 GPU, checked
gpu_job() {
    local job said
    job=$(submit "$1" matmul 60) || { soft_fail "submit refused: $(tail -3 "$WORK/submit.err" | xargs)"; return; }
    said=$(wait_state "$job" succeeded 300) || { soft_fail "$said"; return; }
    "$TP" jobs logs "$job" >"$WORK/job-$job.log" 2>&1 || { soft_fail "cannot read the logs of job $job"; return; }
    said=$(check samples "$job" matmul "$WORK/job-$job.log") || { soft_fail "job $job: $said"; return; }
    ok "job $job: $said"
}

step 1-gpu-job
gpu_job 1
if [ "$NGPU" -ge 2 ]; then
    step 2-member
    gpu_job 2
fi

step idle
idle_job() {
    local job said
    job=$(submit 1 idle 600) || { soft_fail "submit refused: $(tail -3 "$WORK/submit.err" | xargs)"; return; }
    said=$(wait_state "$job" running 600) || { soft_fail "$said"; return; }
    said=$(check idle "$job") || { soft_fail "job $job: $said"; "$TP" jobs cancel "$job" >/dev/null 2>&1; return; }
    "$TP" jobs cancel "$job" --reason "gpu_check done" >/dev/null 2>&1
    ok "job $job: $said"
}
idle_job

summary
exit "$FAILED"
