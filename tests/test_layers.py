"""The layered layout, enforced: each layer is imported in a fresh interpreter and must not load what sits
above it (or beside it). Layers, bottom up: schema/registry; record/ and the read side (runs, queries);
train/ and integrations/ on record/; figures/ on the read side; cli/dashboard and app/ on top."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

# The data layer (run format, queries) reads Parquet only: no torch, plotting, dashboard or training code.
DATA_LAYER_FORBIDDEN = ["torch", "plotly", "streamlit", "tokengrad.record", "tokengrad.train",
                        "tokengrad.figures"]
# module imported -> module prefixes that must not be loaded afterwards
FORBIDDEN = {
    "tokengrad.record": [
        "tokengrad.train",
        "tokengrad.figures",
        "tokengrad.integrations",
        "plotly",
        "streamlit",
        "trl",
        "app",
    ],
    "tokengrad.figures": [
        "torch",
        "tokengrad.record",
        "tokengrad.train",
        "tokengrad.integrations",
        "streamlit",
    ],
    "tokengrad.figures.export": ["torch", "tokengrad.record", "tokengrad.train", "streamlit"],
    "tokengrad.runs": DATA_LAYER_FORBIDDEN,
    "tokengrad.queries": DATA_LAYER_FORBIDDEN,
    "tokengrad.gradient_shares": DATA_LAYER_FORBIDDEN,
    "tokengrad.share_queries": DATA_LAYER_FORBIDDEN,
    "tokengrad.schema": ["torch", "plotly", "streamlit", "pandas", "tokengrad.runs"],
    "tokengrad.registry": ["torch", "plotly", "pandas", "pyarrow"],
    "tokengrad": ["torch", "plotly", "streamlit", "tokengrad.record", "tokengrad.train", "tokengrad.figures"],
    "tokengrad.train.weighting": ["transformers", "plotly", "streamlit", "tokengrad.figures", "trl"],
    "tokengrad.train": ["tokengrad.figures", "plotly", "streamlit", "app", "trl"],
    "tokengrad.train.trainer": ["tokengrad.figures", "plotly", "streamlit", "app", "trl"],
    "tokengrad.integrations.trl": ["tokengrad.figures", "plotly", "streamlit", "app"],
    "tokengrad.cli": ["torch", "plotly", "streamlit", "tokengrad.record", "tokengrad.train"],
}


def loaded_after(module: str) -> list[str]:
    code = (
        f"import importlib, json, sys; importlib.import_module({module!r}); "
        "print(json.dumps(sorted(sys.modules)))"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def _matches(name: str, prefix: str) -> bool:
    return name == prefix or name.startswith(prefix + ".")


pytestmark = pytest.mark.subprocess  # a fresh interpreter per import: scripts/test.sh runs these second


@pytest.mark.parametrize("module", sorted(FORBIDDEN))
def test_import_edges(module):
    if module == "tokengrad.integrations.trl":
        pytest.importorskip("trl")
    loaded = loaded_after(module)
    bad = sorted(n for n in loaded for p in FORBIDDEN[module] if _matches(n, p))
    assert not bad, f"importing {module} loaded {bad[:8]}"


def test_the_edge_check_sees_a_real_load():
    """The check itself can fail: importing the trainer does load record/ and torch."""
    loaded = loaded_after("tokengrad.train.trainer")
    assert "torch" in loaded and "tokengrad.record.recorder" in loaded


def test_public_imports_stay():
    code = (
        "import tokengrad; from tokengrad import Recorder, load_run, token_stats, logprobs_with_stats, "
        "list_runs;"
        "from tokengrad.record import StepRecorder; assert callable(tokengrad.train);"
        "import tokengrad.train.loss; assert callable(tokengrad.train); print('ok')"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr[-2000:]
