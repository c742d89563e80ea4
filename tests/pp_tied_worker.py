"""Under torchrun: `groundup train ARGS...` that, after its last step, writes each process's largest difference
between its copy of the tied embedding and its partner stage's to RUN/tied_diff_RANK.json (tests/test_pipeline.py)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from groundup import cli
from groundup.train import loop
from groundup.train.pipeline import tied_copies_differ

_step = loop.train_step


def _checked_step(state, stop=False):
    result = _step(state, stop)
    if state.step == state.cfg.train.max_steps - 1:  # the last step's update is in: compare the two copies
        diff = tied_copies_differ(state.model, state.model.runtime.tied)
        held = state.model.runtime.tied is not None
        (Path(state.run_dir) / f"tied_diff_{state.dist.global_rank}.json").write_text(json.dumps([held, diff]))
    return result


loop.train_step = _checked_step
sys.exit(cli.main(["train", *sys.argv[1:]]))
