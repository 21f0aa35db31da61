"""Concurrent streaming clients against the server: TTFT, TPOT and E2E at p50/p90/p99, and output
tokens/s (chapter 15).

    PYTHONPATH=python python benchmark/online.py --base-url http://127.0.0.1:1919/v1 \\
        [--num-prompts 64] [--concurrency 16 | --request-rate 4]
    PYTHONPATH=python python benchmark/online.py --launch MODEL [--server-args "--device cpu"]

The requests are nano-vllm's workload (examples/ch15_measure.py), its first ``--num-prompts``
sequences, sent as token ids to ``/v1/completions`` with ``stream=True``, ``ignore_eos`` and
``temperature=0.6``; ``--max-input`` keeps a prompt's first ids only, ``--max-output`` caps
max_tokens, and ids are taken modulo ``--vocab-size`` (with ``--launch``, the model's), so a small
model can serve them. ``--request-rate R`` sends them as a Poisson process of R requests a second
(exponential gaps, seeded); ``--concurrency C`` keeps at most C in flight; with neither, all are
sent at once.

Each request's times are taken by the client: sent, first chunk, last chunk; its token count is
the server's ``usage`` (``stream_options.include_usage``). TTFT = first - sent; TPOT = (last -
first) / (tokens - 1); E2E = last - sent (``request_latencies``). Output tokens/s = all requests'
tokens / the wall time from the first send to the last reply. ``--launch MODEL`` starts
``python -m minisgl`` on a free port of 127.0.0.1 and stops it at the end.

The client is the official ``openai`` package, what a user would pick; ``--client raw`` reads
the same stream with httpx and ``json.loads`` on each ``data:`` line, as SGLang's
``bench_serving`` does with aiohttp. Parsing thousands of chunks a second is work for the client's
one thread too: the summary gives the client's CPU time beside the wall time, and a client busy
most of the run is measuring itself (its queued chunks count as latency).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import resource
import shlex
import socket
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Dict, Iterator, List, Tuple

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "examples"))
sys.path.insert(0, str(ROOT / "python"))

from ch15_measure import nano_vllm_workload, percentile, request_latencies  # noqa: E402

Request = Tuple[List[int], int]  # prompt ids, max_tokens


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    where = p.add_mutually_exclusive_group(required=True)
    where.add_argument("--base-url", help="the server's OpenAI base URL, ending in /v1")
    where.add_argument("--launch", metavar="MODEL", help="start a server for this model")
    p.add_argument("--server-args", default="", help="more flags for the launched server")
    p.add_argument("--num-prompts", type=int, default=64)
    p.add_argument("--request-rate", type=float, default=None, help="requests/s, Poisson")
    p.add_argument("--concurrency", type=int, default=None, help="requests in flight at most")
    p.add_argument("--max-input", type=int, default=None, help="keep a prompt's first ids")
    p.add_argument("--max-output", type=int, default=None, help="cap max_tokens")
    p.add_argument("--vocab-size", type=int, default=10001, help="ids are taken modulo this")
    p.add_argument("--seed", type=int, default=0, help="of the Poisson gaps")
    p.add_argument(
        "--client",
        choices=("openai", "raw"),
        default="openai",
        help="the openai package, or httpx with json.loads on each event",
    )
    p.add_argument("--json", action="store_true", help="print the summary as JSON too")
    return p.parse_args()


def make_requests(args: argparse.Namespace) -> List[Request]:
    prompts, params = nano_vllm_workload(args.num_prompts)
    requests = []
    for ids, sp in zip(prompts, params):
        ids = [t % args.vocab_size for t in ids[: args.max_input]]
        requests.append((ids, min(sp.max_tokens, args.max_output or sp.max_tokens)))
    return requests


async def one_request(client: Any, model: str, request: Request) -> Dict[str, float]:
    """Stream one completion with the openai client; its latencies and token count, by the
    client's clock."""
    ids, max_tokens = request
    sent = time.perf_counter()
    first = last = 0.0
    tokens = 0
    stream = await client.completions.create(
        model=model,
        prompt=ids,
        max_tokens=max_tokens,
        temperature=0.6,
        stream=True,
        stream_options={"include_usage": True},
        extra_body={"ignore_eos": True},
    )
    async for chunk in stream:
        if chunk.usage is not None:
            tokens = chunk.usage.completion_tokens
        if chunk.choices:
            last = time.perf_counter()
            first = first or last
    return {**request_latencies(sent, first, last, tokens), "tokens": tokens}


async def one_raw_request(
    client: httpx.AsyncClient, model: str, request: Request
) -> Dict[str, float]:
    """The same request, its server-sent events read line by line."""
    ids, max_tokens = request
    body = {
        "model": model,
        "prompt": ids,
        "max_tokens": max_tokens,
        "temperature": 0.6,
        "stream": True,
        "stream_options": {"include_usage": True},
        "ignore_eos": True,
    }
    sent = time.perf_counter()
    first = last = 0.0
    tokens = 0
    async with client.stream("POST", "completions", json=body) as reply:
        reply.raise_for_status()
        async for line in reply.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if chunk.get("usage"):
                tokens = chunk["usage"]["completion_tokens"]
            if chunk["choices"]:
                last = time.perf_counter()
                first = first or last
    return {**request_latencies(sent, first, last, tokens), "tokens": tokens}


async def run(
    args: argparse.Namespace, base_url: str
) -> Tuple[List[Dict[str, float]], float, float]:
    """Every request's figures, the wall time and the client's CPU time, both from the first
    send to the last reply."""
    from openai import AsyncOpenAI

    requests = make_requests(args)
    gaps = random.Random(args.seed)
    limit = asyncio.Semaphore(args.concurrency or len(requests))
    raw = httpx.AsyncClient(
        base_url=base_url.rstrip("/") + "/", timeout=3600, limits=httpx.Limits(max_connections=None)
    )
    async with (
        AsyncOpenAI(base_url=base_url, api_key="none", max_retries=0, timeout=3600) as client,
        raw,
    ):
        model = (await client.models.list()).data[0].id

        async def limited(request: Request) -> Dict[str, float]:
            async with limit:
                if args.client == "raw":
                    return await one_raw_request(raw, model, request)
                return await one_request(client, model, request)

        ttft_before = server_ttft(base_url)
        start, cpu_start = time.perf_counter(), client_cpu_s()
        tasks = []
        for request in requests:
            tasks.append(asyncio.create_task(limited(request)))
            if args.request_rate:
                await asyncio.sleep(gaps.expovariate(args.request_rate))
        results = await asyncio.gather(*tasks)
        seconds, cpu_s = time.perf_counter() - start, client_cpu_s() - cpu_start
    ttft_after = server_ttft(base_url)
    if ttft_before and ttft_after and ttft_after[1] > ttft_before[1]:
        server = (ttft_after[0] - ttft_before[0]) / (ttft_after[1] - ttft_before[1])
        client = sum(r["ttft"] for r in results) / len(results)
        print(
            f"TTFT mean: {client * 1e3:.1f} ms by the client, {server * 1e3:.1f} ms by the "
            "server's own clock (its /metrics)"
        )
    return results, seconds, cpu_s


def server_ttft(base_url: str) -> Tuple[float, float] | None:
    """The sum and count of the server's own TTFT histogram (its ``/metrics``, where a reply's
    first piece leaves the API server), or None from a server without it."""
    try:
        text = httpx.get(base_url.rstrip("/").removesuffix("/v1") + "/metrics", timeout=10).text
    except httpx.HTTPError:
        return None
    found = dict(
        line.split(" ", 1)
        for line in text.splitlines()
        if line.startswith("minisgl:time_to_first_token_seconds_")
    )
    try:
        return (
            float(found["minisgl:time_to_first_token_seconds_sum"]),
            float(found["minisgl:time_to_first_token_seconds_count"]),
        )
    except (KeyError, ValueError):
        return None


def client_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def summary(results: List[Dict[str, float]], seconds: float, cpu_s: float) -> Dict[str, Any]:
    tokens = sum(r["tokens"] for r in results)
    out: Dict[str, Any] = {
        "requests": len(results),
        "seconds": seconds,
        "output_tokens": tokens,
        "output_tokens_per_s": tokens / seconds,
        "client_cpu_s": cpu_s,
    }
    for metric in ("ttft", "tpot", "e2e"):
        values = [r[metric] for r in results]
        out[metric] = {f"p{q}": percentile(values, q) for q in (50, 90, 99)}
    return out


def show(s: Dict[str, Any]) -> None:
    print(
        f"{s['requests']} requests, {s['output_tokens']:,} output tokens in "
        f"{s['seconds']:.2f} s: {s['output_tokens_per_s']:,.1f} output tokens/s; the client "
        f"used {s['client_cpu_s']:.2f} CPU-s"
    )
    print(f"{'':6s} {'p50':>10s} {'p90':>10s} {'p99':>10s}  (ms)")
    for metric in ("ttft", "tpot", "e2e"):
        row = " ".join(f"{s[metric][p] * 1e3:10.1f}" for p in ("p50", "p90", "p99"))
        print(f"{metric.upper():6s} {row}")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@contextmanager
def launched(model: str, server_args: str) -> Iterator[str]:
    """``python -m minisgl`` on a free port; its base URL once /health answers."""
    port = free_port()
    paths = [str(ROOT / "python"), os.environ.get("PYTHONPATH", "")]  # keep the caller's
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in paths if p)}
    cmd = [
        sys.executable,
        "-m",
        "minisgl",
        "--model",
        model,
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        *shlex.split(server_args),
    ]
    proc = subprocess.Popen(cmd, env=env)
    try:
        wait_healthy(f"http://127.0.0.1:{port}", proc)
        yield f"http://127.0.0.1:{port}/v1"
    finally:
        proc.terminate()
        proc.wait(timeout=60)


def wait_healthy(url: str, proc: subprocess.Popen, timeout_s: float = 600.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"the server exited with status {proc.returncode}")
        try:
            if httpx.get(f"{url}/health", timeout=1).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.2)
    raise TimeoutError("the server did not become healthy")


def main() -> None:
    args = parse_args()
    if args.launch:
        vocab = json.loads((Path(args.launch) / "config.json").read_text())["vocab_size"]
        args.vocab_size = min(args.vocab_size, vocab)
        with launched(args.launch, args.server_args) as base_url:
            results, seconds, cpu_s = asyncio.run(run(args, base_url))
    else:
        results, seconds, cpu_s = asyncio.run(run(args, args.base_url))
    s = summary(results, seconds, cpu_s)
    show(s)
    if args.json:
        print(json.dumps(s))


if __name__ == "__main__":
    main()
