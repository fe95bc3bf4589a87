"""Importers of other frameworks' dumps (tokengrad.importers): values round-trip into the run format, what
the source lacks is null and named in meta.json, the doctor runs and lists what it could not check, and an
unknown layout is refused naming the missing fields."""

from __future__ import annotations

import json
import math
import warnings

import numpy as np
import pytest
from importer_dumps import write_nemo_rl, write_prime_rl

from tokengrad import load_run
from tokengrad.cli import main
from tokengrad.doctor.engine import examine
from tokengrad.importers import IMPORTERS, import_run, load_importers


def test_registry_lists_the_formats_and_refuses_unknown_ones(tmp_path):
    assert {"trl_completions", "prime_rl", "nemo_rl"} <= set(load_importers())
    with pytest.raises(ValueError, match=r"unknown import format 'verl_dump'.*'nemo_rl'"):
        import_run("verl_dump", tmp_path, tmp_path / "out")
    assert "prime-rl token export" in IMPORTERS.describe()


def _tokens(run) -> "pd.DataFrame":  # noqa: F821
    return run.tokens().sort_values(["step", "sample_id", "position"]).reset_index(drop=True)


def test_prime_rl_tokens_round_trip(tmp_path):
    records = write_prime_rl(tmp_path / "out_dir")
    meta = import_run("prime_rl", tmp_path / "out_dir", tmp_path / "run")
    run = load_run(tmp_path / "run")
    tok = _tokens(run)
    # step 1: rank 0 holds records 0, 1 (sample ids 0, 1), rank 1 records 0, 1 (sample ids 2, 3)
    rec = records[(1, 1, 0)]
    seq = tok[(tok.step == 1) & (tok.sample_id == 2)]
    assert (seq["rank"] == 1).all() and seq["pass_id"].tolist() == [0] * 5
    assert seq["position"].tolist() == [0, 1, 2, 3, 4]  # the 3 prompt tokens are cut
    assert seq["token_id"].tolist() == rec["token_ids"][3:]
    np.testing.assert_allclose(seq["logprob"], rec["trainer_logprobs"][3:], rtol=1e-6)
    np.testing.assert_allclose(seq["prob"], np.exp(rec["trainer_logprobs"][3:]), rtol=1e-6)
    np.testing.assert_allclose(seq["entropy"], rec["entropy"][3:], rtol=1e-6)
    np.testing.assert_allclose(seq["mismatch_kl"], rec["mismatch_kl"][3:], rtol=1e-5, atol=1e-12)
    assert seq["in_loss"].tolist() == [True, True, False, True, True]
    # the tool token's inference log-prob (0: not sampled) is not a rollout log-prob
    mu = seq["rollout_logprob"].tolist()
    assert math.isnan(mu[2]) and mu[0] == pytest.approx(rec["inference_logprobs"][3], rel=1e-6)
    assert seq["old_logprob"].isna().all() and seq["coef"].isna().all()
    # steps: loss tokens and their mean entropy over both ranks, hand-summed from the records
    loss_ent = [
        e for (s, _, _), r in records.items() if s == 1 for e, m in zip(r["entropy"], r["loss_mask"]) if m
    ]
    step1 = run.steps[run.steps.step == 1].iloc[0]
    assert step1["n_tokens"] == len(loss_ent) == 16
    assert step1["entropy_mean"] == pytest.approx(sum(loss_ent) / len(loss_ent), rel=1e-6)
    assert math.isnan(step1["grad_norm"])
    samples = run.samples[run.samples.step == 1].sort_values("sample_id")
    assert samples["advantage"].tolist() == [0.5, 0.25, 0.5, 0.25] and set(samples["task"]) == {"letters"}
    missing = meta["imported"]["not_recorded"]
    assert {"coef", "old_logprob", "token"} <= set(missing["tokens"])
    assert "logprob" not in missing["tokens"] and "reward" in missing["samples"]
    assert "layers" in meta["imported"]["tables_not_recorded"]


def test_prime_rl_masked_tokens(tmp_path):
    records = write_prime_rl(tmp_path / "d", steps=(3,), ranks=(0,), per_rank=3)
    import_run("prime_rl", tmp_path / "d" / "token_exports", tmp_path / "run")
    tok = _tokens(load_run(tmp_path / "run"))
    want = [m for i in range(3) for m in records[(3, 0, i)]["is_masked"][3:]]
    assert tok["masked"].tolist() == want
    assert tok["masked_by"].tolist() == ["is_token_mask" if m else None for m in want]


def test_nemo_rl_round_trip_and_gap_metrics(tmp_path):
    batches = write_nemo_rl(tmp_path / "logs")
    meta = import_run("nemo_rl", tmp_path / "logs", tmp_path / "run", group_size=2)
    run = load_run(tmp_path / "run")
    tok = _tokens(run)
    rec = batches[2][1]
    n = rec["input_lengths"][0]
    seq = tok[(tok.step == 2) & (tok.sample_id == 1)]
    assert seq["token_id"].tolist() == rec["token_ids"][0][2:n] and len(seq) == 6  # padding cut
    np.testing.assert_allclose(seq["old_logprob"], rec["prev_logprobs"][0][2:n], rtol=1e-6)
    np.testing.assert_allclose(seq["rollout_logprob"], rec["generation_logprobs"][0][2:n], rtol=1e-6)
    assert seq["group_id"].unique().tolist() == [0]  # samples 0, 1 form group 0 with group_size 2
    # the step's gap metrics, by hand: mean |prev - generation| over every loss token of step 1
    d = [
        p - g
        for r in batches[1]
        for p, g, m in zip(r["prev_logprobs"][0], r["generation_logprobs"][0], r["token_loss_mask"][0])
        if m
    ]
    step1 = run.steps[run.steps.step == 1].iloc[0]
    assert step1["rollout_mismatch"] == pytest.approx(np.mean(np.abs(d)), rel=1e-5)
    assert step1["rollout_kl_k1"] == pytest.approx(-np.mean(d), rel=1e-4)
    assert step1["reward_mean"] == 0.5 and step1["reward_std"] == pytest.approx(np.std([0, 1, 0, 1], ddof=1))
    s = run.samples[run.samples.step == 2].sort_values("sample_id")
    assert s["reward"].tolist() == [0.0, 1.0, 0.0, 1.0] and s["advantage"].tolist() == [-0.5, 0.5, -0.5, 0.5]
    assert s["length"].tolist() == [4, 6, 3, 5]
    assert {"logprob", "entropy", "coef"} <= set(meta["imported"]["not_recorded"]["tokens"])


def test_doctor_runs_on_an_import_and_says_what_it_could_not_check(tmp_path):
    write_prime_rl(tmp_path / "d")
    import_run("prime_rl", tmp_path / "d", tmp_path / "run")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        result = examine(tmp_path / "run")
    skipped = {n.detector: n.reason for n in result.not_checked}
    assert "grad_norm" in skipped["grad_norm_drift"] and "reward" in skipped["advantage_collapse"]
    assert not [f for f in result.findings if f.id == "detector_error"]


def test_unknown_layouts_are_refused_naming_the_missing_fields(tmp_path):
    records = write_prime_rl(tmp_path / "d", steps=(1,), ranks=(0,), per_rank=1)
    bad = dict(records[(1, 0, 0)])
    del bad["trainer_logprobs"]
    (tmp_path / "d/token_exports/step_1/rank_0.jsonl").write_text(json.dumps(bad) + "\n")
    with pytest.raises(ValueError, match=r"lacks the field\(s\) \['trainer_logprobs'\]"):
        import_run("prime_rl", tmp_path / "d", tmp_path / "run")
    (tmp_path / "d/token_exports/step_1/rank_0.jsonl").write_text(json.dumps({**bad, "schema_version": 2}))
    with pytest.raises(ValueError, match="schema_version"):
        import_run("prime_rl", tmp_path / "d", tmp_path / "run2")
    with pytest.raises(ValueError, match="not a prime-rl token export"):
        import_run("prime_rl", tmp_path, tmp_path / "run3")
    (tmp_path / "nemo").mkdir()
    (tmp_path / "nemo/train_data_step1.jsonl").write_text(json.dumps({"rewards": [1.0], "idx": 0}) + "\n")
    with pytest.raises(ValueError, match=r"lacks the field\(s\) \['input_lengths', 'token_ids'"):
        import_run("nemo_rl", tmp_path / "nemo", tmp_path / "run4")
    with pytest.raises(ValueError, match="takes no option"):
        import_run("prime_rl", tmp_path / "d", tmp_path / "run5", reward_weights=[1.0])


def test_cli_import_prints_what_was_not_recorded(tmp_path, capsys):
    write_prime_rl(tmp_path / "d", steps=(1,), ranks=(0,))
    out = tmp_path / "run"
    assert main(["import", "prime_rl", str(tmp_path / "d"), "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert "not recorded by the source, tokens:" in text and "coef" in text
    assert main(["import", "prime_rl", str(tmp_path / "d"), "--out", str(out)]) == 2  # a run is there
    assert "already holds a run" in capsys.readouterr().err
    assert main(["import", "--list"]) == 0 and "nemo_rl" in capsys.readouterr().out
    assert main(["inspect", str(out)]) == 0
    text = capsys.readouterr().out
    assert "source     imported from prime_rl" in text
    assert "not recorded by the source, tokens: clipped, coef," in text
    assert "not recorded by the source, tables: layers, buckets" in text


@pytest.mark.slow
@pytest.mark.trl
def test_trl_completions_from_a_real_grpo_run(tmp_path):
    """A tiny GRPOTrainer run writes completions_*.parquet and a checkpoint's trainer_state.json; the
    import's rewards are the reward function recomputed on the completions, its steps TRL's logs."""
    trl = pytest.importorskip("trl")
    from datasets import Dataset

    from tokengrad.train.models import make_tiny_model, make_tiny_tokenizer

    def distinct_chars(completions, **kwargs):
        return [len(set(c)) / 8 for c in completions]

    tok = make_tiny_tokenizer()
    args = trl.GRPOConfig(
        output_dir=str(tmp_path / "trl_out"), per_device_train_batch_size=4, num_generations=4,
        max_completion_length=8, max_steps=2, report_to="none", use_cpu=True, bf16=False, logging_steps=1,
        save_strategy="steps", save_steps=2, learning_rate=5e-2, seed=0, disable_tqdm=True,
        log_completions=True,
    )  # fmt: skip
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer = trl.GRPOTrainer(
            model=make_tiny_model(tok), reward_funcs=[distinct_chars], args=args, processing_class=tok,
            train_dataset=Dataset.from_dict({"prompt": ["abc", "hello", "x=1+", "what?"] * 4}),
        )  # fmt: skip
        trainer.train()
    meta = import_run("trl_completions", tmp_path / "trl_out", tmp_path / "run")
    run = load_run(tmp_path / "run")
    s = run.samples.sort_values(["step", "sample_id"])
    assert sorted(s["step"].unique()) == [1, 2] and len(s) == 8
    np.testing.assert_allclose(s["reward"], distinct_chars(s["completion"].tolist()))
    np.testing.assert_allclose(s["reward_distinct_chars"], s["reward"])
    assert s.groupby("step")["group_id"].nunique().tolist() == [1, 1]  # 4 completions of one prompt
    history = json.loads((tmp_path / "trl_out/checkpoint-2/trainer_state.json").read_text())["log_history"]
    logged = {h["step"]: h for h in history if "grad_norm" in h}
    steps = run.steps.set_index("step")
    for step in (1, 2):
        assert steps.loc[step, "grad_norm"] == pytest.approx(logged[step]["grad_norm"])
        assert steps.loc[step, "lr"] == pytest.approx(logged[step]["learning_rate"])
        assert steps.loc[step, "reward_mean"] == pytest.approx(s[s.step == step]["reward"].mean())
    assert meta["imported"]["tables_not_recorded"][0] == "tokens"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        skipped = {n.detector for n in examine(tmp_path / "run").not_checked}
    assert {"rollout_mismatch", "entropy_collapse"} & skipped
