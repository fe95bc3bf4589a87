"""The import rules of the layered layout, in one table. Read statically by tests/test_layers.py (every
import statement of every module, nested ones included) and checked again in fresh interpreters.

Layers, bottom up:
  ground        tokengrad.schema, registry, faults, _version: the run-format contract and its helpers
  read          tokengrad.read: run directories as pandas / DuckDB (never torch)
  objective     tokengrad.objective: the GRPO objective as pure tensor math
  record        tokengrad.record: recording (torch); writes files through read.layout, the one module that
                knows the file layout. Its face (the package, Recorder, the step handle and its host
                verbs, the option groups) sits on its wings (buckets/, attribution/, budget/, store/),
                which never import the face
  train         tokengrad.train: the built-in trainer
  integrations  tokengrad.integrations: other trainers (TRL, verl) and trackers; never the built-in trainer
  figures       tokengrad.figures: pure Plotly builders (never torch)
  doctor        tokengrad.doctor: findings on runs, read through read/ (never torch); record/ may start its
                live runner (tokengrad.doctor.live), which loads the detectors on its own thread, and reads
                the spike rule (tokengrad.doctor.spike_rule, numpy only) for on-spike attribution
  cli, app      the entry points: the `tokengrad` command and the Streamlit app
"""

from __future__ import annotations

GROUND = ["tokengrad.schema", "tokengrad.registry", "tokengrad.faults", "tokengrad._version"]
READ = ["tokengrad.read"]
OBJECTIVE = ["tokengrad.objective"]
RECORD = ["tokengrad.record"]
# read/ modules record/ shares: the files it writes and reads back, the GPT-2 byte table of token texts,
# the bucket URLs and filesystems a run in a bucket is written through
LAYOUT = [
    "tokengrad.read.layout",
    "tokengrad.read.claim_file",
    "tokengrad.read.byte_table",
    "tokengrad.read.remote",
]
TRAIN = ["tokengrad.train"]
INTEGRATIONS = ["tokengrad.integrations"]
FIGURES = ["tokengrad.figures"]
DOCTOR = ["tokengrad.doctor"]
IMPORTERS = ["tokengrad.importers"]
# record/'s wings and its face: a wing may import other wings and record/'s shared modules, never the face
RECORD_WINGS = [f"tokengrad.record.{w}" for w in ("buckets", "attribution", "budget", "store")]
RECORD_FACE = ["tokengrad.record"] + [
    f"tokengrad.record.{m}" for m in ("recorder", "step_recorder", "host", "options", "buckets.passes")
]
FACE = "tokengrad"  # the package face: lazy names only, imported by nothing inside the package

# module prefix -> tokengrad modules it may import (by prefix). The longest matching prefix wins.
ALLOWED = {
    "tokengrad.schema": ["tokengrad.schema"],
    "tokengrad.registry": [],
    "tokengrad.faults": [],
    "tokengrad._version": [],
    "tokengrad.read": GROUND + READ,
    "tokengrad.objective": GROUND + OBJECTIVE,
    # doctor.live only when doctor= is set; doctor.spike_rule (numpy only) for Attribution(on_spike=True)
    "tokengrad.record": GROUND + LAYOUT + RECORD + ["tokengrad.doctor.live", "tokengrad.doctor.spike_rule"],
    # what-if updates evaluate the weighting rules of objective/ on the recorded passes
    "tokengrad.record.buckets.whatif": GROUND + LAYOUT + RECORD + OBJECTIVE,
    # train reads its own run's metadata back (resume) through read/'s one reader of meta.json
    "tokengrad.train": GROUND + OBJECTIVE + RECORD + TRAIN + ["tokengrad.read.meta_file"],
    "tokengrad.integrations": GROUND + OBJECTIVE + RECORD + INTEGRATIONS + READ,
    "tokengrad.figures": GROUND + READ + FIGURES,
    "tokengrad.doctor": GROUND + READ + DOCTOR,
    # importers: other frameworks' dumps written through record/'s writer (never the trainer or the app)
    "tokengrad.importers": GROUND + OBJECTIVE + RECORD + READ + IMPORTERS,
    "tokengrad.cli": GROUND + READ + FIGURES + TRAIN + INTEGRATIONS + DOCTOR + IMPORTERS + ["tokengrad.cli"],
    "tokengrad.app": GROUND + READ + FIGURES + DOCTOR + ["tokengrad.app"],
}

# module prefix -> third-party packages it must never import (statically, anywhere in the module)
THIRD_PARTY_FORBIDDEN = {
    "tokengrad.schema": ["torch", "pandas", "plotly", "streamlit"],
    "tokengrad.registry": ["torch", "pandas", "pyarrow", "plotly"],
    "tokengrad.read": ["torch", "plotly", "streamlit", "transformers", "trl"],
    "tokengrad.objective": ["transformers", "plotly", "streamlit", "trl", "pandas", "duckdb"],
    "tokengrad.record": ["plotly", "streamlit", "trl"],
    "tokengrad.train": ["plotly", "streamlit", "trl"],
    "tokengrad.figures": ["torch", "streamlit", "transformers", "trl"],
    "tokengrad.doctor": ["torch", "plotly", "streamlit", "transformers", "trl"],
    "tokengrad.importers": ["plotly", "streamlit", "transformers", "trl"],
    "tokengrad.app": ["torch", "transformers", "trl"],
}

# Fresh-interpreter check: module imported -> module prefixes that must not be loaded afterwards (what the
# static table cannot see: lazy imports through importlib, and what third-party packages pull in).
DATA_LAYER_FORBIDDEN = [
    "torch",
    "plotly",
    "streamlit",
    "tokengrad.record",
    "tokengrad.train",
    "tokengrad.figures",
]
LOADED_FORBIDDEN = {
    "tokengrad": ["torch", "plotly", "streamlit", "tokengrad.record", "tokengrad.train", "tokengrad.figures"],
    "tokengrad.schema": ["torch", "plotly", "streamlit", "pandas", "tokengrad.read"],
    "tokengrad.registry": ["torch", "plotly", "pandas", "pyarrow"],
    "tokengrad.read": DATA_LAYER_FORBIDDEN,
    "tokengrad.read.runs": DATA_LAYER_FORBIDDEN,
    "tokengrad.read.duck": DATA_LAYER_FORBIDDEN + ["pandas"],
    "tokengrad.read.queries": DATA_LAYER_FORBIDDEN,
    "tokengrad.read.gradient_shares": DATA_LAYER_FORBIDDEN,
    "tokengrad.read.share_queries": DATA_LAYER_FORBIDDEN,
    "tokengrad.read.rollout_queries": DATA_LAYER_FORBIDDEN,
    "tokengrad.read.entropy_queries": DATA_LAYER_FORBIDDEN,
    "tokengrad.read.layout": DATA_LAYER_FORBIDDEN + ["pandas", "duckdb"],
    "tokengrad.read.claim_file": DATA_LAYER_FORBIDDEN + ["pandas", "duckdb"],
    "tokengrad.read.remote": DATA_LAYER_FORBIDDEN + ["pandas", "duckdb"],
    "tokengrad.doctor": DATA_LAYER_FORBIDDEN + ["pandas", "duckdb", "scipy"],
    "tokengrad.doctor.engine": DATA_LAYER_FORBIDDEN + ["tokengrad.integrations"],
    "tokengrad.record": [
        "tokengrad.train",
        "tokengrad.figures",
        "tokengrad.integrations",
        "plotly",
        "streamlit",
        "trl",
        "tokengrad.app",
        "pandas",
        "duckdb",
    ],
    "tokengrad.objective.weighting": [
        "transformers",
        "plotly",
        "streamlit",
        "tokengrad.figures",
        "trl",
        "tokengrad.record",
    ],
    "tokengrad.figures": [
        "torch",
        "tokengrad.record",
        "tokengrad.train",
        "tokengrad.integrations",
        "streamlit",
    ],
    "tokengrad.figures.export": ["torch", "tokengrad.record", "tokengrad.train", "streamlit"],
    "tokengrad.train": ["tokengrad.figures", "plotly", "streamlit", "tokengrad.app", "trl"],
    "tokengrad.train.trainer": ["tokengrad.figures", "plotly", "streamlit", "tokengrad.app", "trl"],
    "tokengrad.integrations.trl": [
        "tokengrad.train",
        "tokengrad.figures",
        "plotly",
        "streamlit",
        "tokengrad.app",
    ],
    "tokengrad.cli": ["torch", "plotly", "streamlit", "tokengrad.record", "tokengrad.train"],
    "tokengrad.importers": [
        "tokengrad.train",
        "tokengrad.figures",
        "plotly",
        "streamlit",
        "tokengrad.app",
        "trl",
    ],
}


def rule_for(module: str, table: dict) -> list[str] | None:
    """The entry of the longest prefix of `module` in `table` (None if no prefix matches)."""
    best = None
    for prefix in table:
        if matches(module, prefix) and (best is None or len(prefix) > len(best)):
            best = prefix
    return None if best is None else table[best]


def matches(name: str, prefix: str) -> bool:
    return name == prefix or name.startswith(prefix + ".")
