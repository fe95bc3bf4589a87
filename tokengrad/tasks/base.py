"""The task contract: a registry of task factories with one fixed signature.

A task turns a seed into problems (prompt text, ground truth, difficulty label) and scores a completion
with a verifiable reward. Tasks are registered by name::

    @register_task("countdown")
    def make_countdown(**params) -> Task: ...

    task = get_task("countdown", max_numbers=4)

Tool-using tasks (offline Search-R1 style QA) also answer tool calls: the trainer stops generation at the
task's `tool_stop` string, calls `task.tool(text_so_far)`, appends the returned text (masked out of the loss)
and continues.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Any, Callable, Protocol


@dataclass(frozen=True)
class Problem:
    prompt: str                 # user message text; the trainer applies the tokenizer's chat template
    answer: Any                 # ground truth the reward compares against
    difficulty: str             # difficulty label, e.g. "3" (K&K people) or "2-digit"
    system: str | None = None   # optional system message
    meta: dict = field(default_factory=dict)  # small task fields; scalar values go into the samples table
    # Text the model's turn starts with (e.g. "<think>"): the trainer appends it after the chat template's
    # generation prompt, so the model continues from it. `reward`/`is_correct` receive only the generated
    # completion and prepend the prefix themselves.
    response_prefix: str = ""


class Task(Protocol):
    name: str
    tool_stop: str | None       # generation stop string that triggers `tool` (None: no tools)

    def train_problems(self, n: int, seed: int) -> list[Problem]: ...
    def eval_problems(self, n_per_difficulty: int, seed: int) -> list[Problem]: ...
    def reward(self, problem: Problem, completion: str) -> float: ...
    def is_correct(self, problem: Problem, completion: str) -> bool: ...
    def tool(self, text: str) -> str | None: ...


TaskFactory = Callable[..., Task]
TASKS: dict[str, TaskFactory] = {}


def register_task(name: str) -> Callable[[TaskFactory], TaskFactory]:
    def deco(fn: TaskFactory) -> TaskFactory:
        if name in TASKS:
            raise ValueError(f"task {name!r} is already registered")
        TASKS[name] = fn
        return fn
    return deco


def get_task(name: str, **params: Any) -> Task:
    if name not in TASKS:
        raise ValueError(f"unknown task {name!r}; known tasks: {sorted(TASKS)}")
    return TASKS[name](**params)


# ---------------------------------------------------------------------------------------------------
# Helpers shared by the task factories
# ---------------------------------------------------------------------------------------------------

EVAL_BUCKETS = 10   # one problem key in ten is held out for evaluation


def parse_int_range(name: str, value: Any, lo: int, hi: int) -> tuple[int, ...]:
    """An int or an inclusive (a, b) pair within lo..hi -> the tuple of allowed values, else ValueError."""
    if isinstance(value, bool):
        raise ValueError(f"{name} must be an int or an (a, b) pair in {lo}..{hi}, got {value!r}")
    if isinstance(value, int):
        value = (value, value)
    if not (isinstance(value, (tuple, list)) and len(value) == 2
            and all(isinstance(v, int) and not isinstance(v, bool) for v in value)):
        raise ValueError(f"{name} must be an int or an (a, b) pair in {lo}..{hi}, got {value!r}")
    a, b = value
    if not lo <= a <= b <= hi:
        raise ValueError(f"{name} must satisfy {lo} <= a <= b <= {hi}, got {value!r}")
    return tuple(range(a, b + 1))


def is_held_out(key: str) -> bool:
    """Stable train/eval split of a problem space: a key is held out when blake2b(key) % EVAL_BUCKETS == 0.

    Training streams skip held-out keys and evaluation sets use only them, so the two never overlap
    whatever seeds they are drawn with (Python's own hash() is salted per process, hence blake2b).
    """
    digest = hashlib.blake2b(key.encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") % EVAL_BUCKETS == 0


def draw_split(sample: Callable[[], Problem], key: Callable[[Problem], str], n: int, held_out: bool,
               max_tries: int | None = None) -> list[Problem]:
    """n problems from `sample()` whose keys fall on the requested side of `is_held_out`.

    Training draws (held_out=False) may repeat. Evaluation draws (held_out=True) are distinct; when the
    held-out part of a small problem space has fewer than n problems, the distinct ones found repeat in order.
    """
    if n < 0:
        raise ValueError(f"n must be >= 0, got {n}")
    max_tries = max_tries if max_tries is not None else 200 * n + 2000
    out: list[Problem] = []
    seen: set[str] = set()
    for _ in range(max_tries):
        if len(out) == n:
            return out
        problem = sample()
        k = key(problem)
        if is_held_out(k) != held_out or (held_out and k in seen):
            continue
        seen.add(k)
        out.append(problem)
    if n and not out:
        raise ValueError(f"no {'held-out' if held_out else 'training'} problem found in {max_tries} draws")
    return [out[i % len(out)] for i in range(n)]
