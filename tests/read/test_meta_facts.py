"""The facts the read side and the dashboard take from meta.json, one accessor each
(tokengrad.read.meta_file), on the meta.json each producer writes and on damaged or empty ones."""

import json

from tokengrad.read import meta_file
from tokengrad.read.runs import load_run

TRAINER = {"task": "kk", "task_params": {"n_people": [3, 5]}, "prompts_per_step": 8, "group_size": 8,
           "bucket_every": 5, "steps": 200}  # fmt: skip
TRL = {"integration": "trl", "args": {"max_steps": 50, "num_generations": 4}}
VERL = {"integration": "verl", "loss_mode": "vanilla"}


def test_origin_says_how_the_run_was_recorded():
    metas = [{"config": c} for c in (TRL, VERL, TRAINER, {"lr": 1e-6})] + [{}, None, {"config": [1, 2]}]
    assert [meta_file.origin(m) for m in metas] == ["trl", "verl", "trainer", "loop", "loop", "loop", "loop"]
    assert meta_file.origin({"config": {"integration": ["trl"]}}) == "loop"  # not a name: a plain loop
    assert set(meta_file.ORIGINS) == {"trl", "verl", "trainer", "loop"}


def test_family_is_task_and_length():
    assert meta_file.family({"config": TRAINER}) == ("kk [('n_people', [3, 5])]", "200")
    assert meta_file.family({"config": TRL}) == ("trl []", "50")
    assert meta_file.family({}) == (" []", "")


def test_names_budgets_drops_and_lopti_phases():
    assert meta_file.run_name({"run_name": "lab_grpo"}) == "lab_grpo"
    assert [meta_file.run_name(m) for m in ({"run_name": ""}, {"run_name": None}, {}, {"run_name": 3})] == [
        None
    ] * 4
    assert meta_file.token_budget({"token_budget": 4096}) == 4096 and meta_file.token_budget({}) is None
    assert meta_file.rows_dropped({"rows_dropped": {"tokens": 7, "steps": 2, "x": True, "y": "3"}}) == 9
    assert meta_file.rows_dropped({"rows_dropped": [4]}) == 0 and meta_file.rows_dropped(None) == 0
    lopti = {"weighting": {"name": "Lopti", "params": {"low_first": False}}}
    assert meta_file.lopti_low_first(lopti) is False
    assert meta_file.lopti_low_first({"weighting": {"name": "lopti"}}) is True  # the rule's default
    assert meta_file.lopti_low_first({"weighting": {"name": "tr_grpo"}}) is None
    assert meta_file.config({"config": "x"}) == {} and meta_file.config({"config": VERL}) == VERL


def test_a_run_reads_its_facts_through_the_accessors(tmp_path):
    run_dir = tmp_path / "copy"
    run_dir.mkdir()
    meta = {"schema_version": 1, "run_name": "lab_grpo", "rows_dropped": {"tokens": 5}, "config": TRL}
    (run_dir / "meta.json").write_text(json.dumps(meta))
    assert meta_file.is_run_dir(run_dir) and not meta_file.is_run_dir(tmp_path)
    run = load_run(run_dir)
    assert (run.meta_name, run.label, run.rows_dropped) == ("lab_grpo", "copy (run_name lab_grpo)", 5)
    assert run.schema_version == 1 and repr(run) == f"Run({str(run_dir)!r}, schema_version=1)"
