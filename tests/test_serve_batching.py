"""Continuous batching and multi-LoRA: requests join and leave a running batch, each row decodes exactly
as the engine decodes its prompt alone (greedy, and sampled for a seed), short requests are not held
behind long ones, a cancelled row frees its slot at once, and rows of different adapters in one
batch give the merged models' outputs."""

from __future__ import annotations

import asyncio
import copy

import httpx
import pytest
import torch
from prometheus_client.parser import text_string_to_metric_families

from conftest import MLA
from groundup.errors import CheckpointError
from groundup.infer import Generator
from groundup.infer.sampling import SamplingConfig
from groundup.model.logprobs import token_stats
from groundup.model.lora import LoraConfig
from groundup.serve.adapters import AdapterBank
from groundup.serve.app import create_app
from groundup.serve.scheduler import Job, Scheduler, make_job
from infer_helpers import VOCAB, model_dir, small_tokenizer
from serve_helpers import make_adapter, make_server, served_model

PROMPTS = ["To be, or not to be, that is the question", "Hello", "My lord", "What light through yonder window",
           "A", "Now is the winter of our discontent", "O Romeo, Romeo", "Friends, Romans"]


async def _collect(sched: Scheduler, job: Job, log: list | None = None, delay: float = 0.0) -> tuple[str, str]:
    await asyncio.sleep(delay)
    queue: asyncio.Queue = asyncio.Queue()
    sched.submit(job, queue)
    text = ""
    while True:
        ev = await queue.get()
        text += ev.text
        if ev.finish_reason:
            if log is not None:
                log.append(job)
            return text, ev.finish_reason


def _run(coro):
    return asyncio.run(coro)


@pytest.mark.parametrize("variant", ["gqa", "mla"])
def test_rows_joining_and_leaving_decode_as_the_engine(variant):
    """3 slots, 8 requests arriving over time with different prompt and output lengths; a KV pool of one
    context (64 tokens, blocks of 4) makes rows cross blocks, and the newest be preempted and resumed.
    Greedy and seeded sampling equal the engine's."""
    tok = small_tokenizer()
    model = served_model(max_seq_len=64, **(MLA if variant == "mla" else {}))
    gen = Generator(copy.deepcopy(model), tok)
    cfgs = [SamplingConfig(max_new_tokens=6 + 5 * i, temperature=0.0 if i % 2 else 0.9, seed=i, stop=["\n\n"])
            for i in range(len(PROMPTS))]

    async def main():
        sched = Scheduler(model, tok, max_batch=3, kv_blocks=model.cfg.max_seq_len // 4 + 1, block_size=4)
        sched.start()
        try:
            jobs = [make_job(gen.encode_prompts([p], c)[0], c) for p, c in zip(PROMPTS, cfgs)]
            results = await asyncio.gather(*(_collect(sched, j, delay=0.003 * i) for i, j in enumerate(jobs)))
        finally:
            sched.stop()
        return results, sched

    results, sched = _run(main())
    for prompt, cfg, (text, finish) in zip(PROMPTS, cfgs, results):
        ref = gen.complete([prompt], cfg)[0]
        assert (text, finish) == (ref.text, ref.finish_reason), prompt
    assert sched.core.preemptions > 0 and sched.running == 0 and sched.kv_blocks_used[0] == 0


def test_short_requests_are_not_held_behind_long_ones():
    tok = small_tokenizer()
    model = served_model()

    async def main():
        sched = Scheduler(model, tok, max_batch=4)
        sched.start()
        order: list[Job] = []
        try:
            long = make_job([tok.eot_id] + tok.encode("To be"), SamplingConfig(max_new_tokens=200, temperature=0),
                       ignore_eos=True)
            shorts = [make_job([tok.eot_id] + tok.encode(p), SamplingConfig(max_new_tokens=4, temperature=0), ignore_eos=True)
                      for p in PROMPTS[:3]]
            task = asyncio.ensure_future(_collect(sched, long, order))
            while long.first_token_at is None:  # the long one is decoding
                await asyncio.sleep(0.001)
            steps_before = sched.steps
            await asyncio.gather(*(_collect(sched, j, order) for j in shorts))
            steps_for_shorts = sched.steps - steps_before
            await task
        finally:
            sched.stop()
        return order, long, steps_for_shorts

    order, long, steps_for_shorts = _run(main())
    assert order[-1] is long  # every short request finished first: they joined the running batch
    assert steps_for_shorts <= 20  # 4 tokens each: a few steps, not the long request's 200


def test_a_cancelled_request_frees_its_slot_at_once():
    tok = small_tokenizer()

    async def main():
        sched = Scheduler(served_model(), tok, max_batch=2)
        sched.start()
        try:
            job = make_job([tok.eot_id], SamplingConfig(max_new_tokens=250, temperature=0), ignore_eos=True)
            queue: asyncio.Queue = asyncio.Queue()
            sched.submit(job, queue)
            await queue.get()
            assert sched.running == 1
            sched.cancel(job)
            for _ in range(200):
                if sched.running == 0:
                    break
                await asyncio.sleep(0.005)
            return sched.running, sched.steps, sched.kv_blocks_used[0]
        finally:
            sched.stop()

    running, steps, blocks = _run(main())
    assert running == 0 and steps < 100 and blocks == 0  # its blocks are back in the pool


# ---------------------------------------------------------------------- adapters


@pytest.fixture(scope="module")
def adapters(tmp_path_factory):
    """The base model, two saved adapters (all layers, Hugging Face names; attention with rsLoRA) and
    the models they merge into."""
    path = tmp_path_factory.mktemp("adapters")
    base = served_model()
    merged = [make_adapter(base, path / "all", LoraConfig(rank=4, alpha=8, targets=["all"]), seed=1),
              make_adapter(base, path / "attn", LoraConfig(rank=2, alpha=4, targets=["attention"], rslora=True), seed=2)]
    return base, {"all": path / "all", "attn": path / "attn"}, merged


def test_rows_of_different_adapters_in_one_batch_equal_the_merged_models(adapters):
    base, dirs, merged = adapters
    served = copy.deepcopy(base)
    bank = AdapterBank(served)
    for name, d in dirs.items():
        bank.add(name, d)
    assert sum(p.numel() for p in served.parameters()) == sum(p.numel() for p in base.parameters())
    x = torch.randint(0, VOCAB, (5, 12), generator=torch.Generator().manual_seed(0))
    rows = [0, 1, 2, 1, 0]
    refs = [base, *merged]
    with torch.no_grad():
        bank.select(rows)
        out = served(x).logits
        expected = torch.cat([refs[i](x[b: b + 1]).logits for b, i in enumerate(rows)])
        bank.select([0] * 5)
        plain = served(x).logits
    assert (out - expected).abs().max() < 1e-4
    assert torch.equal(plain, base(x).logits)


def test_the_server_batches_requests_for_different_adapters(adapters):
    base, dirs, merged = adapters
    tok = small_tokenizer()
    server = make_server(copy.deepcopy(base), adapters=dirs, max_batch=8)
    assert [m["id"] for m in server.models()["data"]] == ["tiny", "all", "attn"]
    names = ["tiny", "all", "attn"]
    refs = {"tiny": base, "all": merged[0], "attn": merged[1]}

    async def main():
        server.start()
        try:
            transport = httpx.ASGITransport(app=create_app(server))
            async with httpx.AsyncClient(transport=transport, base_url="http://test") as c:
                gen_requests = [c.post("/v1/completions", json={"model": names[i % 3], "prompt": p, "max_tokens": 12,
                                                               "temperature": 0})
                                for i, p in enumerate(PROMPTS[:6])]
                echo_requests = [c.post("/v1/completions", json={"model": n, "prompt": PROMPTS[0], "max_tokens": 0,
                                                                "echo": True, "logprobs": 1}) for n in names]
                return await asyncio.gather(*gen_requests, *echo_requests)
        finally:
            server.stop()

    responses = _run(main())
    assert all(r.status_code == 200 for r in responses), [r.text for r in responses]
    families = text_string_to_metric_families(server.metrics.render().decode())
    batch = {(s.name, s.labels.get("le")): s.value for f in families if f.name == "groundup_batch_size" for s in f.samples}
    assert batch["groundup_batch_size_count", None] > batch["groundup_batch_size_bucket", "1.0"]  # rows shared steps
    for i, (p, r) in enumerate(zip(PROMPTS[:6], responses[:6])):
        expected = Generator(refs[names[i % 3]], tok).generate([p], max_new_tokens=12, temperature=0)[0]
        assert r.json()["choices"][0]["text"] == expected, names[i % 3]
    ids = torch.tensor([[tok.eot_id, *tok.encode(PROMPTS[0])]])
    for name, r in zip(names, responses[6:]):
        st = token_stats(refs[name], ids[:, :-1], ids[:, 1:])
        got = r.json()["choices"][0]["logprobs"]["token_logprobs"][1:]
        assert got == pytest.approx(st.logprobs[0].tolist(), abs=1e-4), name


def test_adapters_that_cannot_be_served_per_row_are_refused(tmp_path):
    mla = served_model(**MLA)
    make_adapter(mla, tmp_path / "mla", LoraConfig(rank=2, alpha=4, targets=["attention"]), seed=1)
    with pytest.raises(CheckpointError, match="kv_up"):
        AdapterBank(copy.deepcopy(mla)).add("a", tmp_path / "mla")
    other = served_model(d_model=32, n_heads=2, n_kv_heads=1)
    make_adapter(other, tmp_path / "other", LoraConfig(rank=2, alpha=4, targets=["attention"]), seed=1)
    with pytest.raises(CheckpointError, match="does not fit"):
        AdapterBank(served_model()).add("b", tmp_path / "other")
    with pytest.raises(CheckpointError, match="no such"):
        AdapterBank(served_model()).add("c", tmp_path / "missing")
    with pytest.raises(CheckpointError, match="not a LoRA adapter"):
        AdapterBank(served_model()).add("d", model_dir(tmp_path / "plain", served_model(), small_tokenizer()))


def test_a_failing_step_fails_its_requests_and_the_server_goes_on():
    server = make_server(served_model())
    state = {"fail": False}

    def hook(module, args, out):
        if state["fail"]:
            state["fail"] = False
            raise RuntimeError("boom")

    async def main():
        server.start()  # warm-up first, then the hook
        server.model.register_forward_hook(hook)
        try:
            async with httpx.AsyncClient(transport=httpx.ASGITransport(app=create_app(server)),
                                         base_url="http://test") as c:
                state["fail"] = True
                failed = await c.post("/v1/completions", json={"prompt": "x", "max_tokens": 4})
                ok = await c.post("/v1/completions", json={"prompt": "x", "max_tokens": 4})
                return failed, ok
        finally:
            server.stop()

    failed, ok = _run(main())
    assert failed.status_code == 500 and failed.json()["error"]["type"] == "server_error"
    assert "boom" in failed.json()["error"]["message"]
    assert ok.status_code == 200 and server.scheduler.running == 0


def test_a_full_queue_answers_503():
    server = make_server(served_model(), max_waiting=1)  # its decode loop never starts: requests wait

    async def main():
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=create_app(server)),
                                     base_url="http://test") as c:
            first = asyncio.ensure_future(c.post("/v1/completions", json={"prompt": "x", "max_tokens": 2}))
            while not server.scheduler.queued:
                await asyncio.sleep(0.01)
            second = await c.post("/v1/completions", json={"prompt": "y", "max_tokens": 2})
            first.cancel()
            return second

    second = _run(main())
    assert second.status_code == 503 and second.json()["error"]["code"] == "server_busy"


def test_a_quantized_model_serves_the_engines_text():
    quantize = pytest.importorskip("groundup.quant.quantize")
    model = served_model()
    quantize.quantize_model(model, "int8")
    gen = Generator(copy.deepcopy(model), small_tokenizer())
    server = make_server(model)

    async def main():
        server.start()
        try:
            async with httpx.AsyncClient(transport=httpx.ASGITransport(app=create_app(server)),
                                         base_url="http://test") as c:
                return await asyncio.gather(*(c.post("/v1/completions", json={"prompt": p, "max_tokens": 10,
                                                                             "temperature": 0}) for p in PROMPTS[:3]))
        finally:
            server.stop()

    for p, r in zip(PROMPTS, _run(main())):
        assert r.json()["choices"][0]["text"] == gen.generate([p], max_new_tokens=10, temperature=0)[0]
