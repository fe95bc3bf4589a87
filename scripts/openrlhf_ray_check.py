"""Check, with a real Ray, that the OpenRLHF launcher's runtime env reaches Ray's workers: a local Ray on
CPU is started with `tokengrad.integrations.openrlhf.launch.runtime_env`, and one actor and one task report
whether tokengrad's set-up hook ran in their worker process (its finder for OpenRLHF's trainer module is on
sys.meta_path), whether $TOKENGRAD_RUN_DIR arrived, and that the hook loaded neither torch nor the recorder.

Ray is not in tokengrad's environments; put OpenRLHF's pin in a folder of its own and run:
    .venv/bin/pip install -q --target /tmp/raytgt ray==2.55.0
    PYTHONPATH=/tmp/raytgt .venv/bin/python scripts/openrlhf_ray_check.py
Exits 1 when a worker did not run the hook. (docs/openrlhf.md, "Checked with a real Ray")
"""

from __future__ import annotations

import os
import sys
import time

import ray

from tokengrad.integrations.openrlhf import TRAINER_MODULE, launch

RUN_DIR = "/tmp/tokengrad_ray_check"


def _worker_view() -> dict:
    from tokengrad.integrations.openrlhf import hooks

    return {
        "pid": os.getpid(),
        "finders": [f.name for f in sys.meta_path if isinstance(f, hooks._AfterImport)],
        "run_dir": os.environ.get("TOKENGRAD_RUN_DIR"),
        "heavy": [m for m in ("torch", "tokengrad.record") if m in sys.modules],
    }


@ray.remote
class Probe:
    def look(self) -> dict:
        return _worker_view()


@ray.remote
def probe_task() -> dict:
    return _worker_view()


def main() -> int:
    t0 = time.perf_counter()
    ray.init(
        runtime_env=launch.runtime_env({"TOKENGRAD_RUN_DIR": RUN_DIR}), num_cpus=2, include_dashboard=False
    )
    try:
        views = {"actor": ray.get(Probe.remote().look.remote()), "task": ray.get(probe_task.remote())}
    finally:
        ray.shutdown()
    ok = all(
        v["finders"] == [TRAINER_MODULE]
        and v["run_dir"] == RUN_DIR
        and not v["heavy"]
        and v["pid"] != os.getpid()
        for v in views.values()
    )
    for name, v in views.items():
        print(f"{name}: {v}")
    print(
        f"ray {ray.__version__}: the set-up hook ran in every worker: {ok} ({time.perf_counter() - t0:.1f} s)"
    )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
