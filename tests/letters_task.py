"""A task for the tiny random model: importing this module registers it as "letters"."""

import random

from tokengrad.train.tasks import TASKS, Problem, register_task


class LettersTask:
    """Reward = share of lowercase ASCII letters in the completion, so the tiny random model's completions
    get different rewards and non-zero advantages (a real task would score them all 0). `constant` makes
    every reward 0.5 (every group is then dropped by dynamic sampling); `noisy` draws rewards at random
    (for greedy runs, whose completions are all equal). `tool_stop`/`reply` make it a tool task whose
    tool always answers `reply`."""

    name = "letters"

    def __init__(
        self,
        constant: bool = False,
        noisy: bool = False,
        tool_stop: str | None = None,
        reply: str = " <info>ok</info> ",
    ):
        self.constant, self.tool_stop, self.reply = constant, tool_stop, reply
        self.noise = random.Random(0) if noisy else None

    def train_problems(self, n, seed):
        return [
            Problem(
                prompt=f"Write letters, round {seed}-{i}.",
                answer="abc",
                difficulty=str(1 + i % 2),
                meta={"round": i},
            )
            for i in range(n)
        ]

    def eval_problems(self, n_per_difficulty, seed):
        return self.train_problems(2 * n_per_difficulty, seed + 1000)

    def reward(self, problem, completion):
        if self.constant:
            return 0.5
        if self.noise is not None:  # differs between equal completions: non-zero advantages
            return self.noise.random()
        return sum(c.isascii() and c.islower() for c in completion) / max(len(completion), 1)

    def is_correct(self, problem, completion):
        return self.reward(problem, completion) > 0.2

    def tool(self, text):
        return self.reply


if "letters" not in TASKS:
    register_task("letters")(LettersTask)
