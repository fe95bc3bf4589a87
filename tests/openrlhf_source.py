"""OpenRLHF's own modules for the tests, loaded from the unpacked wheel scripts/openrlhf_env.sh puts in the
cache. OpenRLHF's package __init__ files import flash-attn (CUDA only), peft and the math grader's pylatexenc,
so its packages (`openrlhf.models`, `openrlhf.utils`, ...) are created empty here, pointing at their
folders, and only the modules asked for (and what they import) run: openrlhf/models/loss.py and
models/utils.py (torch, deepspeed) and trainer/ppo_utils/experience.py with utils/utils.py (torch,
transformers). The code that runs is OpenRLHF's."""

from __future__ import annotations

import importlib
import importlib.machinery
import importlib.util
import os
import sys
from importlib import metadata
from pathlib import Path

VERSION = "0.11.2"  # the version scripts/openrlhf_env.sh unpacks


def source_dir() -> Path:
    cache = os.environ.get("TOKENGRAD_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "tokengrad"
    )
    return Path(cache) / f"openrlhf-{VERSION}"


def available() -> bool:
    return (source_dir() / ".complete").is_file()


def version() -> str:
    """The unpacked wheel's version, from its own metadata."""
    (dist,) = metadata.distributions(name="openrlhf", path=[str(source_dir())])
    return dist.version


def _package(name: str) -> None:
    """`name` as a package pointing at its folder in the wheel, its __init__ not run."""
    if name in sys.modules:
        return
    folder = source_dir().joinpath(*name.split("."))
    spec = importlib.machinery.ModuleSpec(name, None, is_package=True)
    spec.submodule_search_locations = [str(folder)]
    sys.modules[name] = importlib.util.module_from_spec(spec)


def load(module: str):
    """Import OpenRLHF's `module` (e.g. "openrlhf.models.loss") from the unpacked wheel."""
    os.environ.setdefault("DS_ACCELERATOR", "cpu")  # DeepSpeed otherwise probes for CUDA and says so
    root = source_dir()
    for init in sorted(root.glob("openrlhf/**/__init__.py")):
        _package(".".join(init.parent.relative_to(root).parts))
    return importlib.import_module(module)
