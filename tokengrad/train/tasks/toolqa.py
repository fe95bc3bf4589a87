"""Tool-augmented QA over a generated world, in the Search-R1 protocol (arXiv 2503.09516), fully offline.

A seed generates a small world of made-up people, cities, companies and rivers; each entity becomes one
passage "Title\\nSentence. Sentence.". The names are invented, so a model cannot answer from memory and has to
search. Questions are single-hop ("In which city was Velo Marn born?") or two-hop compositions ("Which river
flows through the city where Velo Marn was born?"); difficulty labels are "1-hop" and "2-hop".

Protocol (Search-R1): the model writes <search> query </search>; generation stops at `tool_stop`; `tool(text)`
returns "\\n\\n<information>Doc 1(Title: ...) ...\\nDoc 2(...) ...</information>\\n\\n" with the BM25 top-k
passages (bm25s, in process). The trainer appends it, masks those tokens out of the loss, and continues; at
most `max_tool_calls` searches per completion. The answer goes in <answer> ... </answer>.

Reward: exact match (Search-R1 `qa_em.py` normalisation: lower case, no punctuation, no a/an/the, single
spaces) of the last answer in the response against the gold aliases, 1.0 or 0.0. Search-R1 extracts it from
prompt + response and so needs two matches (the prompt holds an example answer); the response alone needs one.

Usage::

    task = get_task("toolqa", hops=1)
"""

from __future__ import annotations

import functools
import re
import string
from dataclasses import dataclass
from typing import Any

import numpy as np

from tokengrad.train.tasks.base import (
    Problem,
    check_int,
    last_answer,
    parse_int_range,
    procedural_eval,
    procedural_train,
    register_task,
)

PROMPT = (
    "Answer the given question. You must conduct reasoning inside <think> and </think> first every time you "
    "get new information. After reasoning, if you find you lack some knowledge, you can call a search engine "
    "by <search> query </search> and it will return the top searched results between <information> and "
    "</information>. You can search as many times as your want. If you find no further external knowledge "
    "needed, you can directly provide the answer inside <answer> and </answer>, without detailed "
    "illustrations. For example, <answer> Beijing </answer>. Question: {question}\n"
)
INVALID_ACTION = (
    "\nMy previous action is invalid. If I want to search, I should put the query between "
    "<search> and </search>. If I want to give the final answer, I should put the answer between "
    "<answer> and </answer>. Let me try again.\n"
)
TOOL_STOP = "</search>"

# Two syllables, consonant-vowel then consonant-vowel-(consonant): short, pronounceable, rarely a real word.
_ONSETS = ("b", "d", "f", "g", "k", "l", "m", "n", "p", "r", "s", "t", "v", "z", "br", "dr", "kr", "th", "qu")
_VOWELS = ("a", "e", "i", "o", "u")
_CODAS = ("", "", "n", "r", "l", "s")
OCCUPATIONS = (
    "painter",
    "botanist",
    "sculptor",
    "chemist",
    "cartographer",
    "violinist",
    "historian",
    "pilot",
    "surgeon",
    "novelist",
)  # all take "a"
INDUSTRIES = ("shipping", "textile", "software", "mining", "glassware", "publishing", "brewing", "rail")
COMPANY_SUFFIXES = ("Works", "Holdings", "Industries", "Trading", "Labs", "Foundry", "Group")


@dataclass(frozen=True, kw_only=True)
class Entity:
    kind: str  # "person" | "city" | "company" | "river"
    name: str
    attrs: dict  # attribute -> value; a value naming another entity is that entity's name
    passage: str  # "Title\nText"


class _Namer:
    """Made-up capitalised words, never repeated within one world."""

    def __init__(self, rng: np.random.Generator):
        self.rng, self.used = rng, set()

    def word(self) -> str:
        while True:
            parts = [
                _pick(self.rng, _ONSETS),
                _pick(self.rng, _VOWELS),
                _pick(self.rng, _ONSETS),
                _pick(self.rng, _VOWELS),
                _pick(self.rng, _CODAS),
            ]
            word = "".join(parts).capitalize()
            if word not in self.used:
                self.used.add(word)
                return word


def _pick(rng: np.random.Generator, items: tuple | list) -> Any:
    return items[int(rng.integers(0, len(items)))]


def generate_world(
    seed: int, n_people: int, n_cities: int, n_companies: int, n_rivers: int
) -> dict[str, Entity]:
    """All entities by name. Family names are shared (one per three people) so passages overlap in words."""
    rng = np.random.default_rng(seed)
    namer = _Namer(rng)
    rivers = [f"{namer.word()} River" for _ in range(n_rivers)]
    cities = {
        namer.word(): {"river": _pick(rng, rivers), "founded": int(rng.integers(800, 1800))}
        for _ in range(n_cities)
    }
    city_names = list(cities)
    families = [namer.word() for _ in range(max(1, n_people // 3))]
    people = {
        f"{namer.word()} {_pick(rng, families)}": {
            "city": _pick(rng, city_names),
            "birth_year": int(rng.integers(1900, 2000)),
            "occupation": _pick(rng, OCCUPATIONS),
            "residence": _pick(rng, city_names),
        }
        for _ in range(n_people)
    }
    person_names = list(people)
    companies = {
        f"{namer.word()} {_pick(rng, COMPANY_SUFFIXES)}": {
            "city": _pick(rng, city_names),
            "ceo": _pick(rng, person_names),
            "founded": int(rng.integers(1850, 2021)),
            "industry": _pick(rng, INDUSTRIES),
        }
        for _ in range(n_companies)
    }
    lengths = {r: int(rng.integers(40, 3000)) for r in rivers}
    return _entities(people, cities, companies, lengths)


def _entities(people: dict, cities: dict, companies: dict, lengths: dict) -> dict[str, Entity]:
    """Each entity with the passage the search tool returns for it."""
    world = {}
    for name, a in people.items():
        given = name.split()[0]
        world[name] = Entity(
            kind="person",
            name=name,
            attrs=a,
            passage=f"{name}\n{name} is a {a['occupation']} born in {a['city']} in "
            f"{a['birth_year']}. {given} now lives in {a['residence']}.",
        )
    for name, a in cities.items():
        world[name] = Entity(
            kind="city",
            name=name,
            attrs=a,
            passage=f"{name}\n{name} is a city on the {a['river']}. It was founded in {a['founded']}.",
        )
    for name, a in companies.items():
        world[name] = Entity(
            kind="company",
            name=name,
            attrs=a,
            passage=f"{name}\n{name} is a {a['industry']} company headquartered "
            f"in {a['city']}. It was founded in {a['founded']}, and its "
            f"chief executive is {a['ceo']}.",
        )
    for river in lengths:
        on = sorted(c for c, a in cities.items() if a["river"] == river)
        flows = f" It flows through {', '.join(on)}." if on else ""
        world[river] = Entity(
            kind="river",
            name=river,
            attrs={"length": lengths[river]},
            passage=f"{river}\n{river} is a river {lengths[river]} kilometres long.{flows}",
        )
    return world


# (question template, subject kind, attribute chain); each step of a chain is a function, so answers are
# unique.
QUESTIONS = {
    1: (
        ("In which city was {} born?", "person", ("city",)),
        ("In what year was {} born?", "person", ("birth_year",)),
        ("Who is the chief executive of {}?", "company", ("ceo",)),
        ("In which city is {} headquartered?", "company", ("city",)),
        ("In what year was {} founded?", "company", ("founded",)),
        ("Which river flows through {}?", "city", ("river",)),
        ("In what year was the city of {} founded?", "city", ("founded",)),
    ),
    2: (
        ("In which city was the chief executive of {} born?", "company", ("ceo", "city")),
        ("In what year was the chief executive of {} born?", "company", ("ceo", "birth_year")),
        ("Which river flows through the city where {} is headquartered?", "company", ("city", "river")),
        ("Which river flows through the city where {} was born?", "person", ("city", "river")),
        ("In what year was the city where {} was born founded?", "person", ("city", "founded")),
    ),
}


def _aliases(value: object) -> tuple[str, ...]:
    text = str(value)
    return (text, text[: -len(" River")]) if text.endswith(" River") else (text,)


def sample_question(
    rng: np.random.Generator, world: dict[str, Entity], by_kind: dict[str, list[str]], hops: int
) -> Problem:
    template, kind, chain = _pick(rng, list(QUESTIONS[hops]))
    subject = _pick(rng, by_kind[kind])
    value: object = subject
    for attr in chain:
        value = world[value].attrs[attr]
    question = template.format(subject)
    return Problem(
        prompt=PROMPT.format(question=question),
        answer=_aliases(value),
        difficulty=f"{hops}-hop",
        meta={"question": question, "hops": hops, "subject": subject},
    )


# ---------------------------------------------------------------------------------------------------
# Reward
# ---------------------------------------------------------------------------------------------------

_ARTICLES = re.compile(r"\b(a|an|the)\b")
_PUNCTUATION = str.maketrans("", "", string.punctuation)
_INFORMATION = re.compile(r"<information>.*?</information>", re.DOTALL)
_SEARCH = re.compile(r"<search>(.*?)</search>", re.DOTALL)


def normalize_answer(text: str) -> str:
    """Search-R1 / SQuAD normalisation: lower case, drop punctuation and articles, single spaces."""
    return " ".join(_ARTICLES.sub(" ", text.lower().translate(_PUNCTUATION)).split())


def exact_match(response: str, golds: tuple[str, ...]) -> float:
    """1.0 when the last answer outside <information> blocks matches a gold alias after normalisation."""
    answer = last_answer(_INFORMATION.sub("", response))
    if answer is None:
        return 0.0
    return float(normalize_answer(answer) in {normalize_answer(g) for g in golds})


# ---------------------------------------------------------------------------------------------------
# Retrieval and the task
# ---------------------------------------------------------------------------------------------------


class Retriever:
    """BM25 (bm25s, k1=1.5, b=0.75, English stop words) over the world's passages."""

    def __init__(self, passages: list[str]):
        # Imported here, not at module top: only tool-using runs need the search index.
        import bm25s
        from bm25s.tokenization import Tokenizer

        self.passages = passages
        self.tokenizer = Tokenizer(stopwords="en")
        ids = self.tokenizer.tokenize(passages, return_as="ids", show_progress=False)
        self.index = bm25s.BM25(k1=1.5, b=0.75)
        self.index.index(ids, show_progress=False)

    def search(self, query: str, k: int) -> list[str]:
        ids = self.tokenizer.tokenize([query], update_vocab=False, return_as="ids", show_progress=False)
        docs, _ = self.index.retrieve(ids, k=min(k, len(self.passages)), show_progress=False)
        return [self.passages[int(i)] for i in docs[0]]


def format_information(passages: list[str]) -> str:
    """Search-R1's observation: "Doc i(Title: first line) rest" per passage inside <information> tags."""
    docs = "".join(
        f"Doc {i + 1}(Title: {p.split(chr(10), 1)[0]}) {p.split(chr(10), 1)[1]}\n"
        for i, p in enumerate(passages)
    )
    return f"\n\n<information>{docs.strip()}</information>\n\n"


class ToolQATask:
    name = "toolqa"
    tool_stop = TOOL_STOP

    def __init__(self, hops: tuple[int, ...], world: dict[str, Entity], top_k: int, max_tool_calls: int):
        self.levels, self.world, self.top_k, self.max_tool_calls = hops, world, top_k, max_tool_calls
        self.by_kind: dict[str, list[str]] = {}
        for name, entity in world.items():
            self.by_kind.setdefault(entity.kind, []).append(name)

    @functools.cached_property
    def retriever(self) -> Retriever:
        return Retriever([e.passage for e in self.world.values()])

    def _sample(self, rng: np.random.Generator, hops: int) -> Problem:
        return sample_question(rng, self.world, self.by_kind, hops)

    def train_problems(self, n: int, seed: int) -> list[Problem]:
        return procedural_train(self._sample, _key, self.levels, n, seed)

    def eval_problems(self, n_per_difficulty: int, seed: int) -> list[Problem]:
        return procedural_eval(self._sample, _key, self.levels, n_per_difficulty, seed)

    def reward(self, problem: Problem, completion: str) -> float:
        return exact_match(problem.response_prefix + completion, problem.answer)

    def is_correct(self, problem: Problem, completion: str) -> bool:
        return self.reward(problem, completion) == 1.0

    def tool(self, text: str) -> str | None:
        """Observation for a completion that ends with "</search>"; None when it does not.

        The query is the last <search> block; an empty or missing one gets Search-R1's invalid-action note.
        """
        if not text.rstrip().endswith(TOOL_STOP):
            return None
        queries = _SEARCH.findall(_INFORMATION.sub("", text))
        query = queries[-1].strip() if queries else ""
        if not query:
            return INVALID_ACTION
        return format_information(self.retriever.search(query, self.top_k))


def _key(problem: Problem) -> str:
    return f"toolqa|{problem.meta['question']}"


@register_task("toolqa")
def make_toolqa(
    hops: int | tuple[int, int] = (1, 2),
    *,
    world_seed: int = 0,
    n_people: int = 400,
    n_cities: int = 60,
    n_companies: int = 150,
    n_rivers: int = 15,
    top_k: int = 3,
    max_tool_calls: int = 2,
) -> ToolQATask:
    """Search-R1-style QA over a world generated from `world_seed` (max_tool_calls=2 as in Search-R1's GRPO)."""  # noqa: E501
    levels = parse_int_range("hops", hops, 1, 2)
    # Upper bounds keep the made-up names (about 45K two-syllable words) far from exhausted.
    sizes = dict(
        n_people=check_int("n_people", n_people, 1, 10_000),
        n_cities=check_int("n_cities", n_cities, 1, 2_000),
        n_companies=check_int("n_companies", n_companies, 1, 2_000),
        n_rivers=check_int("n_rivers", n_rivers, 1, 500),
    )
    world = generate_world(check_int("world_seed", world_seed, 0), **sizes)
    return ToolQATask(
        levels, world, check_int("top_k", top_k, 1, 20), check_int("max_tool_calls", max_tool_calls, 0)
    )
