"""Knights & Knaves text: puzzle wording, the Logic-RL prompt, and the Logic-RL reward.

The wording follows the K&K benchmark of Xie et al. (arXiv 2410.23123) so that a puzzle formatted at list
position `index` with formatter seed `seed + index` is the published quiz, byte for byte. The prompt, the
answer parsing and the reward follow Logic-RL (Xie et al., arXiv 2502.14768):

    format  +1 if <think>, </think>, <answer>, </answer> each occur exactly once and in that order, else -1
    answer  +2 if every person's role matches, -1.5 if parsed but wrong, -2 if unparseable or format failed
    total   3 (correct), -0.5 (well formed, wrong), -1 (well formed, unparseable), -3 (bad format)

Only the wording's random choices (names, sentence templates) use the formatter's numpy generator, in this
order: names first (`choice(..., replace=False)`), then one template per person.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np

# The name list of the K&K benchmark; order matters because `rng.choice` indexes into it.
COMMON_NAMES = (
    "Emma",
    "Liam",
    "Olivia",
    "Noah",
    "Ava",
    "Ethan",
    "Sophia",
    "Mason",
    "Isabella",
    "William",
    "Mia",
    "James",
    "Charlotte",
    "Benjamin",
    "Amelia",
    "Lucas",
    "Harper",
    "Henry",
    "Evelyn",
    "Alexander",
    "Abigail",
    "Michael",
    "Emily",
    "Daniel",
    "Elizabeth",
    "Jacob",
    "Sofia",
    "Logan",
    "Avery",
    "Jackson",
    "Ella",
    "Sebastian",
    "Scarlett",
    "Jack",
    "Grace",
    "Aiden",
    "Chloe",
    "Owen",
    "Victoria",
    "Samuel",
    "Riley",
    "Matthew",
    "Aria",
    "Joseph",
    "Lily",
    "Luke",
    "Aurora",
    "David",
    "Zoey",
    "Oliver",
    "Penelope",
)

# The 18 ways a statement is reported; order matters for the same reason.
TEMPLATES = (
    "{name} said that {content}.",
    "{name} told you that {content}.",
    '{name} said, "{content}."',
    '{name} stated, "{content}".',
    'According to {name}, "{content}".',
    'In {name}\'s words: "{content}".',
    '{name} remarked, "{content}".',
    '"{content}," {name} declared.',
    '{name} was heard saying, "{content}".',
    "{name} expressed that {content}.",
    '"{content}" - {name}.',
    'As {name} put it, "{content}".',
    '{name} asserted: "{content}".',
    '"{content}," {name} mentioned.',
    '{name} commented, "{content}".',
    'In a statement by {name}: "{content}".',
    '{name} noted, "{content}".',
    '"{content}," {name} claimed.',
)

QUIZ_PREFIX = (
    "A very special island is inhabited only by knights and knaves. "
    "Knights always tell the truth, and knaves always lie. "
)
QUIZ_SUFFIX = " So who is a knight and who is a knave?"

# Logic-RL's qwen-instruct system message. The missing space in "and<answer>", the double space and the
# trailing newline are part of the published prompt; with a ChatML chat template, system=LOGIC_RL_SYSTEM,
# user=quiz + "\n" and the response prefix "<think>" render Logic-RL's prompt string exactly.
LOGIC_RL_SYSTEM = (
    "You are a helpful assistant. The assistant first thinks about the reasoning process in the mind and "
    "then provides the user with the answer. The reasoning process and answer are enclosed within <think> "
    "</think> and<answer> </answer> tags, respectively, i.e., <think> reasoning process here </think>"
    "<answer> answer here </answer>.  Now the user asks you to solve a logical reasoning problem. After "
    "thinking, when you finally reach a conclusion, clearly state the identity of each character within "
    "<answer> </answer> tags. i.e., <answer> (1) Zoey is a knight\n(2) ... </answer>.\n"
)
LOGIC_RL_RESPONSE_PREFIX = "<think>"

ROLE = {True: "a knight", False: "a knave"}
LEAF_ROLE = {"telling-truth": True, "lying": False}


@dataclass(frozen=True)
class KKText:
    quiz: str  # the puzzle as published
    names: tuple[str, ...]  # names[i] is person i
    solution_text: str  # "A is a knight, B is a knave, and C is a knight."
    solution_text_format: str  # "(1) A is a knight\n(2) B is a knave\n(3) C is a knight"


def _leaf_text(leaf: tuple, names: tuple[str, ...], negated: bool = False) -> str:
    kind, person = leaf
    return f"{names[person]} is {'not ' if negated else ''}{ROLE[LEAF_ROLE[kind]]}"


def _render_not(stmt, names):
    return _leaf_text(stmt[1], names, negated=True)


def _render_join(word):
    return lambda stmt, names: f" {word} ".join(_leaf_text(c, names) for c in stmt[1:])


def _render_if(stmt, names):
    return f"If {_leaf_text(stmt[1], names)} then {_leaf_text(stmt[2], names)}"


def _render_iff(stmt, names):
    return f"{_leaf_text(stmt[1], names)} if and only if {_leaf_text(stmt[2], names)}"


# Statements of depth <= 2: operators only ever combine leaves, so each renders as one flat clause.
_RENDER = {
    "telling-truth": lambda stmt, names: _leaf_text(stmt, names),
    "lying": lambda stmt, names: _leaf_text(stmt, names),
    "not": _render_not,
    "and": _render_join("and"),
    "or": _render_join("or"),
    "->": _render_if,
    "<=>": _render_iff,
}


def render_statement(stmt: tuple, names: tuple[str, ...]) -> str:
    """One person's statement as an English clause (no final period)."""
    return _RENDER[stmt[0]](stmt, names)


def _comma_list(parts: list[str]) -> str:
    # The benchmark always writes ", and" before the last item, even for two items ("A, and B").
    return ", ".join(parts[:-1]) + ", and " + parts[-1]


def format_puzzle(statements: tuple, solution: tuple[bool, ...], index: int, seed: int = 1234) -> KKText:
    """Word a puzzle as the K&K benchmark does; `index` is its position in the generated list."""
    rng = np.random.default_rng(seed + index)
    n = len(statements)
    names = tuple(str(x) for x in rng.choice(COMMON_NAMES, size=n, replace=False))
    said = [
        " " + str(rng.choice(TEMPLATES)).format(name=names[i], content=render_statement(s, names))
        for i, s in enumerate(statements)
    ]
    quiz = (
        QUIZ_PREFIX
        + f"You meet {n} inhabitants: "
        + _comma_list(list(names))
        + "."
        + "".join(said)
        + QUIZ_SUFFIX
    )
    parts = [f"{name} is {ROLE[bool(k)]}" for name, k in zip(names, solution)]
    return KKText(
        quiz=quiz,
        names=names,
        solution_text=_comma_list(parts) + ".",
        solution_text_format="\n".join(f"({i + 1}) {p}" for i, p in enumerate(parts)),
    )


# ---------------------------------------------------------------------------------------------------
# Logic-RL answer parsing and reward (arXiv 2502.14768)
# ---------------------------------------------------------------------------------------------------

_ANSWER = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)
_TRUTH_LINE = re.compile(r"\b([A-Za-z]+)\b.*?\b(knight|knave)\b", re.IGNORECASE)
_TAGS = ("<think>", "</think>", "<answer>", "</answer>")


@dataclass(frozen=True)
class KKScore:
    format_score: float  # +1 / -1
    answer_score: float  # +2 / -1.5 / -2

    @property
    def total(self) -> float:
        return self.format_score + self.answer_score

    @property
    def correct(self) -> bool:
        return self.answer_score == 2


def parse_truth(solution_text_format: str) -> dict[str, str]:
    """Ground truth lines "(1) Zoey is a knight" -> {"Zoey": "knight"}."""
    truth = {}
    for line in solution_text_format.split("\n"):
        match = _TRUTH_LINE.search(line.strip())
        if match:
            truth[match.group(1)] = match.group(2).lower()
    return truth


def parse_answer(answer_text: str, names: list[str]) -> dict[str, str] | None:
    """Roles claimed in an answer, or None when it does not name exactly one role per person.

    Logic-RL first counts the words "knight"/"knave" (substrings, so "knights" counts): the count must equal
    the number of people. Then each name must appear as "<name> is a knight|knave".
    """
    lower = answer_text.lower()
    if lower.count("knight") + lower.count("knave") != len(names):
        return None
    roles = {}
    for name in names:
        match = re.search(rf"\b{re.escape(name)}\b\s+is\s+a\s+\b(knight|knave)\b", answer_text, re.IGNORECASE)
        if match is None:
            return None
        roles[name] = match.group(1).lower()
    return roles


def check_format(response: str) -> bool:
    """Each tag exactly once, first occurrences in the order think < /think < answer < /answer."""
    if any(response.count(tag) != 1 for tag in _TAGS):
        return False
    positions = [response.find(tag) for tag in _TAGS]
    return positions == sorted(positions)


def score_response(response: str, solution_text_format: str) -> KKScore:
    """Logic-RL's K&K reward on the model's whole turn (response prefix included, prompt excluded).

    Logic-RL locates the turn by splitting prompt + response at "Assistant:" / "<|im_start|>assistant"; here
    the caller passes the turn itself, which gives the same text unless the model writes such a marker.
    """
    format_ok = check_format(response)
    matches = _ANSWER.findall(response)
    answer_text = matches[-1].strip() if matches else ""
    if not (format_ok and answer_text):
        return KKScore(1.0 if format_ok else -1.0, -2.0)
    truth = parse_truth(solution_text_format)
    claimed = parse_answer(answer_text, list(truth))
    if not claimed:
        return KKScore(1.0, -2.0)
    return KKScore(1.0, 2.0 if claimed == truth else -1.5)
