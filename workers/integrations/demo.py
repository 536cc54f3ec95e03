"""The `demo` recipe: trains a small real model with NumPy and writes telemetry the collector reads.

A two-layer MLP (tanh) learns a smooth 2-D function from synthetic data with SGD + momentum and a
cosine learning-rate schedule with warm-up. Every `log_every` steps it writes
  $TUNEPLANE_OUTPUT_DIR/metrics.jsonl            {"step": n, "loss": …, "lr": …} per line
  $TUNEPLANE_OUTPUT_DIR/tensorboard/events.*     scalars loss and lr (tensorboardX)
and at the end the weights in $TUNEPLANE_OUTPUT_DIR/checkpoint/model.npz (the recipe declares that
directory as output `checkpoint` unless the JobSpec names its own outputs). With `checkpoint_every` N it
also saves checkpoints/step-…/model.npz every N steps (and when a user runs `tuneplane artifacts
checkpoint JOB`) and publishes each while it trains (artifacts checkpoint.1, checkpoint.2, …), waiting
at the end until every one is complete. The output directory defaults to ./output. With
`init_from` (a path, relative to $TUNEPLANE_INPUT_DIR when not absolute) training starts from saved
weights instead of random ones: that is how a fine-tune job consumes an earlier job's checkpoint.
A later attempt of the job (after a preemption, a time limit, a lost node or a failure) finds the job's
newest verified checkpoint in $TUNEPLANE_RESUME_DIR (tuneplane.sdk.resume_dir()) and continues from its
step with its weights and optimizer state (state.json says the step), so the run ends after exactly
`steps` steps whatever happened on the way. When TunePlane asks it to stop (tuneplane.sdk.preempting(),
docs/preemption.md) it saves and publishes a checkpoint of the step it reached and exits.

Parameters come from $TUNEPLANE_PARAMS (a JSON object, as the runner passes a recipe's params) and
command-line flags, flags winning:  python -m tuneplane.workers.integrations.demo --steps 50
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from pathlib import Path

import numpy as np

DEFAULTS = {
    "steps": 200,
    "lr": 0.1,
    "batch_size": 64,
    "hidden": 32,
    "seed": 0,
    "log_every": 1,
    "step_seconds": 0.02,
    "init_from": "",
    "checkpoint_every": 0,
}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    params = dict(DEFAULTS)
    raw = os.environ.get("TUNEPLANE_PARAMS")
    if raw:
        params.update(json.loads(raw))
    parser = argparse.ArgumentParser(
        prog="python -m tuneplane.workers.integrations.demo",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--steps", type=int, default=int(params["steps"]))
    parser.add_argument("--lr", type=float, default=float(params["lr"]))
    parser.add_argument("--batch-size", type=int, default=int(params["batch_size"]))
    parser.add_argument("--hidden", type=int, default=int(params["hidden"]))
    parser.add_argument("--seed", type=int, default=int(params["seed"]))
    parser.add_argument("--log-every", type=int, default=int(params["log_every"]))
    # Pacing only, so a person can watch the charts move; the model trains the same without it.
    parser.add_argument("--step-seconds", type=float, default=float(params["step_seconds"]))
    parser.add_argument("--output-dir", default=os.environ.get("TUNEPLANE_OUTPUT_DIR", "output"))
    parser.add_argument(
        "--init-from",
        default=str(params["init_from"]),
        help="weights (.npz) to start from; relative paths are under $TUNEPLANE_INPUT_DIR",
    )
    parser.add_argument(
        "--checkpoint-every",
        type=int,
        default=int(params["checkpoint_every"]),
        help="publish a checkpoint (artifact checkpoint.N) every N steps while training; 0: only at the end",
    )
    args = parser.parse_args(argv)
    if args.checkpoint_every < 0:
        parser.error("checkpoint-every cannot be negative")
    if args.steps < 1 or args.batch_size < 1 or args.hidden < 1 or args.log_every < 1 or args.lr <= 0:
        parser.error("steps, batch-size, hidden and log-every must be at least 1; lr must be positive")
    if args.step_seconds < 0:
        parser.error("step-seconds cannot be negative")
    return args


def target(x: np.ndarray) -> np.ndarray:
    """The function the model learns."""
    return (np.sin(2.0 * x[:, 0]) + 0.5 * x[:, 1] ** 2 - 0.3 * x[:, 0] * x[:, 1])[:, None]


def learning_rate(step: int, steps: int, peak: float) -> float:
    warmup = max(1, steps // 20)
    if step <= warmup:
        return peak * step / warmup
    progress = (step - warmup) / max(1, steps - warmup)
    return peak * (0.05 + 0.95 * 0.5 * (1.0 + math.cos(math.pi * progress)))


class MLP:
    def __init__(self, hidden: int, rng: np.random.Generator) -> None:
        self.params = {
            "w1": rng.normal(0.0, 1.0 / math.sqrt(2), (2, hidden)),
            "b1": np.zeros(hidden),
            "w2": rng.normal(0.0, 1.0 / math.sqrt(hidden), (hidden, 1)),
            "b2": np.zeros(1),
        }
        self.velocity = {k: np.zeros_like(v) for k, v in self.params.items()}

    def load(self, path: Path) -> None:
        with np.load(path) as saved:
            for name, value in self.params.items():
                if name not in saved or saved[name].shape != value.shape:
                    raise SystemExit(f"demo: {path} does not hold {name} with shape {value.shape}")
                self.params[name] = saved[name].copy()
        print(f"initialized from {path} ({sum(v.size for v in self.params.values())} parameters)", flush=True)

    def resume(self, directory: Path) -> int:
        """Weights, momentum and step of a checkpoint this recipe saved; returns the step."""
        self.load(directory / "model.npz")
        with np.load(directory / "model.npz") as saved:
            for name in self.velocity:
                if f"velocity_{name}" in saved:
                    self.velocity[name] = saved[f"velocity_{name}"].copy()
        state_file = directory / "state.json"
        state = json.loads(state_file.read_text()) if state_file.is_file() else {}
        return int(state.get("step", 0))

    def loss_and_grads(self, x: np.ndarray, y: np.ndarray) -> tuple[float, dict[str, np.ndarray]]:
        p = self.params
        h = np.tanh(x @ p["w1"] + p["b1"])
        pred = h @ p["w2"] + p["b2"]
        err = pred - y
        loss = float(np.mean(err**2))
        d_pred = 2.0 * err / len(x)
        d_h = (d_pred @ p["w2"].T) * (1.0 - h**2)
        grads = {"w2": h.T @ d_pred, "b2": d_pred.sum(0), "w1": x.T @ d_h, "b1": d_h.sum(0)}
        return loss, grads

    def step(self, grads: dict[str, np.ndarray], lr: float, momentum: float = 0.9) -> None:
        for name, grad in grads.items():
            self.velocity[name] = momentum * self.velocity[name] - lr * grad
            self.params[name] += self.velocity[name]


def resolve_input(raw: str) -> Path:
    path = Path(raw)
    if not path.is_absolute():
        path = Path(os.environ.get("TUNEPLANE_INPUT_DIR", "input")) / path
    if not path.is_file():
        raise SystemExit(f"demo: init_from {path} does not exist")
    return path


def save_checkpoint(model: MLP, directory: Path, step: int | None = None) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    tmp = directory / "model.tmp.npz"
    np.savez(tmp, **model.params, **{f"velocity_{k}": v for k, v in model.velocity.items()})
    tmp.replace(directory / "model.npz")
    if step is not None:
        (directory / "state.json").write_text(json.dumps({"step": step}))


def publish_checkpoint(model: MLP, out: Path, step: int) -> None:
    """Save the weights of `step` in a directory of their own and ask TunePlane to publish it while
    training goes on (tuneplane.sdk.checkpoint: the node agent uploads it as artifact checkpoint.N)."""
    try:
        from tuneplane import sdk
    except ImportError:  # run outside TunePlane's runtime: nothing to publish to
        return
    directory = out / "checkpoints" / f"step-{step:07d}"
    if directory.exists():  # published already (asked twice at one step)
        return
    save_checkpoint(model, directory, step)
    if sdk.checkpoint(directory, name="checkpoint", step=step) is not None:
        print(f"checkpoint of step {step} requested ({directory})", flush=True)


def wait_for_checkpoints() -> None:
    try:
        from tuneplane import sdk
    except ImportError:
        return
    for result in sdk.wait_for_checkpoints(timeout=300):
        print(
            f"checkpoint {result.get('artifact')}: {result.get('state')} {result.get('reason') or ''}",
            flush=True,
        )


def checkpoint_asked() -> bool:
    try:
        from tuneplane import sdk
    except ImportError:
        return False
    return sdk.checkpoint_requested()


def stop_asked() -> bool:
    """TunePlane asked this member to checkpoint and stop (a preemption or the time limit)."""
    try:
        from tuneplane import sdk
    except ImportError:
        return False
    return bool(getattr(sdk, "preempting", lambda: False)())


def trap_stop_signal() -> None:
    """Hear the preemption signal as a request to checkpoint and stop (it would otherwise end the process)."""
    try:
        from tuneplane import sdk
    except ImportError:
        return
    sdk.trap_preemption_signal()


def resume_from() -> Path | None:
    try:
        from tuneplane import sdk
    except ImportError:
        return None
    directory = sdk.resume_dir()
    return directory if directory is not None and (directory / "model.npz").is_file() else None


def summary_writer_class() -> type:
    """tensorboardX's SummaryWriter, imported without PyTorch. tensorboardX imports torch whenever it is
    installed (to accept its tensors in add_scalar), and on a node with PyTorch that import was 1.3 of the
    demo's 1.7 CPU-seconds of start-up, for a NumPy model whose scalars never touch it. A `None` in
    sys.modules makes that one `import torch` fail as if torch were absent (tensorboardX then takes NumPy
    arrays only); the entry goes again at once, so torch can still be imported later."""
    hidden = "torch" not in sys.modules
    if hidden:
        sys.modules["torch"] = None  # type: ignore[assignment]
    try:
        from tensorboardX import SummaryWriter
    finally:
        if hidden:
            del sys.modules["torch"]
    return SummaryWriter


def train(args: argparse.Namespace) -> float:
    SummaryWriter = summary_writer_class()

    trap_stop_signal()
    out = Path(args.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    rank = int(os.environ.get("RANK", "0"))
    rng = np.random.default_rng(args.seed + rank)
    model = MLP(args.hidden, rng)
    first = 1
    resumed = resume_from()
    if resumed is not None:
        first = model.resume(resumed) + 1
        # The data stream continues from the resumed step, the same on every attempt that reaches it.
        rng = np.random.default_rng([args.seed, rank, first])
        name = os.environ.get("TUNEPLANE_RESUME_FROM") or resumed
        print(f"resumed from {name} at step {first - 1}", flush=True)
    elif args.init_from:
        model.load(resolve_input(args.init_from))
    writer = SummaryWriter(logdir=str(out / "tensorboard"), flush_secs=2)
    loss = float("nan")
    if first > args.steps:  # resumed from the last step's checkpoint: nothing left but to say the loss
        x = rng.uniform(-2.0, 2.0, (args.batch_size, 2))
        loss = model.loss_and_grads(x, target(x))[0]
    started = time.monotonic()
    with open(out / "metrics.jsonl", "a", encoding="utf-8") as metrics:
        for step in range(first, args.steps + 1):
            x = rng.uniform(-2.0, 2.0, (args.batch_size, 2))
            loss, grads = model.loss_and_grads(x, target(x))
            lr = learning_rate(step, args.steps, args.lr)
            model.step(grads, lr)
            if step % args.log_every == 0 or step == args.steps:
                metrics.write(json.dumps({"step": step, "loss": loss, "lr": lr}) + "\n")
                metrics.flush()
                writer.add_scalar("loss", loss, step)
                writer.add_scalar("lr", lr, step)
            if step % max(1, args.steps // 10) == 0 or step == args.steps:
                print(f"step {step}/{args.steps} loss {loss:.5f} lr {lr:.5f}", flush=True)
            if (args.checkpoint_every and step % args.checkpoint_every == 0) or checkpoint_asked():
                publish_checkpoint(model, out, step)
            if step < args.steps and stop_asked():
                publish_checkpoint(model, out, step)
                wait_for_checkpoints()
                print(f"stopping at step {step}/{args.steps}: asked to checkpoint and stop", flush=True)
                writer.close()
                return loss
            if args.step_seconds:
                time.sleep(args.step_seconds)
    writer.close()
    save_checkpoint(model, out / "checkpoint")
    # Every checkpoint asked for is complete (or refused, with the reason) before the member ends.
    wait_for_checkpoints()
    elapsed = time.monotonic() - started
    print(
        f"done: {args.steps} steps ({args.steps - first + 1} in this attempt) in {elapsed:.2f}s, "
        f"final loss {loss:.5f}, output in {out}",
        flush=True,
    )
    return loss


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    loss = train(args)
    return 0 if math.isfinite(loss) else 1


if __name__ == "__main__":
    sys.exit(main())
