"""The training core's golden run: the first 30 losses of a tiny fp32 CPU run (seed 0, one thread).

The values were recorded from the trainer before it was split into a declared state and objectives
(issue 10), so any change to what a step computes (data order, initialisation, loss, optimizer,
schedule) shows up here as a number, not as a feeling.
"""

from __future__ import annotations

import pytest

from train_helpers import make_shards, metrics, tiny_config

from groundup.train import train

GOLDEN = [5.942880630493164, 5.932674407958984, 5.9204301834106445, 5.798104763031006, 5.689731121063232,
          5.624996662139893, 5.551999568939209, 5.498742580413818, 5.399083137512207, 5.431637763977051,
          5.434501647949219, 5.292186737060547, 5.21142053604126, 5.27198600769043, 5.320876121520996,
          5.123287200927734, 5.171483039855957, 5.078860759735107, 5.04475212097168, 5.144491672515869,
          5.072352886199951, 5.194504261016846, 5.035930156707764, 5.072052955627441, 5.083776950836182,
          5.1911420822143555, 4.9691691398620605, 5.061368942260742, 5.110672473907471, 5.05937385559082]


def test_first_30_losses_match_the_recorded_run(tmp_path):
    shards, _ = make_shards(tmp_path)
    cfg = tiny_config(shards, "train.max_steps=30", "train.seed=0", "train.threads=1", "checkpoint.every=100")
    train(cfg, tmp_path / "run")
    losses = [s["loss"] for s in metrics(tmp_path / "run")[0]]
    assert losses == pytest.approx(GOLDEN, abs=1e-5)
