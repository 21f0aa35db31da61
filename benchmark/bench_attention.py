"""Chapter 16's attention kernels against their limits, on one GPU (an H200 by default).

    PYTHONPATH=python python benchmark/bench_attention.py [--hbm-tbps 4.8] [--iters 50] [--sweep]
        [--decode-shapes 131x903,256x903] [--heads 16/8] [--no-extend]
    PYTHONPATH=python python benchmark/bench_attention.py --quick   # on a CPU: a crash check only

Two tables, with Qwen3-0.6B's attention (16 query heads, 8 KV heads, head dim 128, bf16):
- decode: ``decode_attention`` for batch x context from 1 x 1k to 256 x 4k, pages of 16 scattered
  at random in the pool. Bytes are the K and V read plus q and o; GB/s is bytes / time, and the
  share is that against the HBM bandwidth (4.8 TB/s on an H200).
- extend: ``extend_attention`` (a prefill, no prefix) against torch's
  ``scaled_dot_product_attention(..., is_causal=True)`` with its flash kernel, on the same unpaged
  shapes (batch 1..8 x 512..4096 tokens); ratio = torch's time / ours, so above 1 is faster.

Each time is the median of ``--iters`` replays of a CUDA graph (so Python launch overhead is not
counted), with the L2 cache flushed before each. Each shape is also checked against torch: the
largest absolute difference is printed. ``--sweep`` also times other tile sizes and split
counts and prints the best per shape. ``--decode-shapes`` times other batch x context shapes,
``--heads`` other query/KV head counts (32/4: Qwen3-30B-A3B's), and ``--no-extend`` leaves out
the extend table (and its sweep).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Dict, List, Tuple

if "--quick" in sys.argv and not Path("/dev/nvidia0").exists():
    os.environ.setdefault("TRITON_INTERPRET", "1")  # before triton is imported

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "python"))

from minisgl.kernel import attention  # noqa: E402
from minisgl.kernel.attention import decode_attention, extend_attention  # noqa: E402

DECODE_SHAPES = [
    (1, 1024),
    (1, 4096),
    (16, 1024),
    (16, 4096),
    (64, 1024),
    (64, 4096),
    (256, 1024),
    (256, 4096),
]
EXTEND_SHAPES = [
    (1, 512),
    (1, 1024),
    (1, 2048),
    (1, 4096),
    (4, 1024),
    (4, 4096),
    (8, 512),
    (8, 2048),
    (8, 4096),
]
DECODE_SWEEP = [
    dict(BLOCK_N=n, num_warps=w, num_stages=s)
    for n, w, s in [
        (32, 4, 2),
        (64, 4, 2),
        (64, 8, 2),
        (32, 4, 3),
        (128, 8, 2),
        (64, 4, 3),
        (32, 4, 4),
        (16, 4, 3),
        (32, 2, 3),
    ]
]
SPLIT_SWEEP = [None, 1, 2, 4, 8, 16, 32, 64]
EXTEND_SWEEP = [
    dict(BLOCK_M=m, BLOCK_N=n, num_warps=w, num_stages=s)
    for m, n, w, s in [
        (128, 64, 8, 2),
        (128, 64, 8, 1),
        (128, 32, 8, 2),
        (128, 32, 4, 2),
        (64, 64, 4, 2),
        (128, 64, 8, 3),
    ]
]


@dataclass
class Setup:
    num_qo_heads: int
    num_kv_heads: int
    head_dim: int
    page_size: int
    dtype: torch.dtype
    device: str
    iters: int


def time_ms(fn: Callable[[], object], setup: Setup) -> float:
    """Median milliseconds of fn: CUDA-graph replays with L2 flushed, or one call on a CPU."""
    if setup.device != "cuda":
        start = time.perf_counter()
        fn()
        return (time.perf_counter() - start) * 1e3
    fn()  # compile outside the capture
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):  # warm up the graph's allocations on a side stream
        fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    flush = torch.empty(256 << 20, dtype=torch.int8, device="cuda")  # larger than the L2
    times = []
    for _ in range(setup.iters):
        flush.zero_()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def scattered_pool(batch: int, context: int, setup: Setup, gen: torch.Generator):
    """K, V caches holding batch x context tokens in pages scattered at random, the page table
    (row b = request b) and q for one new token per request."""
    pages_per_req = -(-context // setup.page_size)
    num_pages = batch * pages_per_req
    shape = (num_pages * setup.page_size, setup.num_kv_heads, setup.head_dim)
    k_cache = torch.randn(shape, dtype=setup.dtype, device=setup.device)
    v_cache = torch.randn(shape, dtype=setup.dtype, device=setup.device)
    pages = torch.randperm(num_pages, generator=gen).view(batch, pages_per_req).to(setup.device)
    pos = torch.arange(context, device=setup.device)
    table = (pages[:, pos // setup.page_size] * setup.page_size + pos % setup.page_size).int()
    q = torch.randn(
        batch, setup.num_qo_heads, setup.head_dim, dtype=setup.dtype, device=setup.device
    )
    return q, k_cache, v_cache, table


def decode_case(batch: int, context: int, setup: Setup, splits: int | None):
    gen = torch.Generator().manual_seed(batch * 100003 + context)
    q, k_cache, v_cache, table = scattered_pool(batch, context, setup, gen)
    rows = torch.arange(batch, dtype=torch.int32, device=setup.device)
    seq_lens = torch.full((batch,), context, dtype=torch.int32, device=setup.device)
    scale = setup.head_dim**-0.5

    def run() -> torch.Tensor:
        return decode_attention(q, k_cache, v_cache, table, rows, seq_lens, scale, splits)

    return run, (q, k_cache, v_cache, table)


def decode_error(
    out: torch.Tensor,
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    table: torch.Tensor,
) -> float:
    """The largest difference from torch's attention over the gathered (unpaged) K and V."""
    slots = table.long()  # [B, S]
    k, v = k_cache[slots].transpose(1, 2), v_cache[slots].transpose(1, 2)  # [B, Hkv, S, D]
    ref = F.scaled_dot_product_attention(q.unsqueeze(2), k, v, enable_gqa=True).squeeze(2)
    return (out.float() - ref.float()).abs().max().item()


def decode_row(batch: int, context: int, setup: Setup, hbm_tbps: float) -> str:
    run, tensors = decode_case(batch, context, setup, None)
    error = decode_error(run(), *tensors)
    ms = time_ms(run, setup)
    element = torch.finfo(setup.dtype).bits // 8
    kv_bytes = 2 * batch * context * setup.num_kv_heads * setup.head_dim * element
    qo_bytes = 2 * batch * setup.num_qo_heads * setup.head_dim * element
    gbps = (kv_bytes + qo_bytes) / ms / 1e6
    share = gbps / (hbm_tbps * 1e3)
    splits = attention.default_num_kv_splits(batch, setup.num_kv_heads)
    return (
        f"{batch:>5} {context:>7} {splits:>6} {ms * 1e3:>10.1f} {gbps:>9.0f} "
        f"{share:>7.0%} {error:>9.1e}"
    )


def extend_case(batch: int, length: int, setup: Setup, gen: torch.Generator):
    """Contiguous K, V of batch x length new tokens, stored in order (slot = b * length + i),
    and the same as [B, H, L, D] tensors for torch."""
    h_q, h_kv, dim, dev = setup.num_qo_heads, setup.num_kv_heads, setup.head_dim, setup.device
    q = torch.randn(batch * length, h_q, dim, generator=gen).to(dev, setup.dtype)
    k_cache = torch.randn(batch * length, h_kv, dim, generator=gen).to(dev, setup.dtype)
    v_cache = torch.randn(batch * length, h_kv, dim, generator=gen).to(dev, setup.dtype)
    table = torch.arange(batch * length, dtype=torch.int32, device=dev).view(batch, length)
    ints = lambda xs: torch.tensor(xs, dtype=torch.int32, device=dev)  # noqa: E731
    lens = [length] * batch
    args = (
        q,
        k_cache,
        v_cache,
        table,
        ints(list(range(batch))),
        ints([0] * batch),
        ints(lens),
        ints([b * length for b in range(batch)]),
        length,
        dim**-0.5,
    )
    # torch's flash kernel wants as many K, V heads as query heads: expanded outside the timing
    as_bhld = lambda x: x.view(batch, length, -1, dim).transpose(1, 2)  # noqa: E731
    group = h_q // h_kv
    dense = (
        as_bhld(q),
        as_bhld(k_cache).repeat_interleave(group, 1),
        as_bhld(v_cache).repeat_interleave(group, 1),
    )
    return args, dense


def sdpa_flash(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    if q.device.type != "cuda" or q.dtype == torch.float32:
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)
    from torch.nn.attention import SDPBackend, sdpa_kernel

    with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)


def extend_row(batch: int, length: int, setup: Setup) -> str:
    args, dense = extend_case(batch, length, setup, torch.Generator().manual_seed(length + batch))
    ours = extend_attention(*args)
    theirs = sdpa_flash(*dense)
    error = (ours.float() - theirs.transpose(1, 2).reshape(ours.shape).float()).abs().max().item()
    ours_ms = time_ms(lambda: extend_attention(*args), setup)
    torch_ms = time_ms(lambda: sdpa_flash(*dense), setup)
    flops = 2 * batch * setup.num_qo_heads * length * length * setup.head_dim  # causal: half
    return (
        f"{batch:>5} {length:>7} {ours_ms * 1e3:>10.1f} {torch_ms * 1e3:>10.1f} "
        f"{flops / ours_ms / 1e9:>8.0f} {flops / torch_ms / 1e9:>8.0f} "
        f"{torch_ms / ours_ms:>6.2f} {error:>9.1e}"
    )


def best_of(options: List[Tuple[str, Callable[[], float]]]) -> str:
    """Time each option (one that fails to compile or launch counts as infinitely slow) -> the
    three fastest, and the first option (the current choice) for comparison; times in us."""
    results: Dict[str, float] = {}
    for name, measure in options:
        try:
            results[name] = measure()
        except Exception as error:  # noqa: BLE001 (a tile too big for the GPU: report, go on)
            print(f"    {name}: {type(error).__name__}", file=sys.stderr)
            results[name] = float("inf")
    ranked = sorted(results, key=results.__getitem__)[:3]
    first = options[0][0]
    return ", ".join(f"{name} {results[name] * 1e3:.1f}" for name in ranked) + (
        f"; now {first} {results[first] * 1e3:.1f}"
    )


def sweep(
    setup: Setup, decode_shapes: List[Tuple[int, int]], extend_shapes: List[Tuple[int, int]]
) -> None:
    key = "float32" if setup.dtype == torch.float32 else "16bit"
    chosen_decode, chosen_extend = attention.DECODE_TILES[key], attention.EXTEND_TILES[key]
    print("\nsweep: decode, tiles (BLOCK_N, warps, stages) x splits; times in us")
    for batch, context in decode_shapes:
        options = []
        for tiles in DECODE_SWEEP:
            for splits in SPLIT_SWEEP:
                name = f"{tiles['BLOCK_N']}/{tiles['num_warps']}/{tiles['num_stages']}x{splits}"

                def measure(tiles: dict = tiles, splits: int | None = splits) -> float:
                    attention.DECODE_TILES[key] = tiles
                    return time_ms(decode_case(batch, context, setup, splits)[0], setup)

                options.append((name, measure))
        print(f"{batch:>5} x {context:<5} best {best_of(options)}")
    attention.DECODE_TILES[key] = chosen_decode
    if extend_shapes:
        print("\nsweep: extend, tiles (BLOCK_M, BLOCK_N, warps, stages); times in us")
    for batch, length in extend_shapes:
        args, _ = extend_case(batch, length, setup, torch.Generator().manual_seed(0))
        options = []
        for tiles in EXTEND_SWEEP:
            name = "/".join(str(v) for v in tiles.values())

            def measure(tiles: dict = tiles) -> float:
                attention.EXTEND_TILES[key] = tiles
                return time_ms(lambda: extend_attention(*args), setup)

            options.append((name, measure))
        print(f"{batch:>5} x {length:<5} best {best_of(options)}")
    attention.EXTEND_TILES[key] = chosen_extend


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--hbm-tbps", type=float, default=4.8, help="HBM bandwidth (H200: 4.8)")
    parser.add_argument("--iters", type=int, default=50)
    parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    parser.add_argument("--sweep", action="store_true", help="also time other tiles and splits")
    parser.add_argument("--quick", action="store_true", help="tiny shapes, for a crash check")
    parser.add_argument("--decode-shapes", default=None, help="BxC,...: decode shapes to time")
    parser.add_argument("--heads", default="16/8", help="query heads / KV heads")
    parser.add_argument("--no-extend", action="store_true", help="decode only")
    args = parser.parse_args()
    cuda = torch.cuda.is_available()
    if args.quick:
        setup = Setup(4, 2, 16, 4, torch.float32, "cuda" if cuda else "cpu", 3)
        decode_shapes, extend_shapes = [(1, 40), (3, 70)], [(1, 40), (2, 33)]
    else:
        assert cuda, "the full run needs a GPU; --quick runs on a CPU"
        num_qo_heads, num_kv_heads = (int(n) for n in args.heads.split("/"))
        setup = Setup(
            num_qo_heads, num_kv_heads, 128, 16, getattr(torch, args.dtype), "cuda", args.iters
        )
        decode_shapes, extend_shapes = DECODE_SHAPES, EXTEND_SHAPES
    if args.decode_shapes:
        decode_shapes = [
            tuple(int(n) for n in shape.split("x"))  # type: ignore[misc]
            for shape in args.decode_shapes.split(",")
        ]
    if args.no_extend:
        extend_shapes = []
    device = torch.cuda.get_device_name() if cuda else "CPU (Triton interpreter)"
    print(
        f"{device}; Hq {setup.num_qo_heads}, Hkv {setup.num_kv_heads}, D {setup.head_dim}, "
        f"{args.dtype if not args.quick else 'float32'}, page size {setup.page_size}"
    )
    print(f"\ndecode (pages scattered), HBM {args.hbm_tbps} TB/s")
    print(
        f"{'batch':>5} {'context':>7} {'splits':>6} {'time us':>10} {'GB/s':>9} {'of HBM':>7} "
        f"{'max diff':>9}"
    )
    for batch, context in decode_shapes:
        print(decode_row(batch, context, setup, args.hbm_tbps))
    if extend_shapes:
        print("\nextend (prefill, no prefix) against torch SDPA (flash), causal")
        print(
            f"{'batch':>5} {'tokens':>7} {'ours us':>10} {'torch us':>10} {'TFLOP/s':>8} "
            f"{'torch':>8} {'ratio':>6} {'max diff':>9}"
        )
    for batch, length in extend_shapes:
        print(extend_row(batch, length, setup))
    if args.sweep:
        sweep(setup, decode_shapes, extend_shapes)


if __name__ == "__main__":
    main()
