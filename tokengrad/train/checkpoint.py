"""Checkpoints of a training run: RUN/checkpoint/{model/, trainer.pt}.

`model/` is an ordinary transformers checkpoint (model + tokenizer), so a trained policy loads with
`AutoModelForCausalLM.from_pretrained("RUN/checkpoint/model")` or as `model = "RUN/checkpoint/model"` in a
config. `trainer.pt` holds what a resumed run needs besides the weights: the step, the last step whose rows
are on disk (`data_step`, the same step: the save waits for the writer first), the optimizer state and the
config, all plain data: it is loaded with `torch.load(weights_only=True)`, so a shared run directory cannot
run code through it (the weights are safetensors, which hold no code either).

Only the latest checkpoint is kept. A save writes `.checkpoint.tmp/` and fsyncs it (trainer.pt last,
through its own rename, so a folder holding trainer.pt is complete and on disk), renames the current one to
`.checkpoint.old/`, then the new one into place. A process killed between the two renames leaves two
complete checkpoints and no `checkpoint/`: the next load puts the newer one back in place. A disk that fills
up during a save leaves the previous checkpoint in place and no partial folder: one line names the disk
(mount point, free space) and the checkpoint a `--resume` will continue from.
"""

from __future__ import annotations

import contextlib
import os
import pickle
import shutil
import warnings
from datetime import datetime
from pathlib import Path

import torch

from tokengrad.faults import fault_point
from tokengrad.read import meta_file
from tokengrad.record.store.claim import local_dir
from tokengrad.train import distributed as dist
from tokengrad.train import durable
from tokengrad.train.config import TrainConfig, make_config

CHECKPOINT_DIR = "checkpoint"
TRAINER_FILE = "trainer.pt"
PICKLE_SUFFIXES = (".bin", ".pt", ".pkl", ".pth")  # weight files that torch.load would unpickle


def checkpoint_path(run_dir: str | Path) -> Path:
    return Path(run_dir) / CHECKPOINT_DIR


def _tmp_old(run_dir: str | Path) -> tuple[Path, Path]:
    final = checkpoint_path(run_dir)
    return final.with_name(".checkpoint.tmp"), final.with_name(".checkpoint.old")


def checkpoint_after_step(rec, run_dir: Path, step: int, *, model, tokenizer, optimizer, config: dict):
    """Every rank: wait until its steps <= `step` are on disk (the checkpoint must never get ahead of the
    data), then rank 0 saves; returns the checkpoint path (None if the disk refused, see save_checkpoint)."""
    data_step = int(dist.all_reduce([rec.checkpoint_step()], "min")[0])  # also the barrier of all ranks
    return dist.on_main(
        lambda: save_checkpoint(
            run_dir,
            step,
            model=model,
            tokenizer=tokenizer,
            optimizer=optimizer,
            config=config,
            data_step=data_step,
            on_error=rec.on_error,
        )
    )


def save_checkpoint(
    run_dir: str | Path,
    step: int,
    *,
    model,
    tokenizer,
    optimizer,
    config: dict,
    data_step: int | None = None,
    on_error: str = "raise",
) -> Path | None:
    """Write the checkpoint after `step` (the last finished step; `data_step`: the last step on disk).

    A disk that refuses the checkpoint (full, read-only) leaves the previous checkpoint as it was and no
    partial folder; the one-line message names the disk and the last good checkpoint. on_error="count":
    the message is a warning and None is returned; "raise": a CheckpointNotWritten (an OSError) carries it.
    """
    final = checkpoint_path(run_dir)
    tmp, old = _tmp_old(run_dir)
    try:
        fault_point("checkpoint_write")
        _write_folder(
            tmp,
            step,
            model=model,
            tokenizer=tokenizer,
            optimizer=optimizer,
            config=config,
            data_step=data_step,
        )
    except Exception as err:
        shutil.rmtree(tmp, ignore_errors=True)
        cause = durable.write_error(err)
        if cause is None:  # not the disk's doing: a bug keeps its traceback
            raise
        message = not_written_message(run_dir, step, cause)
        if on_error == "raise":
            raise CheckpointNotWritten(cause.errno, message) from err
        warnings.warn(f"tokengrad: {message}", RuntimeWarning, stacklevel=2)
        return None
    shutil.rmtree(old, ignore_errors=True)
    if final.exists():
        final.rename(old)
    fault_point("checkpoint_renamed")
    tmp.rename(final)
    durable.fsync_dir(final.parent)
    shutil.rmtree(old, ignore_errors=True)
    fault_point("checkpoint_saved")
    return final


class CheckpointNotWritten(OSError):
    """The disk refused a checkpoint; str() is the one-line message (no "[Errno N]" in front)."""

    def __str__(self) -> str:
        return self.strerror


def _write_folder(tmp: Path, step: int, *, model, tokenizer, optimizer, config: dict, data_step) -> None:
    """The checkpoint's files into `tmp`, fsynced; trainer.pt last, through its own rename, so that a folder
    holding trainer.pt is complete and on disk."""
    shutil.rmtree(tmp, ignore_errors=True)
    with _no_progress_bar():
        model.save_pretrained(tmp / "model", safe_serialization=True)
    tokenizer.save_pretrained(tmp / "model")
    durable.fsync_tree(tmp)
    state = {
        "step": int(step),
        "data_step": None if data_step is None else int(data_step),
        "optimizer": optimizer.state_dict(),
        "config": config,
    }
    durable.save_torch(state, tmp / TRAINER_FILE)


def not_written_message(run_dir: str | Path, step: int, err: OSError) -> str:
    """One line: why the checkpoint after `step` is not on disk, and which checkpoint a resume would use."""
    final = checkpoint_path(run_dir)
    if durable.is_disk_full(err):
        # the free space is measured after the partial checkpoint was removed: what it lacked is more
        why = f"{durable.describe_disk(run_dir)} ran out of space ({os.strerror(err.errno)})"
        then = "free space, then continue from it with --resume"
    else:
        why = f"{final}: {err}"
        then = "continue from it with --resume"
    last = _last_good_step(run_dir)
    if last is None:
        good = "there is no earlier checkpoint, so --resume starts the run again from step 0"
    else:
        good = f"the last good checkpoint is {final}, after step {last}; {then}"
    return f"the checkpoint after step {step} could not be written: {why}; {good}"


def _last_good_step(run_dir: str | Path) -> int | None:
    """The step of the complete checkpoint a resume would load (None: none, or unreadable). Read with mmap,
    so the optimizer state is not loaded into memory just for the step."""
    for folder in (checkpoint_path(run_dir), _tmp_old(run_dir)[1]):
        if _complete(folder):
            try:
                state = torch.load(folder / TRAINER_FILE, map_location="cpu", weights_only=True, mmap=True)
                return int(state["step"])
            except Exception:  # a message helper: an unreadable state is reported by resume itself
                return None
    return None


def _complete(folder: Path) -> bool:
    return (folder / TRAINER_FILE).is_file() and (folder / "model").is_dir()


def has_checkpoint(run_dir: str | Path) -> bool:
    """A complete checkpoint exists, in place or left by an interrupted save (nothing is moved)."""
    return any(_complete(f) for f in (checkpoint_path(run_dir), *_tmp_old(run_dir)))


def recover_checkpoint(run_dir: str | Path) -> Path | None:
    """The run's complete checkpoint folder, or None. After a kill between the two renames of a save there
    is no `checkpoint/`, but `.checkpoint.tmp/` (newer) and `.checkpoint.old/` are complete: the newer one
    that is complete is renamed back into place."""
    final = checkpoint_path(run_dir)
    if _complete(final):
        return final
    for candidate in _tmp_old(run_dir):  # newer first
        if _complete(candidate):
            if final.exists():  # an incomplete folder in the way (not left by save_checkpoint itself)
                shutil.rmtree(final)
            candidate.rename(final)
            warnings.warn(
                f"tokengrad: recovered the checkpoint of {run_dir} from {candidate.name} (a save "
                "was interrupted)",
                RuntimeWarning,
                stacklevel=2,
            )
            return final
    return None


def load_trainer_state(run_dir: str | Path) -> dict:
    """{"step", "data_step", "optimizer", "config"} of the run's checkpoint; ValueError if there is none or
    it holds anything but tensors and plain data."""
    folder = recover_checkpoint(run_dir)
    path = checkpoint_path(run_dir) / TRAINER_FILE
    if folder is None:
        raise ValueError(f"cannot resume: no checkpoint at {path}")
    pickled = sorted(p.name for p in (folder / "model").iterdir() if p.suffix in PICKLE_SUFFIXES)
    if pickled:
        raise ValueError(
            f"cannot resume: {folder / 'model'} holds pickled weights {pickled}; tokengrad "
            "checkpoints store safetensors only, and pickles can run code when loaded"
        )
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as err:
        raise ValueError(
            f"cannot resume: {path} holds objects other than tensors and plain data, which "
            f"could run code when loaded; it is not loaded ({' '.join(str(err).split())[:300]})"
        ) from None
    if not (
        isinstance(state, dict)
        and isinstance(state.get("step"), int)
        and isinstance(state.get("optimizer"), dict)
        and isinstance(state.get("config"), dict)
    ):
        raise ValueError(f"cannot resume: {path} is not a tokengrad trainer state (step, optimizer, config)")
    return state


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
RESUMABLE_KEYS = {
    "steps",
    "resume",
    "progress",
    "run_dir",
    "run_name",
    "eval_every",
    "eval_per_difficulty",
    "eval_max_new_tokens",
    "checkpoint",
    "checkpoint_every",
    "bucket_every",
    "whatif",  # what-if updates are recorded beside the run and change none of its numbers
    "whatif_every",
    "reuse_old_logprobs",  # the same numbers either way: only whether pi_old has its own forward
}


def resolve_run_dir(cfg: TrainConfig) -> Path:
    """runs/<run_name> unless given; a finished or started run is only reused with resume. A run in a
    bucket (run_dir=s3://...) is recorded and checkpointed in its local staging folder (store/bucket.py),
    which this returns; the Recorder uploads the run's files."""
    name = cfg.run_name or f"{cfg.task}-{cfg.weighting}-{datetime.now():%Y%m%d-%H%M%S}"
    run_dir = local_dir(cfg.run_dir or Path("runs") / name)
    if (run_dir / "meta.json").exists() and not cfg.resume:
        where = "its checkpoint" if has_checkpoint(run_dir) else "step 0, as it has no checkpoint yet"
        raise ValueError(
            f"run directory {run_dir} already holds a run; pass resume=true to continue it "
            f"(from {where}) or choose another run_dir"
        )
    return run_dir


def resume_state(cfg: TrainConfig, run_dir: Path) -> dict | None:
    """The checkpoint's trainer state, after checking that the config only changes resumable keys. None for
    a run that stopped before its first checkpoint: it starts again from step 0 (its rows are removed)."""
    if not has_checkpoint(run_dir) and (run_dir / "meta.json").is_file():
        _check_unchanged(cfg, _meta_config(run_dir), run_dir, "the recorded run's")
        warnings.warn(
            f"tokengrad: {run_dir} has no checkpoint (the run stopped before its first one); "
            "starting it again from step 0",
            RuntimeWarning,
            stacklevel=2,
        )
        return None
    state = load_trainer_state(run_dir)
    _check_unchanged(cfg, state["config"], run_dir, "the checkpoint's")
    if state.get("data_step") is not None and state["data_step"] < state["step"]:
        warnings.warn(
            f"tokengrad: the checkpoint of {run_dir} is at step {state['step']} but its data only "
            f"reaches step {state['data_step']}; the steps in between are missing",
            RuntimeWarning,
            stacklevel=2,
        )
    if state["step"] + 1 == cfg.steps and not _finished(run_dir):
        # killed after its last step (e.g. in its final compaction): resuming trains nothing and closes
        # the run, which tidies its files and marks it finished
        warnings.warn(
            f"tokengrad: {run_dir} stopped after its last step {state['step']}; finishing it",
            RuntimeWarning,
            stacklevel=2,
        )
        return state
    if state["step"] + 1 >= cfg.steps:
        raise ValueError(
            f"cannot resume {run_dir}: its checkpoint is at step {state['step']} and steps={cfg.steps}; "
            "raise steps to train further"
        )
    return state


def _finished(run_dir: Path) -> bool:
    """meta.json says the run finished (an unreadable one: not finished)."""
    try:
        return meta_file.finished(meta_file.read_meta(run_dir, follow_links_out=True))
    except (OSError, ValueError):
        return False


def _meta_config(run_dir: Path) -> dict:
    try:
        meta = meta_file.read_meta(run_dir, follow_links_out=True)
    except meta_file.MetaError as err:
        raise ValueError(f"cannot resume {run_dir}: {err}") from None
    config = meta_file.config(meta)
    if not isinstance(meta.get("config"), dict):
        raise ValueError(f"cannot resume {run_dir}: its meta.json holds no config object")
    return config


def _check_unchanged(cfg: TrainConfig, saved: dict, run_dir: Path, whose: str) -> None:
    saved_cfg = make_config(saved)
    changed = sorted(
        k for k, v in cfg.to_dict().items() if k not in RESUMABLE_KEYS and getattr(saved_cfg, k) != v
    )
    if changed:
        raise ValueError(f"cannot resume {run_dir}: config keys {changed} differ from {whose}")
