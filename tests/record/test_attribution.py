"""Per-token update shares (Recorder(attribute_every=...)) against a brute-force per-token backward."""

from __future__ import annotations

import math

import pytest
import torch
from conftest import TINY_V, forward_logprobs

from tokengrad import Recorder, load_run
from tokengrad.record import Attribution
from tokengrad.record.attribution.shares import ATTRIBUTION_METHODS, directional_logprobs


def _model(tied: bool, seed: int = 0):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    cfg = LlamaConfig(
        vocab_size=TINY_V,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
        tie_word_embeddings=tied,
    )
    return LlamaForCausalLM(cfg).float()


def _loss(lp, old, adv, mask):
    """PPO-clip surrogate, token mean: coef depends on the token through the ratio and the clip."""
    ratio = (lp - old).exp()
    surr = torch.minimum(ratio * adv[:, None], ratio.clamp(0.8, 1.2) * adv[:, None])
    return -(surr * mask).sum() / mask.sum()


def _brute(model, ids, loss_fn, g: list[torch.Tensor]) -> torch.Tensor:
    """coef_t <grad log pi_t, g> for every token by one backward per token ([N, T])."""
    params = [p for p in model.parameters() if p.requires_grad]
    lp = forward_logprobs(model, ids)[1]
    coef = torch.autograd.grad(loss_fn(lp), lp, retain_graph=True)[0]
    out = torch.zeros_like(lp)
    for i in range(lp.shape[0]):
        for j in range(lp.shape[1]):
            gr = torch.autograd.grad(lp[i, j], params, retain_graph=True, allow_unused=True)
            dot = sum(float((a.double() * b.double()).sum()) for a, b in zip(gr, g) if a is not None)
            out[i, j] = coef[i, j] * dot
    return out.detach()


def _run(tmp_path, tied, method="jvp", n_updates=2, micro=2, lr=1e-3, brute=True, **rec_kw):
    """One recorded step: n_updates AdamW updates of `micro` accumulated passes each. Returns the run,
    the brute-force [N, T] shares per (update, pass) and checks on the way."""
    model = _model(tied)
    opt = torch.optim.AdamW(model.parameters(), lr=lr)
    g = torch.Generator().manual_seed(5)
    ids = torch.randint(0, TINY_V, (4, 9), generator=g)
    mask = torch.ones(4, 8)
    mask[1, 5:] = 0
    adv = torch.tensor([1.0, -0.5, 0.25, -1.5])
    with torch.no_grad():
        old = forward_logprobs(model, ids)[1] + 0.05 * torch.randn(4, 8, generator=g)
    chunks = list(torch.arange(4).chunk(micro))
    ref, measured = {}, {}
    with Recorder(
        tmp_path / "run", model=model, attribution=Attribution(every=1, method=method), **rec_kw
    ) as rec:
        with rec.step(0) as st:
            for u in range(n_updates):
                before = {}
                for k, rows in enumerate(chunks):
                    x = ids[rows]
                    lp = forward_logprobs(model, x)[1]
                    st.track(
                        lp,
                        token_ids=x[:, 1:],
                        mask=mask[rows],
                        old_logprobs=old[rows],
                        advantages=adv[rows],
                        sample_ids=rows,
                        update_id=u,
                        recompute=lambda x=x: forward_logprobs(model, x)[1],
                    )
                    # the whole batch's token mean, split over micro-batches
                    (_loss(lp, old[rows], adv[rows], mask[rows]) * mask[rows].sum() / mask.sum()).backward()
                    before[k] = lp.detach()
                grads = [p.grad.clone() for p in model.parameters()]
                theta = [p.detach().clone() for p in model.parameters()]
                st.record_grad_norms(u)
                assert all(torch.equal(a, b) for a, b in zip(theta, model.parameters())), "theta changed"
                g_sq = sum(float(x.double().pow(2).sum()) for x in grads)
                for k, rows in enumerate(chunks) if brute else ():

                    def fn(lp, rows=rows):
                        return _loss(lp, old[rows], adv[rows], mask[rows]) * mask[rows].sum() / mask.sum()

                    ref[u, k] = (_brute(model, ids[rows], fn, grads) / g_sq, g_sq)
                opt.step()
                opt.zero_grad()
                with torch.no_grad():
                    for k, rows in enumerate(chunks):
                        measured[u, k] = forward_logprobs(model, ids[rows])[1] - before[k]
    return load_run(tmp_path / "run"), ref, measured, mask


def _grid(df, n_rows, T=8):
    out = torch.full((n_rows, T), math.nan)
    for r in df.itertuples():
        out[int(r.sample_id) % n_rows, int(r.position)] = float(r.value)
    return out


def _column(run, col, pass_id, n_rows):
    df = run.sql(f"SELECT sample_id, position, {col} AS value FROM tokens WHERE pass_id = ?", [pass_id])
    return _grid(df, n_rows)


@pytest.mark.parametrize("tied", [True, pytest.param(False, marks=pytest.mark.slow)])
def test_update_share_matches_per_token_backward(tmp_path, tied):
    run, ref, measured, mask = _run(tmp_path, tied)
    for (u, k), (share_ref, _) in ref.items():
        pass_id = u * 2 + k
        got = _column(run, "update_share", pass_id, 2)
        m = mask[k * 2 : (k + 1) * 2].bool()
        # the bound is 1e-3 of |g|^2 per token; forward-mode AD is exact to rounding
        assert torch.allclose(got[m], share_ref[m], atol=1e-5, rtol=1e-4), (u, k, got, share_ref)
    for u in range(2):  # the loss is built on log pi alone: the shares of all tokens sum to 1
        total = run.sql("SELECT sum(update_share) AS s FROM tokens WHERE update_id = ?", [u])["s"][0]
        assert total == pytest.approx(1.0, abs=1e-4)
        resid = run.buckets.query("update_id == @u and bucket == 'residual'")["update_share"].iloc[0]
        assert resid == pytest.approx(0.0, abs=1e-4)


def test_applied_update_predicted_and_measured_change(tmp_path):
    run, _, measured, mask = _run(tmp_path, tied=True, lr=1e-4, brute=False)
    for (u, k), dm in measured.items():
        m = mask[k * 2 : (k + 1) * 2].bool()
        got = _column(run, "dlogprob", u * 2 + k, 2)
        assert torch.allclose(got[m], dm[m], atol=2e-5)
        pred = _column(run, "dlogprob_pred", u * 2 + k, 2)
        # first order: the prediction misses only the second-order term, tiny at lr 1e-4
        scale = float(dm[m].abs().max())
        assert scale > 1e-4 and float((pred[m] - dm[m]).abs().max()) < 0.05 * scale


@pytest.mark.slow
def test_central_difference_within_stated_error(tmp_path):
    # against the forward-mode shares of the same step (checked against brute force above)
    run, _, _, mask = _run(tmp_path / "cd", tied=True, method="central_difference", n_updates=1, brute=False)
    ref, _, _, _ = _run(tmp_path / "jvp", tied=True, n_updates=1, brute=False)
    for k in range(2):
        m = mask[k * 2 : (k + 1) * 2].bool()
        got, want = _column(run, "update_share", k, 2), _column(ref, "update_share", k, 2)
        assert float((got[m] - want[m]).abs().max()) <= 1e-3  # the bound, fp32
        assert not torch.equal(got[m], want[m])


def test_bucket_shares_are_token_sums_and_match_exact_passes(tmp_path):
    run, _, _, _ = _run(tmp_path / "a", tied=True, n_updates=1, micro=1, brute=False)
    exact, _, _, _ = _run(tmp_path / "b", tied=True, n_updates=1, micro=1, brute=False, buckets=1)
    sums = run.buckets.set_index("bucket")["update_share"]
    ref = exact.buckets.set_index("bucket")["update_share"]
    assert sums.index.tolist() == ref.index.tolist()
    assert torch.allclose(torch.tensor(sums.to_numpy(float)), torch.tensor(ref.to_numpy(float)), atol=1e-5)
    assert run.buckets["grad_norm"].isna().all()  # norms and cosines need the exact passes


def test_directional_methods_agree_in_double_precision():
    # Llama's RMSNorm computes in fp32 whatever the model dtype, so a plain float64 network is used here
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Embedding(TINY_V, 16), torch.nn.Linear(16, 16), torch.nn.Tanh(), torch.nn.Linear(16, TINY_V)
    ).double()
    ids = torch.randint(0, TINY_V, (2, 7), generator=torch.Generator().manual_seed(2))
    v = {n: torch.randn_like(p) for n, p in model.named_parameters()}

    def lp_fn():
        return torch.log_softmax(model(ids[:, :-1]), -1).gather(2, ids[:, 1:, None]).squeeze(-1)

    lp0 = lp_fn().detach()
    outs = {m: directional_logprobs(model, lp_fn, v, m) for m in ATTRIBUTION_METHODS}
    jv = outs["jvp"][1]
    assert torch.allclose(outs["jvp"][0], lp0.float())
    assert torch.allclose(outs["central_difference"][1], jv, rtol=1e-5, atol=1e-6 * float(jv.abs().max()))
    brute = torch.stack(
        [
            torch.stack(
                [
                    sum(
                        (a * v[n]).sum()
                        for n, a in zip(v, torch.autograd.grad(lp_fn()[i, j], list(model.parameters())))
                    )
                    for j in range(6)
                ]
            )
            for i in range(2)
        ]
    )
    assert torch.allclose(jv.double(), brute, rtol=1e-5)


def test_bad_attribution_arguments(tmp_path):
    with pytest.raises(ValueError, match="attribution method"):
        Recorder(tmp_path / "x", attribution=Attribution(every=1, method="nope"))
    with pytest.raises(ValueError, match="attribution"):
        Recorder(tmp_path / "x", attribution=-1)


def test_recompute_of_another_batch_warns(tmp_path):
    model = _model(tied=True)
    ids = torch.randint(0, TINY_V, (2, 9), generator=torch.Generator().manual_seed(3))
    other = (ids + 1) % TINY_V
    with Recorder(tmp_path / "run", model=model, attribution=Attribution(every=1, applied=False)) as rec:
        with rec.step(0) as st:
            lp = forward_logprobs(model, ids)[1]
            st.track(
                lp,
                token_ids=ids[:, 1:],
                advantages=torch.tensor([1.0, -1.0]),
                recompute=lambda: forward_logprobs(model, other)[1],
            )
            (-lp.sum()).backward()
            with pytest.warns(RuntimeWarning, match="differs from the tracked"):
                st.record_grad_norms()


@pytest.mark.slow
def test_trainer_attributes_every_micro_batch_and_update_within_a_budget(tmp_path):
    from letters_task import LettersTask  # noqa: F401  (registers the task)

    from tokengrad.train.trainer import train

    run_dir = train(
        dict(
            model="tiny",
            task="letters",
            steps=2,
            prompts_per_step=2,
            group_size=2,
            max_new_tokens=8,
            lr=1e-2,
            bf16=False,
            progress=False,
            run_dir=str(tmp_path / "run"),
            attribute_every=1,
            token_budget=12,
            grad_accum=2,
            num_iterations=2,
        )
    )
    run = load_run(run_dir)
    assert run.meta["attribute_every"] == 1 and run.meta["token_budget"] == 12
    assert (run.steps["n_token_rows"] <= 12).all()
    assert run.steps["grad_norm"].tolist()[0] == 0 < run.steps["grad_norm"].tolist()[1]  # equal rewards at 0
    tok = run.tokens()
    assert tok.loc[tok["step"] == 0, "update_share"].isna().all()  # no gradient: shares undefined
    assert tok.loc[tok["step"] == 1, "update_share"].notna().all()
    assert tok.loc[tok["step"] == 1, "dlogprob"].notna().all()
    # every token of both updates counted before sampling: shares sum to 1, the residual is ~0 (no
    # loss term outside log pi at beta = 0)
    bins = run.table("prob_bins")
    per_update = bins[bins["step"] == 1].groupby("update_id")["sum_update_share"].sum()
    assert per_update.tolist() == pytest.approx([1.0, 1.0], abs=1e-3)
    resid = run.buckets.query("step == 1 and bucket == 'residual'")["update_share"]
    assert len(resid) == 2 and resid.abs().max() < 1e-3


def test_a_step_without_gradient_records_null_shares_not_nonfinite_values(tmp_path):
    """Every advantage 0: |g|^2 = 0, so each share is undefined. It is stored as null (not NaN) and the
    step's n_nonfinite stays 0, so the doctor's nonfinite detector does not call a dead step corrupt."""
    model = _model(False)
    ids = torch.randint(0, TINY_V, (4, 9), generator=torch.Generator().manual_seed(1))
    with Recorder(tmp_path / "run", model=model, attribution=Attribution(every=1)) as rec:
        with rec.step(0) as st:
            lp = forward_logprobs(model, ids)[1]
            st.track(
                lp,
                token_ids=ids[:, 1:],
                advantages=torch.zeros(4),
                sample_ids=torch.arange(4),
                recompute=lambda: forward_logprobs(model, ids)[1],
            )
            (lp * 0.0).sum().backward()
            st.record_grad_norms(0)
    run = load_run(tmp_path / "run")
    shares = run.sql("SELECT count(*) AS n, count(update_share) AS kept FROM tokens")
    assert (int(shares["n"][0]), int(shares["kept"][0])) == (32, 0)
    assert int(run.steps["n_nonfinite"][0]) == 0
