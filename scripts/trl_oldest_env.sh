#!/usr/bin/env bash
# Idempotent set-up of .venv-trl-oldest, the environment the TRL tests also run in with the oldest TRL release
# the `trl` extra accepts (its lower bound, e.g. trl>=1.13 gives trl==1.13.*): the main environment
# (.venv, scripts/setup.sh) holds the newest, and one environment holds one TRL. TRL 1.13 and 1.14 score
# log-probs from full logits, 1.15 on through a fused LM head; the TRL integration tells them apart by
# what each trainer has (tokengrad/integrations/trl/fused.py), and these tests check it on the old side.
#
# As scripts/verl_env.sh: the environment lives in a cache outside the clone, keyed by what decides its
# contents (the Python version, the torch pin and every requirement below), and .venv-trl-oldest links to it,
# so a fresh clone on a machine that built it before reuses it, and a change to any pin builds a new one.
# Requirements: the core dependencies, the `record` and `train` extras and the oldest TRL, from pyproject.toml;
# the test runner. TRL 1.13 itself asks for transformers>=4.56.2 and runs with the newest transformers, so
# nothing else is pinned. torch==2.13.0 (CPU wheel) goes in first and stays pinned through a constraint.
# Usage: `bash scripts/trl_oldest_env.sh` — safe to run again, also from two clones at once; prints how long
# it took. TOKENGRAD_CACHE_DIR moves the cache (default ${XDG_CACHE_HOME:-~/.cache}/tokengrad).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
TORCH_PIN=2.13.0
start=$(date +%s)

REQS=$("$PY" - "$TORCH_PIN" <<'EOF'
import re, sys, tomllib
project = tomllib.load(open("pyproject.toml", "rb"))["project"]
extras = project["optional-dependencies"]
(trl,) = [r for r in extras["trl"] if r.startswith("trl")]
lowest = re.search(r">=\s*([0-9]+\.[0-9]+)", trl)
if lowest is None:
    sys.exit(f"the trl extra {trl!r} has no >= lower bound to build the oldest environment from")
reqs = project["dependencies"] + extras["record"] + extras["train"]
reqs = [r for r in reqs if not r.startswith("tokengrad")] + ["pytest>=8", "pytest-timeout>=2.3"]
print(f"torch=={sys.argv[1]}")
print(f"trl=={lowest.group(1)}.*")
print("\n".join(sorted(set(reqs))))
EOF
)
KEY=$(printf '%s\n%s\n' "$("$PY" -c 'import sys; print(sys.version.split()[0])')" "$REQS" | sha256sum | cut -c1-12)
CACHE=${TOKENGRAD_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/tokengrad}
ENV=$CACHE/venv-trl-oldest-$KEY
mkdir -p "$CACHE"

exec 9>"$ENV.lock"  # one builder at a time; a second clone waits, then finds the environment complete
flock 9
if [ ! -f "$ENV/.complete" ]; then
  echo "[trl_oldest_env] building $ENV (key $KEY)"
  rm -rf "$ENV"
  "$PY" -m venv "$ENV"
  "$ENV/bin/pip" install -q "torch==$TORCH_PIN" 2>&1 | grep -v "^WARNING: Location" || true
  CONSTRAINTS=$(mktemp)
  trap 'rm -f "$CONSTRAINTS"' EXIT
  echo "torch==$TORCH_PIN" >"$CONSTRAINTS"
  # shellcheck disable=SC2086  # one requirement per word
  "$ENV/bin/pip" install -q -c "$CONSTRAINTS" $(echo "$REQS" | tr '\n' ' ') 2>&1 \
    | grep -v "^WARNING: Location" || true
  "$ENV/bin/python" -c "import torch, trl, transformers, pytest; print('[trl_oldest_env] trl', trl.__version__, \
'transformers', transformers.__version__, 'torch', torch.__version__)"
  touch "$ENV/.complete"
else
  echo "[trl_oldest_env] reusing $ENV"
fi
flock -u 9

if [ -d .venv-trl-oldest ] && [ ! -L .venv-trl-oldest ]; then
  rm -rf .venv-trl-oldest
fi
ln -sfn "$ENV" .venv-trl-oldest
echo "[trl_oldest_env] done in $(( $(date +%s) - start )) s"
