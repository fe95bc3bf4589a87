#!/usr/bin/env bash
# Idempotent set-up of .venv-verl, the environment verl's tests run in: verl 0.9.x pins transformers<5.11
# while the main environment (.venv, scripts/setup.sh) uses transformers 5.24 for TRL 1.16, so the two
# cannot share one environment (docs/verl.md).
#
# The environment lives in a cache outside the clone, keyed by what decides its contents (the Python
# version, the torch pin and every requirement the `verl` extra pulls in from pyproject.toml), and
# .venv-verl is a link to it: a fresh clone on a machine that built it before reuses it (a few seconds to
# install tokengrad itself, without dependencies), a change to any pin builds a new one, and a fresh
# machine builds it from scratch (about 5.5 minutes). torch==2.13.0 (CPU wheel) goes in first and stays
# pinned through a constraint, so no resolver swaps it for a CUDA build.
# Usage: `bash scripts/verl_env.sh` — safe to run again, also from two clones at once; prints how long it
# took. TOKENGRAD_CACHE_DIR moves the cache (default ${XDG_CACHE_HOME:-~/.cache}/tokengrad).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
TORCH_PIN=2.13.0
start=$(date +%s)

# The requirements (one per line) the environment is built from: the core dependencies, the `record` and
# `verl` extras (without tokengrad's references to itself), the torch pin and the test runner.
REQS=$("$PY" - "$TORCH_PIN" <<'EOF'
import sys, tomllib
project = tomllib.load(open("pyproject.toml", "rb"))["project"]
extras = project["optional-dependencies"]
reqs = project["dependencies"] + extras["record"] + extras["verl"]
reqs = [r for r in reqs if not r.startswith("tokengrad")] + ["pytest>=8", "pytest-timeout>=2.3"]
print(f"torch=={sys.argv[1]}")
print("\n".join(sorted(set(reqs))))
EOF
)
KEY=$(printf '%s\n%s\n' "$("$PY" -c 'import sys; print(sys.version.split()[0])')" "$REQS" | sha256sum | cut -c1-12)
CACHE=${TOKENGRAD_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/tokengrad}
ENV=$CACHE/venv-verl-$KEY
mkdir -p "$CACHE"

exec 9>"$ENV.lock"  # one builder at a time; a second clone waits, then finds the environment complete
flock 9
if [ ! -f "$ENV/.complete" ]; then
  echo "[verl_env] building $ENV (key $KEY)"
  rm -rf "$ENV"
  "$PY" -m venv "$ENV"
  "$ENV/bin/pip" install -q "torch==$TORCH_PIN" 2>&1 | grep -v "^WARNING: Location" || true
  CONSTRAINTS=$(mktemp)
  trap 'rm -f "$CONSTRAINTS"' EXIT
  echo "torch==$TORCH_PIN" >"$CONSTRAINTS"
  # shellcheck disable=SC2086  # one requirement per word
  "$ENV/bin/pip" install -q -c "$CONSTRAINTS" $(echo "$REQS" | tr '\n' ' ') 2>&1 \
    | grep -v "^WARNING: Location" || true
  "$ENV/bin/python" -c "import torch, verl, tensordict, pytest; print('[verl_env] verl', verl.__version__, 'torch', torch.__version__)"
  touch "$ENV/.complete"
else
  echo "[verl_env] reusing $ENV"
fi

# tokengrad itself, editable and without dependencies: verl loads it through its plugin entry point, so it
# must be installed, and it must be this clone's code.
SRC="$PWD $(sha256sum pyproject.toml | cut -c1-12)"
if [ "$(cat "$ENV/.tokengrad-src" 2>/dev/null)" != "$SRC" ]; then
  echo "[verl_env] installing tokengrad from $PWD (no dependencies)"
  "$ENV/bin/pip" install -q --no-deps -e . 2>&1 | grep -v "^WARNING: Location" || true
  echo "$SRC" >"$ENV/.tokengrad-src"
fi
flock -u 9

if [ -d .venv-verl ] && [ ! -L .venv-verl ]; then
  rm -rf .venv-verl  # an environment built inside the clone by an earlier version of this script
fi
ln -sfn "$ENV" .venv-verl
echo "[verl_env] done in $(( $(date +%s) - start )) s"
