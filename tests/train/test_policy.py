"""The one log-prob path (tokengrad.train.policy): the model's own post-head logit transforms, temperature."""

from __future__ import annotations

import pytest
import torch
import transformers

from tokengrad.train.policy import logit_transforms, policy_forward, token_logprobs

SMALL = dict(
    vocab_size=64,
    hidden_size=16,
    intermediate_size=32,
    num_hidden_layers=1,
    num_attention_heads=2,
    num_key_value_heads=1,
    head_dim=8,
    max_position_embeddings=64,
)

# family: (config class, model class, the transform's config key and a value that changes the logits)
FAMILIES = {
    "gemma2": ("Gemma2Config", "Gemma2ForCausalLM", "final_logit_softcapping", 0.5),
    "cohere": ("CohereConfig", "CohereForCausalLM", "logit_scale", 3.0),
    "granite": ("GraniteConfig", "GraniteForCausalLM", "logits_scaling", 0.25),
}


def _tiny(family: str):
    config_cls, model_cls, key, value = FAMILIES[family]
    config = getattr(transformers, config_cls)(**SMALL, **{key: value})
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = getattr(transformers, model_cls)(config).eval()
    return model, key, value


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_policy_logits_apply_the_models_own_logit_transform(family):
    model, key, value = _tiny(family)
    assert [v for _, v in logit_transforms(model)] == [value]
    ids = torch.randint(0, 64, (2, 10), generator=torch.Generator().manual_seed(1))
    attn = torch.ones_like(ids)
    P = 4
    with torch.no_grad():
        want = model(input_ids=ids, attention_mask=attn).logits[:, P - 1 : -1]  # [2, 6, V] as generate() sees
        got, _ = policy_forward(model, ids, attn, P)
        hidden = model.get_decoder()(input_ids=ids).last_hidden_state
        raw = model.get_output_embeddings()(hidden)[:, P - 1 : -1]
    torch.testing.assert_close(got, want.float(), atol=1e-5, rtol=1e-5)
    assert (got - raw).abs().max() > 1e-2  # the transform matters for this config
    if family == "gemma2":
        assert got.abs().max() <= value + 1e-6  # soft-capped


def test_a_model_without_transforms_keeps_its_logits():
    from tokengrad.train.models import load_model

    model, _ = load_model("tiny")
    assert logit_transforms(model) == []


def test_bad_transform_value_is_refused():
    model, key, _ = _tiny("granite")
    model.config.logits_scaling = 0
    with pytest.raises(ValueError, match="logits_scaling"):
        logit_transforms(model)


def test_temperature_divides_the_fp32_logits():
    logits = torch.randn(1, 3, 7, generator=torch.Generator().manual_seed(0))
    ids = torch.tensor([[1, 4, 6]])
    forward = lambda i, a, p: (logits, torch.zeros(1, 3, 2))  # noqa: E731
    out = token_logprobs(forward, ids, attention_mask=ids, prompt_len=1, completion_ids=ids, temperature=0.5)
    want = (logits / 0.5).log_softmax(-1).gather(-1, ids[..., None])[..., 0]
    torch.testing.assert_close(out.logprobs, want)
    torch.testing.assert_close(out.stats.prob, want.exp())
    with pytest.raises(ValueError, match="temperature"):
        token_logprobs(forward, ids, attention_mask=ids, prompt_len=1, completion_ids=ids, temperature=0.0)


def _grouped_rows(vocab: int, P: int = 7, T: int = 5):
    """Six rows, two prompts of lengths 5 and 7 (left-padded to P) with three completions each of 3-5
    tokens (right-padded to T): a GRPO batch of 2 groups of 3."""
    g = torch.Generator().manual_seed(3)
    prompts = [torch.randint(1, vocab, (5,), generator=g), torch.randint(1, vocab, (7,), generator=g)]
    ids = torch.zeros(6, P + T, dtype=torch.long)
    attn = torch.zeros_like(ids)
    for i in range(6):
        p, n = prompts[i // 3], 3 + i % 3
        ids[i, P - len(p) : P], attn[i, P - len(p) : P] = p, 1
        ids[i, P : P + n], attn[i, P : P + n] = torch.randint(1, vocab, (n,), generator=g), 1
    return ids, attn, P


def test_shared_prompts_finds_each_rows_prompt():
    from tokengrad.train.prompt_sharing import shared_prompts

    ids, attn, P = _grouped_rows(64)
    first, inverse = shared_prompts(ids, attn, P)
    assert inverse.tolist() == [0, 0, 0, 1, 1, 1] and first.tolist() == [0, 3]
    order = torch.tensor([3, 0, 4, 1, 5, 2])  # interleaved groups: the first row of each prompt
    first, inverse = shared_prompts(ids[order], attn[order], P)
    assert torch.equal(ids[order][first][inverse, :P], ids[order][:, :P])
    assert first.tolist() == [1, 0] and inverse.tolist() == [1, 0, 1, 0, 1, 0]  # unique sorts the prompts
    assert shared_prompts(ids[[0, 3]], attn[[0, 3]], P) is None  # every prompt its own
    assert shared_prompts(ids, attn, 1) is None


def _forward_and_grads(model, ids, attn, P):
    model.zero_grad()
    logits, hidden = policy_forward(model, ids, attn, P)  # [n, T, V], [n, T, D]
    mask = attn[:, P:].float()
    lp = torch.log_softmax(logits, -1).gather(-1, ids[:, P:, None])[..., 0]  # [n, T]
    ((lp * mask).sum() + (hidden.pow(2).mean(-1) * mask).sum()).backward()
    return logits.detach(), hidden.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}


@pytest.mark.parametrize("family", ["llama", *sorted(FAMILIES)])
def test_shared_prompt_forward_is_the_whole_row_forward(family, monkeypatch):
    """Each distinct prompt runs once and its keys/values serve its group: logits, hidden states and the
    gradient of every parameter (through the prompt's shared activations) are those of whole rows."""
    import tokengrad.train.prompt_sharing as sharing

    if family == "llama":
        model = transformers.LlamaForCausalLM(transformers.LlamaConfig(**SMALL)).eval()
    else:
        model = _tiny(family)[0]
    ids, attn, P = _grouped_rows(64)
    calls = []
    shared = sharing._hidden_from_cache
    monkeypatch.setattr(sharing, "_hidden_from_cache", lambda *a, **k: calls.append(1) or shared(*a, **k))
    got = _forward_and_grads(model, ids, attn, P)
    assert calls == [1]  # the shared path ran
    monkeypatch.setattr(sharing, "shared_prompts", lambda *a: None)
    want = _forward_and_grads(model, ids, attn, P)
    mask = attn[:, P:].bool()
    torch.testing.assert_close(got[0][mask], want[0][mask], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(got[1][mask], want[1][mask], atol=1e-5, rtol=1e-5)
    for name, g in want[2].items():
        assert g.abs().max() > 0, name  # every parameter is reached, the prompt's too
        torch.testing.assert_close(got[2][name], g, atol=1e-5, rtol=1e-4, msg=name)


def test_gradient_checkpointing_runs_whole_rows(monkeypatch):
    import tokengrad.train.prompt_sharing as sharing

    model = transformers.LlamaForCausalLM(transformers.LlamaConfig(**SMALL))
    # transformers 5.25 renamed it activation_checkpointing_enable
    (getattr(model, "activation_checkpointing_enable", None) or model.gradient_checkpointing_enable)()
    model.train()
    monkeypatch.setattr(
        sharing, "_hidden_from_cache", lambda *a, **k: pytest.fail("shared path under checkpointing")
    )
    ids, attn, P = _grouped_rows(64)
    logits, _ = policy_forward(model, ids, attn, P)
    assert logits.shape == (6, 5, 64)
