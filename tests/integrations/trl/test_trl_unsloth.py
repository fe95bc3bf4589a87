"""Unsloth's GRPO trainer is recognised by each of its markers and refused in one line before anything is
written, and a trainer whose loss bypasses the hooked log-prob method (Unsloth's returns (None, None)) stops
training instead of writing steps without tokens. Unsloth needs CUDA and does not install here: the
stand-ins carry its markers (a generated module in unsloth_compiled_cache, the class names, the module
globals UnslothEfficientGRPO and grpo_accumulated_loss) without being subclasses of TRL's trainer."""

import sys
import types

import pytest
import torch

trl = pytest.importorskip("trl")

from test_trl import make_trainer  # noqa: E402

from tokengrad import load_run  # noqa: E402
from tokengrad.integrations import trl as tg_trl  # noqa: E402
from tokengrad.integrations.trl.unsloth import unsloth_markers  # noqa: E402

pytestmark = pytest.mark.trl

GLOBALS_SOURCE = """
import torch

class UnslothEfficientGRPO(torch.autograd.Function):
    @staticmethod
    def forward(ctx, new_logprobs, *rest):
        return new_logprobs.sum()

    @staticmethod
    def backward(ctx, grad):
        return grad


def grpo_accumulated_loss(trainer, *args, **kwargs):
    raise RuntimeError("stand-in")
"""

CLASS_SOURCE = """
class {base}:
    def _get_per_token_logps_and_entropies(self, model, input_ids, attention_mask, logits_to_keep, **kwargs):
        return None, None  # Unsloth's compute_efficient=True answer


class {name}({base}):
    pass
"""


def stand_in(monkeypatch, module: str, name: str, base: str = "_Base", with_globals: bool = True):
    """An instance of class `name` (base `base`) defined in a generated module `module`, registered in
    sys.modules as Unsloth registers its compiled trainers, with or without the loss globals."""
    mod = types.ModuleType(module)
    source = (GLOBALS_SOURCE if with_globals else "") + CLASS_SOURCE.format(base=base, name=name)
    exec(compile(source, f"<{module}>", "exec"), mod.__dict__)
    monkeypatch.setitem(sys.modules, module, mod)
    return getattr(mod, name)()


def test_unsloth_stand_in_is_refused_naming_every_marker_before_anything_is_written(monkeypatch, tmp_path):
    module = "unsloth_compiled_cache.UnslothGRPOTrainer"
    trainer = stand_in(monkeypatch, module, "UnslothGRPOTrainer", base="_UnslothGRPOTrainer")
    assert not isinstance(trainer, trl.GRPOTrainer)
    with pytest.raises(ValueError) as err:
        tg_trl.attach(trainer, tmp_path / "run")
    msg = str(err.value)
    assert "\n" not in msg and msg.startswith("attach() cannot record Unsloth's GRPO trainer (")
    for marker in (
        "class UnslothGRPOTrainer",
        "class _UnslothGRPOTrainer",
        f"module {module}",
        f"global UnslothEfficientGRPO in {module}",
        f"global grpo_accumulated_loss in {module}",
    ):
        assert marker in msg
    assert "returns (None, None)" in msg and "record an unmodified trl.GRPOTrainer" in msg
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize(
    "module, name, with_globals, expected",
    [
        ("plain_trainers", "UnslothGRPOTrainer", False, ["class UnslothGRPOTrainer"]),
        ("unsloth_compiled_cache.GRPO", "MyTrainer", False, ["module unsloth_compiled_cache.GRPO"]),
        (
            "plain_trainers",
            "MyTrainer",
            True,
            [f"global {g} in plain_trainers" for g in ("UnslothEfficientGRPO", "grpo_accumulated_loss")],
        ),
        ("plain_trainers", "MyTrainer", False, []),
    ],
)
def test_each_marker_alone_is_recognised(monkeypatch, tmp_path, module, name, with_globals, expected):
    trainer = stand_in(monkeypatch, module, name, with_globals=with_globals)
    assert unsloth_markers(trainer) == expected
    with pytest.raises(ValueError) as err:
        tg_trl.attach(trainer, tmp_path / "run")
    if expected:
        assert str(err.value).startswith("attach() cannot record Unsloth's GRPO trainer")
    else:  # no marker: the ordinary refusal of a trainer that is not TRL's
        assert str(err.value) == "attach() records a trl.GRPOTrainer, got MyTrainer"


def test_trl_subclass_named_like_unsloths_is_refused(tmp_path):
    # Unsloth rebinds trl.GRPOTrainer to its class, so isinstance passes there: the name still tells it apart
    trainer = make_trainer(tmp_path)
    trainer.__class__ = type("UnslothGRPOTrainer", (trl.GRPOTrainer,), {})
    with pytest.raises(ValueError, match=r"^attach\(\) cannot record Unsloth's GRPO trainer \(class Unsl"):
        tg_trl.attach(trainer, tmp_path / "run")


class NoneLogps(trl.GRPOTrainer):
    """Answers the training pass's log-prob call with (None, None), as Unsloth's does."""

    def _get_per_token_logps_and_entropies(self, model, *args, **kwargs):
        if torch.is_grad_enabled():
            return None, None
        return super()._get_per_token_logps_and_entropies(model, *args, **kwargs)


class LossElsewhere(trl.GRPOTrainer):
    """Builds its training loss without calling the log-prob method at all."""

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        return sum(p.sum() for p in model.parameters()) * 0.0


@pytest.mark.parametrize("cls", [NoneLogps, LossElsewhere])
def test_loss_without_hooked_logprobs_stops_training_and_writes_no_step(tmp_path, cls):
    trainer = make_trainer(tmp_path)
    trainer.__class__ = cls
    tg_trl.attach(trainer, tmp_path / "run")
    with pytest.raises(RuntimeError, match=rf"^tokengrad: {cls.__name__}\.compute_loss built the training"):
        trainer.train()
    run = load_run(tmp_path / "run")
    assert run.meta["finished"] is False
    assert len(run.steps) == 0  # the open step was dropped, not written without its tokens
    assert "compute_loss" not in vars(trainer)  # the trainer is restored
