"""workers/proctree.zombie_children: the agent's reaper finds its ended children from its own children
lists (/proc/<pid>/task/*/children), a child spawned from a worker thread too, never a live one.

The scenario runs in a fresh Python process of its own: in a pytest worker, other tests' in-process agents
(their reap loops wait for any zombie nobody holds) could reap this test's children before it looks (CI saw
the thread's child missing twice)."""

from __future__ import annotations

import json
import subprocess
import sys

SCENARIO = r"""
import json, os, subprocess, threading, time
from tuneplane.workers.proctree import child_pids, zombie_children

ended = subprocess.Popen(["true"])
spawned = []
thread = threading.Thread(target=lambda: spawned.append(subprocess.Popen(["true"])))
thread.start()
thread.join()  # the thread that spawned it is gone; its child is still ours to wait for
live = subprocess.Popen(["sleep", "30"])
wanted = {ended.pid, spawned[0].pid, live.pid}
mine = {ended.pid, spawned[0].pid}
# (a child of a thread that just ended moves to another thread's list: a bounded poll, as the reaper's
# next pass would)
deadline = time.monotonic() + 10
while not wanted <= set(child_pids(os.getpid()) or []) and time.monotonic() < deadline:
    time.sleep(0.02)
children = child_pids(os.getpid())
deadline = time.monotonic() + 10
while not mine <= zombie_children(os.getpid()) and time.monotonic() < deadline:
    time.sleep(0.02)
zombies = zombie_children(os.getpid())
live.kill()
for child in (ended, spawned[0], live):
    child.wait()
print(json.dumps({
    "wanted": sorted(wanted), "mine": sorted(mine), "live": live.pid,
    "children": None if children is None else sorted(children),
    "zombies": sorted(zombies), "zombies_after_wait": sorted(zombie_children(os.getpid())),
}))
"""


def test_ended_children_are_found_from_the_children_lists_live_ones_never() -> None:
    ran = subprocess.run([sys.executable, "-c", SCENARIO], capture_output=True, text=True, timeout=60)
    assert ran.returncode == 0, ran.stderr
    seen = json.loads(ran.stdout)
    assert seen["children"] is not None, "this kernel has /proc/<pid>/task/*/children (CONFIG_PROC_CHILDREN)"
    assert set(seen["wanted"]) <= set(seen["children"])
    assert set(seen["mine"]) <= set(seen["zombies"]) and seen["live"] not in seen["zombies"]
    assert not set(seen["mine"]) & set(seen["zombies_after_wait"])
