"""tokengrad.record.tracked_pass: st.track's arguments reach the pass by name (PassInputs, built keyword
by keyword, no locals()), and the coef hook of a TrackedPass against hand-computed gradients."""

import inspect
import warnings
from dataclasses import MISSING, fields

import pytest
import torch

from tokengrad import Recorder
from tokengrad.record import step_recorder
from tokengrad.record.step_recorder import StepRecorder
from tokengrad.record.tracked_pass import PassInputs, build_pass

NOT_INPUTS = ("self", "logprobs", "update_id", "recompute")  # st.track's own, passed to build_pass apart


def test_track_keywords_are_the_pass_inputs_with_the_same_defaults():
    params = inspect.signature(StepRecorder.track).parameters
    inputs = {f.name: f for f in fields(PassInputs)}
    assert [n for n in params if n not in NOT_INPUTS] == list(inputs)
    for name, f in inputs.items():
        assert params[name].kind is inspect.Parameter.KEYWORD_ONLY
        required = f.default is MISSING  # token_ids only
        assert params[name].default is (inspect.Parameter.empty if required else f.default)
    assert params["update_id"].default == 0 and params["recompute"].default is None


class _Captured(Exception):
    pass


def test_every_track_argument_reaches_its_own_field(tmp_path, monkeypatch):
    seen = {}

    def capture(pass_id, logprobs, inputs, *, update_id, recompute):
        seen.update(inputs=inputs, update_id=update_id, recompute=recompute)
        raise _Captured

    monkeypatch.setattr(step_recorder, "build_pass", capture)
    given = {f.name: object() for f in fields(PassInputs)}  # a distinct object per name
    with Recorder(tmp_path / "run") as rec, rec.step(0) as st:
        with pytest.raises(_Captured):
            st.track(torch.zeros(1, 1), update_id=3, recompute=lambda: None, **given)
    assert all(getattr(seen["inputs"], n) is v for n, v in given.items())
    assert seen["update_id"] == 3
    assert seen["recompute"] is None  # kept only where the step may be attributed


def test_coef_is_the_scaled_gradient_and_a_paused_backward_leaves_it():
    lp = torch.zeros(2, 3, requires_grad=True)  # [N, T]
    scale = torch.tensor([[1.0, 2.0, 3.0], [0.5, 0.0, -1.0]])  # [N, T]
    w = torch.tensor([[1.0, -1.0, 2.0], [4.0, 1.0, 0.5]])  # dL/dlp of L = sum(w * lp)
    p = build_pass(0, lp, PassInputs(token_ids=torch.zeros(2, 3, dtype=torch.long), scale_grad=scale))
    paused = [False]
    p.watch_coef(paused=lambda: paused[0])
    (w * lp).sum().backward()
    assert torch.equal(p.coef, w * scale)
    assert torch.equal(lp.grad, w * scale)  # the hook scales the gradient it passes on
    paused[0] = True
    (w * lp).sum().backward()
    assert torch.equal(p.coef, w * scale)  # a paused backward is not the loss's: coef as it was
    assert torch.equal(lp.grad, w * scale + w)  # and its gradient is not scaled
    paused[0] = False
    (2 * w * lp).sum().backward()
    assert torch.equal(p.coef, 3 * w * scale)  # summed over backwards
    p.unwatch_coef()
    (w * lp).sum().backward()
    assert torch.equal(p.coef, 3 * w * scale)  # removed: nothing added


def test_logprobs_without_grad_warn_at_the_caller(tmp_path):
    with Recorder(tmp_path / "run") as rec, rec.step(0) as st:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            st.track(torch.zeros(1, 2), token_ids=torch.zeros(1, 2, dtype=torch.long))
    [w] = [c for c in caught if "coef will be missing" in str(c.message)]
    assert w.category is RuntimeWarning and w.filename == __file__
