"""Fine-tune a tiny GPT-2 with Hugging Face's Trainer, on files already on the machine.

Nothing is downloaded: the model is built from a GPT2Config (random weights) or loaded from a checkpoint
given with --init-from (a previous job's `checkpoints` artifact, materialized in $TUNEPLANE_INPUT_DIR);
the corpus is the Python standard library's own source files, read as bytes (a byte-level vocabulary of
256 + end-of-text, so no tokenizer is downloaded either). Trainer reports to TensorBoard in
$TUNEPLANE_OUTPUT_DIR/tensorboard (the collector ships train/loss, train/learning_rate, train/grad_norm)
and saves a checkpoint every --save-steps in $TUNEPLANE_OUTPUT_DIR/checkpoints (the job's output).

Preemption and resume (docs/preemption.md): every checkpoint Trainer saves is published while training
goes on (tuneplane.sdk.checkpoint: artifacts ckpt.1, ckpt.2, …). When TunePlane asks the member to stop
(sdk.preempting()), Trainer saves a checkpoint of the step it reached, it is published and verified, and
the script exits; a later attempt finds the newest verified checkpoint in sdk.resume_dir() and continues
with `trainer.train(resume_from_checkpoint=…)` (weights, optimizer, scheduler, RNG and step), so the job
ends with the same number of optimizer steps as an uninterrupted run.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import sysconfig
import time
from pathlib import Path

import torch
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainerCallback, TrainingArguments

try:
    from tuneplane import sdk
except ImportError:  # run outside TunePlane: no publishing, no resuming
    sdk = None

EOS = 256


def corpus(max_bytes: int) -> bytes:
    """Text that is on every machine with Python: the standard library's modules, in a fixed order."""
    data = bytearray()
    for path in sorted(glob.glob(os.path.join(sysconfig.get_paths()["stdlib"], "*.py"))):
        data += Path(path).read_bytes() + bytes([10])
        if len(data) >= max_bytes:
            break
    return bytes(data[:max_bytes])


class Blocks(torch.utils.data.Dataset):
    """Fixed-length blocks of byte ids; the labels are the inputs (the model shifts them)."""

    def __init__(self, data: bytes, block_size: int) -> None:
        ids = torch.tensor(list(data), dtype=torch.long)
        count = len(ids) // block_size
        self.blocks = ids[: count * block_size].view(count, block_size)

    def __len__(self) -> int:
        return len(self.blocks)

    def __getitem__(self, index: int) -> dict:
        block = self.blocks[index]
        return {"input_ids": block, "labels": block}


def latest_checkpoint(directory: Path) -> Path:
    """A Trainer output directory's newest checkpoint-N, or the directory itself if it holds a model."""
    found = sorted(directory.glob("checkpoint-*"), key=lambda p: int(p.name.split("-")[-1]))
    return found[-1] if found else directory


class TunePlaneCheckpoints(TrainerCallback):
    """Publish each checkpoint Trainer saves; on a preemption request save one now and stop training."""

    def on_step_end(self, args, state, control, **kwargs):
        if sdk is not None and sdk.preempting() and state.global_step < state.max_steps:
            control.should_save = True
            control.should_training_stop = True
        return control

    def on_save(self, args, state, control, **kwargs):
        directory = Path(args.output_dir) / f"checkpoint-{state.global_step}"
        if sdk is not None and directory.is_dir():
            result = sdk.checkpoint(directory, name="ckpt", step=state.global_step, wait=True)
            if isinstance(result, dict):
                print(
                    f"checkpoint-{state.global_step}: {result.get('artifact')} {result.get('state')}",
                    flush=True,
                )
        return control


class Pace(TrainerCallback):
    """--step-seconds: wait after every optimizer step (a demo or a test then has time to preempt it)."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds

    def on_step_end(self, args, state, control, **kwargs):
        time.sleep(self.seconds)
        return control


def resumed_step(directory: Path) -> int | None:
    """The optimizer step a Trainer checkpoint holds (its trainer_state.json), None if it is not one."""
    try:
        return int(json.loads((directory / "trainer_state.json").read_text())["global_step"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def main() -> None:
    if sdk is not None:
        sdk.trap_preemption_signal()  # a preemption's SIGTERM marks the request instead of ending training
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--save-steps", type=int, default=20)
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--block-size", type=int, default=64)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--corpus-bytes", type=int, default=400_000)
    parser.add_argument("--step-seconds", type=float, default=0.0, help="wait after every step")
    parser.add_argument(
        "--init-from", default=None, help="a checkpoint directory (relative: in the input dir)"
    )
    args = parser.parse_args()

    torch.manual_seed(0)
    torch.set_num_threads(max(1, min(2, os.cpu_count() or 1)))
    out = Path(os.environ.get("TUNEPLANE_OUTPUT_DIR", "out"))
    if args.init_from:
        source = Path(os.environ.get("TUNEPLANE_INPUT_DIR", ".")) / args.init_from
        start = latest_checkpoint(source)
        model = GPT2LMHeadModel.from_pretrained(start)
        print(f"fine-tuning further from {start}", flush=True)
    else:
        config = GPT2Config(
            vocab_size=257, n_positions=args.block_size, n_embd=64, n_layer=2, n_head=2,
            bos_token_id=EOS, eos_token_id=EOS,
        )  # fmt: skip
        model = GPT2LMHeadModel(config)
        print(f"a tiny GPT-2 from its config: {model.num_parameters()} parameters", flush=True)

    os.environ.setdefault("TENSORBOARD_LOGGING_DIR", str(out / "tensorboard"))
    options = dict(
        output_dir=str(out / "checkpoints"),
        max_steps=args.steps,
        per_device_train_batch_size=args.batch_size,
        learning_rate=args.lr,
        lr_scheduler_type="cosine",
        warmup_steps=max(1, args.steps // 10),
        max_grad_norm=1.0,
        logging_steps=1,
        save_steps=args.save_steps,
        save_total_limit=2,
        report_to=["tensorboard"],
        use_cpu=True,
        dataloader_num_workers=0,
        disable_tqdm=True,  # one line per logging step instead of progress bars in the member's log
        seed=0,
    )
    if "logging_dir" in TrainingArguments.__dataclass_fields__:  # transformers 4.x
        options["logging_dir"] = os.environ["TENSORBOARD_LOGGING_DIR"]
    trainer = Trainer(
        model=model,
        args=TrainingArguments(**options),
        train_dataset=Blocks(corpus(args.corpus_bytes), args.block_size),
        callbacks=[TunePlaneCheckpoints()] + ([Pace(args.step_seconds)] if args.step_seconds > 0 else []),
    )
    resume = sdk.resume_dir() if sdk is not None else None
    if resume is not None:
        # The published checkpoint-K directory, materialized as $TUNEPLANE_RESUME_DIR: Trainer restores
        # weights, optimizer, scheduler, RNG and step K from it and runs the steps left.
        step = resumed_step(resume)
        print(
            f"resuming from {os.environ.get('TUNEPLANE_RESUME_FROM')}: checkpoint-{step} ({resume})",
            flush=True,
        )
    result = trainer.train(resume_from_checkpoint=str(resume) if resume is not None else None)
    if sdk is not None and sdk.preempting() and result.global_step < args.steps:
        print(f"stopped at step {result.global_step}: asked to checkpoint and stop", flush=True)
        return
    final = out / "checkpoints" / f"checkpoint-{args.steps}"
    if not final.exists():  # save_steps did not land on the last step
        trainer.save_model(str(final))
    print(f"done: {result.global_step} steps, final train loss {result.training_loss:.4f}", flush=True)


if __name__ == "__main__":
    main()
