#!/usr/bin/env bash
# Set up (idempotent) and open the dashboard on the shipped sample runs: http://127.0.0.1:8501
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
. .venv/bin/activate
exec tokengrad dashboard sample_runs "$@"
