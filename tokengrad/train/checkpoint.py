"""Checkpoints of a training run: RUN/checkpoint/{model/, trainer.pt}.

`model/` is an ordinary transformers checkpoint (model + tokenizer), so a trained policy loads with
`AutoModelForCausalLM.from_pretrained("RUN/checkpoint/model")` or as `model = "RUN/checkpoint/model"` in a
config. `trainer.pt` holds what a resumed run needs besides the weights: the step, the optimizer state and
the config. Only the latest checkpoint is kept; it is replaced by renaming, so a crash while saving leaves
the previous one intact.
"""

from __future__ import annotations

import contextlib
import shutil
from datetime import datetime
from pathlib import Path

import torch

from tokengrad.train.config import TrainConfig, make_config

CHECKPOINT_DIR = "checkpoint"


def checkpoint_path(run_dir: str | Path) -> Path:
    return Path(run_dir) / CHECKPOINT_DIR


def save_checkpoint(run_dir: str | Path, step: int, model, tokenizer, optimizer, config: dict) -> Path:
    """Write the checkpoint after `step` (the last finished step)."""
    final = checkpoint_path(run_dir)
    tmp, old = final.with_name(".checkpoint.tmp"), final.with_name(".checkpoint.old")
    shutil.rmtree(tmp, ignore_errors=True)
    with _no_progress_bar():
        model.save_pretrained(tmp / "model")
    tokenizer.save_pretrained(tmp / "model")
    torch.save({"step": int(step), "optimizer": optimizer.state_dict(), "config": config}, tmp / "trainer.pt")
    shutil.rmtree(old, ignore_errors=True)
    if final.exists():
        final.rename(old)
    tmp.rename(final)
    shutil.rmtree(old, ignore_errors=True)
    return final


def load_trainer_state(run_dir: str | Path) -> dict:
    """{"step", "optimizer", "config"} of the run's checkpoint; ValueError if there is none."""
    path = checkpoint_path(run_dir) / "trainer.pt"
    if not path.exists():
        raise ValueError(f"cannot resume: no checkpoint at {path}")
    return torch.load(path, map_location="cpu", weights_only=False)


@contextlib.contextmanager
def _no_progress_bar():
    """Silence transformers' shard-writing bar (it would break the trainer's own), then restore it."""
    from transformers.utils import logging as hf_logging
    was_enabled = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if was_enabled:
            hf_logging.enable_progress_bar()


# Keys a resumed run may change; any other difference from the checkpoint's config is an error.
RESUMABLE_KEYS = {"steps", "resume", "progress", "run_dir", "run_name", "eval_every", "eval_per_difficulty",
                  "checkpoint", "checkpoint_every", "bucket_every"}


def resolve_run_dir(cfg: TrainConfig) -> Path:
    """runs/<run_name> unless given; a finished or started run is only reused with resume."""
    name = cfg.run_name or f"{cfg.task}-{cfg.weighting}-{datetime.now():%Y%m%d-%H%M%S}"
    run_dir = Path(cfg.run_dir or Path("runs") / name)
    if (run_dir / "meta.json").exists() and not cfg.resume:
        raise ValueError(f"run directory {run_dir} already holds a run; pass resume=true to continue it "
                         "or choose another run_dir")
    return run_dir


def resume_state(cfg: TrainConfig, run_dir: Path) -> dict:
    """The checkpoint's trainer state, after checking that the config only changes resumable keys."""
    state = load_trainer_state(run_dir)
    saved = make_config(state["config"])
    changed = sorted(
        k for k, v in cfg.to_dict().items() if k not in RESUMABLE_KEYS and getattr(saved, k) != v
    )
    if changed:
        raise ValueError(f"cannot resume {run_dir}: config keys {changed} differ from the checkpoint's")
    if state["step"] + 1 >= cfg.steps:
        raise ValueError(
            f"cannot resume {run_dir}: its checkpoint is at step {state['step']} and steps={cfg.steps}; "
            "raise steps to train further"
        )
    return state
