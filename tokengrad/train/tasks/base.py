"""The task contract: a registry of task factories with one fixed signature.

A task turns a seed into problems (prompt text, ground truth, difficulty label) and scores a completion
with a verifiable reward. Tasks are registered by name::

    @register_task("countdown")
    def make_countdown(**params) -> Task: ...

    task = get_task("countdown", n_numbers=4)

Tool-using tasks (offline Search-R1 style QA) also answer tool calls: the trainer stops generation at the
task's `tool_stop` string, calls `task.tool(text_so_far)`, appends the returned text (masked out of the loss)
and continues. `tool` returns None when the text ends without a tool call; a tool task may also carry
`max_tool_calls`, the most calls worth answering in one completion.

Train/eval separation: procedural tasks split their problem space by a stable hash of each problem's key
(`is_held_out`): training streams skip held-out keys and evaluation sets use only them, and the two draw from
different numpy seed streams (`TRAIN_STREAM`, `EVAL_STREAM`).
"""

from __future__ import annotations

import hashlib
import inspect
import re
from dataclasses import dataclass, field
from typing import Any, Callable, Protocol

import numpy as np

from tokengrad.registry import Registry


@dataclass(frozen=True)
class Problem:
    prompt: str  # user message text; the trainer applies the tokenizer's chat template
    answer: Any  # ground truth the reward compares against
    difficulty: str  # difficulty label, e.g. "3" (K&K people), "2" (arithmetic digits), "1-hop"
    system: str | None = None  # optional system message
    meta: dict = field(default_factory=dict)  # small task fields; scalar values go into the samples table
    # Text the model's turn starts with (e.g. "<think>"): the trainer appends it after the chat template's
    # generation prompt, so the model continues from it. `reward`/`is_correct` receive only the generated
    # completion and prepend the prefix themselves.
    response_prefix: str = ""


class Task(Protocol):
    name: str
    tool_stop: str | None  # generation stop string that triggers `tool` (None: no tools)

    def train_problems(self, n: int, seed: int) -> list[Problem]: ...
    def eval_problems(self, n_per_difficulty: int, seed: int) -> list[Problem]: ...
    def reward(self, problem: Problem, completion: str) -> float: ...
    def is_correct(self, problem: Problem, completion: str) -> bool: ...
    def tool(self, text: str) -> str | None: ...


TaskFactory = Callable[..., Task]
TASKS: Registry[TaskFactory] = Registry("task")


def register_task(name: str) -> Callable[[TaskFactory], TaskFactory]:
    """Decorator: ``TASKS[name] = factory`` (a taken name is refused)."""
    return TASKS.register(name)


def get_task(name: str, **params: Any) -> Task:
    """A task from its registered factory; unknown names (and parameters the factory does not take) raise
    ValueError listing the known ones."""
    factory = TASKS[name]
    try:
        inspect.signature(factory).bind(**params)
    except TypeError as err:
        known = [p for p in inspect.signature(factory).parameters if p not in ("self", "args", "kwargs")]
        raise ValueError(
            f"task {name!r}: bad task_params {sorted(params)} ({err}); it takes {known}"
        ) from None
    return factory(**params)


# ---------------------------------------------------------------------------------------------------
# Helpers shared by the task factories
# ---------------------------------------------------------------------------------------------------

EVAL_BUCKETS = 10  # one problem key in ten is held out for evaluation


def parse_int_range(name: str, value: Any, lo: int, hi: int) -> tuple[int, ...]:
    """An int or an inclusive (a, b) pair within lo..hi -> the tuple of allowed values, else ValueError."""
    if isinstance(value, bool):
        raise ValueError(f"{name} must be an int or an (a, b) pair in {lo}..{hi}, got {value!r}")
    if isinstance(value, int):
        value = (value, value)
    if not (
        isinstance(value, (tuple, list))
        and len(value) == 2
        and all(isinstance(v, int) and not isinstance(v, bool) for v in value)
    ):
        raise ValueError(f"{name} must be an int or an (a, b) pair in {lo}..{hi}, got {value!r}")
    a, b = value
    if not lo <= a <= b <= hi:
        raise ValueError(f"{name} must satisfy {lo} <= a <= b <= {hi}, got {value!r}")
    return tuple(range(a, b + 1))


def check_int(name: str, value: Any, lo: int, hi: int | None = None) -> int:
    """`value` if it is an int in lo..hi (hi None: no upper bound), else ValueError naming the parameter."""
    if isinstance(value, bool) or not isinstance(value, int) or value < lo or (hi is not None and value > hi):
        bound = f"in {lo}..{hi}" if hi is not None else f">= {lo}"
        raise ValueError(f"{name} must be an int {bound}, got {value!r}")
    return value


def is_held_out(key: str) -> bool:
    """Stable train/eval split of a problem space: a key is held out when blake2b(key) % EVAL_BUCKETS == 0.

    Training streams skip held-out keys and evaluation sets use only them, so the two never overlap
    whatever seeds they are drawn with (Python's own hash() is salted per process, hence blake2b).
    """
    digest = hashlib.blake2b(key.encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") % EVAL_BUCKETS == 0


def draw_split(
    sample: Callable[[], Problem],
    key: Callable[[Problem], str],
    n: int,
    held_out: bool,
    max_tries: int | None = None,
) -> list[Problem]:
    """n problems from `sample()` whose keys fall on the requested side of `is_held_out`.

    Training draws (held_out=False) may repeat. Evaluation draws (held_out=True) are distinct; when the
    held-out part of a small problem space has fewer than n problems, the distinct ones found repeat in order.
    """
    check_int("n", n, 0)
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


_ANSWER_TAG = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)


def last_answer(text: str) -> str | None:
    """Content of the last <answer>...</answer> in `text`, stripped; None when there is none."""
    matches = _ANSWER_TAG.findall(text)
    return matches[-1].strip() if matches else None


# Seed streams: numpy SeedSequence entropy (seed, stream[, difficulty index]) keeps the training and
# evaluation generators independent for the same user seed; `is_held_out` then guarantees disjointness.
TRAIN_STREAM, EVAL_STREAM = 0, 1
Sampler = Callable[[np.random.Generator, int], Problem]  # (rng, difficulty value) -> Problem


def procedural_train(
    sample: Sampler, key: Callable[[Problem], str], levels: tuple[int, ...], n: int, seed: int
) -> list[Problem]:
    """n training problems, each at a difficulty level drawn uniformly from `levels`."""
    rng = np.random.default_rng([check_int("seed", seed, 0), TRAIN_STREAM])
    return draw_split(lambda: sample(rng, int(rng.choice(levels))), key, n, held_out=False)


def procedural_eval(
    sample: Sampler, key: Callable[[Problem], str], levels: tuple[int, ...], n_per_difficulty: int, seed: int
) -> list[Problem]:
    """n_per_difficulty held-out problems per level, deterministic in (n_per_difficulty, seed); a smaller
    n_per_difficulty gives a prefix of each level's list."""
    check_int("n_per_difficulty", n_per_difficulty, 1)
    check_int("seed", seed, 0)
    out: list[Problem] = []
    for level in levels:
        rng = np.random.default_rng([seed, EVAL_STREAM, level])
        out += draw_split(lambda: sample(rng, level), key, n_per_difficulty, held_out=True)
    return out
