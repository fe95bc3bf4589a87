"""How the OpenRLHF recorder reaches OpenRLHF's actors: the post-import hook (`when_imported`), Ray's
set-up hook string, the launcher's runtime env, and that the hook module loads no heavy library (Ray runs
it in every worker, vLLM engines included). None of this needs OpenRLHF itself."""

from __future__ import annotations

import importlib
import subprocess
import sys

import pytest

from tokengrad.integrations import openrlhf as tg
from tokengrad.integrations.openrlhf import hooks, launch


@pytest.fixture
def clean_import_state():
    path, meta, modules = list(sys.path), list(sys.meta_path), set(sys.modules)
    yield
    sys.path[:], sys.meta_path[:] = path, meta
    for name in set(sys.modules) - modules:
        del sys.modules[name]


def test_when_imported_runs_the_callback_after_the_module_ran(tmp_path, clean_import_state):
    pkg = tmp_path / "tg_hook_pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "trainer.py").write_text(
        "class ActorPPOTrainer:\n    def training_step(self):\n        return 1\n"
    )
    sys.path.insert(0, str(tmp_path))
    seen = []

    def callback(module):
        seen.append(module.ActorPPOTrainer.training_step(None))  # the module's code has run

    tg.when_imported("tg_hook_pkg.trainer", callback)
    tg.when_imported("tg_hook_pkg.trainer", callback)  # the same pair twice: one finder
    mine = [f for f in sys.meta_path if isinstance(f, hooks._AfterImport) and f.name == "tg_hook_pkg.trainer"]
    assert len(mine) == 1
    import tg_hook_pkg  # noqa: F401  - the parent alone does not fire it

    assert seen == []
    importlib.import_module("tg_hook_pkg.trainer")
    assert seen == [1]
    tg.when_imported("tg_hook_pkg.trainer", callback)  # already imported: at once
    assert seen == [1, 1]


def test_install_waits_for_openrlhfs_trainer_module(clean_import_state):
    assert "openrlhf.trainer.ray.ppo_actor" not in sys.modules
    tg.install()
    found = [f for f in sys.meta_path if isinstance(f, hooks._AfterImport)]
    assert [(f.name, f.callback) for f in found] == [(tg.TRAINER_MODULE, hooks._wrap_trainer_module)]
    assert "torch" not in repr(found)


def test_rays_hook_string_names_install():
    """Ray loads a string worker_process_setup_hook as `module.attribute` (the last dot splits them)."""
    module, attr = tg.HOOK.rsplit(".", 1)
    assert getattr(importlib.import_module(module), attr) is tg.install


def test_launcher_runtime_env_carries_the_hook_and_the_options():
    env = {
        "TOKENGRAD_RUN_DIR": "/shared/runs/a",
        "TOKENGRAD_TOKEN_BUDGET": "64",
        "NCCL_DEBUG": "INFO",
        "HOME": "/r",
    }
    got = launch.runtime_env(env)
    assert got["worker_process_setup_hook"] == "tokengrad.integrations.openrlhf.install"
    assert got["env_vars"] == {
        "TOKENGRAD_RUN_DIR": "/shared/runs/a",
        "TOKENGRAD_TOKEN_BUDGET": "64",
        "NCCL_DEBUG": "INFO",  # the user's value, as train_ppo_ray's own ray.init keeps it
        "TOKENIZERS_PARALLELISM": "true",
        "RAY_ENABLE_ZERO_COPY_TORCH_TENSORS": "1",
    }


@pytest.mark.subprocess
def test_the_hook_loads_only_the_standard_library():
    code = (
        "import sys, tokengrad.integrations.openrlhf as m; m.install(); "
        "heavy = ('torch', 'pyarrow', 'pandas', 'tokengrad.record', 'ray'); "
        "print(sorted(k for k in heavy if k in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]", out.stdout + out.stderr
