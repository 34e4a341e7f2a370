"""The client's side: stream requests through the official `openai` async client and time what a user sees.

`run_load` sends `requests` chat requests with Poisson arrivals at `rate` per second (or all at once, rate=inf), at
most `max_concurrency` in flight, and gives up on what is left after `timeout_s`: every loop is bounded in count and
in time. Each request's record (`Result`) holds when it was sent and when each streamed chunk came, on the client's
clock, so that its latencies are measure/timing's, seen from the client:
    TTFT: sent -> first chunk with text;  ITL: every gap between chunks;  TPOT: (last - first) / (tokens - 1);
    E2E: sent -> the last chunk.
`summarize` turns the records into what vLLM's `bench serve` prints: completed and failed requests, request and
output-token throughput, mean / median / p99 of each latency (milliseconds), and request goodput: requests per second that
met the stated objectives (TTFT and TPOT at most their limits).

It runs its own event loop on a thread of its own, so that it works the same in a script and in a notebook (whose
kernel already runs an event loop).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import math
import random
import statistics
import time
from dataclasses import dataclass, field

import numpy as np

from ..errors import CourseError
from ..measure.timing import (end_to_end_s, inter_token_gaps_s, mean_token_gap_s, met_objectives,
                              time_to_first_token_s)


@dataclass
class Result:
    """One request as its client saw it (client clock, seconds from the run's start)."""

    sent_s: float
    status: int = 0  # 200 served, 429 refused, another HTTP status, 0: no answer (connection, timeout)
    chunk_times_s: list[float] = field(default_factory=list)  # when each chunk with text came
    output_tokens: int = 0  # the server's count (usage), else the chunks
    text: str = ""
    done_s: float | None = None  # when the answer (or the refusal) was complete
    retry_after_s: float | None = None
    error: str = ""
    name: str = ""  # the id the server gave it ("chatcmpl-..."), to find the engine's own record

    @property
    def ok(self) -> bool:
        return self.status == 200 and bool(self.chunk_times_s)

    @property
    def ttft_s(self) -> float:
        return time_to_first_token_s(self.sent_s, self.chunk_times_s)

    @property
    def itl_s(self) -> list[float]:
        return inter_token_gaps_s(self.chunk_times_s)

    @property
    def tpot_s(self) -> float:
        """(last chunk - first chunk) / (tokens - 1): a chunk can carry several tokens, so tokens, not chunks."""
        if self.output_tokens < 2 or len(self.chunk_times_s) < 2:
            return math.nan if self.output_tokens < 2 else mean_token_gap_s(self.chunk_times_s)
        return (self.chunk_times_s[-1] - self.chunk_times_s[0]) / (self.output_tokens - 1)

    @property
    def e2e_s(self) -> float:
        return end_to_end_s(self.sent_s, self.chunk_times_s)


async def _one(client, model: str, messages: list[dict], max_tokens: int, t0: float, extra: dict) -> Result:
    import openai

    result = Result(time.monotonic() - t0)
    try:
        stream = await client.chat.completions.create(model=model, messages=messages, max_tokens=max_tokens,
                                                      stream=True, stream_options={"include_usage": True}, **extra)
        pieces = []
        async for chunk in stream:
            now = time.monotonic() - t0
            result.name = chunk.id
            if chunk.choices and chunk.choices[0].delta.content:
                result.chunk_times_s.append(now)
                pieces.append(chunk.choices[0].delta.content)
            if chunk.usage is not None:
                result.output_tokens = chunk.usage.completion_tokens
        result.status, result.text = 200, "".join(pieces)
        result.output_tokens = result.output_tokens or len(result.chunk_times_s)
    except openai.APIStatusError as err:
        result.status, result.error = err.status_code, err.message
        after = err.response.headers.get("retry-after")
        result.retry_after_s = float(after) if after is not None else None
    except (openai.APIConnectionError, asyncio.TimeoutError) as err:
        result.error = f"{type(err).__name__}: {err}"
    result.done_s = time.monotonic() - t0
    return result


async def _load(url, api_key, model, prompts, requests, rate, max_concurrency, max_tokens, seed, timeout_s, extra):
    import openai

    gaps = random.Random(seed)
    async with openai.AsyncOpenAI(base_url=url, api_key=api_key or "none", max_retries=0,
                                  timeout=timeout_s) as client:
        gate = asyncio.Semaphore(max_concurrency or requests)
        t0 = time.monotonic()

        async def at(when: float, messages):
            await asyncio.sleep(max(0.0, when - (time.monotonic() - t0)))
            async with gate:
                return await _one(client, model, messages, max_tokens, t0, extra)

        when, tasks = 0.0, []
        for i in range(requests):
            tasks.append(asyncio.ensure_future(at(when, prompts[i % len(prompts)])))
            when += 0.0 if math.isinf(rate) else gaps.expovariate(rate)
        done, pending = await asyncio.wait(tasks, timeout=timeout_s)
        for task in pending:  # past the time limit: given up, counted as failed
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
        results = [t.result() if t in done and not t.cancelled() else Result(math.nan, error="timed out")
                   for t in tasks]
        return results, time.monotonic() - t0


def run_load(url: str, model: str, prompts: list[list[dict]], *, requests: int = 16, rate: float = math.inf,
             max_concurrency: int | None = None, max_tokens: int = 16, api_key: str | None = None, seed: int = 0,
             timeout_s: float = 120.0, **extra) -> tuple[list[Result], float]:
    """Send `requests` streamed chat requests (messages cycled from `prompts`), Poisson arrivals at `rate` per second
    (math.inf: all at once), at most `max_concurrency` in flight (None: no limit), greedy unless `extra` says
    otherwise (temperature=0 by default). Returns the results in sending order and the run's duration in seconds."""
    if not isinstance(requests, int) or isinstance(requests, bool) or not 1 <= requests <= 10_000:
        raise CourseError(f"requests must be a whole number from 1 to 10,000, not {requests!r}.")
    if not rate > 0:
        raise CourseError(f"rate must be a number of requests per second > 0 (or math.inf), not {rate!r}.")
    if not prompts:
        raise CourseError("Give at least one prompt (a list of chat messages).")
    extra.setdefault("temperature", 0)
    with concurrent.futures.ThreadPoolExecutor(1) as pool:  # its own event loop, whoever calls
        return pool.submit(asyncio.run, _load(url, api_key, model, prompts, requests, rate, max_concurrency,
                                              max_tokens, seed, timeout_s, extra)).result(timeout_s + 30)


def lean_stream(url: str, model: str, messages: list[dict], *, requests: int = 12, max_tokens: int = 4,
                api_key: str | None = None, timeout_s: float = 60.0) -> list[Result]:
    """Streamed greedy chat requests one at a time over one kept-alive connection, written and read with h11 (the HTTP
    library under uvicorn and httpx) and nothing else: a client that does no other work, so that its TTFT minus the
    engine's is the server's own latency and the loopback's, without a client library's own (the `openai` client
    builds the request and a pydantic model per chunk). Each chunk is stamped when its bytes came, before it is
    parsed. Results as run_load's (client clock, seconds from the first request); at most `requests`, within
    timeout_s."""
    import json
    import socket
    from urllib.parse import urlsplit

    import h11

    where = urlsplit(url)
    body = json.dumps({"model": model, "messages": messages, "max_tokens": max_tokens, "temperature": 0,
                       "stream": True, "stream_options": {"include_usage": True}}).encode()
    headers = [("host", where.netloc), ("content-type", "application/json"), ("content-length", str(len(body)))]
    headers += [("authorization", f"Bearer {api_key}")] if api_key else []
    request = h11.Request(method="POST", target=where.path.rstrip("/") + "/chat/completions", headers=headers)
    results, t0 = [], time.monotonic()
    with socket.create_connection((where.hostname, where.port or 80), timeout=timeout_s) as sock:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)  # the request goes out whole, at once
        conn = h11.Connection(h11.CLIENT)
        for _ in range(requests):
            if time.monotonic() - t0 > timeout_s:
                break
            result, pending = Result(time.monotonic() - t0), b""
            sock.sendall(conn.send(request) + conn.send(h11.Data(data=body)) + conn.send(h11.EndOfMessage()))
            while not isinstance(event := conn.next_event(), h11.EndOfMessage):
                if event is h11.NEED_DATA:
                    conn.receive_data(sock.recv(65536))
                elif isinstance(event, h11.Response):
                    result.status = event.status_code
                elif isinstance(event, h11.Data):
                    now, pending = time.monotonic() - t0, pending + bytes(event.data)
                    *frames, pending = pending.split(b"\n\n")
                    for frame in frames:
                        if not frame.startswith(b"data: {"):  # [DONE], or not an event
                            continue
                        chunk = json.loads(frame[6:])
                        result.name = chunk.get("id", result.name)
                        text = (chunk.get("choices") or [{}])[0].get("delta", {}).get("content")
                        if text:
                            result.chunk_times_s.append(now)
                            result.text += text
                        if chunk.get("usage"):
                            result.output_tokens = chunk["usage"]["completion_tokens"]
            result.done_s = time.monotonic() - t0
            results.append(result)
            conn.start_next_cycle()
    return results


def server_latency(results: list[Result], records: dict) -> list[dict]:
    """Where each served request's time between the two TTFTs went, seconds (measure/timing.py defines both):
    own: client TTFT - engine TTFT, the server's own latency; in_handler: the part the server's handler timed itself
    (from the whole body in hand to the request's arrival at the engine: checking, the chat template; and from the first
    token to its chunk handed to the web server: the hand-over); outside: the rest (the client's own work, the
    loopback, the web server's HTTP parsing and writing). records: the engine's, by the id the client saw
    (GET /debug/requests); requests without a record, or streamed without text, are left out."""
    rows = []
    for r in results:
        e = records.get(r.name) if r.ok else None
        if e is None or e.get("ttft_s") is None:
            continue
        own = r.ttft_s - e["ttft_s"]
        timed = e.get("received_s") is not None and e.get("first_sent_s") is not None
        inside = (e["arrival_s"] - e["received_s"]) + (e["first_sent_s"] - e["first_token_s"]) if timed else math.nan
        rows.append({"name": r.name, "own": own, "in_handler": inside, "outside": own - inside})
    return rows


def summarize(results: list[Result], duration_s: float, ttft_slo_s: float = 1.0, tpot_slo_s: float = 0.2) -> dict:
    """What vLLM's `bench serve` reports, from the client's records: counts, throughputs (per second of the run),
    mean / median / p99 latencies in milliseconds, and the request goodput (requests per second that met both
    objectives: measure.timing.met_objectives)."""
    ok = [r for r in results if r.ok]
    out = {"completed": len(ok), "failed": len(results) - len(ok),
           "refused_429": sum(r.status == 429 for r in results), "duration_s": duration_s,
           "request_throughput": len(ok) / duration_s, "output_throughput": sum(r.output_tokens for r in ok) / duration_s,
           "ttft_slo_ms": ttft_slo_s * 1e3, "tpot_slo_ms": tpot_slo_s * 1e3}
    series = {"ttft": [r.ttft_s for r in ok], "tpot": [r.tpot_s for r in ok],
              "itl": [g for r in ok for g in r.itl_s], "e2e": [r.e2e_s for r in ok]}
    for name, values in series.items():  # p99: numpy's, linear between the two nearest
        values = [v for v in values if not math.isnan(v)] or [math.nan]
        out.update({f"mean_{name}_ms": statistics.fmean(values) * 1e3, f"median_{name}_ms":
                    statistics.median(values) * 1e3, f"p99_{name}_ms": float(np.percentile(values, 99)) * 1e3})
    good = [r for r in ok if met_objectives(r.ttft_s, r.tpot_s, ttft_slo_s, tpot_slo_s)]
    out["request_goodput"] = len(good) / duration_s
    refusals = [r.done_s - r.sent_s for r in results if r.status == 429]
    out["median_refusal_ms"] = statistics.median(refusals) * 1e3 if refusals else math.nan
    return out


def engine_clock_offset(read_clock, tries: int = 5) -> tuple[float, float]:
    """Map the engine's clock onto this client's `time.monotonic()`, as NTP does: read the engine's clock (read_clock:
    seconds since the engine started, e.g. GET /debug/requests' "clock") between two readings of ours, `tries` times,
    and keep the shortest round trip. Returns (offset, error): engine time + offset = our time, within +- error
    (half that round trip), whatever clock each process keeps."""
    best = None
    for _ in range(max(1, tries)):
        before = time.monotonic()
        clock = read_clock()
        after = time.monotonic()
        if best is None or after - before < 2 * best[1]:
            best = ((before + after) / 2 - clock, (after - before) / 2)
    return best


def set_queue_limit(root: str, limit: int | str | None, api_key: str | None = None) -> dict:
    """PUT /debug/max-waiting on the course's server at `root` (http://host:port): how many requests may wait for a
    batch slot (None: no limit; "auto": sized from the TTFT objective). Returns the server's answer."""
    import json
    import urllib.request

    headers = {"Content-Type": "application/json"} | ({"Authorization": f"Bearer {api_key}"} if api_key else {})
    request = urllib.request.Request(root + "/debug/max-waiting", method="PUT", headers=headers,
                                     data=json.dumps({"max_waiting": limit}).encode())
    with urllib.request.build_opener(urllib.request.ProxyHandler({})).open(request, timeout=10) as reply:
        return json.loads(reply.read())


def poll_until(read, done, timeout_s: float = 10.0, every_s: float = 0.02):
    """Call read() every `every_s` seconds until done(value) is true or `timeout_s` has passed. Returns (the last
    value, seconds from the call to the reading that was done, or None when none was)."""
    start = time.monotonic()
    while True:
        value = read()
        if done(value):
            return value, time.monotonic() - start
        if time.monotonic() - start > timeout_s:
            return value, None
        time.sleep(every_s)
