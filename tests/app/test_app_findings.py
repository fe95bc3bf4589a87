"""The findings block on the landing page and the links into the token inspector (Streamlit AppTest)."""

from __future__ import annotations

from pathlib import Path

import pytest
from doctor_runs import write_doctor_run
from streamlit.testing.v1 import AppTest
from test_doctor import kl, spike

from tokengrad.read import served_root

APP = Path(__file__).resolve().parents[2] / "tokengrad" / "app" / "streamlit_app.py"


@pytest.fixture(scope="module")
def root(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("findings")
    write_doctor_run(root / "spike", edit=spike)
    write_doctor_run(root / "kl", edit=kl)
    return root


def _app(root: Path, monkeypatch, **query) -> AppTest:
    monkeypatch.setenv(served_root.ENV_ROOT, str(root))
    at = AppTest.from_file(str(APP), default_timeout=60)
    for k, v in query.items():
        at.query_params[k] = v
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    return at


def test_landing_page_lists_the_findings_critical_first(root, monkeypatch):
    at = _app(root, monkeypatch)
    text = " ".join(m.value for m in at.markdown)
    assert "**gradient_spike** · spike · step 42" in text and "**kl_blowup** · kl · steps 40-59" in text
    assert "2 critical" in " ".join(c.value for c in at.caption)
    first = next(m.value for m in at.markdown if "badge[" in m.value)
    assert first.startswith(":red-badge[critical]")


def test_open_goes_to_the_step_and_sample_of_the_culprit_tokens(root, monkeypatch):
    at = _app(root, monkeypatch, runs="spike")
    at.button(key="fd_open_0").click().run()
    assert not at.exception, [e.value for e in at.exception]
    assert at.session_state["in_step"] == 42
    assert at.selectbox(key="in_sample_42").value == 3  # sample 3 holds the three culprit tokens


def test_a_printed_link_opens_the_same_view(root, monkeypatch):
    monkeypatch.setenv(served_root.ENV_ROOT, str(root))
    at = AppTest.from_file(str(APP), default_timeout=60)
    for k, v in {"runs": "spike", "step": "42", "sample": "3"}.items():
        at.query_params[k] = v
    at.run()
    at.switch_page("views/inspector.py").run()
    assert not at.exception, [e.value for e in at.exception]
    assert at.session_state["in_step"] == 42 and at.selectbox(key="in_sample_42").value == 3
