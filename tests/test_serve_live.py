"""A real server on loopback: the official `openai` client (sync, async, streaming) unchanged, a client
that disconnects (streaming or not, reading or stalled) frees its sequence and its KV blocks at the
engine's next step, lm-evaluation-harness's `local-completions` model
scores through the server exactly as direct scoring does, and SIGINT lets in-flight requests finish
before the process exits."""

from __future__ import annotations

import asyncio
import gc
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest
import torch

from groundup.model.logprobs import token_stats
from groundup.serve.app import create_app
from infer_helpers import model_dir, small_tokenizer
from serve_helpers import LiveServer, make_server, served_model

openai = pytest.importorskip("openai")


@pytest.fixture(scope="module")
def live():
    with LiveServer(make_server(max_batch=8)) as server:
        yield server


def test_the_openai_client_works_unchanged(live):
    client = openai.OpenAI(base_url=live.url + "/v1", api_key="none", max_retries=0)
    assert [m.id for m in client.models.list()] == ["tiny"]
    c = client.completions.create(model="tiny", prompt="To be, or not", max_tokens=6, temperature=0, logprobs=2)
    assert c.object == "text_completion" and c.choices[0].finish_reason in ("stop", "length")
    assert c.usage.completion_tokens == len(c.choices[0].logprobs.tokens)
    chat = client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "Hi"}], max_tokens=6,
                                          n=2, seed=1, logprobs=True, top_logprobs=2)
    assert [ch.index for ch in chat.choices] == [0, 1] and chat.choices[0].message.role == "assistant"
    assert chat.choices[0].logprobs.content[0].top_logprobs[0].bytes is not None
    pieces, usage = [], None
    for chunk in client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "Hi"}],
                                                max_tokens=6, temperature=0, stream=True,
                                                stream_options={"include_usage": True}):
        if chunk.choices:
            pieces.append(chunk.choices[0].delta.content or "")
        else:
            usage = chunk.usage
    greedy = client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "Hi"}], max_tokens=6,
                                            temperature=0)
    assert "".join(pieces) == greedy.choices[0].message.content and usage.completion_tokens >= 1
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(model="tiny", prompt="x", max_tokens=3, extra_body={"temprature": 1})
    assert e.value.body["param"] == "temprature"
    with pytest.raises(openai.NotFoundError):
        client.completions.create(model="gpt-4o", prompt="x", max_tokens=3)

    async def concurrent():
        aclient = openai.AsyncOpenAI(base_url=live.url + "/v1", api_key="none", max_retries=0)
        done = await asyncio.gather(*(aclient.completions.create(model="tiny", prompt=f"Line {i}", max_tokens=8,
                                                                 temperature=0) for i in range(6)))
        stream = await aclient.completions.create(model="tiny", prompt="Hi", max_tokens=5, stream=True, temperature=0)
        return done, [c.choices[0].text async for c in stream if c.choices]

    done, streamed = asyncio.run(concurrent())
    assert all(r.choices[0].finish_reason for r in done)
    alone = client.completions.create(model="tiny", prompt="Hi", max_tokens=5, temperature=0)
    assert "".join(streamed) == alone.choices[0].text


def _cancels(sched, monkeypatch) -> list[int]:
    """The decode steps taken when the server cancels a job, read once the cancel is done: the engine may
    finish the step it is in (1 more at most), the next one frees the blocks."""
    steps, cancel = [], sched.cancel

    def counted(job):
        cancel(job)
        steps.append(sched.steps)

    monkeypatch.setattr(sched, "cancel", counted)
    return steps


@pytest.mark.parametrize("streamed", [True, False], ids=["stream", "non-stream"])
def test_a_client_that_disconnects_frees_its_sequence_and_blocks_within_one_step(live, monkeypatch, streamed):
    sched = live.server.scheduler
    aborted = live.server.metrics.aborted_sequences
    before = aborted._value.get()
    cancels = _cancels(sched, monkeypatch)
    body = json.dumps({"prompt": "x", "max_tokens": 250, "stream": streamed, "ignore_eos": True}).encode()
    start = sched.steps
    with socket.create_connection(("127.0.0.1", live.port)) as s:
        s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                  b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
        if streamed:
            assert s.recv(4096).startswith(b"HTTP/1.1 200")
        deadline = time.time() + 30
        while (sched.kv_blocks_used[0] == 0 or sched.steps < start + 3) and time.time() < deadline:
            time.sleep(0.001)
        assert sched.running == 1 and sched.kv_blocks_used[0] > 0 and not cancels
        closed = sched.steps
    deadline = time.time() + 10
    while (sched.running or sched.kv_blocks_used[0]) and time.time() < deadline:
        time.sleep(0.001)
    assert sched.running == 0 and sched.kv_blocks_used[0] == 0  # its blocks are back in the pool
    assert aborted._value.get() == before + 1  # dropped unfinished, not run out its 250 tokens
    assert cancels and sched.steps - cancels[0] <= 1  # freed at the first step after the server learned of it
    assert cancels[0] - closed < 50  # and it learned of it at once (a loose bound: the engine steps meanwhile)


def test_a_disconnect_while_the_stream_waits_to_write_cancels_at_once(live, monkeypatch):
    """A client that stops reading fills its window, so the stream waits inside `send`, suspended at a
    `yield`: when the client then goes away, Starlette cancels the writer there and the stream's own
    `finally` would only run once the garbage collector found it (disabled here)."""
    sched = live.server.scheduler
    cancels = _cancels(sched, monkeypatch)
    app = create_app(live.server)  # driven by hand: `send` never returns once the body has started
    body = json.dumps({"prompt": "x", "max_tokens": 250, "stream": True, "ignore_eos": True}).encode()
    scope = {"type": "http", "asgi": {"version": "3.0", "spec_version": "2.3"}, "http_version": "1.1",
             "method": "POST", "scheme": "http", "path": "/v1/completions", "raw_path": b"/v1/completions",
             "query_string": b"", "root_path": "", "client": ("127.0.0.1", 1), "server": ("127.0.0.1", 2),
             "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]}

    async def scenario():
        gone, stuck, messages = asyncio.Event(), asyncio.Event(), [{"type": "http.request", "body": body}]

        async def receive():
            if messages:
                return messages.pop()
            await gone.wait()
            return {"type": "http.disconnect"}

        async def send(message):
            if message["type"] == "http.response.body":
                stuck.set()
                await asyncio.Event().wait()  # the client's window is full

        task = asyncio.create_task(app(scope, receive, send))
        await stuck.wait()
        assert sched.running == 1 and not cancels
        gone.set()
        await asyncio.wait_for(task, 10)
        for _ in range(3):
            await asyncio.sleep(0)
        assert cancels, "the job was left running"  # (asyncio.run's exit would close the stream)

    gc.disable()
    try:
        asyncio.run(scenario())
    finally:
        gc.enable()
    deadline = time.time() + 10
    while (sched.running or sched.kv_blocks_used[0]) and time.time() < deadline:
        time.sleep(0.001)
    assert sched.running == 0 and sched.kv_blocks_used[0] == 0 and sched.steps - cancels[0] <= 1


def _lm_eval_items() -> list[tuple[str, list[str], int]]:
    """(context, choices, gold): a small multiple-choice set in the shape of lm-eval's tasks."""
    return [("To be, or not to be, that is the", [" question", " answer", " fish"], 0),
            ("O Romeo, Romeo, wherefore art thou", [" Romeo", " here", " gone"], 0),
            ("Now is the winter of our", [" discontent", " summer", " lord"], 0),
            ("Friends, Romans,", [" countrymen", " enemies", " cats"], 0),
            ("A horse, a horse, my kingdom for a", [" horse", " crown", " sword"], 0),
            ("The quality of mercy is not", [" strained", " kind", " cheap"], 0)]


def test_lm_eval_local_completions_scores_like_direct_scoring(live):
    pytest.importorskip("lm_eval")
    pytest.importorskip("tenacity")  # lm-eval's API models need it (lm-eval[api])
    from lm_eval.api.instance import Instance
    from lm_eval.models.openai_completions import LocalCompletionsAPI

    lm = LocalCompletionsAPI(base_url=live.url + "/v1/completions", model="tiny", tokenizer_backend="remote",
                             batch_size=4, max_length=256)
    items = _lm_eval_items()
    requests = [Instance("loglikelihood", {}, (ctx, choice), i) for i, (ctx, choices, _) in enumerate(items)
                for choice in choices]
    through_server = lm.loglikelihood(requests, disable_tqdm=True)
    tok, model = small_tokenizer(), live.server.model
    direct = []
    for ctx, choices, _ in items:  # lm-eval's tokenisation (no prefix for a non-empty context), our scorer
        for choice in choices:
            context, whole = tok.encode(ctx), tok.encode(ctx + choice)
            ids = torch.tensor([whole])
            st = token_stats(model, ids[:, :-1], ids[:, 1:])
            n = len(whole) - len(context)
            direct.append((st.logprobs[0, -n:].sum().item(), bool(st.greedy[0, -n:].all())))
    assert [g for _, g in through_server] == [g for _, g in direct]
    assert [lp for lp, _ in through_server] == pytest.approx([lp for lp, _ in direct], abs=1e-4)

    def accuracy(scores):
        k = 3
        return sum(max(range(k), key=lambda j: scores[i * k + j][0]) == gold
                   for i, (_, _, gold) in enumerate(items)) / len(items)

    assert accuracy(through_server) == accuracy(direct)


def test_sigint_lets_in_flight_requests_finish_then_exits(tmp_path):
    directory = model_dir(Path(tmp_path) / "model", served_model(max_seq_len=1024), small_tokenizer())
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parent.parent)}
    proc = subprocess.Popen([sys.executable, "-m", "groundup", "serve", "--checkpoint", str(directory), "--port",
                             str(port), "--threads", "1", "--grace", "30", "--log-level", "warning"],
                            stderr=subprocess.PIPE, text=True, env=env)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.time() + 60
        while True:
            assert proc.poll() is None, proc.stderr.read()
            try:
                if httpx.get(url + "/health", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.time() < deadline, "the server did not start"
            time.sleep(0.1)
        lines: list[str] = []

        def stream():
            with httpx.stream("POST", url + "/v1/completions", json={"prompt": "x", "max_tokens": 600,
                                                                    "ignore_eos": True, "stream": True}, timeout=60) as r:
                lines.extend(line for line in r.iter_lines() if line)

        client = threading.Thread(target=stream)
        client.start()
        while not lines and client.is_alive():
            time.sleep(0.01)
        proc.send_signal(signal.SIGINT)
        at_signal = len(lines)
        assert proc.wait(60) == 0
        client.join(10)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert lines[-1] == "data: [DONE]" and len(lines) > at_signal + 10  # it was in flight, and went on
    assert json.loads(lines[-2][6:])["choices"][0]["finish_reason"] == "length"  # it ran to its end
    assert "server stopped" in proc.stderr.read()
