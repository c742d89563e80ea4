"""/metrics on a real loopback server, read by prometheus-client's own parser: vLLM's names and labels,
counters that agree with the usage the responses reported, the prefix cache hit by a shared prefix,
histograms with one observation per request or per token as vLLM defines them, and the gauges read live
while a request runs and back at 0 after it. Each server has its own registry: the counts start at 0
although other servers in this process have answered requests."""

from __future__ import annotations

import json

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from serve_helpers import LiveServer, make_server, scrape

SHARED = ("To be, or not to be, that is the question: whether 'tis nobler in the mind to suffer the slings and "
          "arrows of outrageous fortune, or to take arms against a sea of troubles")  # 85 tokens: 5 full blocks


@pytest.fixture
def live():
    with LiveServer(make_server(max_batch=4)) as server:
        yield server


def test_the_metrics_agree_with_the_responses(live):
    usage, choices = [], 0
    with httpx.Client(base_url=live.url, timeout=60) as c:
        assert scrape(c.get("/metrics").text)["vllm:time_to_first_token_seconds_count"] == 0  # the warm-up is not
        for tail in (" Ay, there is the rub", " To sleep, perchance to dream"):  # sharing 86 tokens
            r = c.post("/v1/completions", json={"prompt": SHARED + tail, "max_tokens": 6, "temperature": 0})
            usage.append(r.json()["usage"])
        r = c.post("/v1/completions", json={"prompt": "Hello", "max_tokens": 4, "n": 2, "seed": 1})
        usage.append(r.json()["usage"])
        body = {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 5, "stream": True,
                "stream_options": {"include_usage": True}}
        with c.stream("POST", "/v1/chat/completions", json=body) as s:
            chunks = [json.loads(line[6:]) for line in s.iter_lines() if line.startswith("data: {")]
        usage.append(chunks[-1]["usage"])
        choices = 2 + 2 + 1
        r = c.get("/metrics")
        text = r.text
    assert r.headers["content-type"].startswith("text/plain; version=")
    m = scrape(text)
    prompt, generated = sum(u["prompt_tokens"] for u in usage), sum(u["completion_tokens"] for u in usage)
    assert m["vllm:num_requests_running"] == 0 and m["vllm:num_requests_waiting"] == 0
    assert m["vllm:kv_cache_usage_perc"] == 0 == m["groundup_kv_blocks_used"] and m["groundup_kv_blocks_total"] > 0
    assert m["vllm:prompt_tokens_total"] == prompt  # each prompt once (n = 2 included), as usage counts it
    assert m["vllm:generation_tokens_total"] == generated
    assert m["vllm:time_to_first_token_seconds_count"] == 4  # one per request
    assert m["vllm:request_success_total"] == choices == m["vllm:e2e_request_latency_seconds_count"]
    assert m["vllm:request_prompt_tokens_count"] == choices
    assert m["vllm:request_generation_tokens_sum"] == generated
    # one inter-token latency per token after a choice's first (one token a step without speculation)
    assert m["vllm:inter_token_latency_seconds_count"] == generated - choices
    assert m["vllm:time_per_output_token_seconds_count"] == generated - choices
    assert m["vllm:request_time_per_output_token_seconds_count"] == choices  # every choice made 2 tokens or more
    # the prefix cache, in tokens as vLLM counts it: every prompt looked up, the second one hit its 5 shared blocks
    assert m["vllm:prefix_cache_queries_total"] == prompt
    assert m["vllm:prefix_cache_hits_total"] == 5 * 16
    assert m["groundup_prefill_tokens_total"] == prompt - m["vllm:prefix_cache_hits_total"]
    assert m["vllm:num_preemptions_total"] == 0 and m["groundup_sequences_aborted_total"] == 0
    assert m["groundup_decode_steps_total"] > 0
    assert m["groundup_requests_total"] == 5  # the first /metrics and 4 generations (this one counts once answered)
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name.startswith("vllm:"):
                assert sample.labels["model_name"] == "tiny" and sample.labels["engine"] == "0", sample
    reasons = {s.labels["finished_reason"]: s.value for f in text_string_to_metric_families(text)
               for s in f.samples if s.name == "vllm:request_success_total"}
    assert set(reasons) == {"stop", "length"} and sum(reasons.values()) == choices


def test_the_gauges_are_read_while_a_request_runs(live):
    with httpx.Client(base_url=live.url, timeout=60) as c:
        body = {"prompt": "x", "max_tokens": 240, "stream": True, "ignore_eos": True}
        with c.stream("POST", "/v1/completions", json=body) as s:
            lines = s.iter_lines()
            next(lines)
            during = scrape(c.get("/metrics").text)
            assert sum(1 for line in lines if line.startswith("data: {")) > 0
        after = scrape(c.get("/metrics").text)
    assert during["vllm:num_requests_running"] == 1 and during["vllm:num_requests_waiting"] == 0
    assert 0 < during["vllm:kv_cache_usage_perc"] <= 1
    assert during["vllm:kv_cache_usage_perc"] == pytest.approx(during["groundup_kv_blocks_used"] /
                                                               during["groundup_kv_blocks_total"])
    assert during["vllm:gpu_cache_usage_perc"] == during["vllm:kv_cache_usage_perc"]
    assert after["vllm:num_requests_running"] == 0 and after["vllm:kv_cache_usage_perc"] == 0
    assert after["vllm:generation_tokens_total"] == 240
