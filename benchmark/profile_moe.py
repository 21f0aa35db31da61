"""Where the fast MoE layer's time goes, kernel by kernel, on one GPU.

    PYTHONPATH=python python benchmark/profile_moe.py [--tokens 1,2,16,512,4096,16384]
        [--iters 20]

Qwen3-30B-A3B's layer as ``bench_moe.py`` sets it up (E=128, top-8, H=2048, I=768, bf16). For
each T: the layer replayed from a CUDA graph (median of ``--iters`` replays, each between two
CUDA events), then ``--iters`` eager calls under ``torch.profiler``: each kernel's GPU time per
call. What the replay takes beyond the kernels' sum is the gaps between them (launch latency
inside the graph); with programmatic dependent launch a kernel's time includes waiting for
the one before, so the sum can exceed the replay. For the aligned path it also prints how
many of the GEMMs' rows are padding. Needs a GPU; the times are this GPU's and this run's.
"""

from __future__ import annotations

import argparse
import sys
from collections import defaultdict
from pathlib import Path
from typing import Callable, Dict

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "python"))

from bench_moe import QWEN3_30B_A3B, graph_of, make_weights, median_ms  # noqa: E402

from minisgl.kernel.moe_routing import align, route  # noqa: E402
from minisgl.moe.configs import get_config  # noqa: E402
from minisgl.moe.sync_free import SyncFreeMoeBackend  # noqa: E402


def kernel_us(call: Callable[[], object], iters: int) -> Dict[str, float]:
    """GPU microseconds per call of each kernel name, from the profiler's trace of iters calls."""
    call()
    torch.cuda.synchronize()
    activities = [torch.profiler.ProfilerActivity.CUDA]
    with torch.profiler.profile(activities=activities) as prof:
        for _ in range(iters):
            call()
        torch.cuda.synchronize()
    per_call: Dict[str, float] = defaultdict(float)
    for event in prof.key_averages():
        if event.device_time_total > 0:
            per_call[event.key] += event.device_time_total / iters
    return dict(per_call)


def computed_rows(tiles: torch.Tensor, num_pairs: int, split: int) -> int:
    """The rows the GEMMs compute over tiles [tiles, BLOCK_M] of sorted slots when a last tile
    computes only the parts of BLOCK_M / split rows up to its last pair, in halves or quarters
    as kernel/fused_moe.py does."""
    block_m = tiles.shape[1]
    rows = torch.full((tiles.shape[0],), block_m, device=tiles.device)
    parts = (2, 4) if split == 4 else (2,)
    for part in parts:  # a quarter overrides a half
        rows = torch.where(tiles[:, block_m // part] >= num_pairs, block_m // part, rows)
    return int(rows.sum().item())


def padding(logits: torch.Tensor, topk: int, inter: int, dtype: torch.dtype) -> str:
    """The aligned path's slots against its pairs: the share of the GEMMs' rows that is
    padding (each expert's last tile, part empty)."""
    tokens, experts = logits.shape
    config = get_config(tokens, topk, experts, inter, dtype, logits.device)
    if config["path"] != "aligned":
        return f"{config['path']} path"
    _, ids, block_counts = route(logits, topk, True)
    block_m = config["BLOCK_M"]
    sorted_ids, _, num_padded = align(ids, block_counts, experts, block_m)
    slots, pairs = int(num_padded.item()), ids.numel()
    line = (
        f"BLOCK_M {block_m}: {slots} slots for {pairs} pairs, "
        f"{100 * (1 - pairs / slots):.1f}% padding"
    )
    splits = {gemm: config[gemm].get("TAIL_SPLIT", 1) for gemm in ("gate_up", "down")}
    for gemm, split in splits.items():
        if split > 1:
            rows = computed_rows(sorted_ids[:slots].view(-1, block_m), pairs, split)
            line += (
                f"; {gemm} with TAIL_SPLIT {split} computes {rows} rows, "
                f"{100 * (1 - pairs / rows):.1f}% padding"
            )
    return line


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--tokens", default="1,2,16,512,4096,16384")
    p.add_argument("--iters", type=int, default=20)
    args = p.parse_args()
    if not torch.cuda.is_available():
        print("profile_moe.py needs a GPU")
        return 1
    shape, device = QWEN3_30B_A3B, "cuda"
    w1, w2 = make_weights(shape, device)
    backend = SyncFreeMoeBackend()
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}")
    for tokens in map(int, args.tokens.split(",")):
        torch.manual_seed(tokens)
        x = torch.randn(tokens, shape.hidden, dtype=shape.dtype, device=device)
        logits = torch.randn(tokens, shape.experts, device=device)
        call = lambda: backend.forward(x, w1, w2, logits, shape.topk, True)  # noqa: E731
        replay, _ = graph_of(call)
        total = median_ms(replay, device, args.iters) * 1e3
        kernels = kernel_us(call, args.iters)
        print(
            f"\nT={tokens}: graph replay {total:.1f} us, kernels {sum(kernels.values()):.1f} us; "
            f"{padding(logits, shape.topk, shape.inter, shape.dtype)}"
        )
        for name, us in sorted(kernels.items(), key=lambda item: -item[1]):
            print(f"  {us:9.1f} us  {name[:70]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
