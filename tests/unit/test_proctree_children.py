"""workers/proctree.zombie_children: the agent's reaper finds its ended children from its own children
lists (/proc/<pid>/task/*/children), a child spawned from a worker thread too, never a live one."""

from __future__ import annotations

import os
import subprocess
import threading
import time

from tuneplane.workers.proctree import child_pids, zombie_children


def test_ended_children_are_found_from_the_children_lists_live_ones_never() -> None:
    ended = subprocess.Popen(["true"])
    spawned: list[subprocess.Popen] = []
    thread = threading.Thread(target=lambda: spawned.append(subprocess.Popen(["true"])))
    thread.start()
    thread.join()  # the thread that spawned it is gone; its child is still ours to wait for
    live = subprocess.Popen(["sleep", "30"])
    try:
        # (a child of a thread that just ended moves to another thread's list: a bounded poll, as the
        # reaper's next pass would)
        wanted = {ended.pid, spawned[0].pid, live.pid}
        deadline = time.monotonic() + 10
        while not wanted <= set(child_pids(os.getpid()) or []) and time.monotonic() < deadline:
            time.sleep(0.02)
        children = child_pids(os.getpid())
        assert children is not None, "this kernel has /proc/<pid>/task/*/children (CONFIG_PROC_CHILDREN)"
        assert wanted <= set(children)
        mine = {ended.pid, spawned[0].pid}
        deadline = time.monotonic() + 10
        while not mine <= zombie_children(os.getpid()) and time.monotonic() < deadline:
            time.sleep(0.02)
        # (other tests in this process may have left zombies of their own: only ours are asserted)
        zombies = zombie_children(os.getpid())
        assert mine <= zombies and live.pid not in zombies
    finally:
        live.kill()
        for child in (ended, spawned[0], live):
            child.wait()
    assert not mine & zombie_children(os.getpid())
