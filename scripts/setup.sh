#!/usr/bin/env bash
# Idempotent set-up of a fresh machine for tokengrad: a virtual environment in .venv, torch 2.13.0 (CPU wheel,
# installed first and explicitly so that no resolver pulls a CUDA build), the package with its dev, trl, trackers
# and deepspeed extras, and Debian's chromium for static figure export and browser tests (only when root; otherwise it says so).
# Usage: source-free; `bash scripts/setup.sh` — safe to run again.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}

if [ ! -x .venv/bin/python ]; then
  echo "[setup] creating virtual environment .venv"
  "$PY" -m venv .venv
fi
. .venv/bin/activate

if ! python -c "import torch" 2>/dev/null; then
  echo "[setup] installing torch==2.13.0 first (CPU wheel)"
  pip install -q torch==2.13.0
else
  echo "[setup] torch $(python -c 'import torch; print(torch.__version__)') already installed"
fi

STAMP=.venv/.tokengrad-installed
if [ ! -f "$STAMP" ] || [ pyproject.toml -nt "$STAMP" ]; then
  echo "[setup] installing tokengrad with extras [all,dev,trl,trackers,deepspeed]"
  pip install -q -e ".[all,dev,trl,trackers,deepspeed]" 2>&1 | grep -v "^WARNING: Location" || true
  python -c "import tokengrad, torch, transformers, streamlit, plotly, duckdb, trl, ruff, tensorboard, wandb, deepspeed" && touch "$STAMP"
else
  echo "[setup] tokengrad already installed"
fi

# OpenRLHF's source for tests/integrations/openrlhf/test_openrlhf.py: its wheel unpacked into a cache, not installed (docs/openrlhf.md)
bash scripts/openrlhf_env.sh

if command -v chromium >/dev/null 2>&1 || [ -x /usr/bin/chromium ]; then
  echo "[setup] chromium present: $(command -v chromium || echo /usr/bin/chromium)"
elif [ "$(id -u)" = "0" ] && command -v apt-get >/dev/null 2>&1; then
  echo "[setup] installing Debian chromium (static figure export, browser tests)"
  apt-get update -qq >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null \
    || echo "[setup] SKIPPED: chromium install failed; static PNG/SVG/PDF export and browser tests will be skipped"
else
  echo "[setup] SKIPPED: chromium is missing and this is not root; install it with 'sudo apt-get install -y chromium'"
  echo "        (without it, export writes HTML and the browser tests are skipped)"
fi

# word-cloud fonts: Noto Sans CJK (Chinese, Japanese, Korean) and Symbola (emoji as outlines, which Pillow
# scales; Noto Color Emoji is a fixed-size bitmap font it cannot); tokengrad.figures.fonts picks per cloud
FONT_PKGS="fonts-noto-cjk fonts-symbola"
if dpkg -s $FONT_PKGS >/dev/null 2>&1; then
  echo "[setup] word-cloud fonts present: $FONT_PKGS"
elif [ "$(id -u)" = "0" ] && command -v apt-get >/dev/null 2>&1; then
  echo "[setup] installing word-cloud fonts: $FONT_PKGS"
  { apt-get update -qq >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $FONT_PKGS >/dev/null; } \
    || echo "[setup] SKIPPED: font install failed; word clouds draw CJK and emoji as escapes (\\u4e2d)"
else
  echo "[setup] SKIPPED: fonts missing and this is not root; install with 'sudo apt-get install -y $FONT_PKGS'"
  echo "        (without them, word clouds draw CJK and emoji as escapes such as \\u4e2d)"
fi
