"""`groundup data curate`, entered here so that `perplexity.checkpoint` can score documents with a groundup
model: curation (data/) sits below the model and its scorer (eval/bpb.py), so this handler, above both,
hands the scorer down. Everything else is data/commands.py's.
"""

from __future__ import annotations

import argparse

from groundup.data.commands import curate_arguments

__all__ = ["curate", "curate_arguments"]  # the CLI looks up the verb's flags beside its function


def curate(args: argparse.Namespace) -> None:
    from groundup.data.commands import curate as run
    from groundup.eval.bpb import CheckpointBitsPerByte

    run(args, checkpoint_scorer=CheckpointBitsPerByte)
