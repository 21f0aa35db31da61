"""The server against the offline engine, on the same tiny model and the same requests.

    PYTHONPATH=python python benchmark/bench_server.py [--streams 1 16 64] [--output-len 64]

For each number of concurrent streams N: N requests (prompts of 16 to 48 words, greedy, exactly
``--output-len`` tokens each) run once through ``LLM.generate`` in this process and once through
``python -m minisgl`` as N concurrent streaming HTTP clients. It prints the output tokens per
second of both, the server's time to first token (median and worst) and the per-token overhead
of the process pipeline: (server time - offline time) / output tokens. Best of ``--repeat`` runs.
Then, for each N, the CPU seconds that each of the server's processes (read from Linux's
``/proc/PID/stat``) and the offline run took, per run, the mean of the ``--repeat`` timed runs:
where the server's work goes.

``--threads`` is torch's thread count in both (``OMP_NUM_THREADS`` for the server's processes):
with one, the scheduler leaves the other core to the API server and the tokenizer worker.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import re
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Dict, List, Tuple

import httpx
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "examples"))
sys.path.insert(0, str(ROOT / "python"))

import tiny_models  # noqa: E402

from minisgl.core import SamplingParams  # noqa: E402
from minisgl.llm import LLM  # noqa: E402

OPTIONS = dict(device="cpu", page_size=16, num_pages=1024, max_running_req=64)
FLAGS = [
    "--device",
    "cpu",
    "--page-size",
    "16",
    "--num-pages",
    "1024",
    "--max-running-requests",
    "64",
]


def make_prompts(n: int, seed: int = 0) -> List[str]:
    rng = random.Random(seed)
    words = tiny_models.TEXT.split()
    return [" ".join(rng.choices(words, k=rng.randint(16, 48))) for _ in range(n)]


def offline_seconds(llm: LLM, prompts: List[str], output_len: int) -> float:
    params = SamplingParams(max_tokens=output_len, ignore_eos=True)
    start = time.perf_counter()
    out = llm.generate(prompts, params)
    elapsed = time.perf_counter() - start
    assert all(len(o["token_ids"]) == output_len for o in out)
    return elapsed


async def _stream(
    http: httpx.AsyncClient, prompt: str, output_len: int, start: float
) -> Tuple[float, int]:
    """One streaming request: (its time to first token, its output tokens)."""
    body = {
        "prompt": prompt,
        "max_tokens": output_len,
        "ignore_eos": True,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    ttft, tokens = None, 0
    async with http.stream("POST", "/v1/completions", json=body) as r:
        async for line in r.aiter_lines():
            if not line.startswith("data: {"):
                continue
            event = json.loads(line[6:])
            if event.get("usage"):
                tokens = event["usage"]["completion_tokens"]
            elif ttft is None:
                ttft = time.perf_counter() - start
    return ttft or 0.0, tokens


async def server_run(url: str, prompts: List[str], output_len: int) -> Tuple[float, List[float]]:
    """Every prompt as a concurrent stream: (wall seconds, each request's TTFT)."""
    limits = httpx.Limits(max_connections=len(prompts) + 4)
    async with httpx.AsyncClient(base_url=url, timeout=600, limits=limits) as http:
        start = time.perf_counter()
        results = await asyncio.gather(*(_stream(http, p, output_len, start) for p in prompts))
        elapsed = time.perf_counter() - start
    assert all(tokens == output_len for _, tokens in results), results
    return elapsed, [ttft for ttft, _ in results]


def start_server(
    model: Path, threads: int, log: Path
) -> Tuple[subprocess.Popen, str, Dict[str, int]]:
    """The server, its URL, and the pids of its three processes by role."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {**os.environ, "PYTHONPATH": str(ROOT / "python"), "OMP_NUM_THREADS": str(threads)}
    with open(log, "wb") as err:  # its first line names the workers' pids
        proc = subprocess.Popen(
            [sys.executable, "-m", "minisgl", "--model", str(model), "--port", str(port), *FLAGS],
            env=env,
            stderr=err,
        )
    url = f"http://127.0.0.1:{port}"
    for _ in range(600):
        try:
            if httpx.get(url + "/health", timeout=1).status_code == 200:
                workers = re.search(
                    r"workers: scheduler \(pid (\d+)\), tokenizer \(pid (\d+)\)", log.read_text()
                )
                assert workers, log.read_text()
                pids = {
                    "API server": proc.pid,
                    "tokenizer": int(workers[2]),
                    "scheduler": int(workers[1]),
                }
                return proc, url, pids
        except httpx.TransportError:
            time.sleep(0.2)
    raise TimeoutError("the server did not start")


def cpu_seconds(pids: Dict[str, int]) -> Dict[str, float]:
    """User + system CPU seconds each process has used so far (Linux's /proc/PID/stat)."""
    tick = os.sysconf("SC_CLK_TCK")
    out = {}
    for name, pid in pids.items():
        fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
        out[name] = (int(fields[11]) + int(fields[12])) / tick  # utime, stime
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--streams", type=int, nargs="+", default=[1, 16, 64])
    ap.add_argument("--output-len", type=int, default=64)
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--model", default="llama3", choices=tiny_models.FAMILIES)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    with tempfile.TemporaryDirectory() as tmp:
        model = tiny_models.make_tiny_model(a.model, f"{tmp}/{a.model}")
        llm = LLM(model, **OPTIONS)
        proc, url, pids = start_server(model, a.threads, Path(tmp) / "server.log")
        cpu: List[str] = []
        try:
            print(
                "| streams | offline tok/s | server tok/s | server / offline | TTFT median "
                "| TTFT worst | overhead per token |\n| --- | --- | --- | --- | --- | --- "
                "| --- |"
            )
            for n in a.streams:
                prompts = make_prompts(n, seed=n)
                offline_seconds(llm, prompts, a.output_len)  # warm up both
                asyncio.run(server_run(url, prompts, a.output_len))
                start = time.process_time()
                off = min(offline_seconds(llm, prompts, a.output_len) for _ in range(a.repeat))
                offline_cpu = (time.process_time() - start) / a.repeat
                before = cpu_seconds(pids)
                runs = [
                    asyncio.run(server_run(url, prompts, a.output_len)) for _ in range(a.repeat)
                ]
                used = {k: (v - before[k]) / a.repeat for k, v in cpu_seconds(pids).items()}
                cpu.append(
                    f"| {n} | {statistics.mean(w for w, _ in runs):.2f} | "
                    + " | ".join(f"{s:.2f}" for s in used.values())
                    + f" | {offline_cpu:.2f} |"
                )
                wall, ttfts = min(runs)
                tokens = n * a.output_len
                print(
                    f"| {n} | {tokens / off:.0f} | {tokens / wall:.0f} | "
                    f"{off / wall:.0%} | {statistics.median(ttfts) * 1e3:.0f} ms | "
                    f"{max(ttfts) * 1e3:.0f} ms | {(wall - off) / tokens * 1e3:.2f} ms |",
                    flush=True,
                )
            print(
                "\nCPU seconds per run, the mean of the timed runs:\n"
                f"| streams | server wall s | {' | '.join(pids)} | offline (this process) |\n"
                "| --- | --- | --- | --- | --- | --- |"
            )
            print("\n".join(cpu), flush=True)
        finally:
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=30)
            llm.shutdown()


if __name__ == "__main__":
    main()
