"""Where one decode step's GPU time goes, kernel by kernel, grouped by kind (chapter 22).

    PYTHONPATH=python python benchmark/profile_decode.py [--shape qwen3-0.6b] [--batch 256]
        [--context N | --mean-step] [--page-size 16] [--steps 20] [--json PATH]

The engine of ``offline.py`` (random bf16 weights of the shape, made on the GPU; CUDA graphs
for decode) runs ``--batch`` requests of ``--context`` cached tokens each (default: the mean
context of nano-vllm's workload's decode steps), their pages scattered over the pool. After a
warm-up, one decode step (``Engine.forward_batch``: the batch's copies, the graph's replay, the
sampling) runs under ``torch.profiler``; its kernels are grouped by kind from their names and
printed as a table: kind, kernels, total microseconds, share of the kernels' time. ``--json``
writes the same rows, with the step's time (the median of ``--steps`` steps between two CUDA
events) and the kernels that took longest. ``--mean-step`` profiles the workload's mean decode
step instead (chapter 15's ``workload_floor``: its mean batch, each request with the mean
context), and every run prints the step's bandwidth floor beside its time: every weight and the
batch's K and V read once at 4.8 TB/s.

Kinds are read from kernel names alone: rotary embeddings made of torch's own elementwise
kernels count as elementwise, chapter 22's q/k norm + rotary kernel as rotary, and a kernel no
pattern names as other.
Needs a GPU; the times are this GPU's and this run's.
"""

from __future__ import annotations

import argparse
import datetime
import json
import platform
import re
import statistics
import sys
import tempfile
from collections import defaultdict
from pathlib import Path
from typing import Dict, List, Tuple

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "examples"))
sys.path.insert(0, str(ROOT / "python"))

from ch15_measure import (  # noqa: E402
    SHAPES,
    decode_floor_s,
    kv_bytes_per_token,
    weight_bytes,
    workload_floor,
    write_shape,
)

from minisgl.core import Batch, Req, SamplingParams  # noqa: E402
from minisgl.engine.config import EngineConfig  # noqa: E402
from minisgl.engine.engine import Engine  # noqa: E402

HBM_BYTES_PER_S = 4.8e12  # an H200's rated bandwidth, as chapter 15's floor uses

# (kind, pattern of the lowercased kernel name); the first that matches names the kernel
KINDS: List[Tuple[str, str]] = [
    ("attention", r"decode_split|decode_combine|extend_kernel|attention|attn|flash"),
    ("KV store", r"store_kv|store_cache|kv_store"),
    ("rotary", r"rope|rotary|rotate"),
    ("norm", r"rms|norm"),
    (
        "MoE",
        r"moe|gate_up|_down_kernel|route_and_count|sum_chunks|plan_tiles|"
        r"scatter_pairs|sum_choices",
    ),
    (
        "sampling",
        r"race_blocks|pick_winner|multinomial|softmax|sample|argmax|topk|sort|"
        r"exponential|distribution|philox|gumbel",
    ),
    ("activation", r"silu|gelu|swiglu|act_and_mul"),
    ("GEMM", r"gemm|gemv|cutlass|xmma|nvjet|cublas|matmul|splitk|sm90_|\bmm_"),
    ("elementwise/copy", r"elementwise|copy|memcpy|memset|fill|cat|index|gather|scatter|reduce"),
]


def kind_of(kernel: str) -> str:
    name = kernel.lower()
    return next((kind for kind, pattern in KINDS if re.search(pattern, name)), "other")


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--shape", choices=sorted(SHAPES), default="qwen3-0.6b")
    p.add_argument("--batch", type=int, default=256)
    p.add_argument(
        "--context",
        type=int,
        default=None,
        help="cached tokens per request; default: the workload's mean decode context",
    )
    p.add_argument(
        "--mean-step",
        action="store_true",
        help="the workload's mean decode step: its mean batch and mean context",
    )
    p.add_argument("--page-size", type=int, default=16)
    p.add_argument("--steps", type=int, default=20, help="timed steps (median)")
    p.add_argument("--json", metavar="PATH", default=None)
    return p.parse_args()


def decode_batch(engine: Engine, batch_size: int, context: int) -> List[Req]:
    """``batch_size`` requests, each with ``context`` tokens cached and one to run, their pages
    drawn at random from the pool (as a long-running engine's are)."""
    size = engine.config.page_size
    pages_each = -(-(context + 1) // size)
    if batch_size * pages_each > engine.num_pages:
        raise SystemExit(f"{batch_size} x {pages_each} pages do not fit {engine.num_pages}")
    gen = torch.Generator().manual_seed(0)
    pages = torch.randperm(engine.num_pages, generator=gen)[: batch_size * pages_each]
    offsets = torch.arange(size)
    slots = (pages.view(batch_size, pages_each, 1) * size + offsets).flatten(1)
    engine.page_table[:batch_size, : slots.shape[1]] = slots.to(engine.device, torch.int32)
    ids = torch.randint(
        0, engine.model_config.vocab_size, (batch_size, context + 1), generator=gen
    ).tolist()
    params = SamplingParams(temperature=0.6, ignore_eos=True, max_tokens=1 << 20)
    return [Req(i, ids[i], params, table_idx=i, cached_len=context) for i in range(batch_size)]


def step(engine: Engine, reqs: List[Req], context: int) -> None:
    for req in reqs:  # forward_batch counts the token as cached: run the same step again
        req.cached_len = context
    engine.forward_batch(Batch(reqs, "decode"))


def median_step_us(engine: Engine, reqs: List[Req], context: int, steps: int) -> float:
    times = []
    for _ in range(steps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        step(engine, reqs, context)
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e3)
    return statistics.median(times)


def profile_kernels(engine: Engine, reqs: List[Req], context: int) -> Dict[str, Tuple[int, float]]:
    """Each kernel name's launches and GPU microseconds in one decode step."""
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        step(engine, reqs, context)
        torch.cuda.synchronize()
    kernels: Dict[str, Tuple[int, float]] = {}
    for event in prof.key_averages():
        if event.device_time_total > 0:
            kernels[event.key] = (event.count, event.device_time_total)
    return kernels


def by_kind(kernels: Dict[str, Tuple[int, float]]) -> List[Dict[str, object]]:
    count: Dict[str, int] = defaultdict(int)
    micros: Dict[str, float] = defaultdict(float)
    for name, (n, us) in kernels.items():
        count[kind_of(name)] += n
        micros[kind_of(name)] += us
    total = sum(micros.values())
    order = [kind for kind, _ in KINDS] + ["other"]
    return [
        {
            "kind": kind,
            "kernels": count[kind],
            "us": round(micros[kind], 1),
            "share": round(micros[kind] / total, 4),
        }
        for kind in order
        if count[kind]
    ]


def main() -> int:
    args = parse_args()
    if not torch.cuda.is_available():
        print("profile_decode.py needs a GPU")
        return 1
    floor = workload_floor(SHAPES[args.shape])  # the workload's mean decode step
    mean_context = round(floor.context / floor.sequences)  # per request: 903
    context = args.context if args.context is not None else mean_context
    if args.mean_step:
        args.batch, context = round(floor.sequences), mean_context
    floor_us = (
        decode_floor_s(
            weight_bytes(SHAPES[args.shape]),
            kv_bytes_per_token(SHAPES[args.shape]),
            args.batch * context,
            HBM_BYTES_PER_S,
        )
        * 1e6
    )
    with tempfile.TemporaryDirectory() as tmp:
        config = EngineConfig(
            str(write_shape(args.shape, tmp)),
            device="cuda",
            dtype=torch.bfloat16,
            page_size=args.page_size,
            max_running_req=args.batch,
            max_seq_len=4096,
            dummy_weights=True,
        )
        engine = Engine(config)
    reqs = decode_batch(engine, args.batch, context)
    for _ in range(3):  # warm-up: the sampler's first call, the graph's first replay
        step(engine, reqs, context)
    step_us = median_step_us(engine, reqs, context, args.steps)
    kernels = profile_kernels(engine, reqs, context)
    rows = by_kind(kernels)
    total_us = sum(float(r["us"]) for r in rows)  # type: ignore[arg-type]
    print(
        f"{torch.cuda.get_device_name()}, torch {torch.__version__}; {args.shape}, batch "
        f"{args.batch}, {context} cached tokens each, pages of {args.page_size}"
    )
    print(
        f"one decode step: {step_us:.0f} us (median of {args.steps}, CUDA events); "
        f"{sum(n for n, _ in kernels.values())} kernels, {total_us:.0f} us of kernel time"
    )
    print(
        f"its floor (weights and K/V read once at {HBM_BYTES_PER_S / 1e12:.1f} TB/s): "
        f"{floor_us:.0f} us; the step is {step_us / floor_us:.2f}x it\n"
    )
    print(f"{'kind':18s} {'kernels':>8s} {'total us':>10s} {'share':>7s}")
    for r in rows:
        print(f"{r['kind']:18s} {r['kernels']:8d} {r['us']:10.1f} {r['share']:7.1%}")
    top = sorted(kernels.items(), key=lambda item: -item[1][1])[:15]
    print("\nlongest kernels:")
    for name, (n, us) in top:
        print(f"  {us:9.1f} us {n:5d}x  {kind_of(name):16s} {name[:80]}")
    if args.json:
        record = {
            "date": datetime.date.today().isoformat(),
            "gpu": torch.cuda.get_device_name(),
            "torch": torch.__version__,
            "python": platform.python_version(),
            "shape": args.shape,
            "batch": args.batch,
            "context": context,
            "page_size": args.page_size,
            "step_us": round(step_us, 1),
            "floor_us": round(floor_us, 1),
            "kernels": sum(n for n, _ in kernels.values()),
            "kernel_us": round(total_us, 1),
            "rows": rows,
            "top": [
                {"name": name, "kind": kind_of(name), "count": n, "us": round(us, 1)}
                for name, (n, us) in top
            ],
        }
        Path(args.json).write_text(json.dumps(record, indent=2) + "\n")
    engine.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
