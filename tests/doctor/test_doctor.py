"""The doctor's detectors: each fires at its onset on a run made to show it and stays silent (no warning
or critical finding) on healthy runs; findings carry numbers, thresholds and token evidence."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
from doctor_runs import EOS, MAX_NEW_TOKENS, tokens_of, write_doctor_run

from tokengrad.doctor import DETECTORS, diagnose
from tokengrad.doctor.engine import load_detectors
from tokengrad.doctor.stats import robust_z, runs_of, sustained, trend

ONSET = 30


def _after(df: pd.DataFrame, step: int = ONSET) -> pd.Series:
    return df["step"] >= step


def entropy(t):
    st = t["steps"]
    k = np.clip(st["step"] - ONSET, 0, None)
    st["entropy_mean"] = 0.5 * np.exp(-0.15 * k)


def kl(t):
    t["steps"].loc[_after(t["steps"], 40), "kl"] = 2.0


def clip(t):
    t["steps"].loc[_after(t["steps"]), "clip_frac"] = 0.3


def reward_std(t):
    t["steps"].loc[_after(t["steps"]), "reward_std"] = 0.0


def nan(t):
    t["steps"].loc[t["steps"]["step"] == 33, "grad_norm"] = np.inf


def drift(t):
    st = t["steps"]
    st["grad_norm"] = st["grad_norm"] * np.exp(0.08 * st["step"])


def slow(t):
    st = t["steps"]
    st["time_step"] = st["time_step"] + 0.05 * st["step"]


def dead(t):
    st = t["steps"]
    st.loc[st["step"].between(ONSET, 55), "grad_norm"] = 0.0


def all_correct(t):
    s = t["samples"]
    s.loc[_after(s), ["reward", "correct"]] = [1.0, 1]


def same_text(t):
    s = t["samples"]
    s.loc[_after(s), "completion"] = "w1 w2 w3"


def long(t):
    s = t["samples"]
    later = _after(s)
    k = (s["step"] - ONSET).clip(lower=0)
    s.loc[later, "length"] = 20 + k[later] + np.arange(later.sum()) % 7
    s["reward"] = (s["length"] > s.groupby("step")["length"].transform("median")).astype(float)
    s.loc[later, "reward"] = s.loc[later, "reward"]
    rng = np.random.default_rng(1)
    s["correct"] = (rng.random(len(s)) < 0.5).astype(int)


def truncate(t):
    s = t["samples"]
    hit = _after(s) & (s["sample_id"] % 4 != 0)
    s["truncated"] = hit
    s.loc[hit, "length"] = MAX_NEW_TOKENS


def repeat(t):
    s = t["samples"]
    s.loc[_after(s) & (s["sample_id"] % 2 == 0), "completion"] = " ".join(["a b c"] * 8)


def format_game(t):
    s = t["samples"]
    s.loc[_after(s), "reward"] = s["correct"] + 1.0  # a format bonus paid whatever the answer


def spike(t):
    st = t["steps"]
    st.loc[st["step"] == 42, "grad_norm"] = 40.0
    rng = np.random.default_rng(0)
    tok = tokens_of(t["samples"], rng)
    hit = (tok["step"] == 42) & (tok["sample_id"] == 3) & tok["position"].isin([1, 2, 4])
    tok.loc[hit, ["logit_grad_norm", "prob"]] = [50.0, 0.002]
    t["tokens"] = tok


def low_dom(t):
    b = t["buckets"]
    b.loc[b["lo"] == 0, "update_share"] = 0.7
    b.loc[b["lo"] == 0.75, "update_share"] = 0.1


def high_drag(t):
    b = t["buckets"]
    b.loc[(b["lo"] == 0.75) & _after(b), "correct_ratio"] = 0.3
    b.loc[(b["lo"] == 0.75) & ~_after(b), "correct_ratio"] = 0.45


def zeroed(t):
    tok = tokens_of(t["samples"], np.random.default_rng(0))
    hit = (tok["prob"] > 0.19) & _after(tok, 0)  # TR-GRPO's ratio placement: no gradient above p ~ 0.19
    tok.loc[hit, ["weight", "coef", "logit_grad_norm"]] = 0.0
    t["tokens"] = tok


def mismatch(t):
    st = t["steps"]
    k = np.clip(st["step"] - ONSET, 0, None)
    st["rollout_mismatch"] = st["rollout_mismatch"] + 0.002 * k


def confident(t):
    """From ONSET on, each sequence's first token: the trainer's pi_old gives it 0.95, the engine 0.05."""
    tok = tokens_of(t["samples"], np.random.default_rng(0))
    hit = _after(tok) & (tok["position"] == 0)
    tok.loc[hit, "old_logprob"], tok.loc[hit, "rollout_logprob"] = np.log(0.95), np.log(0.05)
    t["tokens"] = tok


def masked(t):
    """TRL's IS sequence mask as the attach records it (tokens.masked / masked_by): from ONSET on, every loss
    token of 6 of each step's 16 sequences (sample_id % 8 < 3) masked."""
    tok = tokens_of(t["samples"], np.random.default_rng(0))
    hit = _after(tok) & (tok["sample_id"] % 8 < 3)
    tok["masked"] = np.where(hit, True, None)
    tok["masked_by"] = np.where(hit, "is_sequence_mask", None)
    early = (tok["step"] == 3) & (tok["sample_id"] % 8 == 0) & (tok["position"] == 0)
    tok.loc[early, ["masked", "masked_by"]] = [True, "entropy_mask"]  # one token masked: not a sequence
    t["tokens"] = tok


# detector -> (edit, expected onset, tolerance, expected severity)
CASES = {
    "entropy_collapse": (entropy, 35, 2, "critical"),
    "kl_blowup": (kl, 40, 0, "critical"),
    "clip_saturation": (clip, ONSET, 0, "warning"),
    "reward_std_death": (reward_std, ONSET, 0, "critical"),
    "nonfinite": (nan, 33, 0, "critical"),
    "grad_norm_drift": (drift, 29, 6, "warning"),
    "throughput_decay": (slow, 10, 10, "info"),  # 3.3x: within machine-load noise (6.28x warns)
    "dead_steps": (dead, ONSET, 0, "critical"),
    "advantage_collapse": (all_correct, ONSET, 0, "critical"),
    "degenerate_groups": (same_text, ONSET, 0, "warning"),
    "length_hacking": (long, ONSET, 5, "warning"),
    "truncation": (truncate, ONSET, 0, "critical"),
    "repetition": (repeat, ONSET, 0, "warning"),
    "format_gaming": (format_game, ONSET, 3, "warning"),
    "gradient_spike": (spike, 42, 0, "critical"),
    "low_prob_dominance": (low_dom, 0, 0, "warning"),
    "high_prob_drag": (high_drag, 0, 0, "warning"),
    "zeroed_gradients": (zeroed, 0, 0, "critical"),
    "rollout_mismatch": (mismatch, ONSET, 8, "warning"),
    "masked_sequences": (masked, ONSET, 0, "warning"),
    "confident_disagreement": (confident, ONSET, 0, "critical"),
}


def test_every_detector_has_a_case():
    load_detectors()
    files = {"unreadable_files", "rank_missing"}  # tests/read/test_damaged_runs.py
    integrity = {n for n in DETECTORS if DETECTORS[n].about == "data"} - files  # integrity, _ranks
    assert len(integrity) == 8
    assert set(DETECTORS) - {"rows_dropped", "files_not_uploaded"} - integrity - files == set(CASES)


@pytest.mark.parametrize("name", sorted(CASES))
def test_detector_fires_at_onset(tmp_path, name):
    edit, onset, tol, severity = CASES[name]
    run = write_doctor_run(tmp_path / name, edit=edit)
    found = [f for f in diagnose(run) if f.id == name]
    assert found, f"{name} did not fire"
    f = found[0]
    assert abs(f.first_step - onset) <= tol, (f.first_step, onset, f.message)
    assert f.severity == severity, f.message
    assert f.evidence.get("thresholds") or f.evidence.get("statistic")
    assert any(ch.isdigit() for ch in f.message) and f.actions
    others = [g for g in diagnose(run) if g.id != name and g.at_least("critical")]
    assert not others or name in ("all_correct",), [g.message for g in others]


@pytest.mark.parametrize("seed", range(4))
def test_healthy_runs_are_silent(tmp_path, seed):
    run = write_doctor_run(tmp_path / f"h{seed}", seed=seed)
    loud = [f for f in diagnose(run) if f.at_least("warning")]
    assert loud == [], [f.message for f in loud]


def test_masked_sequences_counts_whole_sequences_and_their_reasons(tmp_path):
    run = write_doctor_run(tmp_path / "masked", edit=masked)
    f = next(f for f in diagnose(run) if f.id == "masked_sequences")
    assert f.first_step == ONSET and f.last_step == 59  # the run's last step
    assert f.evidence["values"]["first"] == pytest.approx(6 / 16)
    assert f.evidence["values"]["reasons"] == {"is_sequence_mask": 6 * 30}  # the entropy-masked token: no
    assert [t.sample_id for t in f.tokens] == [0, 1, 2, 8, 9] and f.tokens[0].share == pytest.approx(1 / 16)
    assert "38 % of step 30's sequences lost their whole gradient" in f.message


def test_tokens_a_host_mask_removed_are_not_zeroed_gradients(tmp_path):
    """The same zeroed tokens, each carrying the host's IS mask (coef 0 because the mask removed it): the
    gradient was removed on purpose and masked_sequences' business, so zeroed_gradients stays silent."""

    def masked_zero(t):
        zeroed(t)
        tok = t["tokens"]
        hit = tok["coef"] == 0
        tok["masked"] = np.where(hit, True, None)
        tok["masked_by"] = np.where(hit, "is_token_mask", None)

    run = write_doctor_run(tmp_path / "mz", edit=masked_zero)
    assert [f.id for f in diagnose(run) if f.id == "zeroed_gradients"] == []
    assert [f.id for f in diagnose(write_doctor_run(tmp_path / "z", edit=zeroed))].count(
        "zeroed_gradients"
    ) == 1


def test_masked_sequences_from_trls_step_count(tmp_path):
    def counted(t):  # no token mask records: steps.is_masked_sequences over the step's completions
        st = t["steps"]
        st["is_masked_sequences"] = np.where(_after(st), 4, 1)

    f = next(
        f for f in diagnose(write_doctor_run(tmp_path / "count", edit=counted)) if f.id == "masked_sequences"
    )
    assert f.first_step == ONSET and f.evidence["values"]["peak"] == pytest.approx(4 / 16)
    assert f.evidence["values"]["source"] == "steps.is_masked_sequences" and f.tokens == ()
    quiet = lambda t: t["steps"].__setitem__("is_masked_sequences", 1)  # noqa: E731 - 1 of 16: below 10 %
    assert not [
        f for f in diagnose(write_doctor_run(tmp_path / "q", edit=quiet)) if f.id == "masked_sequences"
    ]


def test_spike_names_its_culprit_tokens(tmp_path):
    run = write_doctor_run(tmp_path / "spike", edit=spike)
    f = next(f for f in diagnose(run) if f.id == "gradient_spike")
    top = f.tokens[:3]
    assert {t.sample_id for t in top} == {3} and {t.position for t in top} == {1, 2, 4}
    assert all(not t.exact and t.share_of == "logit_grad_norm" for t in top)
    assert "3 tokens of sample 3" in f.message and "estimate" in f.message
    # the shares are logit_grad_norm / its step sum, checked by hand from the written rows
    from tokengrad.read import load_run

    tok = load_run(run).tokens(columns=["step", "logit_grad_norm"], steps=(42, 42))
    assert top[0].share == pytest.approx(50.0 / tok["logit_grad_norm"].sum(), rel=1e-5)


def test_spike_uses_exact_update_shares_on_attribution_steps(tmp_path):
    def attributed(t):
        spike(t)
        tok = t["tokens"]
        tok["update_share"] = np.nan
        at42 = tok["step"] == 42
        tok.loc[at42, "update_share"] = 0.001
        tok.loc[at42 & (tok["sample_id"] == 5) & (tok["position"] == 0), "update_share"] = 0.71

    run = write_doctor_run(tmp_path / "attr", edit=attributed)
    f = next(f for f in diagnose(run) if f.id == "gradient_spike")
    assert f.tokens[0].exact and f.tokens[0].share_of == "update"
    assert (f.tokens[0].sample_id, f.tokens[0].position) == (5, 0)
    assert f.tokens[0].share == pytest.approx(0.71)
    assert "71 % of the update" in f.message


def test_advantage_collapse_splits_all_correct_and_all_wrong(tmp_path):
    def wrong(t):
        s = t["samples"]
        s.loc[_after(s), ["reward", "correct"]] = [0.0, 0]

    f = next(
        f for f in diagnose(write_doctor_run(tmp_path / "w", edit=wrong)) if f.id == "advantage_collapse"
    )
    assert f.evidence["values"]["all_wrong"] > 0 and f.evidence["values"]["all_correct"] == 0
    assert "too hard" in f.actions[0].text
    g = next(
        f
        for f in diagnose(write_doctor_run(tmp_path / "c", edit=all_correct))
        if f.id == "advantage_collapse"
    )
    assert g.evidence["values"]["all_correct"] == 30 * 4 and "too easy" in g.actions[0].text


def test_truncation_tells_an_end_token_at_the_limit_from_a_cut(tmp_path):
    def at_limit(t):  # completions that end with EOS exactly at max_new_tokens are not truncated
        s = t["samples"]
        s.loc[_after(s), "length"] = MAX_NEW_TOKENS

    run = write_doctor_run(tmp_path / "limit", edit=at_limit)
    assert [f for f in diagnose(run) if f.id == "truncation"] == []
    tok = pd.read_parquet(next((run / "tokens").rglob("*.parquet")))
    assert (tok[tok["position"] == MAX_NEW_TOKENS - 1]["token_id"] == EOS).all()


def test_rows_dropped(tmp_path):
    run = write_doctor_run(tmp_path / "drop")
    (run / "ranks").mkdir()
    (run / "ranks" / "rank000.json").write_text(json.dumps({"rows_dropped": {"tokens": 12}}))
    f = next(f for f in diagnose(run) if f.id == "rows_dropped")
    assert f.evidence["values"] == {"tokens": 12} and "12 tokens rows" in f.message


def test_a_failing_detector_does_not_hide_the_others(tmp_path):
    from tokengrad.doctor.registry import detector

    @detector("always_fails")
    def always_fails(view):
        raise KeyError("boom")

    try:
        fs = diagnose(write_doctor_run(tmp_path / "kl", edit=kl))
    finally:
        DETECTORS.unregister("always_fails")
    assert any(f.id == "kl_blowup" for f in fs)
    assert any(f.id == "detector_error" and "always_fails" in f.message for f in fs)


def test_live_prefix_sees_only_committed_steps(tmp_path):
    run = write_doctor_run(tmp_path / "kl", edit=kl)
    assert [f for f in diagnose(run, upto=39) if f.id == "kl_blowup"] == []
    assert [f.first_step for f in diagnose(run, upto=42) if f.id == "kl_blowup"] == [40]


def test_stats_by_hand():
    z = robust_z([1.0, 2.0, 3.0, 4.0, 100.0])  # median 3, MAD 1
    assert z[-1] == pytest.approx(0.6745 * 97)
    assert np.isnan(robust_z([1.0, 1.0, 1.0, 5.0])).all()  # MAD 0: no scale
    tr = trend([1.0, 2.0, 3.0, 4.0, 5.0, 7.0])
    assert tr.tau == pytest.approx(1.0) and tr.slope == pytest.approx(1.0) and tr.rising(0.05)
    assert runs_of([0, 1, 1, 0, 1]) == [(1, 3), (4, 5)]
    assert sustained([1, 0, 1, 1, 1], 3) == (2, 5) and sustained([1, 1, 0], 3) is None


def test_unknown_detector_name_lists_the_known_ones(tmp_path):
    with pytest.raises(ValueError, match="known detectors"):
        diagnose(write_doctor_run(tmp_path / "h"), only=["no_such"])


def test_repetition_is_a_loop_not_templated_reasoning(tmp_path):
    from tokengrad.doctor.detect_outputs import loop, seq_rep
    from tokengrad.train.tasks.lab_kk import trace

    # by hand: 'a b c' x 8 is 8 copies from word 0; the loop in 'x y a b c a b c a b c z' starts at word 2
    assert loop(" ".join(["a b c"] * 8)) == (8, 0) and loop("x y a b c a b c a b c z") == (3, 2)
    assert loop("a b a c") == (1, 0) and loop("q the the the the") == (4, 1)
    # a correct K&K trace (3 people) reuses over half of its 3-grams and never repeats a span back to back
    # (A: "A is a knight and B is a knave"; B: "A is not a knave"; C: "B is not a knave")
    kk = trace((("and", ("telling-truth", 0), ("lying", 1)), ("not", ("lying", 0)), ("not", ("lying", 1))))
    assert seq_rep(kk) > 0.5 and loop(kk)[0] == 1

    def templated(t):
        t["samples"].loc[_after(t["samples"]), "completion"] = kk

    run = write_doctor_run(tmp_path / "kk", edit=templated)
    assert [f for f in diagnose(run) if f.id == "repetition"] == []

    def looping(t):
        s = t["samples"]
        s.loc[_after(s) & (s["sample_id"] % 2 == 0), "completion"] = "so the answer is " + "B knave " * 12

    f = next(f for f in diagnose(write_doctor_run(tmp_path / "loop", edit=looping)) if f.id == "repetition")
    assert abs(f.first_step - ONSET) <= 0 and f.tokens[0].text.startswith("B knave B knave")
