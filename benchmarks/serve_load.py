"""Load on `groundup serve`: a real server on loopback, many concurrent clients, one JSON object out.

    .venv/bin/python benchmarks/serve_load.py [--requests 1000] [--concurrency 16] [--sweep-requests 32]
                                              [--threads 1] [--max-batch 16]

The model is the decode benchmark's shape (vocab 8192, d_model 384, 6 layers, 6 heads, 2 KV heads,
FFN 1024, context 1024), randomly initialised, with an 8192-token BPE trained on Shakespeare; the
server runs as a subprocess (`python -m groundup serve`), the clients here (httpx, asyncio).

1. Load: --requests requests at --concurrency, mixed prompt lengths (16..384 tokens, as token ids
   or as chat text) and output lengths (8..128 tokens, `ignore_eos` so each generates exactly
   max_tokens), half streamed, a fifth chats. Counted: errors, and responses that are not complete
   (finish_reason, usage.completion_tokens == max_tokens, a stream's [DONE] and finish chunk).
2. Sweep: the same --sweep-requests streamed completions (prompts 16..128 tokens, outputs 32..256:
   chat-like, where decoding dominates) at concurrency 1, 4, 8 and 16: p50/p99 time to first token
   (client side: request sent -> first chunk with text) and aggregate tokens/s (completion tokens /
   wall time). `speedup_c8_vs_c1` is concurrency 8's tokens/s over the same requests one at a time.
   Batching speeds up decoding only: on CPU a prefill costs the same per token at any batch size,
   so a prefill-heavy mix (the load run's) gains less.
3. The official `openai` client, sync, async and streaming, unchanged against the same server.
"""

from __future__ import annotations

import argparse
import asyncio
import ctypes
import itertools
import json
import os
import platform
import random
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

CONFIG = dict(vocab_size=8192, d_model=384, n_layers=6, n_heads=6, n_kv_heads=2, d_ff=1024, max_seq_len=1024,
              tie_embeddings=False, init_std=0.05)
PROMPT_LENGTHS = (16, 32, 64, 128, 256, 384)  # the load run
OUTPUT_LENGTHS = (8, 16, 32, 64, 128)
SWEEP_PROMPT_LENGTHS = (16, 32, 64, 128)  # the sweep: chat-like, decoding dominates
SWEEP_OUTPUT_LENGTHS = (32, 64, 128, 256)
REPO = str(Path(__file__).resolve().parents[1])  # the server subprocess imports groundup from here


def build_model(work: Path, config: dict = CONFIG, texts: int = 30) -> Path:
    """A randomly initialised model of `config` and a BPE of its vocab_size trained on `texts` of Shakespeare's
    works, saved to WORK/model (returned)."""
    import torch

    from groundup.config import from_dict
    from groundup.corpus import iter_shakespeare
    from groundup.model import ModelConfig, Transformer
    from groundup.model.model_dir import save_model
    from groundup.tokenizer import TokenizerConfig, train_tokenizer

    corpus = [w["text"] for w in itertools.islice(iter_shakespeare(), texts)]
    tok = train_tokenizer(corpus, TokenizerConfig(vocab_size=config["vocab_size"]), progress=False)
    torch.manual_seed(0)
    model = Transformer(from_dict(ModelConfig, config)).eval()
    save_model(model, work / "model")
    tok.save(work / "model" / "tokenizer")
    return work / "model"


def start_server(model: Path, threads: int | None, max_batch: int, device: str | None = None, extra: tuple = (),
                 stderr=subprocess.PIPE, stdout=None, wait: float = 120) -> tuple[subprocess.Popen, str]:
    """`groundup serve` on a free loopback port as a subprocess, once /health answers: (process, base URL).
    `threads` None: torch's choice; `device` None: the server's default; `extra`: more `serve` arguments;
    `stderr`, `stdout`: where the server's log goes (default: a pipe, read if it exits early; this process's
    stdout). The server gets SIGTERM if this process dies; otherwise the caller stops it (stop_server)."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    cmd = [sys.executable, "-m", "groundup", "serve", "--checkpoint", str(model), "--name", "bench", "--port",
           str(port), "--max-batch", str(max_batch), "--log-level", "warning", *map(str, extra)]
    if threads is not None:
        cmd += ["--threads", str(threads)]
    if device is not None:
        cmd += ["--device", device]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [REPO, os.environ.get("PYTHONPATH")]))}
    proc = subprocess.Popen(cmd, stdout=stdout, stderr=stderr, text=True, env=env, preexec_fn=_die_with_parent)
    url = f"http://127.0.0.1:{port}"
    deadline = time.time() + wait
    try:
        while time.time() < deadline:
            if proc.poll() is not None:
                log = proc.stderr.read()[-2000:] if proc.stderr else "(see its log)"
                raise RuntimeError(f"the server exited with {proc.returncode}: {log}")
            try:
                if httpx.get(url + "/health", timeout=2).status_code == 200:
                    return proc, url
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        raise RuntimeError(f"the server did not come up within {wait:g} s")
    except BaseException:
        stop_server(proc)
        raise


def _die_with_parent() -> None:
    """In the server's process, before exec: SIGTERM when this process dies, even killed (Linux only)."""
    if sys.platform.startswith("linux"):
        ctypes.CDLL(None, use_errno=True).prctl(1, int(signal.SIGTERM))  # PR_SET_PDEATHSIG


def stop_server(proc: subprocess.Popen, grace: float = 30) -> None:
    """SIGTERM (the server finishes in-flight requests), then SIGKILL after `grace` seconds."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(grace)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def scrape_metrics(url: str) -> dict[str, float]:
    """The server's /metrics samples by name, summed over their labels (vllm:* carry model_name)."""
    out: dict[str, float] = {}
    for line in httpx.get(url + "/metrics", timeout=30).text.splitlines():
        if line.startswith("#") or not line.strip():
            continue
        series, _, value = line.rpartition(" ")
        name = series.split("{", 1)[0]
        if name.startswith(("groundup_", "vllm:")):
            out[name] = out.get(name, 0.0) + float(value)
    return out


def make_requests(n: int, seed: int, vocab: int, words: list[str], chat_share: float = 0.2,
                  stream_share: float = 0.5, prompts=PROMPT_LENGTHS, outputs=OUTPUT_LENGTHS) -> list[dict]:
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        length, new = rng.choice(prompts), rng.choice(outputs)
        stream = rng.random() < stream_share
        body = {"model": "bench", "max_tokens": new, "temperature": rng.choice([0, 0.8]), "seed": rng.randrange(1 << 30),
                "stream": stream, "ignore_eos": True}
        if stream:
            body["stream_options"] = {"include_usage": True}
        if rng.random() < chat_share:
            text = " ".join(rng.choice(words) for _ in range(length // 2))
            out.append({"path": "/v1/chat/completions", "max_tokens": new,
                        "body": {**body, "messages": [{"role": "user", "content": text}]}})
        else:
            out.append({"path": "/v1/completions", "max_tokens": new,
                        "body": {**body, "prompt": [rng.randrange(vocab) for _ in range(length)]}})
    return out


async def one(client: httpx.AsyncClient, req: dict) -> dict:
    """Send one request; check it is complete; time to first token (streams) and tokens."""
    start = time.perf_counter()
    body = req["body"]
    if not body["stream"]:
        r = await client.post(req["path"], json=body)
        if r.status_code != 200:
            return {"error": f"{r.status_code} {r.text[:200]}"}
        data = r.json()
        choice = data["choices"][0]
        ok = choice["finish_reason"] == "length" and data["usage"]["completion_tokens"] == req["max_tokens"]
        return {"complete": ok, "tokens": data["usage"]["completion_tokens"], "seconds": time.perf_counter() - start}
    first, finish, done, tokens = None, None, False, 0
    async with client.stream("POST", req["path"], json=body) as r:
        if r.status_code != 200:
            return {"error": f"{r.status_code} {(await r.aread())[:200]!r}"}
        async for line in r.aiter_lines():
            if not line.startswith("data: "):
                continue
            if line == "data: [DONE]":
                done = True
                continue
            chunk = json.loads(line[6:])
            if "error" in chunk:
                return {"error": chunk["error"]["message"]}
            if chunk.get("usage"):
                tokens = chunk["usage"]["completion_tokens"]
            for c in chunk["choices"]:
                text = c.get("text") or (c.get("delta") or {}).get("content")
                if text and first is None:
                    first = time.perf_counter() - start
                finish = c.get("finish_reason") or finish
    ok = done and finish == "length" and tokens == req["max_tokens"]
    return {"complete": ok, "tokens": tokens, "ttft": first, "seconds": time.perf_counter() - start}


async def run_load(url: str, requests: list[dict], concurrency: int) -> dict:
    sem = asyncio.Semaphore(concurrency)
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    async with httpx.AsyncClient(base_url=url, timeout=600, limits=limits) as client:
        async def guarded(req):
            async with sem:
                try:
                    return await one(client, req)
                except httpx.HTTPError as e:
                    return {"error": f"{type(e).__name__}: {e}"}

        start = time.perf_counter()
        results = await asyncio.gather(*(guarded(r) for r in requests))
        wall = time.perf_counter() - start
    errors = [r["error"] for r in results if "error" in r]
    ok = [r for r in results if "error" not in r]
    ttfts = sorted(r["ttft"] for r in ok if r.get("ttft") is not None)
    tokens = sum(r["tokens"] for r in ok)
    return {"requests": len(requests), "concurrency": concurrency, "errors": len(errors), "error_examples": errors[:3],
            "incomplete": sum(1 for r in ok if not r["complete"]), "wall_s": round(wall, 2), "completion_tokens": tokens,
            "tokens_per_s": round(tokens / wall, 1), "ttft_p50_s": _pct(ttfts, 50), "ttft_p99_s": _pct(ttfts, 99)}


def _pct(values: list[float], q: int) -> float | None:
    if not values:
        return None
    return round(values[min(len(values) - 1, max(0, round(q / 100 * len(values)) - 1))], 4)


def openai_client_check(url: str) -> dict:
    import openai

    client = openai.OpenAI(base_url=url + "/v1", api_key="unused")
    sync = client.completions.create(model="bench", prompt="To be, or not", max_tokens=8, temperature=0)
    chat = client.chat.completions.create(model="bench", messages=[{"role": "user", "content": "Hi"}], max_tokens=8)
    pieces = [c.choices[0].delta.content or "" for c in client.chat.completions.create(
        model="bench", messages=[{"role": "user", "content": "Hi"}], max_tokens=8, stream=True) if c.choices]

    async def both():
        aclient = openai.AsyncOpenAI(base_url=url + "/v1", api_key="unused")
        rs = await asyncio.gather(*(aclient.completions.create(model="bench", prompt=f"Line {i}", max_tokens=8)
                                    for i in range(4)))
        stream = await aclient.completions.create(model="bench", prompt="Hi", max_tokens=8, stream=True)
        return rs, [c.choices[0].text async for c in stream if c.choices]

    rs, apieces = asyncio.run(both())
    return {"sync": sync.choices[0].finish_reason is not None and chat.choices[0].message.role == "assistant",
            "async": all(r.choices[0].finish_reason for r in rs), "streaming": len(pieces) > 1 and len(apieces) > 0,
            "models": [m.id for m in client.models.list()]}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--requests", type=int, default=1000)
    p.add_argument("--concurrency", type=int, default=16)
    p.add_argument("--sweep-requests", type=int, default=32)
    p.add_argument("--threads", type=int, default=1, help="the server's torch threads (default: 1)")
    p.add_argument("--max-batch", type=int, default=16)
    args = p.parse_args()

    from groundup.corpus import iter_shakespeare

    load_before = os.getloadavg()
    work = Path(tempfile.mkdtemp(prefix="groundup-serve-load-"))
    model = build_model(work)
    words = next(iter_shakespeare())["text"].split()[:5000]
    proc, url = start_server(model, args.threads, args.max_batch)
    report = {"config": CONFIG, "server_threads": args.threads, "max_batch": args.max_batch,
              "machine": f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores"}
    try:
        asyncio.run(run_load(url, make_requests(8, 99, 2048, words), 4))  # warm-up
        report["load"] = asyncio.run(run_load(url, make_requests(args.requests, 1, 2048, words), args.concurrency))
        sweep_set = make_requests(args.sweep_requests, 2, 2048, words, chat_share=0.0, stream_share=1.0,
                                  prompts=SWEEP_PROMPT_LENGTHS, outputs=SWEEP_OUTPUT_LENGTHS)
        report["sweep"] = {c: asyncio.run(run_load(url, sweep_set, c)) for c in (1, 4, 8, 16)}
        c1, c8 = report["sweep"][1]["tokens_per_s"], report["sweep"][8]["tokens_per_s"]
        report["speedup_c8_vs_c1"] = round(c8 / c1, 2)
        report["openai_client"] = openai_client_check(url)
        report["server_decode_steps"] = int(scrape_metrics(url)["groundup_decode_steps_total"])
    finally:
        stop_server(proc, 60)
    load = report["load"]
    report["checks"] = {"no_errors": load["errors"] == 0, "all_complete": load["incomplete"] == 0,
                        "c8_at_least_3x_c1": report["speedup_c8_vs_c1"] >= 3.0,
                        "openai_client": all(v for k, v in report["openai_client"].items() if k != "models")}
    report["load_avg_before_after"] = [round(x, 2) for x in (*load_before[:1], *os.getloadavg()[:1])]
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
