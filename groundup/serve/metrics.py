"""`GET /metrics`: Prometheus text exposition (format 0.0.4), no client library needed.

    groundup_requests_total{endpoint, status}      counter: answered HTTP requests
    groundup_prompt_tokens_total                   counter: prompt tokens prefilled
    groundup_generation_tokens_total               counter: tokens generated
    groundup_decode_steps_total                    counter: batched decode steps
    groundup_requests_running / _waiting           gauges: rows in the batch, requests queued
    groundup_kv_blocks_used, _kv_cache_usage_perc  gauges: paged KV blocks held, their share of the pool
    groundup_prefix_cache_queries / _hits_total    counters: full prompt blocks looked up / found cached
    groundup_preemptions_total                     counter: sequences preempted (the blocks ran out)
    groundup_batch_size                            histogram: rows per decode step
    groundup_time_to_first_token_seconds           histogram: arrival to first token (queue + prefill)
    groundup_request_duration_seconds              histogram: whole requests, by endpoint

Counters are updated from the decode thread and the event loop; one lock keeps them consistent.
"""

from __future__ import annotations

import bisect
import threading

TTFT_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
DURATION_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0)
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256)


class Histogram:
    def __init__(self, buckets):
        self.buckets = tuple(buckets)
        self.counts = [0] * (len(self.buckets) + 1)
        self.sum = 0.0
        self.count = 0

    def observe(self, value: float) -> None:
        self.counts[bisect.bisect_left(self.buckets, value)] += 1
        self.sum += value
        self.count += 1

    def lines(self, name: str, labels: str = "") -> list[str]:
        out, running = [], 0
        sep = "," if labels else ""
        for bound, n in zip(self.buckets, self.counts):
            running += n
            out.append(f'{name}_bucket{{{labels}{sep}le="{bound}"}} {running}')
        out.append(f'{name}_bucket{{{labels}{sep}le="+Inf"}} {self.count}')
        braces = f"{{{labels}}}" if labels else ""
        out.append(f"{name}_sum{braces} {self.sum:.6f}")
        out.append(f"{name}_count{braces} {self.count}")
        return out


class Metrics:
    def __init__(self):
        self.lock = threading.Lock()
        self.requests: dict[tuple[str, int], int] = {}
        self.prompt = 0
        self.generated = 0
        self.steps = 0
        self.prefix_queries = self.prefix_hits = self.preemptions = 0
        self.spec_proposed = self.spec_accepted = 0
        self.batch = Histogram(BATCH_BUCKETS)
        self.ttft = Histogram(TTFT_BUCKETS)
        self.durations: dict[str, Histogram] = {}
        self.scheduler = None  # set by the Server: read for the gauges

    # ------------------------------------------------------------------ updates

    def request(self, endpoint: str, status: int, seconds: float) -> None:
        with self.lock:
            key = (endpoint, status)
            self.requests[key] = self.requests.get(key, 0) + 1
            self.durations.setdefault(endpoint, Histogram(DURATION_BUCKETS)).observe(seconds)

    def prompt_tokens(self, n: int) -> None:
        with self.lock:
            self.prompt += n

    def generated_tokens(self, n: int) -> None:
        with self.lock:
            self.generated += n

    def decode_step(self, rows: int) -> None:
        with self.lock:
            self.steps += 1
            self.batch.observe(rows)

    def first_token(self, seconds: float) -> None:
        with self.lock:
            self.ttft.observe(seconds)

    def prefix_cache(self, queries: int, hits: int) -> None:
        with self.lock:
            self.prefix_queries += queries
            self.prefix_hits += hits

    def speculated(self, proposed: int, accepted: int) -> None:
        with self.lock:
            self.spec_proposed += proposed
            self.spec_accepted += accepted

    def preempted(self) -> None:
        with self.lock:
            self.preemptions += 1

    # ------------------------------------------------------------------ exposition

    def render(self) -> str:
        running = self.scheduler.running if self.scheduler is not None else 0
        waiting = self.scheduler.queued if self.scheduler is not None else 0
        blocks_used, blocks = self.scheduler.kv_blocks_used if self.scheduler is not None else (0, 1)
        with self.lock:
            lines = ["# HELP groundup_requests_total HTTP requests answered, by endpoint and status code.",
                     "# TYPE groundup_requests_total counter"]
            for (endpoint, status), n in sorted(self.requests.items()):
                lines.append(f'groundup_requests_total{{endpoint="{endpoint}",status="{status}"}} {n}')
            for name, kind, value, text in (
                    ("groundup_prompt_tokens_total", "counter", self.prompt, "Prompt tokens prefilled."),
                    ("groundup_generation_tokens_total", "counter", self.generated, "Tokens generated."),
                    ("groundup_decode_steps_total", "counter", self.steps, "Batched decode steps."),
                    ("groundup_requests_running", "gauge", running, "Rows (choices) in the running batch."),
                    ("groundup_requests_waiting", "gauge", waiting, "Requests waiting for a batch slot."),
                    ("groundup_kv_blocks_used", "gauge", blocks_used, "KV cache blocks held by sequences."),
                    ("groundup_kv_cache_usage_perc", "gauge", blocks_used / max(1, blocks), "Share of KV blocks in use."),
                    ("groundup_prefix_cache_queries_total", "counter", self.prefix_queries,
                     "Full prompt blocks looked up in the prefix cache."),
                    ("groundup_prefix_cache_hits_total", "counter", self.prefix_hits,
                     "Full prompt blocks found in the prefix cache (not prefilled)."),
                    ("groundup_preemptions_total", "counter", self.preemptions,
                     "Sequences preempted when the KV blocks ran out (resumed later)."),
                    ("groundup_spec_decode_num_draft_tokens_total", "counter", self.spec_proposed,
                     "Tokens proposed by speculative decoding (prompt lookup or the draft model)."),
                    ("groundup_spec_decode_num_accepted_tokens_total", "counter", self.spec_accepted,
                     "Proposed tokens the target kept.")):
                lines += [f"# HELP {name} {text}", f"# TYPE {name} {kind}", f"{name} {value}"]
            lines += ["# HELP groundup_batch_size Rows per decode step.", "# TYPE groundup_batch_size histogram"]
            lines += self.batch.lines("groundup_batch_size")
            lines += ["# HELP groundup_time_to_first_token_seconds From arrival to the first generated token.",
                      "# TYPE groundup_time_to_first_token_seconds histogram"]
            lines += self.ttft.lines("groundup_time_to_first_token_seconds")
            lines += ["# HELP groundup_request_duration_seconds Whole requests, by endpoint.",
                      "# TYPE groundup_request_duration_seconds histogram"]
            for endpoint, h in sorted(self.durations.items()):
                lines += h.lines("groundup_request_duration_seconds", f'endpoint="{endpoint}"')
        return "\n".join(lines) + "\n"
