"""Offline throughput on nano-vllm's workload, optionally beside transformers, where a step's time
goes, and how far a decode step is from the bandwidth floor (chapter 15).

    PYTHONPATH=python python benchmark/offline.py --shape qwen3-0.6b [--num-seqs 32]
        [--max-output 128] [--compare hf] [--breakdown] [--busy] [--profile DIR] [--nvtx]
        [--tp-size 2] [--moe-backend sync_free] [--overlap on|off]
    PYTHONPATH=python python benchmark/offline.py --model PATH ...

The workload is nano-vllm's bench.py, draw for draw (examples/ch15_measure.py): 256 sequences,
142,827 input and 133,966 output tokens, sampled at temperature 0.6 past EOS. ``--num-seqs N``
takes its first N sequences; ``--max-output M`` caps each output at M tokens.

``--shape`` writes the named shape's config.json into a temporary directory and builds the model
from it with random weights made on the device (``dummy_weights``), in bf16; ``--model`` loads a
checkpoint (its own dtype unless ``--dtype``). First a warm-up generate (other ids, so the prefix
cache holds none of the workload), then the timed one: throughput = requested output tokens /
wall time of that ``generate``, as nano-vllm's and upstream's bench.py count it.

``--compare hf`` then frees the engine and runs transformers in the same process on the same
workload: ``AutoModelForCausalLM.from_config`` on the same config.json, its own random weights in
the same dtype, built on the device; prompts left-padded into batches of ``--hf-batch-size``
(default: all at once), ``generate`` sampling at temperature 0.6 (top-k and top-p off) with
``min_new_tokens = max_new_tokens`` = the batch's longest requested output, so that EOS never
stops a row. Its figure is counted exactly as ours: requested output tokens (the sum of every
sequence's own max_tokens, not the padded batch's longest) / wall time of all its ``generate``
calls. The rows that finish early still compute up to their batch's longest output, so
transformers does more work than it is credited with; that is its way of batching.

``--breakdown`` runs the workload once more (the same lengths, ids shifted by one so that the
prefix cache holds none of them) with the engine's step timer on, which synchronizes the device at
every phase's edges, and prints each phase's time; then the mean decode forward beside its floor:
the weights a decode step reads plus the KV of its mean context (summed over the batch), over
``--hbm-gbps`` (4,800 GB/s: an H200's HBM3e). ``--profile DIR`` runs the first 16 sequences,
outputs capped at 16 tokens, under torch.profiler and writes DIR/trace.json (chrome://tracing or
Perfetto); ``--nvtx`` names every phase with an NVTX range, for ``nsys profile``. ``--busy`` runs
the workload once more (ids shifted by four) under torch.profiler, recording the device's kernels
only, and prints how much of the wall time the device spent running kernels (the union of their
intervals) and how the rest splits into gaps between kernels: the time the device waited for the
host.

``--overlap on|off`` sets the scheduler's ``overlap_scheduling`` (chapter 18); left out, the
engine's default: on on a GPU, off on a CPU. ``benchmark/bench_settings.py`` runs this script with
each setting in turn on one chapter's tree.
"""

from __future__ import annotations

import argparse
import gc
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, List, Sequence, Tuple

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "examples"))
sys.path.insert(0, str(ROOT / "python"))

from ch15_measure import (  # noqa: E402
    SHAPES,
    decode_context_tokens,
    decode_floor_s,
    decode_weight_params,
    kv_bytes_per_token,
    nano_vllm_workload,
    write_shape,
)

from minisgl.core import SamplingParams  # noqa: E402
from minisgl.llm import LLM  # noqa: E402
from minisgl.models import ModelConfig  # noqa: E402
from minisgl.utils.torch_utils import resolve_device  # noqa: E402

Workload = Tuple[List[List[int]], List[SamplingParams]]
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    which = p.add_mutually_exclusive_group(required=True)
    which.add_argument("--shape", choices=sorted(SHAPES), help="random weights of this shape")
    which.add_argument("--model", help="a model directory (a checkpoint)")
    p.add_argument("--num-seqs", type=int, default=256, help="the workload's first N sequences")
    p.add_argument("--max-output", type=int, default=None, help="cap every output length")
    p.add_argument("--device", default="auto")
    p.add_argument(
        "--dtype",
        choices=sorted(DTYPES),
        default=None,
        help="default: bf16 for --shape, the checkpoint's for --model",
    )
    p.add_argument("--page-size", type=int, default=16)
    p.add_argument("--attn", default="auto", help="attention backend")
    p.add_argument(
        "--tp-size",
        type=int,
        default=1,
        help="tensor parallelism: ranks, one GPU each (chapter 19)",
    )
    p.add_argument(
        "--moe-backend",
        default=None,
        help="MoE backend: torch, fused (chapter 20), sync_free (chapter 21); default: auto",
    )
    p.add_argument(
        "--overlap",
        choices=["on", "off"],
        default=None,
        help="overlap scheduling (chapter 18); default: the engine's (on on a GPU)",
    )
    p.add_argument("--max-running-req", type=int, default=256)
    p.add_argument("--max-seq-len", type=int, default=4096)
    p.add_argument("--max-extend-tokens", type=int, default=16384)
    p.add_argument("--compare", choices=["hf"], default=None)
    p.add_argument("--hf-batch-size", type=int, default=None, help="default: all at once")
    p.add_argument("--breakdown", action="store_true")
    p.add_argument("--busy", action="store_true", help="how long the device ran kernels")
    p.add_argument("--hbm-gbps", type=float, default=4800.0, help="4800: an H200")
    p.add_argument("--profile", metavar="DIR", default=None)
    p.add_argument("--nvtx", action="store_true")
    p.add_argument(
        "--cuda-graph-max-bs",
        type=int,
        default=None,
        help="0: no CUDA graphs; default: the engine's (256 on a GPU)",
    )
    return p.parse_args()


def workload(num_seqs: int, max_output: int | None, shift: int = 0) -> Workload:
    """The first ``num_seqs`` sequences; ``shift`` moves every id (mod 10,001) so that another
    run of the same lengths shares no prefix with this one."""
    prompts, params = nano_vllm_workload(num_seqs)
    prompts = [[(t + shift) % 10001 for t in p] for p in prompts]
    if max_output is not None:
        params = [
            SamplingParams(
                temperature=p.temperature, ignore_eos=True, max_tokens=min(p.max_tokens, max_output)
            )
            for p in params
        ]
    return prompts, params


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed_generate(
    generate: Any, prompts: List[List[int]], params: List[SamplingParams], device: torch.device
) -> float:
    synchronize(device)
    start = time.perf_counter()
    generate(prompts, params)
    synchronize(device)
    return time.perf_counter() - start


def report(name: str, params: Sequence[SamplingParams], seconds: float) -> None:
    tokens = sum(p.max_tokens for p in params)
    print(
        f"{name:12s} {tokens / seconds:10,.0f} output tokens/s  ({tokens:,} tokens in "
        f"{seconds:.2f} s)",
        flush=True,
    )


def build_llm(args: argparse.Namespace, model_dir: str) -> LLM:
    dtype = DTYPES[args.dtype] if args.dtype else (torch.bfloat16 if args.shape else None)
    options = (
        {} if args.cuda_graph_max_bs is None else {"cuda_graph_max_bs": args.cuda_graph_max_bs}
    )  # chapter 17's option
    if args.moe_backend:
        options["moe_backend"] = args.moe_backend  # chapter 21's option
    if args.tp_size > 1:
        options["tp_size"] = args.tp_size  # chapter 19's option
    if args.overlap is not None:
        options["overlap_scheduling"] = args.overlap == "on"  # chapter 18's option
    return LLM(
        model_dir,
        device=args.device,
        dtype=dtype,
        dummy_weights=bool(args.shape),
        page_size=args.page_size,
        attention_backend=args.attn,
        max_running_req=args.max_running_req,
        max_seq_len=args.max_seq_len,
        max_extend_tokens=args.max_extend_tokens,
        nvtx=args.nvtx,
        **options,
    )


def run_minisgl(args: argparse.Namespace, model_dir: str) -> None:
    llm = build_llm(args, model_dir)
    device = llm.scheduler.engine.device
    warm_prompts, warm_params = workload(min(args.num_seqs, 4), 8, shift=2)
    llm.generate(warm_prompts, warm_params)
    prompts, params = workload(args.num_seqs, args.max_output)
    report("minisgl", params, timed_generate(llm.generate, prompts, params, device))
    if args.breakdown:
        breakdown(args, llm, model_dir)
    if args.busy:
        busy(args, llm)
    if args.profile:
        profile(llm, Path(args.profile), args)
    llm.shutdown()
    del llm
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


def breakdown(args: argparse.Namespace, llm: LLM, model_dir: str) -> None:
    """The workload again (ids shifted) with the step timer on; each phase's share, then the
    mean decode forward beside the bandwidth floor of the mean decode step."""
    engine = llm.scheduler.engine
    timer = engine.timer
    timer.enabled = True
    timer.reset()
    prompts, params = workload(args.num_seqs, args.max_output, shift=1)
    total = timed_generate(llm.generate, prompts, params, engine.device)
    timer.enabled = False
    print(
        f"\nwhere the time goes (a second run: the same lengths, other ids, the device "
        f"synchronized at every phase's edges; {total:.2f} s):"
    )
    print(f"  {'phase':16s} {'seconds':>9s} {'calls':>7s} {'ms/call':>9s} {'share':>6s}")
    for name, seconds in timer.seconds.items():
        calls = timer.counts[name]
        print(
            f"  {name:16s} {seconds:9.3f} {calls:7d} {seconds / calls * 1e3:9.3f} "
            f"{seconds / total:6.1%}"
        )
    rest = total - sum(timer.seconds.values())
    print(f"  {'(outside phases)':16s} {rest:9.3f} {'':7s} {'':9s} {rest / total:6.1%}")
    decode_steps = timer.counts.get("forward decode", 0)
    if decode_steps:
        roofline(
            args, engine, model_dir, prompts, params, timer.seconds["forward decode"], decode_steps
        )


def busy(args: argparse.Namespace, llm: LLM) -> None:
    """The workload again under torch.profiler (device kernels only): the device's busy time
    and its idle gaps, by length. A gap is time with no kernel running, so the host's launches
    (or a copy the profiler does not list as a kernel) had the device waiting."""
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    device = llm.scheduler.engine.device
    if device.type != "cuda":
        print("\n--busy needs a GPU: on a CPU the host runs every kernel itself")
        return
    prompts, params = workload(args.num_seqs, args.max_output, shift=4)
    with torch_profile(activities=[ProfilerActivity.CUDA]) as prof:
        wall = timed_generate(llm.generate, prompts, params, device)
    spans = [
        (e.start_ns(), e.start_ns() + e.duration_ns())
        for e in prof.profiler.kineto_results.events()
        if e.device_type() == torch.autograd.DeviceType.CUDA
    ]
    busy_ns, gaps = busy_and_gaps(spans)
    length = max(stop for _, stop in spans) - min(start for start, _ in spans)
    print(
        f"\ndevice busy (a third run under torch.profiler, {wall:.2f} s): {len(spans):,} "
        f"kernels and copies, {busy_ns / 1e9:.2f} s busy of the {length / 1e9:.2f} s "
        f"from the first to the last ({busy_ns / length:.1%})"
    )
    for low, high in [(0, 10e3), (10e3, 100e3), (100e3, 1e6), (1e6, float("inf"))]:
        inside = [g for g in gaps if low <= g < high]
        label = (
            f"{low / 1e3:g}-{high / 1e3:g} us" if high != float("inf") else f">= {low / 1e3:g} us"
        )
        print(f"  idle gaps of {label:14s} {len(inside):8,} of them, {sum(inside) / 1e9:6.3f} s")


def busy_and_gaps(spans: Sequence[Tuple[int, int]]) -> Tuple[int, List[int]]:
    """(start, stop) intervals, in any order and overlapping -> the length of their union and
    the gaps between its pieces, in order."""
    ordered = sorted(spans)
    busy, gaps, end = 0, [], ordered[0][0]
    for start, stop in ordered:
        if start > end:
            gaps.append(start - end)
        busy += max(0, stop - max(start, end))
        end = max(end, stop)
    return busy, gaps


def roofline(
    args: argparse.Namespace,
    engine: Any,
    model_dir: str,
    prompts: List[List[int]],
    params: List[SamplingParams],
    decode_seconds: float,
    decode_steps: int,
) -> None:
    config = json.loads((Path(model_dir) / "config.json").read_text())
    size = engine.dtype.itemsize
    weights = decode_weight_params(ModelConfig.from_dict(config)) * size
    kv = kv_bytes_per_token(config, engine.dtype)
    outputs = [p.max_tokens for p in params]
    context = decode_context_tokens([len(p) for p in prompts], outputs) / decode_steps
    floor = decode_floor_s(weights, kv, context, args.hbm_gbps * 1e9)
    measured = decode_seconds / decode_steps
    print(
        f"\nroofline: a decode step reads {weights / 1e9:.3f} GB of weights and the KV of "
        f"{context:,.0f} cached tokens ({kv * context / 1e9:.3f} GB) on average"
    )
    print(
        f"  floor at {args.hbm_gbps:,.0f} GB/s: {floor * 1e3:.3f} ms; measured decode forward: "
        f"{measured * 1e3:.3f} ms over {decode_steps} steps ({floor / measured:.1%} of the "
        f"bandwidth)"
    )


def profile(llm: LLM, directory: Path, args: argparse.Namespace) -> None:
    """The first 16 sequences, outputs capped at 16 tokens, under torch.profiler."""
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    directory.mkdir(parents=True, exist_ok=True)
    prompts, params = workload(min(args.num_seqs, 16), 16, shift=3)
    device = llm.scheduler.engine.device
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    with torch_profile(activities=activities) as prof:
        timed_generate(llm.generate, prompts, params, device)
    prof.export_chrome_trace(str(directory / "trace.json"))
    sort = "self_cuda_time_total" if device.type == "cuda" else "self_cpu_time_total"
    print(f"\nprofile of 16 sequences x 16 tokens: {directory / 'trace.json'}")
    print(prof.key_averages().table(sort_by=sort, row_limit=15))


def run_hf(args: argparse.Namespace, model_dir: str) -> None:
    from transformers import AutoConfig, AutoModelForCausalLM
    from transformers.utils import logging

    logging.set_verbosity_error()
    device = resolve_device(args.device)
    dtype = DTYPES[args.dtype] if args.dtype else torch.bfloat16
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(
            AutoConfig.from_pretrained(model_dir), dtype=dtype
        ).eval()
    warm_prompts, warm_params = workload(min(args.num_seqs, 4), 8, shift=2)
    hf_generate(model, warm_prompts, warm_params, device, len(warm_prompts))
    prompts, params = workload(args.num_seqs, args.max_output)
    batch = args.hf_batch_size or len(prompts)
    seconds = timed_generate(
        lambda p, s: hf_generate(model, p, s, device, batch), prompts, params, device
    )
    report("transformers", params, seconds)


@torch.inference_mode()
def hf_generate(
    model: Any,
    prompts: List[List[int]],
    params: List[SamplingParams],
    device: torch.device,
    batch_size: int,
) -> None:
    """Batches of ``batch_size`` prompts, left-padded, each run to its longest requested output."""
    for start in range(0, len(prompts), batch_size):
        rows = prompts[start : start + batch_size]
        longest = max(p.max_tokens for p in params[start : start + batch_size])
        width = max(len(r) for r in rows)
        ids = torch.tensor([[0] * (width - len(r)) + r for r in rows], device=device)
        mask = torch.tensor([[0] * (width - len(r)) + [1] * len(r) for r in rows], device=device)
        model.generate(
            ids,
            attention_mask=mask,
            do_sample=True,
            temperature=0.6,
            top_k=0,
            top_p=1.0,
            max_new_tokens=longest,
            min_new_tokens=longest,
            pad_token_id=0,
        )


def main() -> None:
    args = parse_args()
    prompts, params = nano_vllm_workload()
    print(
        f"nano-vllm's workload: {len(prompts)} sequences, {sum(map(len, prompts)):,} input "
        f"and {sum(p.max_tokens for p in params):,} output tokens"
    )
    prompts, params = workload(args.num_seqs, args.max_output)
    print(
        f"this run: the first {len(prompts)}, {sum(map(len, prompts)):,} input and "
        f"{sum(p.max_tokens for p in params):,} output tokens"
        + (f" (outputs capped at {args.max_output})" if args.max_output else "")
    )
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = str(write_shape(args.shape, tmp)) if args.shape else args.model
        print(
            f"model: {args.shape or args.model}, page size {args.page_size}, "
            f"attention {args.attn}, device {resolve_device(args.device)}"
            + (f", MoE backend {args.moe_backend}" if args.moe_backend else "")
            + (f", overlap {args.overlap}" if args.overlap else ""),
            flush=True,
        )
        run_minisgl(args, model_dir)
        if args.compare == "hf":
            run_hf(args, model_dir)


if __name__ == "__main__":
    main()
