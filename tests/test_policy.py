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
