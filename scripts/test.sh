#!/usr/bin/env bash
# Set up (idempotent) and run the whole test suite: the default suite, then the slow-marked tests once.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
. .venv/bin/activate
mkdir -p artifacts
python -m pytest -q -p no:cacheprovider "$@"
python -m pytest -q -p no:cacheprovider -m slow "$@" || { rc=$?; [ "$rc" = 5 ] && echo "no slow tests" || exit "$rc"; }
