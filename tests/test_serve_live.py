"""A real server on loopback: the official `openai` client (sync, async, streaming) unchanged, a client
that disconnects mid-stream frees its slot at once, lm-evaluation-harness's `local-completions` model
scores through the server exactly as direct scoring does, and SIGINT lets in-flight requests finish
before the process exits."""

from __future__ import annotations

import asyncio
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


def test_a_client_that_disconnects_mid_stream_frees_its_slot(live):
    sched = live.server.scheduler
    with httpx.Client(base_url=live.url, timeout=30) as client:
        with client.stream("POST", "/v1/completions", json={"prompt": "x", "max_tokens": 250, "stream": True,
                                                           "ignore_eos": True}) as r:
            lines = r.iter_lines()
            for _ in range(3):
                next(lines)
            assert sched.running == 1
            steps = sched.steps
        deadline = time.time() + 5
        while sched.running and time.time() < deadline:
            time.sleep(0.002)
    assert sched.running == 0 and sched.steps - steps < 100  # freed long before its 250 tokens


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
