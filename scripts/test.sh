#!/usr/bin/env bash
# The README's test command: create .venv if needed, install groundup with its test and peer
# extras (CPU torch 2.13.0), and run the whole suite.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python3.11}"
command -v "$PYTHON" >/dev/null || PYTHON=python3
[ -x .venv/bin/python ] || "$PYTHON" -m venv .venv
.venv/bin/pip install -q torch==2.13.0 -e ".[dev,bench]"
exec .venv/bin/python -m pytest -q "$@"
