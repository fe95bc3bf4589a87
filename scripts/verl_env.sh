#!/usr/bin/env bash
# Idempotent set-up of .venv-verl, the environment verl's tests run in: verl 0.9.x pins transformers<5.11
# while the main environment (.venv, scripts/setup.sh) uses transformers 5.24 for TRL 1.16, so the two
# cannot share one environment (docs/verl.md). torch==2.13.0 (CPU wheel) goes in first and stays pinned
# through a constraint, so no resolver swaps it for a CUDA build; then tokengrad with its `verl` extra.
# Usage: `bash scripts/verl_env.sh` — safe to run again; prints how long it took.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
ENV=.venv-verl
start=$(date +%s)

if [ ! -x "$ENV/bin/python" ]; then
  echo "[verl_env] creating virtual environment $ENV"
  "$PY" -m venv "$ENV"
fi
. "$ENV/bin/activate"

if ! python -c "import torch" 2>/dev/null; then
  echo "[verl_env] installing torch==2.13.0 first (CPU wheel)"
  pip install -q torch==2.13.0
fi
TORCH=$(python -c 'import torch; print(torch.__version__.split("+")[0])')
CONSTRAINTS=$(mktemp)
trap 'rm -f "$CONSTRAINTS"' EXIT
echo "torch==$TORCH" >"$CONSTRAINTS"

STAMP=$ENV/.tokengrad-installed
if [ ! -f "$STAMP" ] || [ pyproject.toml -nt "$STAMP" ]; then
  echo "[verl_env] installing tokengrad[verl] with torch held at $TORCH"
  pip install -q -c "$CONSTRAINTS" -e ".[verl]" "pytest>=8" "pytest-timeout>=2.3" 2>&1 \
    | grep -v "^WARNING: Location" || true
  python -c "import tokengrad, torch, verl, tensordict; print('[verl_env] verl', verl.__version__, 'torch', torch.__version__)" \
    && touch "$STAMP"
else
  echo "[verl_env] $ENV already set up"
fi
echo "[verl_env] done in $(( $(date +%s) - start )) s"
