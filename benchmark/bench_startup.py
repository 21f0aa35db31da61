"""How soon a default ``LLM`` serves its first tokens, and how big it makes the KV pool.

    PYTHONPATH=python python benchmark/bench_startup.py [--device cuda] [--family llama3]

A tiny random-weight model (examples/tiny_models.py) is loaded with ``LLM(path)`` and no sizing
option, as a new user would: on a GPU the pool takes the memory ratio's share of the free memory,
capped by what ``max_running_req`` rows of ``max_seq_len`` tokens can fill (chapter 6). Then it
times the first call (one request, one token), one request of 8 tokens and 8 requests of 8
tokens, each from the call to its result.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "examples"))
sys.path.insert(0, str(ROOT / "python"))

import tiny_models  # noqa: E402

from minisgl.core import SamplingParams  # noqa: E402
from minisgl.llm import LLM  # noqa: E402


def timed(label: str, fn) -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    start = time.perf_counter()
    fn()
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    print(f"  {label:<36} {time.perf_counter() - start:8.3f} s")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="auto")
    parser.add_argument("--family", default="llama3")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        path = str(tiny_models.make_tiny_model(args.family, tmp))
        holder = {}
        print(f"tiny {args.family}, LLM(path, device={args.device!r}) with default options:")
        timed("LLM(path)", lambda: holder.setdefault("llm", LLM(path, device=args.device)))
        llm = holder["llm"]
        engine = llm.scheduler.engine
        print(
            f"  KV pool: {engine.num_pages} pages of {engine.config.page_size} token(s), "
            f"{engine.config.max_running_req} rows of {engine.max_seq_len} tokens, "
            f"on {engine.device}"
        )
        one, eight = SamplingParams(max_tokens=1), SamplingParams(max_tokens=8, ignore_eos=True)
        timed("first token (1 request, 1 token)", lambda: llm.generate(["Hello"], one))
        timed("1 request x 8 tokens", lambda: llm.generate(["Hello world"], eight))
        prompts = [f"The story number {i} begins" for i in range(8)]
        timed("8 requests x 8 tokens", lambda: llm.generate(prompts, eight))
        llm.shutdown()


if __name__ == "__main__":
    main()
