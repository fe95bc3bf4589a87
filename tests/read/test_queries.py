"""DuckDB aggregations over a run's tokens (tokengrad.read.queries) on a hand-built run and a recorded one."""

import json

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tokengrad import load_run, schema
from tokengrad.read.gradient_shares import gradient_by_bucket, step_gradients
from tokengrad.read.queries import (
    bin_edges,
    grad_norm_by_prob,
    prob_histogram,
    sample_tokens,
    token_frequencies,
    token_steps,
    top_samples,
    top_tokens,
)
from tokengrad.record import RunInfo

# Step 0, update 0: two completions of four tokens. Token 7 of sample 1 is not in the loss.
#            sample  pos token    prob  adv   coef  in_loss
_STEP0 = [
    (0, 0, "Ġthe", 0.05, 1.0, 0.50, True),
    (0, 1, "cat", 0.30, 1.0, 0.50, True),
    (0, 2, "Ġthe", 0.80, 1.0, 0.50, True),
    (0, 3, "sat", 0.95, 1.0, 0.50, True),
    (1, 0, "Ġthe", 0.10, -1.0, -0.25, True),
    (1, 1, "dog", 0.60, -1.0, -0.25, True),
    (1, 2, "Ġthe", 1.00, -1.0, -0.25, True),
    (1, 3, "<tool>", 0.20, -1.0, 0.00, False),
]


def _write(run_dir, table, rows, rank=0, seq=0):
    sch = schema.arrow_schema(table)
    t = pa.table({f.name: [r.get(f.name) for r in rows] for f in sch}, schema=sch)
    folder = run_dir / schema.rank_dir(table, rank)
    folder.mkdir(parents=True, exist_ok=True)
    pq.write_table(t, folder / schema.file_name(seq, seq))


def _token_rows(step, update_id, spec, vocab=("Ġthe", "cat", "sat", "dog", "<tool>")):
    rows = []
    for sample, pos, tok, p, adv, coef, in_loss in spec:
        unit = float(np.sqrt(2.0) * (1 - p) * 0.9)  # inside the Prop 4.2 wedge
        rows.append(
            dict(
                step=step,
                rank=0,
                update_id=update_id,
                pass_id=update_id,
                sample_id=sample,
                group_id=7,
                position=pos,
                token_id=vocab.index(tok),
                token=tok,
                in_loss=in_loss,
                prob=p,
                logprob=float(np.log(p)),
                advantage=adv,
                weight=1.0,
                coef=coef,
                logit_grad_unit=unit,
                logit_grad_norm=abs(coef) * unit,
                entropy=0.5,
            )
        )
    return rows


def make_tiny_run(run_dir, name="tiny", n_steps=6, weighting=None):
    """A complete run written with pyarrow from schema.py: tokens (steps 0-1, step 0 with a second update
    that queries must ignore), steps, layers, buckets, samples and evals for `n_steps` steps."""
    run_dir.mkdir(parents=True, exist_ok=True)
    meta = {
        "schema_version": schema.SCHEMA_VERSION,
        "run_name": name,
        "weighting": weighting
        or {
            "name": "tr_grpo",
            "params": {"alpha": 1.0},
            "curve": {"p": [0.0, 0.5, 1.0], "w": [0.5, 1.0, 1.5]},
        },
    }
    (run_dir / schema.META_FILE).write_text(json.dumps(meta))
    step1 = [(s, pos, tok, 0.5, adv, coef, True) for s, pos, tok, _, adv, coef, _ in _STEP0[:4]]
    _write(run_dir, "tokens", _token_rows(0, 0, _STEP0) + _token_rows(0, 1, _STEP0[:2]), seq=0)
    _write(run_dir, "tokens", _token_rows(1, 0, step1), seq=1)
    rng = np.random.default_rng(0)
    steps = [
        dict(
            step=s,
            rank=0,
            loss=1.0 / (s + 1),
            grad_norm=1.0 + 0.1 * s,
            reward_mean=0.1 * s,
            entropy_mean=0.5,
            kl=0.01 * s,
            clip_frac=0.0,
            weight_mean=1.0,
        )
        for s in range(n_steps)
    ]
    layers = [
        dict(step=s, rank=0, update_id=u, layer=layer, grad_norm=(10.0 if s == 3 else 1.0) * (1 + u) * k)
        for s in range(n_steps)
        for u in (0, 1)
        for layer, k in (("total", 1.0), ("model.layers.0", 0.5))
    ]
    buckets = [
        dict(
            step=s,
            rank=0,
            update_id=0,
            bucket=schema.bucket_label(lo, lo + 0.5),
            lo=lo,
            hi=lo + 0.5,
            n_tokens=n,
            token_share=n / 4,
            grad_norm=g,
            update_share=u,
            cos_to_total=0.5,
            dprob_mean=0.01,
            correct_ratio=0.5,
        )
        for s in range(n_steps)
        for lo, n, g, u in ((0.0, 1, 2.0, 0.8), (0.5, 3, 1.0, 0.3))
    ]
    buckets += [
        dict(step=s, rank=0, update_id=0, bucket=schema.RESIDUAL_BUCKET, n_tokens=0, update_share=-0.1)
        for s in range(n_steps)
    ]
    samples = [
        dict(
            step=0,
            rank=0,
            sample_id=i,
            group_id=7,
            prompt="p",
            completion=f"c{i}",
            reward=float(1 - i),
            advantage=float(1 - 2 * i),
            length=4,
            task="kk",
            difficulty="3",
        )
        for i in (0, 1)
    ]
    evals = [
        dict(step=s, rank=0, task="kk", difficulty=d, accuracy=float(rng.uniform()), n=10)
        for s in (0, n_steps - 1)
        for d in ("3", "5")
    ]
    for table, rows in (
        ("steps", steps),
        ("layers", layers),
        ("buckets", buckets),
        ("samples", samples),
        ("evals", evals),
    ):
        _write(run_dir, table, rows)
    return run_dir


class SqlOnly:
    """A run that only offers sql(): records how many rows each query returned to pandas."""

    def __init__(self, run):
        self._run, self.returned = run, []

    def sql(self, query, params=None):
        df = self._run.sql(query, params)
        self.returned.append(len(df))
        return df


@pytest.fixture
def run(tmp_path):
    return SqlOnly(load_run(make_tiny_run(tmp_path / "tiny")))


def test_token_frequencies_counts_update_zero_loss_tokens(run):
    df = token_frequencies(run, update_id=0)
    # step 0: Ġthe x4 (sample 0 pos 0,2; sample 1 pos 0,2), cat, sat, dog;
    # the <tool> token is not in the loss;
    # step 1: Ġthe, cat, Ġthe, sat; update 1 of step 0 (a second pass over the same tokens) is ignored.
    assert dict(zip(df["token"], df["count"])) == {"Ġthe": 6, "cat": 2, "sat": 2, "dog": 1}
    assert list(df["token"]) == ["Ġthe", "cat", "sat", "dog"]  # count desc, then token
    assert token_frequencies(run, update_id=None)["count"].sum() == 11 + 2  # + the 2 rows of update 1
    assert token_frequencies(run)["count"].sum() == 11 + 2  # the default reads every update's loss tokens
    with_tool = token_frequencies(run, loss_only=False, update_id=0)
    assert dict(zip(with_tool["token"], with_tool["count"]))["<tool>"] == 1


def test_token_frequencies_filters_prob_step_and_advantage(run):
    hi = token_frequencies(run, 0.75, 1.0, step_range=(0, 0), update_id=0)
    assert dict(zip(hi["token"], hi["count"])) == {
        "Ġthe": 2,
        "sat": 1,
    }  # 0.80, 1.00 (top edge inclusive), 0.95
    lo = token_frequencies(run, 0.0, 0.25, step_range=(0, 0), update_id=0)
    assert dict(zip(lo["token"], lo["count"])) == {"Ġthe": 2}  # 0.05, 0.10
    neg = token_frequencies(run, adv_sign=-1, update_id=0)
    assert dict(zip(neg["token"], neg["count"])) == {"Ġthe": 2, "dog": 1}
    assert len(token_frequencies(run, limit=2)) == 2
    assert run.returned[-1] == 2
    for bad in (dict(prob_lo=0.5, prob_hi=0.5), dict(adv_sign=2), dict(limit=0), dict(step_range=(3, 1))):
        with pytest.raises(ValueError):
            token_frequencies(run, **bad)


def test_prob_histogram_has_every_bin_and_aggregates_in_sql(run):
    h = prob_histogram(run, 4, step_range=(0, 0), update_id=0)
    # loss tokens of step 0: 0.05 0.10 | 0.30 | 0.60 | 0.80 0.95 1.00
    assert list(h["lo"]) == [0.0, 0.25, 0.5, 0.75] and list(h["hi"]) == [0.25, 0.5, 0.75, 1.0]
    assert list(h["count"]) == [2, 1, 1, 3]
    assert run.returned[-1] <= 4  # only bins come back to pandas
    h = prob_histogram(run, [0.0, 0.5, 0.9, 1.0], update_id=0)
    # all steps: step 1 adds four tokens at p=0.5 -> bin [0.5, 0.9)
    assert list(h["count"]) == [3, 6, 2]
    with pytest.raises(ValueError):
        bin_edges([0.0, 0.5, 0.5])


def test_grad_norm_by_prob_means(run):
    g = grad_norm_by_prob(run, 2, step_range=(0, 0), update_id=0)
    # bin [0, .5): p 0.05, 0.30, 0.10 -> mean 0.15; [.5, 1]: 0.80, 0.95, 0.60, 1.00 -> mean 0.8375
    assert g["count"].tolist() == [3, 4]
    np.testing.assert_allclose(g["prob"], [0.15, 0.8375], rtol=1e-6)
    # logit_grad_unit = 0.9 sqrt2 (1 - p) is linear in p, so its bin mean is 0.9 sqrt2 (1 - mean p)
    np.testing.assert_allclose(
        g["logit_grad_unit"], 0.9 * np.sqrt(2) * (1 - np.array([0.15, 0.8375])), rtol=1e-5
    )
    # |coef|: 0.5, 0.5, 0.25 -> 0.41667 ; 0.5, 0.5, 0.25, 0.25 -> 0.375
    np.testing.assert_allclose(g["abs_coef"], [1.25 / 3, 0.375], rtol=1e-6)


def test_top_tokens_and_samples_share_of_step(run):
    t = top_tokens(run, 0, k=3, update_id=0)
    # logit_grad_norm = |coef| 0.9 sqrt2 (1 - p);
    # the largest: sample 0 p=.05 (.95*.5), p=.30 (.7*.5), s1 p=.10 (.9*.25)
    assert list(zip(t["sample_id"], t["position"])) == [(0, 0), (0, 1), (1, 0)]
    c = 0.9 * np.sqrt(2)
    # step total: sample 0 0.5 (0.95 + 0.70 + 0.20 + 0.05) = 0.95; sample 1 0.25 (0.90 + 0.40 + 0) = 0.325,
    # and the <tool> token adds 0 (coef 0); 0.95 + 0.325 = 1.275
    total = c * 1.275
    np.testing.assert_allclose(t["share"], c * np.array([0.475, 0.35, 0.225]) / total, rtol=1e-5)
    # context: the neighbours in the completion (every token, also those outside the loss), ranked one marked
    toks = {sid: list(sample_tokens(run, 0, sid)["token"]) for sid in (0, 1)}
    for (sid, pos), ctx in zip(zip(t["sample_id"], t["position"]), t["context"]):
        words = toks[sid]
        assert ctx == "".join(words[max(pos - 5, 0) : pos]) + f"⟦{words[pos]}⟧" + "".join(
            words[pos + 1 : pos + 6]
        )
    assert list(top_tokens(run, 0, k=1, context=1, update_id=0)["context"]) == [f"⟦{toks[0][0]}⟧{toks[0][1]}"]
    s = top_samples(run, 0, update_id=0)
    assert (
        list(s["sample_id"]) == [0, 1]
        and list(s["reward"]) == [1.0, 0.0]
        and list(s["completion"]) == ["c0", "c1"]
    )
    np.testing.assert_allclose(s["share"], [0.95 / 1.275, 0.325 / 1.275], rtol=1e-5)
    assert list(s["n_tokens"]) == [4, 4]
    with pytest.raises(ValueError, match="not a tokens column"):
        top_tokens(run, 0, value="nope; DROP TABLE tokens")


def test_sample_tokens_and_steps(run):
    df = sample_tokens(run, 0, 1)
    assert list(df["position"]) == [0, 1, 2, 3] and list(df["token"]) == ["Ġthe", "dog", "Ġthe", "<tool>"]
    assert token_steps(run) == [0, 1]


def test_recorded_run_obeys_the_one_minus_p_wedge(tmp_path, tiny_model):
    """On a run recorded by the Recorder, per-bin means respect Prop. 4.2's linear bounds (AR-Lopti
    arXiv 2505.12929): sqrt(V/(V-1)) (1 - mean p) <= mean |p - e_y| <= sqrt2 (1 - mean p)."""
    import torch
    from conftest import TINY_V, forward_logprobs

    from tokengrad import Recorder

    g = torch.Generator().manual_seed(0)
    with Recorder(
        tmp_path / "rec", model=tiny_model, info=RunInfo(weighting={"name": "grpo", "params": {}})
    ) as rec:
        for step in range(2):
            with rec.step(step) as st:
                ids = torch.randint(0, TINY_V, (3, 8), generator=g)
                logits, lp, _, tgt = forward_logprobs(tiny_model, ids)
                adv = torch.tensor([1.0, -1.0, 0.5])
                st.track(
                    lp,
                    token_ids=tgt,
                    advantages=adv,
                    logits=logits,
                    sample_ids=torch.arange(3),
                    group_ids=torch.zeros(3, dtype=torch.long),
                )
                st.backward(-(lp * adv[:, None]).mean())
    recorded = load_run(tmp_path / "rec")
    h = prob_histogram(recorded, 10)
    assert h["count"].sum() == 2 * 3 * 7
    b = grad_norm_by_prob(recorded, 10)
    b = b[b["count"] > 0]
    lower = np.sqrt(TINY_V / (TINY_V - 1)) * (1 - b["prob"])
    assert (b["logit_grad_unit"] >= lower - 1e-5).all()
    assert (b["logit_grad_unit"] <= np.sqrt(2) * (1 - b["prob"]) + 1e-5).all()


def _add_dead_and_attributed_steps(run_dir):
    """Step 2: three loss tokens with coef 0 (every advantage 0: no gradient). Step 3: two tokens with
    per-token attribution (update_share 0.75 and 0.25), p 0.2 and 0.7, coef 1."""
    dead = [(0, i, "cat", 0.1, 0.0, 0.0, True) for i in range(3)]
    _write(run_dir, "tokens", _token_rows(2, 0, dead), seq=2)
    rows = _token_rows(3, 0, [(0, 0, "cat", 0.2, 1.0, 1.0, True), (0, 1, "dog", 0.7, 1.0, 1.0, True)])
    for row, share in zip(rows, (0.75, 0.25)):
        row["update_share"] = share
    _write(run_dir, "tokens", rows, seq=3)


def test_gradient_by_bucket_over_live_steps(tmp_path):
    run_dir = make_tiny_run(tmp_path / "tiny")
    assert "update_share" not in gradient_by_bucket(load_run(run_dir)).columns  # no attribution recorded
    _add_dead_and_attributed_steps(run_dir)
    run = load_run(run_dir)
    per_step = step_gradients(run)
    assert per_step["step"].tolist() == [0, 1, 2, 3]
    assert per_step["live"].tolist() == [True, True, False, True]
    g = gradient_by_bucket(run, [0.0, 0.5, 1.0])
    # logit_grad_norm = |coef| c (1 - p), c = 0.9 sqrt2. Loss tokens of every update, live steps 0, 1, 3:
    # [0, .5): step 0 u0 .5*.95 + .5*.7 + .25*.9, u1 .5*.95 + .5*.7, step 3 1*.8 -> 2.675 c over 6 tokens
    # [.5, 1]: step 0 .5*.2 + .5*.05 + .25*.4 + .25*0, step 1 4 * .5*.5, step 3 1*.3 -> 1.525 c over 9
    c = 0.9 * np.sqrt(2)
    assert g["count"].tolist() == [6, 9]
    np.testing.assert_allclose(g["grad_sum"], [2.675 * c, 1.525 * c], rtol=1e-5)
    np.testing.assert_allclose(g["grad_share"], [2.675 / 4.2, 1.525 / 4.2], rtol=1e-5)
    np.testing.assert_allclose(g["token_share"], [6 / 15, 9 / 15])
    np.testing.assert_allclose(g["update_share"], [0.75, 0.25])  # only step 3 recorded attribution
    assert (g.attrs["n_steps"], g.attrs["n_live"], g.attrs["steps"]) == (4, 3, [0, 1, 3])
    with_dead = gradient_by_bucket(run, [0.0, 0.5, 1.0], live_only=False)
    assert with_dead["count"].tolist() == [9, 9]  # the dead step's three p = 0.1 tokens
    only_dead = gradient_by_bucket(run, [0.0, 0.5, 1.0], step_range=(2, 2))
    assert only_dead["count"].sum() == 0 and only_dead.attrs["n_live"] == 0
    assert np.isnan(only_dead["grad_share"]).all()


def test_gradient_by_bucket_prefers_the_exact_prob_bins_of_a_budgeted_run(tmp_path):
    """A budgeted run keeps some token rows only; its prob_bins histogram is exact over all loss tokens."""
    run_dir = make_tiny_run(tmp_path / "tiny")
    #        step  lo    hi    n   Σ logit_grad_norm  Σ update_share
    spec = [
        (5, 0.00, 0.25, 4, 2.0, 0.6),
        (5, 0.25, 0.50, 1, 0.5, 0.1),
        (5, 0.50, 0.75, 0, 0.0, 0.0),
        (5, 0.75, 1.00, 5, 0.5, 0.3),
        (6, 0.00, 0.25, 10, 0.0, None),
    ]  # step 6: no gradient
    rows = [
        dict(
            step=s,
            rank=0,
            update_id=0,
            lo=lo,
            hi=hi,
            adv_sign=1,
            n_tokens=n,
            sum_logit_grad_norm=g,
            sum_update_share=u,
        )
        for s, lo, hi, n, g, u in spec
    ]
    _write(run_dir, "prob_bins", rows)
    run = load_run(run_dir)
    g = gradient_by_bucket(run)
    assert g.attrs["source"] == "prob_bins" and (g.attrs["n_steps"], g.attrs["n_live"]) == (2, 1)
    assert g["count"].tolist() == [4, 1, 0, 5]  # the dead step's 10 tokens left out
    np.testing.assert_allclose(g["grad_share"], [2 / 3, 0.5 / 3, 0.0, 0.5 / 3])
    np.testing.assert_allclose(g["update_share"], [0.6, 0.1, 0.0, 0.3])
    halves = gradient_by_bucket(run, [0.0, 0.5, 1.0])
    assert halves["count"].tolist() == [5, 5] and halves.attrs["source"] == "prob_bins"
    uneven = gradient_by_bucket(run, [0.0, 0.1, 1.0])  # 0.1 splits a recorded bin: the token table answers
    assert uneven.attrs["source"] == "tokens"
