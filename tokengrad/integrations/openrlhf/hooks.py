"""The Ray worker set-up hook: `install` runs in every worker process of the job (Ray's
`worker_process_setup_hook`, set by tokengrad.integrations.openrlhf.launch) and arranges for OpenRLHF's actor
trainer to be wrapped when, and only where, it is imported.

Ray imports this module in every worker of the job, vLLM engines and reward workers included, before any
actor code runs; so it imports only the standard library, and the trainer module
(`openrlhf.trainer.ray.ppo_actor`, which imports DeepSpeed and Ray) is never imported by tokengrad: a
meta-path finder waits for OpenRLHF's own import of it, in the policy actor's process, and wraps its
`ActorPPOTrainer` right after the module has run (tokengrad.integrations.openrlhf.trainer).
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
from collections.abc import Callable
from types import ModuleType

TRAINER_MODULE = "openrlhf.trainer.ray.ppo_actor"  # defines ActorPPOTrainer and the PolicyModelActor actor
HOOK = "tokengrad.integrations.openrlhf.install"  # Ray loads a string hook as module path + attribute


class _AfterImport(importlib.abc.MetaPathFinder):
    """Finds `name` through the other finders and runs `callback(module)` once its code has run."""

    def __init__(self, name: str, callback: Callable[[ModuleType], None]):
        self.name, self.callback = name, callback

    def find_spec(self, fullname, path, target=None):
        if fullname != self.name:
            return None
        spec = importlib.machinery.PathFinder.find_spec(fullname, path, target)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        run, callback = spec.loader.exec_module, self.callback

        def exec_module(module: ModuleType) -> None:
            run(module)
            callback(module)

        spec.loader.exec_module = exec_module  # this spec's loader object only: a fresh one per find
        return spec


def when_imported(name: str, callback: Callable[[ModuleType], None]) -> None:
    """Run `callback(module)` after module `name` is imported; at once if it already is. A second call for
    the same name and callback does nothing."""
    if name in sys.modules:
        callback(sys.modules[name])
        return
    for finder in sys.meta_path:
        if isinstance(finder, _AfterImport) and (finder.name, finder.callback) == (name, callback):
            return
    sys.meta_path.insert(0, _AfterImport(name, callback))


def _wrap_trainer_module(module: ModuleType) -> None:
    from tokengrad.integrations.openrlhf.trainer import wrap_trainer_module

    wrap_trainer_module(module)


def install() -> None:
    """Ray's worker_process_setup_hook: wrap OpenRLHF's ActorPPOTrainer when this process imports it."""
    when_imported(TRAINER_MODULE, _wrap_trainer_module)
