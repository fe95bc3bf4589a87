"""attach()'s checks of a trainer and a run directory that would otherwise fail late or record wrong
numbers silently: a directory already holding this run's steps, a trainer whose `train()` is already
running."""

from __future__ import annotations

import sys

from tokengrad.read import layout


def check_run_dir(run_dir, resume_step: int | None) -> None:
    """A directory that already holds recorded steps is refused unless the run resumes (a re-run script
    would otherwise fail at its first step, after the model loaded and generation ran)."""
    if resume_step is not None:
        return
    # the file names carry each file's step range (tokengrad.schema.file_name)
    ranges = [
        (a, b) for folder in layout.rank_folders(run_dir, "steps") for a, b, _ in layout.entries(folder)
    ]
    if not ranges:
        return
    first, last = min(a for a, _ in ranges), max(b for _, b in ranges)
    raise ValueError(
        f"{run_dir} already holds steps {first}..{last} of a recorded run. Record into a new directory, or, "
        f"when trainer.train(resume_from_checkpoint=...) continues that run from a checkpoint taken before "
        f"step N, pass attach(..., resume_step=N) (the rows of steps >= N are removed first)"
    )


def check_not_training(trainer) -> None:
    """attach() from inside a running `train()` (a callback, another thread) would miss the steps already
    under way and leave the run unfinished: refused. Found by TRL's training loop on a thread's stack."""
    for frame in sys._current_frames().values():
        while frame is not None:
            if frame.f_code.co_name == "_inner_training_loop" and frame.f_locals.get("self") is trainer:
                raise RuntimeError(
                    "attach() was called while trainer.train() is running; call attach() before train()"
                )
            frame = frame.f_back
