"""Sweep the launch sizes of the fast MoE's small kernels: routing, plan, scatter and k-sum.

    PYTHONPATH=python python benchmark/sweep_moe_launches.py [--tokens 4096,16384] [--iters 50]
    PYTHONPATH=python python benchmark/sweep_moe_launches.py --quick   # on a CPU: agreement only

The GEMMs have ``tune_moe.py``; these four kernels wait on memory, and their sizes are
module constants of ``kernel/moe_routing.py`` and ``kernel/fused_moe.py``. For each T
(Qwen3-30B-A3B's E=128, top-8, H=2048, fp32 router logits as ``bench_moe.py`` makes them,
128-row tiles), each candidate is set in the module, run, checked bit-equal to the current
choice's output, and timed per kernel by torch's profiler as ``profile_moe.py`` times them. The
five fastest candidates are printed, and the current choice (``*``) with its rank. ``--quick``
runs every candidate on a tiny shape and checks agreement only, in Triton's interpreter where
there is no GPU: no time is printed. Exit status 1 if a candidate disagrees, or if there is no
GPU and no ``--quick``.
"""

from __future__ import annotations

import argparse
import itertools
import os
import sys
from pathlib import Path
from typing import Callable, Dict, List, Tuple

if "--quick" in sys.argv and not Path("/dev/nvidia0").exists():
    os.environ.setdefault("TRITON_INTERPRET", "1")  # before triton is imported

import torch  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "python"))

from minisgl.kernel import fused_moe, moe_routing  # noqa: E402

Candidate = Dict[str, int]  # module constant -> value
SPACES: Dict[str, Tuple[object, List[Candidate]]] = {
    "routing": (moe_routing, [dict(ROUTE_TOKENS_PER_WARP=t) for t in (16, 8, 4, 2)]),
    "plan": (
        moe_routing,
        [
            dict(PLAN_CHUNK_B=c, PLAN_TILE_CHUNK=t, PLAN_WARPS=w)
            for c, t, w in itertools.product((16, 32, 64), (64, 128, 256), (2, 4, 8))
        ],
    ),
    "scatter": (moe_routing, [dict(SCATTER_WARPS=w) for w in (1, 2, 4, 8)]),
    "k-sum": (
        fused_moe,
        [
            dict(SUM_BLOCK_T=t, SUM_BLOCK_H=h, SUM_WARPS=w)
            for t, h, w in itertools.product((1, 2, 4, 8), (256, 512, 1024, 2048), (4, 8))
        ],
    ),
}
KERNELS = {
    "routing": ("_route_and_count_kernel",),
    "plan": ("_sum_chunks_kernel", "_plan_tiles_kernel"),
    "scatter": ("_scatter_pairs_kernel",),
    "k-sum": ("_sum_choices_kernel",),
}


def calls(
    tokens: int, experts: int, topk: int, hidden: int, block_m: int, sum_tokens: int, device: str
) -> Dict[str, Callable[[], Tuple[torch.Tensor, ...]]]:
    """Each sweep's call, on one routing of random logits (the k-sum on sum_tokens tokens);
    each returns what it writes (of sorted_ids the used slots only: the rest is never read)."""
    logits = torch.randn(tokens, experts, device=device)
    _, ids, counts = moe_routing.route(logits, topk, True)
    y = torch.randn(sum_tokens * topk, hidden, device=device, dtype=torch.bfloat16)

    def aligned() -> Tuple[torch.Tensor, ...]:
        sorted_ids, expert_ids, num_padded = moe_routing.align(ids, counts, experts, block_m)
        return sorted_ids[: int(num_padded.item())], expert_ids, num_padded

    return {
        "routing": lambda: moe_routing.route(logits, topk, True),
        "plan": aligned,
        "scatter": aligned,
        "k-sum": lambda: (fused_moe.sum_choices(y, topk),),
    }


def with_constants(module: object, candidate: Candidate, run: Callable[[], object]) -> object:
    """run() with the module's constants set to the candidate's, then put back."""
    saved = {name: getattr(module, name) for name in candidate}
    for name, value in candidate.items():
        setattr(module, name, value)
    try:
        return run()
    finally:
        for name, value in saved.items():
            setattr(module, name, value)


def current(module: object, candidates: List[Candidate]) -> Candidate:
    return {name: getattr(module, name) for name in candidates[0]}


def timed_us(run: Callable[[], object], kernels: Tuple[str, ...], iters: int) -> float:
    """The named kernels' GPU microseconds per call of run."""
    from profile_moe import kernel_us

    per_kernel = kernel_us(run, iters)
    return sum(us for name, us in per_kernel.items() if name.startswith(kernels))


def sweep(name: str, run: Callable[[], Tuple[torch.Tensor, ...]], iters: int, timed: bool) -> bool:
    """Every candidate of one sweep: True if all agree with the current choice."""
    module, candidates = SPACES[name]
    chosen = current(module, candidates)
    want = run()
    results, agree = [], True
    for candidate in candidates:
        got = with_constants(module, candidate, run)
        same = all(torch.equal(a, b) for a, b in zip(got, want))
        if not same:
            print(f"  {name} {candidate}: DISAGREES with the current choice")
            agree = False
        if timed:
            us = with_constants(module, candidate, lambda: timed_us(run, KERNELS[name], iters))
            results.append((us, candidate))
    if not timed:
        print(
            f"  {name}: {len(candidates)} candidates, "
            f"{'all agree' if agree else 'NOT all agree'} with the current choice {chosen}"
        )
        return agree
    results.sort(key=lambda r: r[0])
    rank = next(i for i, (_, c) in enumerate(results) if c == chosen)
    for i, (us, candidate) in enumerate(results):
        if i < 5 or i == rank:
            mark = "*" if i == rank else " "
            print(f"  {name:8s}{mark} {i + 1:3d}. {us:7.1f} us  {candidate}")
    return agree


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--tokens", default="4096,16384")
    p.add_argument("--iters", type=int, default=50)
    p.add_argument(
        "--quick",
        action="store_true",
        help="tiny shape, interpreted on a CPU: checks that every candidate agrees",
    )
    args = p.parse_args()
    timed = torch.cuda.is_available() and not args.quick
    if not timed and not args.quick:
        print("sweep_moe_launches.py needs a GPU (or --quick)")
        return 1
    device = "cuda" if torch.cuda.is_available() else "cpu"
    # --quick: blocks for 1 or 2 chunks of the plan, tiles for 2 programs of 64, and a k-sum
    # of 21 tokens by 300 columns (past the tiles' edges)
    experts, topk, hidden, block_m = (128, 8, 2048, 128) if not args.quick else (8, 2, 300, 8)
    tokens_list = [int(t) for t in args.tokens.split(",")] if not args.quick else [300]
    if timed:
        print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}")
    agree = True
    for tokens in tokens_list:
        torch.manual_seed(tokens)
        print(f"T={tokens}, E={experts}, top-{topk}, H={hidden}")
        for name, run in calls(
            tokens, experts, topk, hidden, block_m, 21 if args.quick else tokens, device
        ).items():
            agree &= sweep(name, run, args.iters, timed)
    return 0 if agree else 1


if __name__ == "__main__":
    sys.exit(main())
