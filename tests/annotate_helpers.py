"""A fake OpenAI-compatible judge for `data annotate` tests: /v1/chat/completions in a thread, scoring by a rule.

    judge = FakeJudge()            # judge.url: the base URL; judge.plan: per-document failures; judge.log: requests
    make_corpus(path, n)           # n JSONL records "d0".."d{n-1}", even ones teaching (score 3-5), odd ones selling (0-2)
"""

from __future__ import annotations

import json
import random
import re
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

EDU = ["photosynthesis", "equation", "theorem", "molecule", "chapter", "exercise", "fraction", "grammar", "history",
       "geometry", "energy", "experiment", "definition", "example", "lesson", "proof", "cell", "velocity"]
SPAM = ["buy", "discount", "casino", "click", "offer", "cheap", "deal", "subscribe", "bonus", "winner", "free",
        "coupon", "prize", "shipping", "sale", "promo", "jackpot", "limited"]
FILLER = ["the", "and", "of", "to", "a", "in", "is", "for", "with", "on"]


def score_of(i: int) -> int:
    """The judge's rule: even documents teach (3, 4 or 5), odd ones sell (0, 1 or 2)."""
    return 3 + i % 3 if i % 2 == 0 else i % 3


def make_corpus(path: Path, n: int, seed: int = 0, shuffle: bool = False) -> list[dict]:
    rng = random.Random(seed)
    records = []
    for i in range(n):
        vocab = EDU if i % 2 == 0 else SPAM
        words = [rng.choice(vocab if rng.random() < 0.6 else FILLER) for _ in range(60)]
        records.append({"id": f"d{i}", "text": f"doc-{i:04d} " + " ".join(words)})
    if shuffle:
        random.Random(99).shuffle(records)
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return records


class FakeJudge:
    """An OpenAI-compatible /v1/chat/completions in a thread. `plan[i]` lists what document i's successive
    requests get ("ok", "sleep", "junk", "nochoices", "malformed", "500", "400", "401", "429" with Retry-After 0.2); past its end, "ok"."""

    def __init__(self, delay: float = 0.0):
        self.plan: dict[int, list[str]] = {}
        self.log: list[int] = []  # document numbers, one per request, in arrival order
        self.times: list[float] = []  # time.monotonic() of each request's arrival
        self.auth: set[str] = set()
        self.delay = delay
        self.lock = threading.Lock()
        judge = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                prompt = body["messages"][0]["content"]
                marker = re.search(r"doc-(\d{4})", prompt)
                doc = int(marker.group(1)) if marker else -1 - len(prompt) % 6  # any text: a score by its length
                with judge.lock:
                    judge.auth.add(self.headers.get("Authorization", ""))
                    seen = judge.log.count(doc)
                    judge.log.append(doc)
                    judge.times.append(time.monotonic())
                    steps = judge.plan.get(doc, [])
                    step = steps[seen] if seen < len(steps) else "ok"
                time.sleep(judge.delay)
                try:
                    judge.answer(self, doc, step)
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the client gave up (a timeout)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, args=(0.05,), daemon=True)
        self.thread.start()
        self.url = f"http://127.0.0.1:{self.server.server_port}/v1"

    def answer(self, h: BaseHTTPRequestHandler, doc: int, step: str) -> None:
        score = score_of(doc) if doc >= 0 else -1 - doc
        status, content = 200, f"It is about lesson {doc}.\nEducational score: {score}"
        if step == "sleep":
            time.sleep(1.5)
        elif step == "malformed":
            content = "A fine text, I would say a 4 out of 5."
        elif step in ("500", "400", "401", "429"):
            status = int(step)
        if step == "junk":
            data = b"<html>this is not json"
        elif step == "nochoices":
            data = json.dumps({"id": "x", "object": "chat.completion"}).encode()
        elif status != 200:
            data = json.dumps({"error": {"message": f"status {status}", "type": "x"}}).encode()
        else:
            data = json.dumps({"id": "c", "object": "chat.completion", "created": 0, "model": "judge",
                               "choices": [{"index": 0, "finish_reason": "stop",
                                            "message": {"role": "assistant", "content": content}}]}).encode()
        h.send_response(status)
        if status == 429:
            h.send_header("Retry-After", "0.2")
        h.send_header("Content-Type", "application/json")
        h.send_header("Content-Length", str(len(data)))
        h.end_headers()
        h.wfile.write(data)

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
