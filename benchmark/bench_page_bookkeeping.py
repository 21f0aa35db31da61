"""What one request's page bookkeeping costs as the KV pool grows: the free-page ring against
a Python list of the free pages (chapter 7).

    PYTHONPATH=python python benchmark/bench_page_bookkeeping.py [--device cpu|cuda]

For pools of 10^3 to 10^8 pages (page size 1), a request of 64 tokens takes its pages
(``CacheManager.allocate``) and gives them back (``cache_req``), many times over; it prints the
microseconds of one round trip. Beside it, a Python list whose head is sliced off on every
take, which copies the rest of the list, so it costs O(pool) (it is skipped at 10^8 pages, where
the list alone would take gigabytes). Run from a chapter's tree (``python tools/steps.py
checkout 7 DIR``, with this file copied into DIR/benchmark), it measures that chapter's
``CacheManager``.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Callable, List

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "python"))

from minisgl.core import Req, SamplingParams  # noqa: E402
from minisgl.kvcache import create_prefix_cache  # noqa: E402
from minisgl.scheduler.cache import CacheManager  # noqa: E402

TOKENS = 64


class ListFreePages:
    """The free pages as a Python list: take from the front, give back at the end."""

    def __init__(self, num_pages: int):
        self.free_pages: List[int] = list(range(num_pages))

    def take(self, n: int) -> List[int]:
        taken, self.free_pages = self.free_pages[:n], self.free_pages[n:]  # copies the rest
        return taken

    def give(self, pages: List[int]) -> None:
        self.free_pages.extend(pages)


def ring_round_trip(num_pages: int, device: str) -> Callable[[], None]:
    table = torch.zeros(1, TOKENS, dtype=torch.int32, device=device)
    cache = CacheManager(num_pages, 1, table, create_prefix_cache("naive", 1))
    req = Req(0, list(range(TOKENS)), SamplingParams(max_tokens=1), table_idx=0)

    def round_trip() -> None:
        req.cached_len, req.device_len = 0, TOKENS
        req.cache_handle = cache.match_req(req)
        cache.allocate([req])
        req.complete_forward()
        cache.cache_req(req, finished=True)

    return round_trip


def list_round_trip(num_pages: int) -> Callable[[], None]:
    pages = ListFreePages(num_pages)
    return lambda: pages.give(pages.take(TOKENS))


def microseconds(fn: Callable[[], None], device: str, repeat: int = 200) -> float:
    """The best of 5 runs of ``repeat`` calls, per call."""
    best = float("inf")
    for _ in range(5):
        if device == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        for _ in range(repeat):
            fn()
        if device == "cuda":
            torch.cuda.synchronize()
        best = min(best, (time.perf_counter() - start) / repeat)
    return best * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args()
    torch.set_num_threads(1)
    print(
        f"one request of {TOKENS} tokens takes its pages and gives them back ({args.device}, "
        "1 thread), microseconds:"
    )
    print(f"{'pool (pages)':>14}  {'ring':>8}  {'list':>10}")
    for exponent in (3, 5, 7, 8):
        num_pages = 10**exponent
        ring = microseconds(ring_round_trip(num_pages, args.device), args.device)
        listed = "skipped"
        if exponent <= 7:  # fewer calls where each one copies millions of entries
            calls = max(2, 200 // 10 ** (exponent - 3))
            listed = f"{microseconds(list_round_trip(num_pages), 'cpu', calls):.0f}"
        print(f"{'10^' + str(exponent):>14}  {ring:8.0f}  {listed:>10}")


if __name__ == "__main__":
    main()
