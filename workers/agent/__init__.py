"""The Node agent (`tuneplane node`): dials out to the node gateway, reports capacity, runs commands.

Modules, by what they hold:
- `main`: enrollment, one control session kept alive (reconnect with backoff and jitter);
  `session`: one control connection (hello, heartbeats, commands, credential rotation);
  `handlers`: the command registry (kind -> handler) and the hooks run when a session opens.
- `directories`: the private state directory and the work directory, kept apart;
  `credential`: the node credential stored in the state directory;
  `workload_dir_check`: the start-up check that the work directory's folders take writes.
- `capacity`: what this machine offers (CPUs, memory, GPUs, container runtimes).
- `launch`: the launch handlers (prepare, start, stop, abort, kill) and reconcile;
  `prepare`: PREPARE's steps, with `environments` (job environments built with uv), `images` (pinned
  image pulls) and `probe` (peer network and shared storage checks);
  `member_records`: the agent's durable record of each member (one JSON file per member).
- While and after a member runs: `collectors` (its metrics collector process), `logship` (its stdout and
  stderr to the server), `checkpoints` (checkpoints published while it runs), `preemption` (PREEMPT: ask it
  to checkpoint and stop within its grace), `outputs` (one delivery try
  of one output), `delivery` (the durable, retried delivery of all its outputs after it ended).
- `disk_cleanup`: what the agent removes from the node's disk (caches, abandoned downloads, finished
  members' directories) and the cache sizes it reports.
"""
