"""`GET /metrics`: Prometheus text (prometheus-client), under vLLM's metric names so that dashboards and
autoscalers written for vLLM read groundup unchanged.

Every `vllm:` series carries vLLM's labels `model_name` (the served name) and `engine` ("0"):

    vllm:num_requests_running                   gauge: sequences (choices) in the running batch
    vllm:num_requests_waiting                   gauge: requests queued (a preempted choice counts as one)
    vllm:kv_cache_usage_perc                    gauge: share of the paged KV blocks held (0 to 1);
                                                vllm:gpu_cache_usage_perc is its older name, kept
    vllm:prefix_cache_queries_total             counter: prompt tokens looked up in the prefix cache
    vllm:prefix_cache_hits_total                counter: of those, tokens found cached (not prefilled)
    vllm:prompt_tokens_total                    counter: prompt tokens of requests that started generating
                                                (each prompt once, cached or not: what `usage` reports)
    vllm:generation_tokens_total                counter: tokens generated
    vllm:num_preemptions_total                  counter: sequences preempted (the blocks ran out)
    vllm:request_success_total{finished_reason} counter: choices that finished (stop, length)
    vllm:spec_decode_num_drafts_total           counter: speculative proposals verified (one per sequence a step)
    vllm:spec_decode_num_draft_tokens_total     counter: tokens proposed
    vllm:spec_decode_num_accepted_tokens_total  counter: proposed tokens the target kept
    vllm:time_to_first_token_seconds            histogram: arrival to a request's first token (queue + prefill)
    vllm:inter_token_latency_seconds            histogram: between a sequence's consecutive steps' tokens;
                                                vllm:time_per_output_token_seconds, its older name, kept
    vllm:request_time_per_output_token_seconds  histogram: a finished choice's (last token - first) / (tokens - 1)
    vllm:e2e_request_latency_seconds            histogram: arrival to a choice's last token
    vllm:request_prompt_tokens / _generation_tokens  histograms: a finished choice's token counts

groundup's own, no labels: groundup_requests_total{endpoint,status} and
groundup_request_duration_seconds{endpoint} (HTTP; a stream's duration runs to its last byte),
groundup_prefill_tokens_total (tokens actually prefilled: prefix-cache hits not, preemptions again),
groundup_decode_steps_total, groundup_batch_size (rows per decode step), groundup_kv_blocks_used and
groundup_kv_blocks_total, groundup_sequences_aborted_total (clients that went away, shutdown),
groundup_tool_calls_total{tool,outcome} (calls `serve --execute-tools` ran: ok or error).

Each Server has its own CollectorRegistry (never the process-wide one). The gauges are read from the
scheduler at scrape time; the rest is updated by the engine thread and the event loop (prometheus-client
values are thread-safe). vLLM turns off the `_created` series and so does this exposition.
"""

from __future__ import annotations

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily

__all__ = ["CONTENT_TYPE_LATEST", "Metrics"]

LABELS = ("model_name", "engine")
# vLLM's buckets, so that histogram_quantile over groundup and vLLM servers together adds up.
TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
                40.0, 80.0, 160.0, 640.0, 2560.0)
TPOT_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0,
                80.0)
LATENCY_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0,
                   480.0, 960.0, 1920.0, 7680.0)
DURATION_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0)
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256)
FINISH_REASONS = ("stop", "length")


def one_two_five(limit: int) -> list[int]:
    """1, 2, 5, 10, 20, 50, ... up to `limit` (vLLM's token-count buckets)."""
    out, scale = [], 1
    while True:
        for m in (1, 2, 5):
            if m * scale > limit:
                return out
            out.append(m * scale)
        scale *= 10


class Metrics:
    content_type = CONTENT_TYPE_LATEST  # of `render()`'s bytes

    def __init__(self, model_name: str = "groundup", max_model_len: int = 2048):
        self.registry = CollectorRegistry()
        self.scheduler = None  # set by the Server: read for the gauges
        self.model_name = model_name
        r, values = self.registry, (model_name, "0")

        def counter(name: str, doc: str):
            return Counter(name, doc, LABELS, registry=r).labels(*values)

        def histogram(name: str, doc: str, buckets):
            return Histogram(name, doc, LABELS, buckets=buckets, registry=r).labels(*values)

        self.prompt = counter("vllm:prompt_tokens", "Prompt tokens of requests that started generating.")
        self.generated = counter("vllm:generation_tokens", "Tokens generated.")
        self.preemptions = counter("vllm:num_preemptions", "Sequences preempted when the KV blocks ran out.")
        self.prefix_queries = counter("vllm:prefix_cache_queries", "Prefix cache queries, in prompt tokens.")
        self.prefix_hits = counter("vllm:prefix_cache_hits", "Prefix cache hits, in tokens found cached.")
        self.spec_drafts = counter("vllm:spec_decode_num_drafts", "Speculative proposals verified.")
        self.spec_proposed = counter("vllm:spec_decode_num_draft_tokens", "Tokens proposed by speculative decoding.")
        self.spec_accepted = counter("vllm:spec_decode_num_accepted_tokens", "Proposed tokens the target kept.")
        success = Counter("vllm:request_success", "Choices that finished, by reason.", (*LABELS, "finished_reason"),
                          registry=r)
        self.success = {reason: success.labels(*values, reason) for reason in FINISH_REASONS}
        self.ttft = histogram("vllm:time_to_first_token_seconds", "From arrival to the first token.", TTFT_BUCKETS)
        self.itl = histogram("vllm:inter_token_latency_seconds", "Between a sequence's steps' tokens.", TPOT_BUCKETS)
        self.itl_old = histogram("vllm:time_per_output_token_seconds",
                                 "Between a sequence's steps' tokens (vllm:inter_token_latency_seconds).",
                                 TPOT_BUCKETS)
        self.tpot = histogram("vllm:request_time_per_output_token_seconds",
                              "A finished choice's time per token after its first.", TPOT_BUCKETS)
        self.e2e = histogram("vllm:e2e_request_latency_seconds", "From arrival to a choice's last token.",
                             LATENCY_BUCKETS)
        lengths = one_two_five(max_model_len)
        self.prompt_lengths = histogram("vllm:request_prompt_tokens", "A finished choice's prompt tokens.", lengths)
        self.generated_lengths = histogram("vllm:request_generation_tokens", "A finished choice's generated tokens.",
                                           lengths)

        self.requests = Counter("groundup_requests", "HTTP requests answered, by endpoint and status code.",
                                ("endpoint", "status"), registry=r)
        self.durations = Histogram("groundup_request_duration_seconds", "Whole HTTP requests, by endpoint.",
                                   ("endpoint",), buckets=DURATION_BUCKETS, registry=r)
        self.prefill = Counter("groundup_prefill_tokens", "Prompt tokens prefilled (prefix-cache hits not).",
                               registry=r)
        self.steps = Counter("groundup_decode_steps", "Batched decode steps.", registry=r)
        self.batch = Histogram("groundup_batch_size", "Rows per decode step.", buckets=BATCH_BUCKETS, registry=r)
        self.aborted_sequences = Counter("groundup_sequences_aborted", "Sequences dropped unfinished.", registry=r)
        self.tool_calls = Counter("groundup_tool_calls", "Tool calls the server ran (--execute-tools), by tool and "
                                  "outcome (ok, error).", ("tool", "outcome"), registry=r)
        r.register(_Live(self))

    # ------------------------------------------------------------------ updates (the engine, the HTTP guard)

    def request(self, endpoint: str, status: int, seconds: float) -> None:
        self.requests.labels(endpoint, str(status)).inc()
        self.durations.labels(endpoint).observe(seconds)

    def first_token(self, seconds: float, prompt_tokens: int) -> None:
        """A request's first token: its time to it, and its prompt counted."""
        self.ttft.observe(seconds)
        self.prompt.inc(prompt_tokens)

    def prompt_tokens(self, n: int) -> None:
        """A request that only scores its prompt (echo, max_tokens 0)."""
        self.prompt.inc(n)

    def prefilled(self, n: int) -> None:
        self.prefill.inc(n)

    def generated_tokens(self, n: int) -> None:
        self.generated.inc(n)

    def inter_token(self, seconds: float) -> None:
        self.itl.observe(seconds)
        self.itl_old.observe(seconds)

    def decode_step(self, rows: int) -> None:
        self.steps.inc()
        self.batch.observe(rows)

    def prefix_cache(self, queries: int, hits: int) -> None:
        """Tokens looked up and found, for one admitted sequence."""
        self.prefix_queries.inc(queries)
        self.prefix_hits.inc(hits)

    def speculated(self, proposed: int, accepted: int) -> None:
        self.spec_drafts.inc()
        self.spec_proposed.inc(proposed)
        self.spec_accepted.inc(accepted)

    def preempted(self) -> None:
        self.preemptions.inc()

    def finished(self, reason: str, e2e: float, prompt_tokens: int, generated: int, decode_seconds: float) -> None:
        """A choice ended ("stop" or "length"): `decode_seconds` from its first token to its last."""
        if reason in self.success:
            self.success[reason].inc()
        self.e2e.observe(e2e)
        self.prompt_lengths.observe(prompt_tokens)
        self.generated_lengths.observe(generated)
        if generated > 1:
            self.tpot.observe(decode_seconds / (generated - 1))

    def aborted(self) -> None:
        self.aborted_sequences.inc()

    def tool_call(self, tool: str, ok: bool) -> None:
        """One call run by `serve --execute-tools`."""
        self.tool_calls.labels(tool, "ok" if ok else "error").inc()

    # ------------------------------------------------------------------ exposition

    def render(self) -> bytes:
        """The exposition, for `CONTENT_TYPE_LATEST`."""
        return generate_latest(_WithoutCreated(self.registry))


class _Live:
    """The gauges, read from the scheduler when scraped."""

    def __init__(self, metrics: Metrics):
        self.metrics = metrics

    def collect(self):
        sched, values = self.metrics.scheduler, [self.metrics.model_name, "0"]
        running = sched.running if sched is not None else 0
        waiting = sched.queued if sched is not None else 0
        used, blocks = sched.kv_blocks_used if sched is not None else (0, 1)
        usage = used / max(1, blocks)
        for name, doc, value in (
                ("vllm:num_requests_running", "Sequences (choices) in the running batch.", running),
                ("vllm:num_requests_waiting", "Requests waiting to be admitted.", waiting),
                ("vllm:kv_cache_usage_perc", "KV-cache usage: 1 means every block is held.", usage),
                ("vllm:gpu_cache_usage_perc", "KV-cache usage (vllm:kv_cache_usage_perc's older name).", usage)):
            family = GaugeMetricFamily(name, doc, labels=LABELS)
            family.add_metric(values, value)
            yield family
        yield GaugeMetricFamily("groundup_kv_blocks_used", "Paged KV blocks held by sequences.", value=used)
        yield GaugeMetricFamily("groundup_kv_blocks_total", "Paged KV blocks in the pool.", value=blocks)


class _WithoutCreated:
    """The registry's metrics less their `_created` samples."""

    def __init__(self, registry: CollectorRegistry):
        self.registry = registry

    def collect(self):
        for metric in self.registry.collect():
            metric.samples = [s for s in metric.samples if not s.name.endswith("_created")]
            yield metric
