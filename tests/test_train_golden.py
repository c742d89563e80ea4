"""The training core's golden run: the first 30 losses of a tiny fp32 CPU run (seed 0, one thread).

The values were recorded from the trainer before it was split into a declared state and objectives
(issue 10), so any change to what a step computes (data order, initialisation, loss, optimizer,
schedule) shows up here as a number, not as a feeling. Re-recorded once since, when the tokenizer gained
the four tool-tag tokens (its merges, and so the test shards' ids, changed); the training core with the
tokenizer before them still gives the first recording exactly.
"""

from __future__ import annotations

import pytest

from train_helpers import make_shards, metrics, tiny_config

from groundup.train import train

GOLDEN = [5.937094688415527, 5.958916187286377, 5.877011299133301, 5.775544166564941, 5.654748916625977,
          5.549914360046387, 5.55760383605957, 5.511372089385986, 5.333637237548828, 5.355626106262207,
          5.42926025390625, 5.177144527435303, 5.186187744140625, 5.242271423339844, 5.2888994216918945,
          5.1347479820251465, 5.18524169921875, 5.166549205780029, 5.084734916687012, 5.349633693695068,
          5.173572063446045, 5.1080851554870605, 5.136786460876465, 5.014333248138428, 5.016523361206055,
          5.085379600524902, 4.981921195983887, 5.178099632263184, 5.082745552062988, 5.20139741897583]


def test_first_30_losses_match_the_recorded_run(tmp_path):
    shards, _ = make_shards(tmp_path)
    cfg = tiny_config(shards, "train.max_steps=30", "train.seed=0", "train.threads=1", "checkpoint.every=100")
    train(cfg, tmp_path / "run")
    losses = [s["loss"] for s in metrics(tmp_path / "run")[0]]
    assert losses == pytest.approx(GOLDEN, abs=1e-5)
