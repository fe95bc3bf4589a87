"""A token's share of its step, one definition for the inspector and the doctor (tokengrad.read.token_shares);
a run named by its folder; spike cards that name one sample; footnotes that say how a share was computed."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import numpy as np
import pytest
from streamlit.testing.v1 import AppTest

from tokengrad.doctor.culprits import culprits
from tokengrad.doctor.engine import diagnose
from tokengrad.doctor.finding import TokenEvidence, share_note
from tokengrad.doctor.links import dashboard_query
from tokengrad.doctor.view import RunView
from tokengrad.read import served_root
from tokengrad.read.queries import top_samples, top_tokens
from tokengrad.read.runs import load_run
from tokengrad.read.token_shares import step_updates, token_shares

REPO = Path(__file__).resolve().parents[2]
RUNS = REPO / "sample_runs"
APP = REPO / "tokengrad" / "app" / "streamlit_app.py"
pytestmark = pytest.mark.skipif(
    not (RUNS / "lab_ar_lopti" / "meta.json").exists(), reason="sample_runs/ not generated yet"
)
SPIKE = 97  # lab_ar_lopti's largest spike; its culprit (sample 37, position 2) trained in Lopti phase 0


def _own(run, step: int, update_id: int | None = None):
    """The step's in-loss rows, read whole: the shares computed here without the query under test."""
    df = run.tokens(steps=(step, step), where="in_loss")
    return df if update_id is None else df[df["update_id"] == update_id]


def test_inspector_default_share_is_the_doctors_and_an_update_its_own():
    run = load_run(RUNS / "lab_ar_lopti")
    ups = step_updates(run, SPIKE)
    assert list(ups["update_id"]) == [0, 1] and list(ups["n_loss"]) == [16, 332]  # 16 of 348 in phase 0
    rows = _own(run, SPIKE).set_index(["sample_id", "position"])
    want = rows.loc[(37, 2), "logit_grad_norm"] / rows["logit_grad_norm"].sum()
    phase0 = _own(run, SPIKE, 0)
    want0 = rows.loc[(37, 2), "logit_grad_norm"] / phase0["logit_grad_norm"].sum()
    assert want == pytest.approx(0.0905, abs=5e-4) and want0 == pytest.approx(0.153, abs=5e-4)
    doctor = culprits(RunView(run), SPIKE)[0]
    assert (doctor.sample_id, doctor.position) == (37, 2) and doctor.share == pytest.approx(want, rel=1e-6)
    step = top_tokens(run, SPIKE, k=3)
    assert (step["sample_id"].iloc[0], step["position"].iloc[0]) == (37, 2)
    assert step["share"].iloc[0] == pytest.approx(want, rel=1e-6) and step["updates"].iloc[0] == "0"
    assert top_tokens(run, SPIKE, k=1, update_id=0)["share"].iloc[0] == pytest.approx(want0, rel=1e-6)
    # a completion's share is the sum of its tokens' shares, of the step or of the update
    samples = top_samples(run, SPIKE, k=100).set_index("sample_id")
    per_sample = rows["logit_grad_norm"].groupby(level="sample_id").sum() / rows["logit_grad_norm"].sum()
    np.testing.assert_allclose(samples.loc[per_sample.index, "share"], per_sample, rtol=1e-6)


def test_the_steps_update_share_pools_its_updates_by_their_squared_norm():
    run = load_run(RUNS / "lab_kk_ar_lopti")
    step = 60  # an attribution step with two Lopti phases
    rows = _own(run, step).dropna(subset=["update_share"])
    lay = run.layers[(run.layers["step"] == step) & (run.layers["layer"] == "total")]
    sq = lay.groupby("update_id")["grad_norm"].max() ** 2
    rows = rows.assign(w=rows["update_share"] * rows["update_id"].map(sq) / sq.sum())
    want = rows.groupby(["sample_id", "position"])["w"].sum()
    got = token_shares(run, step, value="update_share").set_index(["sample_id", "position"])["share"]
    np.testing.assert_allclose(got.loc[want.index], want, rtol=1e-5, atol=1e-9)
    one = token_shares(run, step, value="update_share", update_id=1).set_index(["sample_id", "position"])
    own1 = rows[rows["update_id"] == 1].set_index(["sample_id", "position"])["update_share"]
    np.testing.assert_allclose(one.loc[own1.index, "share"], own1, rtol=1e-6)  # an update: its own share
    doctor = culprits(RunView(run), step, k=3)
    assert all(t.exact for t in doctor)
    np.testing.assert_allclose([t.share for t in doctor], got.abs().nlargest(3).to_numpy(), rtol=1e-6)


def _share_of(at: AppTest, sample: int, position: int) -> float:
    table = next(d.value for d in at.dataframe if "updates" in d.value.columns)
    hit = table[(table["sample_id"] == sample) & (table["position"] == position)]
    return float(hit["share"].iloc[0])


def test_inspector_shows_the_step_by_default_and_an_update_on_demand(monkeypatch):
    monkeypatch.setenv(served_root.ENV_ROOT, str(RUNS))
    at = AppTest.from_file(str(APP), default_timeout=60)
    at.query_params.update({"runs": "lab_ar_lopti", "step": str(SPIKE)})
    at.run()
    at.switch_page("views/inspector.py").run()
    assert not at.exception, [e.value for e in at.exception]
    radio = at.radio(key=f"in_update_{SPIKE}")
    assert radio.value is None and radio.options[1].startswith("update 0: 16 of the step's 348 loss tokens")
    doctor = next(
        f for f in diagnose(RUNS / "lab_ar_lopti", only=["gradient_spike"]) if f.first_step == SPIKE
    )
    top = next(t for t in doctor.tokens if (t.sample_id, t.position) == (37, 2))
    assert _share_of(at, 37, 2) == pytest.approx(top.share, rel=1e-6)
    radio.set_value(0).run()
    assert not at.exception, [e.value for e in at.exception]
    assert _share_of(at, 37, 2) == pytest.approx(0.153, abs=5e-4)
    labels = at.selectbox(key=f"in_sample_{SPIKE}").options  # the completions, ranked by that share
    assert labels and all("share of update 0" in label for label in labels)


def test_every_spike_card_names_one_sample_in_headline_list_and_link():
    checked = 0
    for name in ("lab_ar_lopti", "lab_kk_ar_lopti", "lab_kk_tr_grpo"):
        for f in diagnose(RUNS / name, only=["gradient_spike"]):
            named = int(re.search(r"of sample (\d+)", f.message).group(1))
            assert f.tokens[0].sample_id == named, f.message
            assert dashboard_query(f)["sample"] == str(named), f.message
            checked += 1
    assert checked >= 8  # lab_ar_lopti step 15 named sample 25 but linked sample 36 before


def test_a_copied_run_folder_is_named_and_opened_as_itself(tmp_path, monkeypatch):
    copy = tmp_path / "lab_grpo_copy"
    shutil.copytree(RUNS / "lab_grpo", copy)
    shutil.copytree(RUNS / "lab_grpo", tmp_path / "lab_grpo")
    run = load_run(copy)
    assert (run.name, run.meta_name) == ("lab_grpo_copy", "lab_grpo")
    assert run.label == "lab_grpo_copy (run_name lab_grpo)"
    f = diagnose(copy, only=["gradient_spike"])[0]
    assert f.run == "lab_grpo_copy" and dashboard_query(f)["runs"] == "lab_grpo_copy"
    monkeypatch.setenv(served_root.ENV_ROOT, str(tmp_path))
    at = AppTest.from_file(str(APP), default_timeout=60)
    at.query_params["runs"] = "lab_grpo_copy"
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    cards = [m.value for m in at.markdown if "**gradient_spike**" in m.value]
    assert cards and all("lab_grpo_copy (run_name lab_grpo)" in c for c in cards)
    assert at.dataframe[0].value["run"].tolist() == ["lab_grpo_copy (run_name lab_grpo)"]
    at.button(key="fd_open_0").click().run()
    assert at.session_state["in_run"] == str(copy)


def test_footnotes_say_how_each_share_was_computed():
    estimate = diagnose(RUNS / "lab_ar_lopti", only=["gradient_spike"])[0]
    exact = next(f for f in diagnose(RUNS / "lab_kk_tr_grpo", only=["gradient_spike"]) if f.first_step == 40)
    assert share_note(estimate.tokens).startswith("token shares: estimate: share of the step's summed")
    assert share_note(exact.tokens).startswith("token shares: exact share of the update")
    assert estimate.evidence["token_shares"] == share_note(estimate.tokens)
    assert share_note([t.as_dict() if hasattr(t, "as_dict") else vars(t) for t in exact.tokens]) == (
        share_note(exact.tokens)
    )
    # example samples without a share get no footnote (it said "estimated (logit-gradient norms)")
    collapse = diagnose(RUNS / "lab_kk_grpo", only=["advantage_collapse"])[0]
    assert collapse.tokens and share_note(collapse.tokens) == ""
    assert share_note([TokenEvidence(step=0, share=0.5, share_of="count", exact=True)]).startswith(
        "token shares: exact: share of"
    )
    with pytest.raises(ValueError, match="exact=False"):
        TokenEvidence(step=0, share=0.5, share_of="logit_grad_norm", exact=True)
