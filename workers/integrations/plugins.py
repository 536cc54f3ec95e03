"""The built-in integrations, declared as plugins (group `tuneplane.integrations`).

`details` is what submission needs: `kind` (recipe: selected by name as a JobSpec input; launcher: runs
a source archive's entrypoint or an image's command), `module` (what the runner executes with
`python -m`), `files` (the artifact, relative to this package, pinned by sha256), `requires` (packages
the Python runtime pin lists with versions) and, for recipes, `parameters`.
"""

from __future__ import annotations

from tuneplane.app.plugins import Plugin

demo = Plugin(
    name="demo",
    purpose="integrations",
    description="Trains a small NumPy model on synthetic data; writes TensorBoard events and metrics.jsonl",
    capabilities=("recipe", "cpu", "tensorboard_events", "jsonl_metrics"),
    executes_on=("node",),
    details={
        "kind": "recipe",
        "module": "tuneplane.workers.integrations.demo",
        "files": ["demo.py"],
        "requires": ["numpy", "tensorboardX"],
        "parameters": {
            "steps": {"type": "int", "default": 200, "min": 1, "max": 1_000_000, "help": "training steps"},
            "lr": {
                "type": "float",
                "default": 0.1,
                "min": 1e-6,
                "max": 10.0,
                "help": "peak learning rate (cosine decay with warm-up)",
            },
            "batch_size": {"type": "int", "default": 64, "min": 1, "max": 65536, "help": "examples per step"},
            "hidden": {"type": "int", "default": 32, "min": 1, "max": 4096, "help": "hidden units"},
            "seed": {"type": "int", "default": 0, "min": 0, "max": 2**31 - 1, "help": "random seed"},
            "log_every": {
                "type": "int",
                "default": 1,
                "min": 1,
                "max": 1_000_000,
                "help": "write metrics every N steps",
            },
            "step_seconds": {
                "type": "float",
                "default": 0.02,
                "min": 0.0,
                "max": 60.0,
                "help": "pause after each step so the charts can be watched",
            },
            "init_from": {
                "type": "str",
                "default": "",
                "help": "weights (.npz) to start from, relative to the job's input directory (fine-tuning)",
            },
            "checkpoint_every": {
                "type": "int",
                "default": 0,
                "min": 0,
                "max": 1_000_000,
                "help": "publish a checkpoint artifact (checkpoint.N) every N steps while training (0: off)",
            },
        },
        # Declared as the job's output when the JobSpec names none (tuneplane submit --recipe demo).
        "outputs": [{"name": "checkpoint", "path": "checkpoint"}],
    },
)

script = Plugin(
    name="script",
    purpose="integrations",
    description="Runs the entrypoint of a source archive (or an image's command) as one process per member",
    capabilities=("launcher", "source", "image"),
    executes_on=("node",),
    details={
        "kind": "launcher",
        "module": "tuneplane.workers.integrations.script",
        "files": ["script.py"],
        "requires": [],
    },
)

torchrun = Plugin(
    name="torchrun",
    purpose="integrations",
    description="PyTorch distributed: runs the entrypoint under torch.distributed.run across members",
    capabilities=("launcher", "source", "image", "distributed", "gpu"),
    executes_on=("node",),
    details={
        "kind": "launcher",
        "module": "tuneplane.workers.integrations.torchrun",
        "files": ["torchrun.py"],
        "requires": ["torch"],
    },
)
