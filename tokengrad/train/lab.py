"""The CPU lab models: tiny Llamas with word-level tokenizers, warm-started by the project's own SFT.

    model, tok = load_model("lab-add")     # offline: the weights ship in the package (tokengrad/assets/)
    python scripts/make_lab_model.py       # rebuilds them (fixed seed, about two minutes on two cores)

A lab model is a "model organism" for GRPO (docs/study.md): small enough that a 200-step run takes minutes
on a CPU, started from partial competence so that RL has both signal and room. `lab-add` answers the
`lab_add` task (compact 4-digit addition) after supervised training on a sloppy-carry teacher
(tokengrad.train.tasks.lab_add.sloppy_sum), which leaves it at partial accuracy that RL can raise.
`lab-kk` answers the `lab_kk` task (Knights & Knaves with a plain-word trace) after supervised training on a
teacher that overlooks each contradiction with probability 0.6 (tokengrad.train.tasks.lab_kk.trace);
`--organism kk` builds it.
"""

from __future__ import annotations

from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

ASSETS = Path(__file__).resolve().parents[1] / "assets"
SPECIAL = {"pad": "<pad>", "bos": "<s>", "eos": "</s>", "unk": "<unk>"}
ADD_WORDS = tuple("0123456789") + ("+", "=")
# ~0.85 M parameters: big enough to learn 4-digit addition with carries, small enough for 0.1 s RL steps.
ADD_CONFIG = dict(
    hidden_size=128,
    intermediate_size=384,
    num_hidden_layers=4,
    num_attention_heads=4,
    num_key_value_heads=4,
    max_position_embeddings=64,
    tie_word_embeddings=True,
)
# `lab-kk`: the K&K trace task's words (tokengrad.train.tasks.lab_kk); prompt and trace words alike.
KK_WORDS = ("A", "B", "C", "D", "E", "says", "is", "a", "not", "knight", "knave", "and", "or", "If", "then")
KK_WORDS += ("if", "only", ".", "try", "lies", "truthful", "ok", "so", "yes", "no", "true", "false", "iff")
# lab-add's shape (~0.86 M parameters): a 4-person prompt and faithful trace run to ~720 tokens, so width
# costs twice (hidden 192: ~2.2 s per SFT step of 64 short traces on a loaded core). Rotary positions have
# no weights: 1,024 positions cover 4-person traces.
KK_CONFIG = dict(
    hidden_size=128,
    intermediate_size=384,
    num_hidden_layers=4,
    num_attention_heads=4,
    num_key_value_heads=4,
    max_position_embeddings=1024,
    tie_word_embeddings=True,
)


def lab_dir(name: str) -> Path:
    """Where the weights and tokenizer of lab model `name` live inside the package."""
    return ASSETS / name


def make_word_tokenizer(words: tuple[str, ...]) -> PreTrainedTokenizerFast:
    """A word-level tokenizer over `words` (split on whitespace) that prepends <s> to every encoded text.

    Decoding joins tokens with single spaces, so a decoded completion reproduces the task's spaced answer
    exactly. No chat template: the trainer's prompt is the problem text plus a newline (whitespace here).
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors

    vocab = {tok: i for i, tok in enumerate([*SPECIAL.values(), *words])}
    core = Tokenizer(models.WordLevel(vocab=vocab, unk_token=SPECIAL["unk"]))
    core.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    core.decoder = decoders.WordPiece(prefix="##", cleanup=False)  # joins words with spaces
    core.post_processor = processors.TemplateProcessing(
        single=f"{SPECIAL['bos']} $A", special_tokens=[(SPECIAL["bos"], vocab[SPECIAL["bos"]])]
    )
    tok = PreTrainedTokenizerFast(tokenizer_object=core, **{f"{k}_token": v for k, v in SPECIAL.items()})
    tok.padding_side = "left"
    return tok


def make_lab_model(tok: PreTrainedTokenizerFast, seed: int, **config: int) -> LlamaForCausalLM:
    """A randomly initialised Llama over `tok`'s vocabulary; weights depend only on `seed`."""
    cfg = LlamaConfig(
        vocab_size=len(tok),
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
        **config,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = LlamaForCausalLM(cfg)
    set_generation_ids(model, tok)
    return model


def set_generation_ids(model, tok) -> None:
    """End-of-sequence and padding must be set on the generation config as well as on the tokenizer."""
    model.generation_config.pad_token_id = tok.pad_token_id
    model.generation_config.eos_token_id = tok.eos_token_id
    model.generation_config.bos_token_id = tok.bos_token_id


def save_lab_model(model, tok, name: str) -> Path:
    """Write safetensors weights, config and tokenizer to `lab_dir(name)`."""
    out = lab_dir(name)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out, safe_serialization=True)
    tok.save_pretrained(out)
    return out


def load_lab_model(name: str) -> tuple[torch.nn.Module, PreTrainedTokenizerFast]:
    """(fp32 model, tokenizer) of a shipped lab model; a missing one says how to build it."""
    path = lab_dir(name)
    if not (path / "model.safetensors").exists():
        raise ValueError(
            f"lab model {name!r} is not built: {path} has no model.safetensors; "
            "run `python scripts/make_lab_model.py`"
        )
    tok = PreTrainedTokenizerFast.from_pretrained(path)
    tok.padding_side = "left"
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    set_generation_ids(model, tok)
    return model, tok
