"""TunePlane's built-in plugins, registered through the same entry points as everyone else's."""

from __future__ import annotations

from tuneplane.app.plugins import Plugin

node_backend = Plugin(
    name="node",
    purpose="backends",
    description="Runs members on machines whose agents dial out to the node control gateway",
    capabilities=("gang_launch", "prepare_commit", "gpu", "object_delivery", "reconcile"),
    executes_on=("worker", "node"),
)

slurm_backend = Plugin(
    name="slurm",
    purpose="backends",
    description="Runs each attempt as one sbatch gang job on an existing Slurm cluster (22.05+, CLI only)",
    capabilities=("gang_launch", "prepare_commit", "gpu", "queue_reasons", "shared_path", "preemption"),
    executes_on=("worker",),
    details={"worker": "tuneplane worker --backend slurm", "docs": "docs/slurm.md"},
)

filesystem_storage = Plugin(
    name="filesystem",
    purpose="storage",
    description="Content-addressed blob store in a directory under the data directory",
    capabilities=("blobs", "sha256_addressing"),
    executes_on=("server",),
)

tensorboard_source = Plugin(
    name="tensorboard",
    purpose="telemetry_sources",
    description="Scalars from TensorBoard event files (simple_value and TF2 tensor forms)",
    capabilities=("scalars", "resume_from_offset", "crc_checked"),
    executes_on=("collector",),
)

jsonl_source = Plugin(
    name="jsonl",
    purpose="telemetry_sources",
    description='Metrics from JSON-lines files ({"step": 10, "loss": 0.3})',
    capabilities=("scalars", "resume_from_offset"),
    executes_on=("collector",),
)
