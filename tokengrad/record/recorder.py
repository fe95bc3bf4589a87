"""The recorder: a training loop drives it step by step; it writes the run format in the background.

    with Recorder("runs/demo", model=model, tokenizer=tok, bucket_every=10) as rec:
        for step in range(n_steps):
            with rec.step(step) as st:
                logprobs = ...                                    # [N, T] log pi the loss is built from
                st.track(logprobs, token_ids=ids, mask=mask, old_logprobs=old, advantages=adv,
                         sample_ids=sid, group_ids=gid, logits=logits)
                loss = my_loss(logprobs, ...)
                st.backward(loss)                                 # loss.backward() + bucket analysis
                st.record_grad_norms()                            # before clipping
                clip_grad_norm_(...); opt.step(); opt.zero_grad()
                st.log(loss=loss.item(), lr=lr)

The exact per-token loss coefficient coef = dL/dlog pi_t is read by an autograd hook on the tracked
log-probs tensor, so it is right for any loss built on log pi (PPO-clip, asymmetric clip, KL, any
aggregation) without re-deriving it. Hooks live only between track() and the end of the step; nothing is
set on the user's modules.
"""

from __future__ import annotations

import json
import os
import time
import warnings
from datetime import datetime, timezone
from pathlib import Path

import torch

from tokengrad import __version__, schema
from tokengrad.record.bucket_analysis import validate_edges
from tokengrad.record.gradnorms import NamesFilter
from tokengrad.record.rows import TokenDecoder, scalar_table
from tokengrad.record.step_recorder import StepRecorder
from tokengrad.record.writer import RunWriter, atomic_write_json


def _label(name: str | None) -> str | None:
    """A tokenizer's name for meta.json: a hub-style id as it is, a local directory by its last component
    (an absolute cache path means nothing on another machine)."""
    if name and os.path.isabs(str(name)):
        return Path(str(name).rstrip("/")).name
    return name


def _dist_rank_world() -> tuple[int, int]:
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return torch.distributed.get_rank(), torch.distributed.get_world_size()
    return int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))


class Recorder:
    """Records a training run into a run directory (see tokengrad.schema for the format).

    Args:
        run_dir: directory of the run (created; an existing run is appended to, e.g. on resume).
        model: the model being trained (for gradient norms and bucket analysis); DDP wrappers are fine.
        tokenizer: decodes token ids into the `token` column (optional).
        config: the full training config (stored in meta.json).
        run_name, model_name: labels for meta.json (defaults: directory name, model class).
        weighting: {"name": ..., "params": {...}, "curve": {"p": [...], "w": [...]}} of the
            token-weighting rule.
        bucket_every: bucket analysis every N steps (0 = never; it costs one extra backward per bucket).
        bucket_edges: probability bucket edges (default AR-Lopti's 0, .25, .5, .75, 1).
        layers: which top-level blocks get a grad-norm row (None = all; a name, list, or predicate).
        on_error: "count" (writer failures drop and count rows, training goes on) or "raise".
        compact_every: merge small per-step files after this many steps.
        temperature: the T the recorded log-probs divide the logits by (the sampler's; meta.json).
        resume_step: continuing a run from a checkpoint taken before this step: rows already recorded for
            steps >= resume_step (after the checkpoint) are removed on open, so no step appears twice.
    """

    def __init__(
        self,
        run_dir: str | os.PathLike,
        model: torch.nn.Module | None = None,
        tokenizer=None,
        config: dict | None = None,
        run_name: str | None = None,
        model_name: str | None = None,
        weighting: dict | None = None,
        bucket_every: int = 0,
        bucket_edges=schema.DEFAULT_BUCKET_EDGES,
        layers: NamesFilter = None,
        on_error: str = "count",
        compact_every: int = 64,
        resume_step: int | None = None,
        temperature: float | None = None,
    ):
        if bucket_every < 0:
            raise ValueError(f"bucket_every must be >= 0, got {bucket_every}")
        self.run_dir = Path(run_dir)
        self.model = model
        self.bucket_every = int(bucket_every)
        self.bucket_edges = validate_edges(bucket_edges)
        self.layers = layers
        self.rank, self.world_size = _dist_rank_world()
        self.decode = TokenDecoder(tokenizer)
        self._meta = self._make_meta(config, run_name, model_name, model, tokenizer, weighting)
        self._meta["temperature"] = temperature
        self._writer: RunWriter | None = None
        self._on_error, self._compact_every = on_error, compact_every
        self._resume_step = resume_step
        self._step: StepRecorder | None = None
        self.last_step: int | None = None
        self._last_seq: int | None = None

    # ---- lifecycle --------------------------------------------------------------------------------
    def __enter__(self) -> "Recorder":
        self.open()
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if self._step is not None:  # a step interrupted by an exception is still recorded as far as it got
            self.end_step()
        self.close()

    def open(self) -> "Recorder":
        if self._writer is not None:
            raise RuntimeError("Recorder is already open")
        self.run_dir.mkdir(parents=True, exist_ok=True)
        if self.rank == 0:
            self._write_meta(finished=False)
        self._writer = RunWriter(self.run_dir, self.rank, self._on_error, self._compact_every)
        if self._resume_step is not None:
            removed = self._writer.drop_steps_from(self._resume_step)
            if removed:
                warnings.warn(
                    f"tokengrad: resuming at step {self._resume_step}: removed {removed} rows recorded "
                    f"after the checkpoint from {self.run_dir}",
                    RuntimeWarning,
                    stacklevel=2,
                )
        return self

    def close(self) -> None:
        if self._writer is None:
            return
        try:
            self._writer.close()
        finally:
            self._write_status(finished=True)
            if self.rank == 0:
                self._write_meta(finished=True)
            dropped = sum(self._writer.rows_dropped.values())
            if dropped:
                warnings.warn(
                    f"tokengrad: {dropped} rows could not be written to {self.run_dir} "
                    f"(see meta.json rows_dropped)",
                    RuntimeWarning,
                    stacklevel=2,
                )
            self._writer = None

    def flush(self) -> None:
        """Wait until every finished step is on disk."""
        self._require_open().flush()

    # ---- steps ------------------------------------------------------------------------------------
    def step(self, step: int) -> StepRecorder:
        """Context manager for one training step: `with rec.step(i) as st: ...`."""
        return self.begin_step(step)

    def begin_step(self, step: int) -> StepRecorder:
        self._require_open()
        if self._step is not None:
            raise RuntimeError(f"step {self._step.step} is still open; end it before beginning step {step}")
        bucket = self.bucket_every > 0 and step % self.bucket_every == 0
        self._step = StepRecorder(self, int(step), bucket)
        return self._step

    def end_step(self) -> None:
        st, self._step = self._step, None
        if st is None:
            raise RuntimeError("no step is open")
        bundle = st.finish()
        writer = self._require_open()
        # At most one finished step is ever waiting for the writer: before handing over step k, step k-1
        # must be on disk (normally long done), so a crash loses at most the step in flight and the one
        # being written, while writing still overlaps with the next step's compute.
        if self._last_seq is not None:
            writer.wait_for(self._last_seq)
        self._last_seq = writer.submit(bundle)
        self.last_step = st.step

    @property
    def current_step(self) -> StepRecorder | None:
        return self._step

    def log_eval(self, step: int, task: str, difficulty, accuracy: float, n: int) -> None:
        """One evaluation result (e.g. K&K accuracy for 3 people) into the evals table."""
        row = dict(
            step=int(step),
            rank=self.rank,
            task=str(task),
            difficulty=str(difficulty),
            accuracy=float(accuracy),
            n=int(n),
        )
        self._require_open().submit({"evals": lambda: scalar_table("evals", [row])})

    # ---- meta -------------------------------------------------------------------------------------
    def _make_meta(self, config, run_name, model_name, model, tokenizer, weighting) -> dict:
        return {
            "schema_version": schema.SCHEMA_VERSION,
            "tokengrad_version": __version__,
            "run_name": run_name or self.run_dir.name,
            "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "config": config or {},
            "weighting": weighting or {"name": "none", "params": {}},
            "model": model_name or (type(model).__name__ if model is not None else None),
            "tokenizer": _label(getattr(tokenizer, "name_or_path", None))
            or (type(tokenizer).__name__ if tokenizer else None),
            "world_size": self.world_size,
            "bucket_every": self.bucket_every,
            "bucket_edges": list(self.bucket_edges),
            "rows_dropped": {},
            "finished": False,
        }

    def _write_meta(self, finished: bool) -> None:
        path = self.run_dir / schema.META_FILE
        meta = dict(self._meta)
        if path.exists():  # keep the creation time of a resumed run
            try:
                meta["created"] = json.loads(path.read_text()).get("created", meta["created"])
            except ValueError:
                pass
        meta["finished"] = finished
        meta["rows_dropped"] = dict(self._writer.rows_dropped) if self._writer else {}
        atomic_write_json(path, meta)

    def _write_status(self, finished: bool) -> None:
        folder = self.run_dir / schema.RANKS_DIR
        try:
            folder.mkdir(parents=True, exist_ok=True)
            w = self._writer
            atomic_write_json(
                folder / f"rank{self.rank:03d}.json",
                {
                    "rank": self.rank,
                    "finished": finished,
                    "last_step": self.last_step,
                    "rows_dropped": dict(w.rows_dropped) if w else {},
                    "rows_written": dict(w.rows_written) if w else {},
                    "time": time.time(),
                },
            )
        except OSError as err:
            warnings.warn(
                f"tokengrad: could not write rank status to {folder}: {err}", RuntimeWarning, stacklevel=2
            )

    def _require_open(self) -> RunWriter:
        if self._writer is None:
            raise RuntimeError("Recorder is not open: use `with Recorder(...) as rec:` or call rec.open()")
        return self._writer
