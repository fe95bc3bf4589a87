"""Tool-augmented QA: the generated world, BM25 search through `tool`, exact-match reward, splits."""

import re

import pytest

from tokengrad.train.tasks import get_task
from tokengrad.train.tasks.base import is_held_out
from tokengrad.train.tasks.toolqa import (
    INVALID_ACTION,
    QUESTIONS,
    exact_match,
    generate_world,
    normalize_answer,
)

SIZES = dict(n_people=60, n_cities=12, n_companies=20, n_rivers=5)


@pytest.fixture(scope="module")
def task():
    return get_task("toolqa", **SIZES)


def search(task, query):
    return task.tool(f"<think> I need to look this up. </think>\n<search> {query} </search>")


def titles(observation):
    return re.findall(r"Doc \d+\(Title: ([^)]*)\)", observation)


def test_world_is_deterministic_and_consistent():
    world = generate_world(3, **SIZES)
    assert world.keys() == generate_world(3, **SIZES).keys()
    assert world.keys() != generate_world(4, **SIZES).keys()
    kinds = [e.kind for e in world.values()]
    assert [kinds.count(k) for k in ("person", "city", "company", "river")] == [60, 12, 20, 5]
    for name, entity in world.items():
        assert entity.passage.split("\n")[0] == name  # "Title\nText"
        for attr in ("city", "residence", "ceo", "river"):
            if attr in entity.attrs:
                assert entity.attrs[attr] in world  # references resolve
    person = next(e for e in world.values() if e.kind == "person")
    assert f"born in {person.attrs['city']} in {person.attrs['birth_year']}." in person.passage


def test_tool_returns_search_r1_information(task):
    company = next(e for e in task.world.values() if e.kind == "company")
    observation = search(task, f"Who runs {company.name}?")
    assert observation.startswith("\n\n<information>Doc 1(Title: ") and observation.endswith(
        "</information>\n\n"
    )
    assert len(titles(observation)) == 3  # top_k = 3
    assert titles(observation)[0] == company.name
    body = company.passage.split("\n", 1)[1]
    assert f"Doc 1(Title: {company.name}) {body}\nDoc 2(Title: " in observation


def test_tool_edge_cases(task):
    assert task.tool_stop == "</search>"
    assert task.tool("<think> the answer is </think><answer> Paris </answer>") is None  # no search call
    assert task.tool("<search>   </search>") == INVALID_ACTION
    assert task.tool("</search>") == INVALID_ACTION
    assert len(titles(task.tool("<search> qqqq zzzz </search>"))) == 3  # unknown words still return docs
    # Only the last query counts, and queries inside earlier observations are ignored.
    first = search(task, "river")
    city = next(e for e in task.world.values() if e.kind == "city")
    assert (
        titles(task.tool(f"<search> river </search>{first}<search> {city.name} </search>\n"))[0] == city.name
    )


def test_one_hop_answers_are_one_search_away(task):
    problems = task.train_problems(40, seed=0) + task.eval_problems(10, seed=0)
    one_hop = [p for p in problems if p.meta["hops"] == 1]
    assert len(one_hop) >= 20
    for p in one_hop:
        # Some retrieved passage names both the subject and the answer (for "Which river flows through X?"
        # that is often the river's own passage, which lists its cities).
        docs = search(task, p.meta["question"]).split("\nDoc ")
        assert any(p.meta["subject"] in doc and p.answer[0] in doc for doc in docs)


def test_two_hop_answers_are_two_searches_away(task):
    for template, kind, (first, second) in QUESTIONS[2]:
        subject = next(e for e in task.world.values() if e.kind == kind)
        bridge = subject.attrs[first]
        gold = task.world[bridge].attrs[second]
        assert subject.name in titles(search(task, template.format(subject.name)))
        assert bridge in titles(search(task, bridge))
        assert str(gold) in task.world[bridge].passage


@pytest.mark.parametrize(
    "completion, reward",
    [
        ("<think> found it </think><answer> Velo River </answer>", 1.0),
        ("<answer>the velo river.</answer>", 1.0),  # articles, case and punctuation
        ("<answer> Velo </answer>", 1.0),  # alias
        ("<answer> Velo Stream </answer>", 0.0),
        ("<answer>Velo River</answer> wait <answer>Mar River</answer>", 0.0),  # the last answer counts
        (
            "<search> velo </search>\n\n<information>Doc 1(Title: x) <answer>Velo</answer></information>\n\n",
            0.0,
        ),
        ("Velo River", 0.0),  # no tags
    ],
)
def test_exact_match_reward(completion, reward):
    assert exact_match(completion, ("Velo River", "Velo")) == reward


def test_normalize_answer():
    assert normalize_answer("  The  Velo-River!  ") == "veloriver"
    assert normalize_answer("An Apple a day") == "apple day"


def test_full_trajectory_reward(task):
    problem = next(p for p in task.train_problems(50, seed=1) if p.meta["hops"] == 2)
    observation = search(task, problem.meta["question"])
    trajectory = (
        f"<think> search </think>\n<search> {problem.meta['question']} </search>{observation}"
        f"<think> got it </think>\n<answer> {problem.answer[0]} </answer>"
    )
    assert task.reward(problem, trajectory) == 1.0 and task.is_correct(problem, trajectory)
    assert task.reward(problem, trajectory.replace(problem.answer[0], "Nowhere")) == 0.0


def test_splits(task):
    train = task.train_problems(200, seed=0)
    assert train == task.train_problems(200, seed=0)
    assert {p.difficulty for p in train} == {"1-hop", "2-hop"}
    evals = task.eval_problems(15, seed=0)
    assert [p.difficulty for p in evals] == ["1-hop"] * 15 + ["2-hop"] * 15
    assert all(is_held_out(f"toolqa|{p.meta['question']}") for p in evals)
    assert not {p.meta["question"] for p in train} & {p.meta["question"] for p in evals}
    assert evals[0].prompt.startswith("Answer the given question. You must conduct reasoning inside <think>")
    assert evals[0].prompt.endswith(f"Question: {evals[0].meta['question']}\n")
    assert get_task("toolqa", hops=2, **SIZES).eval_problems(5, seed=0) == evals[15:20]


@pytest.mark.parametrize(
    "params, message",
    [
        (dict(hops=3), "hops"),
        (dict(hops=(2, 1)), "hops"),
        (dict(n_people=0), "n_people"),
        (dict(n_cities=True), "n_cities"),
        (dict(world_seed=-1), "world_seed"),
        (dict(top_k=0), "top_k"),
        (dict(max_tool_calls=-1), "max_tool_calls"),
    ],
)
def test_bad_params(params, message):
    with pytest.raises(ValueError, match=message):
        get_task("toolqa", **params)
