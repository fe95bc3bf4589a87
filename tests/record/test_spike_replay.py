"""The exact replay of a gradient spike (Attribution(on_spike=True)): the spike step is attributed although
no schedule asks for it, and its norm without the top-k culprit tokens matches a brute-force backward of the
same loss without those tokens, on tiny random GPT-2 and Llama models (one pass, two accumulated)."""

from __future__ import annotations

import copy
import math
import warnings

import numpy as np
import pytest
import torch

transformers = pytest.importorskip("transformers")

from tokengrad.doctor import diagnose  # noqa: E402
from tokengrad.read import load_run  # noqa: E402
from tokengrad.record import Attribution, Recorder  # noqa: E402
from tokengrad.record.attribution.spike_replay import SpikeWatch, top_tokens  # noqa: E402

N, L, V = 6, 9, 48  # sequences, sequence length, vocabulary; completion = tokens 1..L-1
T = L - 1
SPIKE_STEP, STEPS, HOT = 12, 14, 3  # the step whose sample HOT gets a 300x advantage


def tiny(arch: str) -> torch.nn.Module:
    torch.manual_seed(0)
    if arch == "gpt2":
        cfg = transformers.GPT2Config(
            vocab_size=V, n_positions=16, n_embd=32, n_layer=2, n_head=2, resid_pdrop=0.0,
            embd_pdrop=0.0, attn_pdrop=0.0,
        )  # fmt: skip
        model = transformers.GPT2LMHeadModel(cfg)
    else:
        cfg = transformers.LlamaConfig(
            vocab_size=V, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
            num_key_value_heads=1, max_position_embeddings=16,
        )  # fmt: skip
        model = transformers.LlamaForCausalLM(cfg)
    return model.float().train()


def logprobs(model, ids: torch.Tensor) -> torch.Tensor:
    lp = torch.log_softmax(model(input_ids=ids).logits[:, :-1].float(), -1)  # [n, T, V]
    return lp.gather(-1, ids[:, 1:, None]).squeeze(-1)  # [n, T]


def loss_of(lp, adv, keep=None) -> torch.Tensor:
    """-(A lp) summed over tokens, over a fixed count (Dr. GRPO's constant normaliser): masking tokens out
    leaves the others' coefficients alone."""
    w = adv[:, None].expand_as(lp) if keep is None else adv[:, None] * keep
    return -(w * lp).sum() / (N * T)


def batch(step: int):
    g = torch.Generator().manual_seed(100 + step)
    ids = torch.randint(0, V, (N, L), generator=g)
    adv = torch.randn(N, generator=g)
    if step == SPIKE_STEP:
        adv[HOT] = 300.0
    return ids, adv


def run_loop(tmp_path, arch: str, passes: int):
    """A plain loop: one update per step from `passes` accumulated micro-batches; the model and batch of the
    spike step are kept (before its optimizer step) for the brute force."""
    model = tiny(arch)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    rows = np.array_split(np.arange(N), passes)
    kept = None
    with Recorder(tmp_path / arch, model=model, attribution=Attribution(on_spike=True)) as rec:
        for step in range(STEPS):
            ids, adv = batch(step)
            with rec.step(step) as st:
                for r in rows:
                    r = torch.as_tensor(r)
                    lp = logprobs(model, ids[r])
                    st.track(
                        lp, token_ids=ids[r, 1:], advantages=adv[r], sample_ids=r,
                        recompute=lambda r=r: logprobs(model, ids[r]),
                    )  # fmt: skip
                    st.backward(loss_of(lp, adv[r]))
                st.record_grad_norms()
                if step == SPIKE_STEP:
                    kept = copy.deepcopy(model), ids, adv
                opt.step()
                opt.zero_grad()
    return load_run(tmp_path / arch), kept


def brute_norm(model, ids, adv, remove: list[tuple[int, int]]) -> float:
    """|grad| of the whole batch's loss with the tokens `remove` ((sample, position)) masked out."""
    keep = torch.ones(N, T)
    for n, t in remove:
        keep[n, t] = 0.0
    model.zero_grad()
    loss_of(logprobs(model, ids), adv, keep).backward()
    return math.sqrt(
        sum(float(p.grad.double().pow(2).sum()) for p in model.parameters() if p.grad is not None)
    )


@pytest.mark.parametrize("arch,passes", [("gpt2", 1), ("llama", 2)])
def test_replay_matches_brute_force_backward(tmp_path, arch, passes):
    run, (model, ids, adv) = run_loop(tmp_path, arch, passes)
    steps = run.steps.set_index("step")
    # only the spike step was flagged and attributed: spike_z and the replay columns there, nowhere else
    assert steps["spike_z"].notna().tolist() == [s == SPIKE_STEP for s in range(STEPS)]
    assert steps.loc[SPIKE_STEP, "spike_z"] > 3.5
    tok = run.tokens(columns=["step", "sample_id", "position", "update_share"])
    attributed = sorted(tok.loc[tok["update_share"].notna(), "step"].unique())
    assert attributed == [SPIKE_STEP]
    at = tok[tok["step"] == SPIKE_STEP].assign(a=lambda d: d["update_share"].abs())
    at = at.sort_values(["a", "sample_id", "position"], ascending=[False, True, True])
    full = brute_norm(model, ids, adv, [])
    assert steps.loc[SPIKE_STEP, "grad_norm"] == pytest.approx(full, rel=1e-5)
    for k in (1, 5, 20):
        top = list(zip(at["sample_id"].head(k), at["position"].head(k)))
        want = brute_norm(model, ids, adv, top)
        got = steps.loc[SPIKE_STEP, f"grad_norm_without_top{k}"]
        assert got == pytest.approx(want, rel=1e-4, abs=1e-7), (k, got, want)
    # the culprits are the hot sample's tokens: removing 20 tokens takes most of the norm
    assert set(at["sample_id"].head(5)) == {HOT}
    assert steps.loc[SPIKE_STEP, "grad_norm_without_top20"] < 0.5 * full
    assert (
        steps.loc[SPIKE_STEP, "grad_norm_without_top1"]
        > steps.loc[SPIKE_STEP, "grad_norm_without_top5"]
        > steps.loc[SPIKE_STEP, "grad_norm_without_top20"]
    )


def test_the_spike_finding_says_the_norm_without_its_tokens(tmp_path):
    run, _ = run_loop(tmp_path, "gpt2", 1)
    spikes = [f for f in diagnose(run.path) if f.id == "gradient_spike" and f.first_step == SPIKE_STEP]
    assert len(spikes) == 1
    f = spikes[0]
    at = run.steps.set_index("step").loc[SPIKE_STEP]
    without, full = at["grad_norm_without_top5"], at["grad_norm"]
    said = f"without its top 5 culprit tokens the step's gradient norm is {without:.3g}, not {full:.3g}"
    assert said in f.message
    assert (
        f"top 1: {at['grad_norm_without_top1']:.3g}, top 20: {at['grad_norm_without_top20']:.3g}" in f.message
    )
    assert f.evidence["values"]["grad_norm_without_top5"] == pytest.approx(without)
    assert f.tokens[0].exact and f.tokens[0].sample_id == HOT


def test_spike_watch_follows_the_doctors_rule():
    w = SpikeWatch()
    for x in [1.0, 1.1, 0.9, 1.0, 1.2, 0.8, 1.0, 1.05, 0.95, 1.0]:
        assert math.isnan(w.z(5.0))  # no reference before 10 steps with a gradient
        w.add(x)
    w.add(0.0)  # a step without gradient is no reference
    assert len(w.norms) == 10
    # median 1.0, MAD 0.05: z = 0.6745 * (x - 1) / 0.05
    assert w.z(1.3) == pytest.approx(0.6745 * 0.3 / 0.05)
    assert w.flags(1.2)[0] is False and w.flags(1.3)[0] is True  # z 2.70 vs 4.05 against 3.5


def test_top_tokens_orders_by_absolute_share_then_sample_and_position():
    class P:
        def __init__(self, pid, share, sids):
            self.pass_id, self.sample_ids = pid, torch.tensor(sids)
            self.tensors = {"update_share": torch.tensor(share)}
            self.in_loss = torch.ones(len(share), len(share[0]), dtype=torch.bool)
            self.coef = torch.ones(len(share), len(share[0]))

    a = P(0, [[0.1, -0.5], [0.3, float("nan")]], [4, 2])
    b = P(1, [[0.5, 0.05]], [1])
    got = [(p.pass_id, n, t) for p, n, t in top_tokens([a, b], 3)]
    # |0.5| twice: sample 1 (pass b) before sample 4; then 0.3 (sample 2); NaN shares never count
    assert got == [(1, 0, 0), (0, 0, 1), (0, 1, 0)]


def test_on_spike_needs_a_bool():
    with pytest.raises(ValueError, match="on_spike must be True or False"):
        Attribution(on_spike="yes")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert Attribution(on_spike=True).every == 0
