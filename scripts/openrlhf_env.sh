#!/usr/bin/env bash
# Idempotent: puts OpenRLHF's source (the wheel's files, no dependencies) where tests/test_openrlhf*.py find it.
#
# OpenRLHF 0.11.2 requires ray 2.55, deepspeed 0.19.6, flash-attn 2.8.3 (CUDA only), vllm and transformers
# 5.15.0; the main environment runs transformers 5.24+ for TRL, and flash-attn does not install on a CPU
# machine. The tests need only the modules OpenRLHF's policy loss and experience live in
# (openrlhf/models/loss.py and utils.py: torch and deepspeed; openrlhf/trainer/ppo_utils/experience.py:
# transformers), which the main environment already has. So the wheel is unpacked with
# `pip install --no-deps --target` into a cache outside the clone (nothing is installed into .venv, whose
# `pip check` stays clean), and the tests load those modules from it without running the package
# __init__ files that import flash-attn and peft (docs/openrlhf.md). About 3 s with pip's cache warm.
# Usage: `bash scripts/openrlhf_env.sh`; TOKENGRAD_CACHE_DIR moves the cache (default
# ${XDG_CACHE_HOME:-~/.cache}/tokengrad). Keep VERSION equal to tests/openrlhf_source.py's.
set -euo pipefail
cd "$(dirname "$0")/.."
VERSION=0.11.2
PIP=${PIP:-.venv/bin/pip}
start=$(date +%s)
CACHE=${TOKENGRAD_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/tokengrad}
DEST=$CACHE/openrlhf-$VERSION
mkdir -p "$CACHE"
exec 9>"$DEST.lock"  # one builder at a time; a second clone waits, then finds it complete
flock 9
if [ -f "$DEST/.complete" ]; then
  echo "[openrlhf_env] reusing $DEST"
else
  echo "[openrlhf_env] unpacking openrlhf==$VERSION into $DEST (no dependencies)"
  rm -rf "$DEST"
  "$PIP" install -q --no-deps --no-compile --target "$DEST" "openrlhf==$VERSION" 2>&1 \
    | grep -v "^WARNING: Location" || true
  test -f "$DEST/openrlhf/models/loss.py"
  touch "$DEST/.complete"
fi
echo "[openrlhf_env] done in $(( $(date +%s) - start )) s"
