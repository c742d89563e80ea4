"""Blind battles between two served models, voted by people, appended to a battle log `groundup arena` rates.

    arena = Arena(server, "votes.jsonl")        # `groundup serve --arena-log votes.jsonl`
    POST /arena/battle {messages, temperature?, top_p?, max_tokens?, seed?}  -> {"battle_id"}
    POST /arena/answer {battle_id, side: "a" | "b", stream?}   -> that side's chat completion, as /v1/chat/completions
    POST /arena/vote   {battle_id, vote: "a" | "b" | "tie" | "bothbad"}  -> the row written, names revealed
    GET  /arena        {"enabled", "ready", "models", "message"}: whether the page offers blind battles

The promises this module keeps:
- Two different served models (the base model and the adapters) are drawn at random for each battle, in
  random order, and both answer the same messages with the same sampling settings.
- The names stay on the server until the vote: an answer's `model` field is "Model A" or "Model B", and no
  message sent before the vote names either model. The vote's answer reveals them.
- Each side is answered once (a second request is a 409), and the text logged is the text the server
  generated and sent for that side (up to where its client stopped it), never text a client claims.
- A battle is voted once, after both answers are in (finished, or stopped by the client): an unknown id is a
  404, a second vote or a vote before the answers a 409.
- Each vote appends one JSON line with FastChat's battle columns (model_a, model_b, winner: model_a, model_b,
  tie or tie (bothbad)) plus the prompt, both answers and the button (`ROW_KEYS`), in one write followed by
  fsync, under a thread lock and an flock on the file, so concurrent votes, from this server or another
  one sharing the file, never interleave. A line cut short by an earlier crash is closed before ours.
- Memory stays bounded: the newest MAX_OPEN unvoted battles and MAX_VOTED voted ids are kept; an older
  one is "unknown or expired".
"""

from __future__ import annotations

import asyncio
import fcntl
import json
import os
import random
import threading
import time
import uuid
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from pydantic import Field, ValidationError, field_validator, model_validator

from groundup.errors import ConfigError
from groundup.io import naming_full_disk, sha256_bytes
from groundup.serve.generation import Plan, plan_chat
from groundup.serve.protocol import APIError, ChatCompletionRequest, ChatMessage, StreamOptions, _Strict

SIDES = ("a", "b")
LABELS = {"a": "Model A", "b": "Model B"}  # what the client sees instead of the names
WINNERS = {"a": "model_a", "b": "model_b", "tie": "tie", "bothbad": "tie (bothbad)"}  # FastChat's winner column
BUTTONS = {"a": "A is better", "b": "B is better", "tie": "Tie", "bothbad": "Both are bad"}  # the page's buttons
ROW_KEYS = ("battle_id", "question_id", "category", "model_a", "model_b", "winner", "judge", "swap", "prompt",
            "answer_a", "answer_b", "verdict_raw", "attempts", "tstamp")
MAX_OPEN = 4096  # unvoted battles kept (the oldest is dropped first)
MAX_VOTED = 65536  # voted battle ids remembered, so a second vote is told why it is refused
HOW_TO_ENABLE = ("blind battles are off on this server: start it with --arena-log FILE (votes are appended "
                 "to FILE) and at least two models (--adapter NAME=DIR)")


class BattleRequest(_Strict):
    messages: list[ChatMessage] = Field(min_length=1)  # the prompt: an optional system message, a user message last
    temperature: float | None = Field(None, ge=0, allow_inf_nan=False)
    top_p: float | None = Field(None, gt=0, le=1)
    max_tokens: int | None = Field(None, ge=1)
    seed: int | None = Field(None, ge=-(2**63), lt=2**63)

    @field_validator("messages")
    @classmethod
    def _ends_with_user(cls, v):
        if v[-1].role != "user":
            raise ValueError(f"the last message must be the user's prompt, not a {v[-1].role} message")
        if any(m.tool_calls or m.role == "tool" for m in v):
            raise ValueError("blind battles take text messages, no tool calls")
        return v


class AnswerRequest(_Strict):
    battle_id: str
    side: Literal["a", "b"]
    stream: bool = False
    stream_options: StreamOptions | None = None

    @model_validator(mode="after")
    def _options(self):
        if self.stream_options is not None and not self.stream:
            raise ValueError("stream_options is only allowed when stream is true")
        return self


class VoteRequest(_Strict):
    battle_id: str
    vote: Literal["a", "b", "tie", "bothbad"]  # A is better, B is better, Tie, Both are bad


@dataclass
class Answer:
    """One side of a battle: claimed by its answer request, then the run whose text is logged."""

    claimed: bool = False
    run: object | None = None  # serve/generation.py's Run: its first choice holds the text sent
    ended: bool = False  # the request answering it has ended (finished, stopped by the client, or failed)

    def attach(self, run) -> None:
        """Keep `run`; called in the task answering the request, which ends when the answer has gone out."""
        self.run = run
        task = asyncio.current_task()
        if task is not None:
            task.add_done_callback(lambda _: setattr(self, "ended", True))

    def release(self) -> None:
        """The request failed before its run started (busy, shutting down): the side may be asked again."""
        if self.run is None:
            self.claimed = False

    @property
    def done(self) -> bool:
        return self.run is not None and (self.ended or self.run.choices[0].finish_reason is not None)

    @property
    def text(self) -> str:
        return self.run.choices[0].text


@dataclass
class Battle:
    id: str
    models: dict[str, str]  # side -> served name
    messages: list[dict]
    sampling: dict  # temperature, top_p, max_tokens, seed as given
    answers: dict[str, Answer] = field(default_factory=lambda: {side: Answer() for side in SIDES})
    voting: bool = False  # a vote is being written

    def chat(self, side: str, stream: bool = False, stream_options: StreamOptions | None = None):
        body = {**self.sampling, "model": self.models[side], "messages": self.messages, "stream": stream}
        if stream_options is not None:
            body["stream_options"] = stream_options.model_dump()
        try:
            return ChatCompletionRequest.model_validate(body)
        except ValidationError as e:  # not expected: the battle's fields were validated the same way
            raise APIError(400, e.errors()[0]["msg"]) from None

    @property
    def prompt(self) -> str:
        return ChatMessage.model_validate(self.messages[-1]).text()

    @property
    def question_id(self) -> str:
        """The same messages give the same id (battles on one prompt group together)."""
        return sha256_bytes(json.dumps(self.messages, sort_keys=True, ensure_ascii=False).encode())[:16]

    def row(self, vote: str) -> dict:
        return {"battle_id": self.id, "question_id": self.question_id, "category": "",
                "model_a": self.models["a"], "model_b": self.models["b"], "winner": WINNERS[vote], "judge": "human",
                "swap": False, "prompt": self.prompt, "answer_a": self.answers["a"].text,
                "answer_b": self.answers["b"].text, "verdict_raw": BUTTONS[vote], "attempts": 1,
                "tstamp": time.time()}


class BattleLog:
    """The JSONL battle log, appended one whole line at a time (see the module's promises)."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.lock = threading.Lock()
        try:  # now, so that a path that cannot be written fails at start-up, not at the first vote
            os.close(os.open(self.path, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o666))
        except OSError as e:
            raise ConfigError(f"--arena-log {path}: cannot append to it ({e.strerror or e})", key="arena-log") from None

    def append(self, row: dict) -> None:
        data = (json.dumps(row, ensure_ascii=False) + "\n").encode("utf-8")
        with self.lock, naming_full_disk(self.path):
            fd = os.open(self.path, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o666)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX)  # another process appending to the same file waits
                size = os.fstat(fd).st_size
                if size and os.pread(fd, 1, size - 1) != b"\n":
                    data = b"\n" + data  # an earlier writer died mid-line: ours starts on a line of its own
                view = memoryview(data)
                while view:  # one write for a regular file; the loop only guards a short one
                    view = view[os.write(fd, view):]
                os.fsync(fd)
            finally:
                os.close(fd)  # releases the flock


def require_two(names: list[str], models_can_change: bool = False) -> None:
    """Refuse blind battles at start-up with fewer than two models (unless adapters may be loaded later)."""
    if len(names) < 2 and not models_can_change:
        raise ConfigError(f"--arena-log: blind battles need at least two served models, and this server serves "
                          f"only {', '.join(names)}; add one with --adapter NAME=DIR", key="arena-log")


class Arena:
    """The battles of one server and the log their votes go to."""

    def __init__(self, server, log_path: str | Path, models_can_change: bool = False, seed: int | None = None):
        self.server = server
        require_two(server.model_names(), models_can_change)
        self.log = BattleLog(log_path)
        self.rng = random.Random(seed)
        self.open_battles: OrderedDict[str, Battle] = OrderedDict()
        self.voted: OrderedDict[str, None] = OrderedDict()

    def status(self) -> dict:
        names = self.server.model_names()
        ready = len(names) >= 2
        message = "" if ready else self._too_few(names)
        return {"enabled": True, "ready": ready, "models": len(names), "message": message}

    @staticmethod
    def _too_few(names: list[str]) -> str:
        return (f"blind battles need at least two served models; this server serves {len(names)} "
                f"({', '.join(names)}): load another (POST /v1/load_lora_adapter) or restart with --adapter NAME=DIR")

    def open(self, req: BattleRequest) -> dict:
        """A new battle: two different models at random, in random order. A prompt that does not fit is a 400 now."""
        names = self.server.model_names()
        if len(names) < 2:
            raise APIError(409, self._too_few(names), code="too_few_models")
        model_a, model_b = self.rng.sample(names, 2)
        sampling = req.model_dump(exclude={"messages"}, exclude_none=True)
        battle = Battle(uuid.uuid4().hex, {"a": model_a, "b": model_b},
                        [m.model_dump(exclude_none=True) for m in req.messages], sampling)
        self._plan(battle, "a", battle.chat("a"))  # the context and token limits, before anything runs
        self.open_battles[battle.id] = battle
        while len(self.open_battles) > MAX_OPEN:
            self.open_battles.popitem(last=False)
        return {"battle_id": battle.id, "sides": dict(LABELS)}

    def plan_answer(self, req: AnswerRequest) -> tuple[Plan, Answer]:
        """The chat plan of one side, its model shown as "Model A"/"Model B", and the side claimed: run the plan
        and `attach` the run to the answer, or `release` it if the run could not start."""
        battle = self._battle(req.battle_id)
        answer = battle.answers[req.side]
        if answer.claimed:
            raise APIError(409, f"{LABELS[req.side]} has answered battle {battle.id} already; each side answers once",
                           param="side", code="already_answered")
        plan = self._plan(battle, req.side, battle.chat(req.side, req.stream, req.stream_options))
        answer.claimed = True
        return plan, answer

    def _plan(self, battle: Battle, side: str, chat) -> Plan:
        try:
            plan = plan_chat(self.server, chat)
        except APIError as e:
            if e.code == "model_not_found":  # unloaded since the battle began; its message would name it
                raise APIError(409, f"{LABELS[side]} is no longer served; start a new battle",
                               code="model_gone") from None
            raise
        plan.model = LABELS[side]
        return plan

    async def vote(self, req: VoteRequest) -> dict:
        """Append the vote's row to the log (in a thread: fsync) and reveal the names."""
        battle = self._battle(req.battle_id)
        if battle.voting:
            raise APIError(409, f"battle {battle.id} is being voted on already; each battle takes one vote",
                           param="battle_id", code="already_voted")
        for side in SIDES:
            if not battle.answers[side].done:
                raise APIError(409, f"{LABELS[side]} has not answered battle {battle.id} yet: vote once both answers "
                                    "are in", param="battle_id", code="not_answered")
        row = battle.row(req.vote)
        battle.voting = True
        try:
            await asyncio.to_thread(self.log.append, row)
        except OSError as e:  # a full disk names the log (io.naming_full_disk)
            battle.voting = False
            raise APIError(503, f"the vote could not be recorded: {e}", type="server_error",
                           code="log_unwritable") from None
        self.open_battles.pop(battle.id, None)
        self.voted[battle.id] = None
        while len(self.voted) > MAX_VOTED:
            self.voted.popitem(last=False)
        return {"battle_id": battle.id, "vote": req.vote, "winner": row["winner"], "model_a": row["model_a"],
                "model_b": row["model_b"]}

    def _battle(self, battle_id: str) -> Battle:
        battle = self.open_battles.get(battle_id)
        if battle is not None:
            return battle
        if battle_id in self.voted:
            raise APIError(409, f"battle {battle_id} has been voted on already; each battle takes one vote",
                           param="battle_id", code="already_voted")
        raise APIError(404, f"no battle {battle_id[:64]!r} on this server (unknown, or expired: it keeps the newest "
                            f"{MAX_OPEN} unvoted battles); start one with POST /arena/battle", param="battle_id",
                       code="battle_not_found")
