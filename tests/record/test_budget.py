"""Budgeted recording (Recorder(token_budget=K)): kept rows, exact aggregates, old runs, the read side."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pyarrow.parquet as pq
import pytest
import torch
from conftest import TINY_V, forward_logprobs, make_model

from tokengrad import Recorder, load_run, schema
from tokengrad.read import queries, share_queries
from tokengrad.record import Attribution

N, L = 8, 13  # sequences, ids per sequence (T = 12 scored tokens)


def _record(path, budget=None, attribute=True, seed=0):
    """One step of N sequences, two micro-batches of one update, through a fresh tiny model."""
    model = make_model(seed=seed)
    g = torch.Generator().manual_seed(7)
    ids = torch.randint(0, TINY_V, (N, L), generator=g)
    mask = torch.ones(N, L - 1)
    mask[2, 6:] = 0
    mask[5, 3:] = 0
    loss_mask = mask.clone()
    loss_mask[0, :2] = 0  # tool-like tokens: recorded, not in the loss
    adv = torch.tensor([1.0, -0.5, 0.0, -1.5, 0.7, 0.2, -0.3, 1.1])
    with (
        Recorder(
            path,
            model=model,
            attribution=Attribution(every=1 if attribute else 0, applied=False),
            budget=budget,
        ) as rec,
        rec.step(0) as st,
    ):
        for rows in torch.arange(N).chunk(2):
            x = ids[rows]
            logits, lp, hidden, _ = forward_logprobs(model, x)
            st.track(
                lp,
                token_ids=x[:, 1:],
                mask=mask[rows],
                loss_mask=loss_mask[rows],
                advantages=adv[rows],
                sample_ids=rows,
                logits=logits,
                hidden=hidden,
                recompute=lambda x=x: forward_logprobs(model, x)[1],
            )
            (-(lp * adv[rows, None] * loss_mask[rows]).sum() / loss_mask.sum()).backward()
        st.record_grad_norms()
    return load_run(path)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    d = tmp_path_factory.mktemp("budget")
    return _record(d / "full"), _record(d / "budget", budget=30)


def test_budget_keeps_whole_sequences_and_the_largest_shares(runs):
    full, cut = runs
    tok = cut.tokens()
    assert len(tok) == 30 and cut.steps["n_token_rows"].iloc[0] == 30
    assert set(tok["selected_by"]) == {"sequence", "top_update_share"}
    all_rows = full.tokens()
    per_sample = all_rows.groupby("sample_id").size()
    seq = tok[tok["selected_by"] == "sequence"]
    for sid, n in seq.groupby("sample_id").size().items():
        assert n == per_sample[sid]  # whole sequences
    assert len(seq) <= 15
    # the other kept rows are the largest |update_share| outside the sampled sequences
    rest = all_rows[~all_rows["sample_id"].isin(seq["sample_id"].unique())]
    want = rest["update_share"].abs().nlargest(30 - len(seq)).min()
    top = tok[tok["selected_by"] == "top_update_share"]
    assert top["update_share"].abs().min() == pytest.approx(want)


def test_aggregates_are_exact_over_all_tokens(runs):
    full, cut = runs
    for col in ("n_tokens", "entropy_mean", "weight_mean", "n_nonfinite", "grad_norm"):
        assert cut.steps[col].iloc[0] == pytest.approx(full.steps[col].iloc[0], rel=1e-6), col
    b_full, b_cut = full.buckets.set_index("bucket"), cut.buckets.set_index("bucket")
    assert np.allclose(b_cut["update_share"].to_numpy(float), b_full["update_share"].to_numpy(float))
    assert (b_cut["n_tokens"].fillna(-1) == b_full["n_tokens"].fillna(-1)).all()
    # prob_bins: the same sums as SQL over the unbudgeted run's loss tokens
    bins = cut.table("prob_bins")
    tok = full.tokens(where="in_loss")
    assert bins["n_tokens"].sum() == len(tok)
    assert bins["sum_update_share"].sum() == pytest.approx(tok["update_share"].sum(), abs=1e-5)
    pos = bins[bins["adv_sign"] == 1]
    assert pos["sum_logit_grad_norm"].sum() == pytest.approx(
        tok.loc[tok["advantage"] > 0, "logit_grad_norm"].sum(), rel=1e-5
    )
    hist = share_queries.prob_bin_histogram(cut)
    assert hist["count"].sum() == len(tok)
    assert hist["update_share"].sum() == pytest.approx(tok["update_share"].sum(), abs=1e-5)


def test_vocab_table_counts_and_shares(runs):
    full, cut = runs
    tok = full.tokens(where="in_loss")
    vocab = cut.table("vocab")
    assert vocab["n_tokens"].sum() == len(tok)  # 64-token vocabulary: every token is a top token here
    got = share_queries.vocab_frequencies(cut, limit=500).set_index("token")
    counts = tok.groupby("token_id").size()
    for tid, n in counts.items():
        assert got.loc[f"#{tid}", "count"] == n
    share = tok.groupby("token_id")["update_share"].sum()
    by_share = share_queries.vocab_frequencies(cut, value="update_share", limit=3)
    assert [f"#{t}" for t in share.abs().nlargest(3).index] == by_share["token"].tolist()
    neg = share_queries.vocab_frequencies(cut, adv_sign=-1, prob_lo=0.0, prob_hi=0.25, limit=500)
    assert neg["count"].sum() == ((tok["advantage"] < 0) & (tok["prob"] < 0.25)).sum()


def test_budget_covering_the_step_keeps_all_rows(tmp_path):
    run = _record(tmp_path / "r", budget=10_000, attribute=False)
    tok = run.tokens()
    assert (tok["selected_by"] == "all").all() and tok["update_share"].isna().all()
    assert len(tok) == run.steps["n_tokens"].iloc[0] + 2  # plus the two recorded tool-like tokens


def test_without_attribution_top_rows_rank_by_gradient_norm(tmp_path):
    run = _record(tmp_path / "r", budget=20, attribute=False)
    assert "top_grad_norm" in set(run.tokens()["selected_by"])


def test_share_by_partition(runs):
    full, _ = runs
    tok = full.tokens(where="in_loss")
    for by in share_queries.PARTITIONS:
        part = share_queries.share_by_partition(full, by=by, bins=4)
        assert part["count"].sum() == len(tok), by
        assert part["update_share"].sum() == pytest.approx(tok["update_share"].sum(), abs=1e-5), by
    sign = share_queries.share_by_partition(full, by="adv_sign").set_index("lo")
    assert sign.loc[-1, "update_share"] == pytest.approx(tok.loc[tok["advantage"] < 0, "update_share"].sum())
    ent = share_queries.share_by_partition(full, by="entropy_quantile", bins=4)
    assert ent["count"].max() - ent["count"].min() <= 1  # quantiles of a continuous value
    with pytest.raises(ValueError, match="unknown partition"):
        share_queries.share_by_partition(full, by="color")


def test_run_written_at_the_previous_schema_version_loads(tmp_path, runs):
    """A version-1 run: no update_share / dlogprob* / selected_by / n_token_rows, no prob_bins or vocab."""
    import shutil

    full, _ = runs
    old = tmp_path / "v1"
    shutil.copytree(full.path, old)
    v2_only = {"update_share", "dlogprob_pred", "dlogprob", "selected_by", "n_token_rows"}
    for table in ("prob_bins", "vocab"):
        shutil.rmtree(old / table, ignore_errors=True)
    for f in old.rglob("*.parquet"):
        t = pq.read_table(f)
        pq.write_table(t.drop_columns([c for c in t.column_names if c in v2_only]), f)
    meta = json.loads((old / schema.META_FILE).read_text())
    meta["schema_version"] = 1
    (old / schema.META_FILE).write_text(json.dumps(meta))
    run = load_run(old)
    assert run.tokens()["update_share"].isna().all()
    assert run.steps["n_token_rows"].isna().all() and len(run.table("vocab")) == 0
    part = share_queries.share_by_partition(run, by="prob", bins=4)
    assert part["count"].sum() > 0 and part["update_share"].isna().all()
    assert share_queries.vocab_frequencies(run).empty
    assert share_queries.attributed_steps(run) == 0
    assert share_queries.attributed_steps(full) == full.steps["step"].nunique()
    assert len(queries.top_tokens(run, step=0, value="logit_grad_norm")) > 0


def test_bad_budgets_raise():
    with pytest.raises(ValueError, match="budget=K"):
        Recorder("unused", budget=0)
    with pytest.raises(ValueError, match="budget=K"):
        Recorder("unused", budget=2.5)


def _synthetic_step(path, budget, step=3):
    """Two passes of one update, no model: ragged masks, tool tokens outside the loss whose ids exceed
    every loss token's, NaN entropies and weights; returns the loaded run."""
    from tokengrad.record.stats import TokenStats

    g = torch.Generator().manual_seed(11)
    n, t, v = 6, 9, 16
    with Recorder(path, budget=budget) as rec, rec.step(step) as st:
        for k in range(2):
            prob = torch.rand(n, t, generator=g).clamp_min(1e-3)  # [N, T]
            lp = prob.log().requires_grad_()
            sum_p2 = prob**2 + (1 - prob) ** 2 / (v - 1)
            ent = -(prob * prob.log()) * 3
            ent[0, 1] = float("nan")
            stats = TokenStats(
                logprob=lp.detach(),
                prob=prob,
                entropy=ent,
                sum_p2=sum_p2,
                logit_grad_unit=(1 - 2 * prob + sum_p2).sqrt(),
            )
            mask = torch.arange(t)[None] < torch.randint(3, t + 1, (n,), generator=g)[:, None]  # [N, T]
            loss_mask = mask.clone()
            loss_mask[:, 0] = False
            ids = torch.randint(0, v - 2, (n, t), generator=g)
            ids[:, 0] = v - 1  # only outside the loss: the vocab table must not index past its ids
            adv = torch.randn(n, generator=g)
            adv[1] = 0.0
            w = torch.rand(n, t, generator=g)
            w[2, 2] = float("nan")
            x = st.track(
                lp,
                token_ids=ids,
                mask=mask,
                loss_mask=loss_mask,
                advantages=adv,
                stats=stats,
                weights=w,
                clipped=torch.rand(n, t, generator=g) < 0.3,
                sample_ids=torch.arange(n) + k * n,
            )
            (-(x * adv[:, None] * w.nan_to_num()).sum()).backward()
    return load_run(path)


def test_budget_matches_a_brute_force_reference(tmp_path):
    """Kept rows: the sequences of the documented uniform draw, then the largest logit_grad_norm outside
    them; every aggregate equal to one computed row by row from the same step recorded in full."""
    full, cut = _synthetic_step(tmp_path / "full", None), _synthetic_step(tmp_path / "cut", 25)
    rows = full.tokens()
    tok = cut.tokens()
    assert len(tok) == 25 == cut.steps["n_token_rows"].iloc[0]
    # sequences: a permutation seeded by (seed, step, rank), the prefix whose rows fit half the budget
    per_seq = rows.groupby("sample_id").size()  # sorted sample ids, as torch.unique
    gen = torch.Generator().manual_seed((0 * 1_000_003 + 3) * 65_537 + 0)
    order = torch.randperm(len(per_seq), generator=gen).tolist()
    lengths = per_seq.to_numpy()[order].cumsum()
    seqs = set(per_seq.index[order][lengths <= 12])
    assert seqs and set(tok.loc[tok["selected_by"] == "sequence", "sample_id"]) == seqs
    key = ["sample_id", "position"]
    want_seq = rows[rows["sample_id"].isin(seqs)]
    rest = rows[~rows["sample_id"].isin(seqs)]
    top = rest.loc[rest["logit_grad_norm"].abs().nlargest(25 - len(want_seq)).index]
    want = {tuple(r) for r in pd.concat([want_seq, top])[key].to_numpy()}
    assert {tuple(r) for r in tok[key].to_numpy()} == want
    assert set(tok["selected_by"]) == {"sequence", "top_grad_norm"}
    # the steps table's statistics over all loss tokens
    loss = rows[rows["in_loss"]]
    got = cut.steps.iloc[0]
    assert got["n_tokens"] == len(loss) == full.steps["n_tokens"].iloc[0]
    assert got["entropy_mean"] == pytest.approx(loss["entropy"].mean())  # NaN left out
    assert got["weight_mean"] == pytest.approx(loss["weight"].mean())
    assert got["weight_min"] == loss["weight"].min() and got["weight_max"] == loss["weight"].max()
    assert got["clip_frac"] == pytest.approx(loss["clipped"].mean())
    nan_rows = int(rows["entropy"].isna().sum() + rows["weight"].isna().sum())  # the only NaN columns
    assert got["n_nonfinite"] == full.steps["n_nonfinite"].iloc[0] == nan_rows == 4
    # prob_bins: per (probability bin, advantage sign) counts and sums, NaN as 0
    b = np.clip(np.searchsorted(np.linspace(0, 1, 21)[1:-1], loss["prob"].astype(float), side="right"), 0, 19)
    sign = np.sign(loss["advantage"]).astype(int)
    ref = loss.assign(bin=b, adv_sign=sign).groupby(["bin", "adv_sign"])
    bins = cut.table("prob_bins")
    bins = bins.assign(bin=(bins["lo"].astype(float) * 20).round().astype(int)).set_index(["bin", "adv_sign"])
    bins = bins.sort_index()
    assert list(bins.index) == list(ref.size().index)
    assert (bins["n_tokens"].to_numpy() == ref.size().to_numpy()).all()
    assert np.allclose(bins["sum_entropy"], ref["entropy"].apply(lambda x: x.fillna(0).sum()))
    assert np.allclose(bins["sum_logit_grad_norm"], ref["logit_grad_norm"].sum())
    assert np.allclose(bins["sum_abs_coef"], ref["coef"].apply(lambda x: x.abs().sum()))
    # vocab: every loss token kept (16-token vocabulary), by advantage sign and probability bucket
    vocab = cut.table("vocab")
    edges = np.asarray(schema.DEFAULT_BUCKET_EDGES)
    lo = edges[np.clip(np.searchsorted(edges[1:-1], loss["prob"].astype(float), side="right"), 0, None)]
    vref = loss.assign(lo=lo, adv_sign=sign).groupby(["token_id", "adv_sign", "lo"])
    got_v = vocab.assign(lo=vocab["lo"].astype(float).round(6)).set_index(["token_id", "adv_sign", "lo"])
    got_v = got_v.sort_index()
    assert list(got_v.index) == [(t, s, round(x, 6)) for t, s, x in vref.size().index]
    assert (got_v["n_tokens"].to_numpy() == vref.size().to_numpy()).all()
    assert np.allclose(got_v["sum_prob"], vref["prob"].sum())
    assert np.allclose(got_v["sum_logit_grad_norm"], vref["logit_grad_norm"].sum())


def test_budget_work_on_cpu_tensors_runs_on_the_writer_thread(tmp_path, monkeypatch):
    """The training thread hands CPU tensors over, as when recording every row; the writer computes."""
    import threading

    from tokengrad.record.budget import kept_rows as budget_mod

    threads = []
    real = budget_mod.budget_step

    def spy(*args):
        threads.append(threading.current_thread().name)
        return real(*args)

    monkeypatch.setattr(budget_mod, "budget_step", spy)
    run = _synthetic_step(tmp_path / "r", 25)
    assert len(threads) == 1 and threads[0].startswith("tokengrad-writer")
    assert len(run.tokens()) == 25 and len(run.table("prob_bins")) > 0
