"""`rm:PATH` rewards: a reward model trained with `groundup reward-model` scores a reply to a chat prompt.

    scorer = RewardModelScorer("runs/rm")
    scorer("What is 6 x 7?", "Answer: 42")                        # the value head at the reply's last token
    scorer(prompt, reply, messages=[{"role": "system", ...}, ...])  # the whole conversation, as it was trained
"""

from __future__ import annotations

from pathlib import Path

import torch

from groundup.errors import DataError
from groundup.loading import load_for_inference
from groundup.model.heads import RewardScore


def full_rows(seqs: list[list[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(whole rows right-padded, the position of each row's last token): what a reward model reads."""
    x = torch.full((len(seqs), max(len(s) for s in seqs)), pad_id, dtype=torch.long)
    for i, s in enumerate(seqs):
        x[i, : len(s)] = torch.tensor(s)
    return x, torch.tensor([len(s) - 1 for s in seqs])



class RewardModelScorer:
    """`scorer(prompt, completion, messages=None) -> float`: a trained reward model's score of one chat
    turn; with `messages` (the prompt's conversation, system message included) it reads them, as it
    was trained, rather than the user's last message alone."""

    wants_messages = True  # `rewards.score` passes a chat prompt's conversation

    def __init__(self, path: str | Path, device: str = "cpu"):
        self.model, self.tok = load_for_inference(path, device=device)
        if self.model.value_head is None:
            raise DataError(f"{path}: not a reward model (its config has no value head); train one with 'groundup reward-model'")
        self.device = device

    @torch.no_grad()
    def __call__(self, prompt: str, completion: str, messages: list[dict] | None = None, **_) -> float:
        conversation = list(messages or [{"role": "user", "content": prompt}])
        full, _ = self.tok.render_chat(conversation + [{"role": "assistant", "content": completion}])
        x, last = full_rows([full], self.tok.eot_id)
        return float(self.model(x.to(self.device), head=RewardScore(last.to(self.device))).rewards[0])
