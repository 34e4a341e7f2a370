"""What the server tells a monitoring system: `GET /metrics` in Prometheus's text format (prometheus_client writes it).

The names follow vLLM's (`vllm:time_to_first_token_seconds` is ours `llm_anatomy_time_to_first_token_seconds`):
- histograms of the latencies, each defined once in measure/timing.py: TTFT (arrival at the engine to the first
  token), TPOT (a request's mean gap between tokens), ITL (every gap), end-to-end;
- gauges of the engine's state after its last step, read from the scheduler's stats(): requests running and waiting,
  KV blocks used by requests, held only by the prefix cache (free to evict), and free;
- counters: requests by how they finished, requests refused because the queue was full, prompt and output tokens,
  the prefix cache's prompt tokens looked up and found, and preemptions.
A histogram is cumulative buckets (`_bucket{le="0.1"}`: how many were at most 0.1 s) plus `_sum` and `_count`.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from ..serve.batching import Request

PREFIX = "llm_anatomy_"
LATENCY_BUCKETS = (0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.15, 0.2, 0.3, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0, 5.0, 7.5,
                   10.0, 20.0, 40.0, 80.0)
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


class Metrics:
    """The server's Prometheus metrics, in a registry of their own (two servers in one process do not mix)."""

    def __init__(self):
        self.registry = r = CollectorRegistry()

        def histogram(name, doc):
            return Histogram(PREFIX + name, doc, buckets=LATENCY_BUCKETS, registry=r)

        self.ttft = histogram("time_to_first_token_seconds", 
                              "From a request's arrival at the engine to its first token")
        self.tpot = histogram("time_per_output_token_seconds", "A request's mean gap between its output tokens")
        self.itl = histogram("inter_token_latency_seconds", "Every gap between two tokens of a request")
        self.e2e = histogram("e2e_request_latency_seconds", "From a request's arrival at the engine to its last token")
        self.running = Gauge(PREFIX + "num_requests_running", "Requests holding a batch slot", registry=r)
        self.waiting = Gauge(PREFIX + "num_requests_waiting", "Requests queued for a batch slot", registry=r)
        self.blocks_used = Gauge(PREFIX + "kv_blocks_used", "KV blocks held by requests", registry=r)
        self.blocks_cached = Gauge(PREFIX + "kv_blocks_cached", "KV blocks held only by the prefix cache", registry=r)
        self.blocks_free = Gauge(PREFIX + "kv_blocks_free", "KV blocks nobody holds", registry=r)
        self.finished_total = Counter(PREFIX + "requests_finished", "Requests by how they ended", ["finish_reason"],
                                      registry=r)
        self.rejected = Counter(PREFIX + "requests_rejected_queue_full", "Requests refused with 429", registry=r)
        self.prompt_tokens = Counter(PREFIX + "prompt_tokens", "Prompt tokens of finished requests", registry=r)
        self.output_tokens = Counter(PREFIX + "generation_tokens", "Output tokens of finished requests", registry=r)
        self.prefix_queries = Counter(PREFIX + "prefix_cache_queries", "Prompt tokens looked up", registry=r)
        self.prefix_hits = Counter(PREFIX + "prefix_cache_hits", "Prompt tokens found in the cache", registry=r)
        self.preemptions = Counter(PREFIX + "num_preemptions", "Admissions ended to make room (recomputed later)",
                                   registry=r)
        self._seen = (0, 0, 0)  # the scheduler's (prefix queries, prefix hits, preemptions) at the last update

    def first_token(self, request: Request) -> None:
        self.ttft.observe(request.ttft_s)

    def finished(self, request: Request, reason: str) -> None:
        """Count a request that ended (`reason`: stop, length, cancelled, error) and observe its latencies."""
        self.finished_total.labels(reason).inc()
        self.prompt_tokens.inc(len(request.prompt))
        self.output_tokens.inc(len(request.output))
        if request.token_times:
            self.e2e.observe(request.end_to_end_s)
            for gap in request.inter_token_gaps_s:
                self.itl.observe(gap)
            if len(request.output) > 1:
                self.tpot.observe(request.mean_token_gap_s)

    def start_from(self, stats) -> None:
        """Count from the scheduler's `stats` on (what happened before, a warm-up, is not counted)."""
        self._seen = (stats.prefix_query_tokens, stats.prefix_hit_tokens, stats.preemptions)

    def update(self, engine) -> None:
        """Set the gauges from the scheduler's stats() (called by the engine thread after each of its rounds)."""
        stats = engine.scheduler.stats()
        self.running.set(stats.running)
        self.waiting.set(engine.waiting)
        self.blocks_free.set(stats.blocks_free)
        self.blocks_cached.set(stats.blocks_cached)
        self.blocks_used.set(stats.blocks_used)
        seen = (stats.prefix_query_tokens, stats.prefix_hit_tokens, stats.preemptions)
        for counter, now, before in zip((self.prefix_queries, self.prefix_hits, self.preemptions), seen, self._seen):
            counter.inc(now - before)
        self._seen = seen

    def text(self) -> bytes:
        """Every metric in Prometheus's text format."""
        return generate_latest(self.registry)


def parse_metrics(text: str) -> dict[str, float]:
    """Prometheus text as {sample name with its labels: value}, e.g. {'llm_anatomy_kv_blocks_free': 512.0,
    'llm_anatomy_requests_finished_total{finish_reason="stop"}': 3.0} (what a client reads back)."""
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            labels = ",".join(f'{k}="{v}"' for k, v in sorted(s.labels.items()))
            out[s.name + (f"{{{labels}}}" if labels else "")] = s.value
    return out
