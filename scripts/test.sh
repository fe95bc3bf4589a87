#!/usr/bin/env bash
# Set up (idempotent) and run the whole test suite: ruff, the default (fast, offline) tier, then the tests marked
# slow, torchrun, browser or subprocess once (pyproject.toml [tool.pytest.ini_options] lists the tiers), the TRL
# tests with the oldest tested TRL (.venv-trl-oldest, scripts/trl_oldest_env.sh), then verl's tests in their
# own environment (.venv-verl, built by scripts/verl_env.sh; docs/verl.md says why).
set -euo pipefail
export DS_ACCELERATOR=${DS_ACCELERATOR:-cpu}  # DeepSpeed otherwise prints its accelerator guess to stdout
cd "$(dirname "$0")/.."
# how long each stage took, printed at the end (the test command's figure in benchmarks/README.md)
STAGES=""
stage() { STAGES="$STAGES $1 $((SECONDS - T0)) s,"; T0=$SECONDS; }
T0=$SECONDS
bash scripts/setup.sh
stage setup
. .venv/bin/activate
mkdir -p artifacts
ruff check .
ruff format --check .
stage ruff
python -m pytest -q -p no:cacheprovider "$@"
stage "default tier"
python -m pytest -q -p no:cacheprovider -m "slow or torchrun or browser or subprocess" \
  --ignore=tests/integrations/trl/test_trl_deepspeed.py "$@" \
  || { rc=$?; [ "$rc" = 5 ] && echo "no tests in the second tier" || exit "$rc"; }
stage "second tier"
# DeepSpeed engines change process-wide state (ZeRO-3 swaps torch's linear for its own autograd function,
# accelerate keeps the DeepSpeed plugin): their tests get a process of their own.
python -m pytest -q -p no:cacheprovider -m "slow" tests/integrations/trl/test_trl_deepspeed.py "$@" \
  || { rc=$?; [ "$rc" = 5 ] && echo "no DeepSpeed engine tests" || exit "$rc"; }
stage deepspeed
deactivate
# The TRL tests again with the oldest TRL the `trl` extra accepts, in its own environment (.venv-trl-oldest,
# built by scripts/trl_oldest_env.sh): .venv holds the newest. Without the DeepSpeed ones (no deepspeed there).
bash scripts/trl_oldest_env.sh
stage "trl-oldest env"
# shellcheck disable=SC2046  # one test file per word
PYTHONPATH="$PWD" .venv-trl-oldest/bin/python -m pytest -q -p no:cacheprovider \
  -m "not torchrun and not browser and not subprocess" $(ls tests/integrations/trl/test_trl*.py | grep -v deepspeed) "$@" \
  || { rc=$?; [ "$rc" = 5 ] && echo "no TRL tests selected" || exit "$rc"; }
stage "trl oldest"
bash scripts/verl_env.sh
stage "verl env"
# printed before the last test run so that pytest's summary closes the output; verl's own time is in it
echo "[test] $SECONDS s before verl's tests:${STAGES%,}"
PYTHONPATH="$PWD" .venv-verl/bin/python -m pytest -q -p no:cacheprovider tests/integrations/verl/test_verl.py tests/integrations/verl/test_verl_rollout.py \
  tests/integrations/verl/test_verl_probe.py tests/integrations/verl/test_verl_conformance.py "$@"
