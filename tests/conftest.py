"""Shared fixtures: a tiny seeded Llama on CPU and a rollout-like batch for it; an S3-compatible server and a
fresh bucket on it (tests/bucket_server.py)."""

from __future__ import annotations

import os

import pytest
import torch
from bucket_server import bucket, s3_server  # noqa: F401 - fixtures, registered by being here


def pytest_configure(config):
    """Child Python processes the tests start (torchrun ranks, killed recorders, scripts) import the shared
    helpers and other rooms' test modules as the tests do: pyproject's pytest `pythonpath` (tests/ and its
    rooms) goes into PYTHONPATH, ahead of what was there."""
    rooms = [str(p) for p in config.getini("pythonpath")]
    repo = str(config.rootpath)
    old = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    os.environ["PYTHONPATH"] = os.pathsep.join(dict.fromkeys([repo, *rooms, *old]))


# DeepSpeed (the deepspeed extra) prints its accelerator guess to stdout on import unless told; tests and the
# processes they start parse stdout
os.environ.setdefault("DS_ACCELERATOR", "cpu")

TINY_V = 64


def make_model(vocab_size: int = TINY_V, seed: int = 0, hidden: int = 32, layers: int = 2):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    cfg = LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=hidden,
        intermediate_size=2 * hidden,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=128,
        tie_word_embeddings=True,
    )
    return LlamaForCausalLM(cfg).float()


@pytest.fixture
def tiny_model():
    return make_model()


def forward_logprobs(model, ids: torch.Tensor):
    """logits [N, T, V], per-token log-probs [N, T] (with grad) and final hidden [N, T, D] of ids[:, 1:]."""
    out = model(ids, output_hidden_states=True)
    logits = out.logits[:, :-1]  # [N, T, V]
    tgt = ids[:, 1:]  # [N, T]
    lp = torch.log_softmax(logits.float(), -1).gather(2, tgt.unsqueeze(-1)).squeeze(-1)  # [N, T]
    return logits, lp, out.hidden_states[-1][:, :-1], tgt


@pytest.fixture
def batch():
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, TINY_V, (4, 9), generator=g)  # N=4 sequences, T=8 scored tokens
    mask = torch.ones(4, 8)
    mask[1, 5:] = 0  # a shorter completion
    adv = torch.tensor([1.0, -0.5, 0.25, -1.5])  # [N]
    return ids, mask, adv
