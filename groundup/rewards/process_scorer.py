"""`prm:PATH` rewards: a process reward model (`groundup rm --process`) scores each step of a solution, and
a solution scores its LOWEST step (Lightman et al. 2023, "Let's Verify Step by Step"; Wang et al. 2023,
Math-Shepherd): one wrong step spoils the answer however good the rest.

    split_steps("2 + 3 = 5. 5 * 4 = 20.\\nAnswer: 20", "sentences")   # ["2 + 3 = 5.", " 5 * 4 = 20.", "\\nAnswer: 20"]
    scorer = ProcessRewardScorer("runs/prm")
    scorer.step_scores("What is (2 + 3) * 4?", reply)   # [P(step 1 good), P(step 2 good), ...]
    scorer("What is (2 + 3) * 4?", reply)               # min of them: the reward GRPO and best-of-n use
    best_of_n([[0.9, 0.2], [0.6, 0.7]])                  # 1: the candidate whose lowest step is highest

The promise kept between labelling, training and scoring: a solution is split by `split_steps`
(lossless: the steps joined are the text) and read as `step_rows` builds it, the conversation rendered
as a chat up to the assistant's turn, then the solution's tokens (the text encoded whole, so the model
reads the tokens it writes); a step's score is the sigmoid of the value head at the token holding its
last character. The split a model was trained with is read from RUN/process_reward.json.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Sequence

import torch

from groundup.errors import DataError
from groundup.layout import PROCESS_REWARD_FILE
from groundup.loading import load_for_inference
from groundup.model.heads import StepRewardScores

STEP_SPLITS = ("lines", "sentences")  # any other value of a split is a literal step marker (Math-Shepherd's "ки")
_SENTENCE_END = re.compile(r"[.!?](?=\s)")


def split_steps(text: str, split: str = "lines") -> list[str]:
    """A solution's steps, their concatenation exactly `text`. A step ends where its terminator ends
    (a line's last character before its newline; ".", "!" or "?" before whitespace or a line's end with
    "sentences"; right after the marker otherwise); the whitespace that follows opens the next step.
    A piece with nothing but whitespace joins its neighbour; a blank text has no step."""
    if not split:
        raise ValueError("a step split is 'lines', 'sentences' or a non-empty marker")
    if split == "lines":
        ends = [m.start() for m in re.finditer("\n", text)]
    elif split == "sentences":
        ends = [m.end() for m in _SENTENCE_END.finditer(text)] + [m.start() for m in re.finditer("\n", text)]
    else:
        ends = [m.end() for m in re.finditer(re.escape(split), text)]
    steps, start = [], 0
    for end in sorted(set(ends)) + [len(text)]:
        if end > start and text[start:end].strip():
            steps.append(text[start:end])
            start = end
    if steps and start < len(text):  # trailing whitespace belongs to the last step
        steps[-1] += text[start:]
    return steps


def step_tokens(tok, steps: Sequence[str]) -> tuple[list[int], list[int]]:
    """(the steps' text encoded whole, the index of the token holding each step's last non-blank character).
    The text is encoded as one piece, as the model reads and writes it: a step boundary inside a merged
    token (".\n" after "sentences" splits "5." from "\nAnswer") changes no token; that token ends the step."""
    text = "".join(steps)
    tokens = tok.encode(text)
    reach, total = [], 0  # bytes of the text covered by tokens[0..i]
    for t in tokens:
        total += len(tok.id_to_bytes(t))
        reach.append(total)
    ends, start, i = [], 0, 0
    for step in steps:
        last = len(text[: start + len(step.rstrip())].encode("utf-8"))  # byte just after the step's last character
        while i < len(tokens) - 1 and reach[i] < last:
            i += 1
        ends.append(i)
        start += len(step)
    return tokens, ends


def step_rows(tok, conversation: Sequence[dict], steps: Sequence[str]) -> tuple[list[int], list[int]]:
    """(token ids, the position of each step's last token): the chat up to the assistant's turn, then the
    steps' tokens (`step_tokens`). Blank steps: each ends at the prompt's last token."""
    ids, _ = tok.render_chat(list(conversation), add_generation_prompt=True)
    tokens, ends = step_tokens(tok, steps)
    if not tokens:
        return ids, [len(ids) - 1] * len(steps)
    return ids + tokens, [len(ids) + e for e in ends]


def conversation_of(prompt: str, messages: Sequence[dict] | None = None) -> list[dict]:
    """The conversation a reward model reads: a chat prompt's messages, else the prompt as the user's turn."""
    return list(messages) if messages else [{"role": "user", "content": prompt}]


def solution_score(step_scores: Sequence[float]) -> float:
    """A solution's score: its lowest step score."""
    if not step_scores:
        raise ValueError("a solution with no step has no score")
    return float(min(step_scores))


def best_of_n(step_scores: Sequence[Sequence[float]]) -> int:
    """The candidate best-of-n keeps: the highest lowest step score; a tie goes to the earlier candidate."""
    if not step_scores:
        raise ValueError("best_of_n needs at least one candidate")
    mins = [solution_score(s) for s in step_scores]
    return max(range(len(mins)), key=lambda i: (mins[i], -i))


def read_process_reward(path: str | Path) -> dict:
    """The settings a process reward model was trained with (its run's PROCESS_REWARD_FILE)."""
    path = Path(path)
    for where in (path, path.parent.parent):  # a run, or one of its checkpoints (RUN/checkpoints/step_N)
        meta = where / PROCESS_REWARD_FILE
        if meta.is_file():
            try:
                data = json.loads(meta.read_text(encoding="utf-8"))
            except (OSError, ValueError) as e:
                raise DataError(f"{meta}: unreadable ({e})") from None
            if not isinstance(data, dict) or not isinstance(data.get("split"), str) or not data["split"]:
                raise DataError(f"{meta}: key 'split' = {data.get('split') if isinstance(data, dict) else data!r}: "
                                "expected 'lines', 'sentences' or a step marker")
            return data
    raise DataError(f"{path}: not a process reward model (no {PROCESS_REWARD_FILE}); train one with "
                    "'groundup rm --process' and name its run directory")


class ProcessRewardScorer:
    """`scorer(prompt, completion, messages=None) -> float`: the lowest step score of a solution under a
    process reward model; `step_scores` gives every step's, `step_scores_batch` many solutions' at once."""

    wants_messages = True  # `rewards.score` passes a chat prompt's conversation

    def __init__(self, path: str | Path, device: str = "cpu", batch_size: int = 16):
        self.split = read_process_reward(path)["split"]
        self.model, self.tok = load_for_inference(path, device=device)
        if self.model.value_head is None:
            raise DataError(f"{path}: not a reward model (its config has no value head)")
        self.device, self.batch_size = device, batch_size
        self.pad = self.tok.pad_id if self.tok.pad_id is not None else self.tok.eot_id

    @torch.no_grad()
    def step_scores_batch(self, conversations: Sequence[Sequence[dict]], completions: Sequence[str]) -> list[list[float]]:
        """Each completion's step scores (P(step good)), read after its conversation. A blank completion
        is one empty step, scored at the prompt's last token."""
        out: list[list[float]] = []
        for i in range(0, len(completions), self.batch_size):
            rows, where = [], []
            for conv, text in zip(conversations[i : i + self.batch_size], completions[i : i + self.batch_size]):
                ids, ends = step_rows(self.tok, conv, split_steps(text, self.split) or [text])
                rows.append(ids[: self.model.cfg.max_seq_len])
                where.append([min(e, len(rows[-1]) - 1) for e in ends])
            x = torch.full((len(rows), max(map(len, rows))), self.pad, dtype=torch.long)
            for r, ids in enumerate(rows):
                x[r, : len(ids)] = torch.tensor(ids)
            rr = torch.tensor([r for r, ends in enumerate(where) for _ in ends])
            pos = torch.tensor([e for ends in where for e in ends])
            scores = torch.sigmoid(self.model(x.to(self.device), head=StepRewardScores(rr, pos)).rewards).tolist()
            k = 0
            for ends in where:
                out.append(scores[k : k + len(ends)])
                k += len(ends)
        return out

    def step_scores(self, prompt: str, completion: str, messages: Sequence[dict] | None = None) -> list[float]:
        return self.step_scores_batch([conversation_of(prompt, messages)], [completion])[0]

    def __call__(self, prompt: str, completion: str, messages: Sequence[dict] | None = None, **_) -> float:
        return solution_score(self.step_scores(prompt, completion, messages))
