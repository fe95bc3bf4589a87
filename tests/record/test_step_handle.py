"""The step handle's public face stays small (at most 10 methods, the ones a user's loop and the recorder's
`with` block call), and the host and bucket-pass verbs live on their two named objects."""

from __future__ import annotations

import inspect

import torch

from tokengrad.record import Recorder, StepRecorder
from tokengrad.record.buckets.passes import BucketPasses
from tokengrad.record.host import HostHooks

USER_LOOP = {
    "track",
    "backward",
    "record_grad_norms",
    "clip_grad_norm_",
    "record_prob_change",
    "log",
    "samples",
}


def public_methods(cls) -> set[str]:
    return {n for n, v in inspect.getmembers(cls, inspect.isfunction) if not n.startswith("_")}


def test_the_step_handle_has_at_most_ten_methods():
    methods = public_methods(StepRecorder)
    assert len(methods) <= 10, sorted(methods)
    assert USER_LOOP <= methods and methods - USER_LOOP == {"finish", "discard"}


def test_host_and_bucket_verbs_on_their_objects(tmp_path):
    model = torch.nn.Linear(3, 5)
    with Recorder(tmp_path / "run", model=model, buckets=1) as rec:
        with rec.step(0) as st:
            assert isinstance(st.host, HostHooks) and isinstance(st.bucket_passes, BucketPasses)
            assert st.bucket_passes.scheduled  # buckets=1: every step, and the recorder has the model
            st.host.set_loss_scale(8.0)
            assert st.loss_scale == 8.0
            st.host.add_grad_norms(2.5, {"block.0": 1.5}, update_id=0)
            assert not st.host.nonfinite()
            st.host.add_grad_norms(float("nan"), {}, update_id=1)
            assert st.host.nonfinite()
            st.bucket_passes.skip()
            assert not st.bucket_passes.scheduled
            try:
                st.host.set_loss_scale(float("inf"))
            except ValueError as e:
                assert "loss_scale" in str(e)
            else:
                raise AssertionError("an infinite loss scale was accepted")
