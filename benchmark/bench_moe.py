"""Chapter 21's fused MoE layer against chapter 20's, a tuned baseline and the roofline, on one GPU.

    PYTHONPATH=python python benchmark/bench_moe.py [--tokens 1,2,4,...,16384] [--iters 50]
                                                    [--layers 8] [--json OUT]
    PYTHONPATH=python python benchmark/bench_moe.py --quick   # on a CPU: runs and agrees

Qwen3-30B-A3B's MoE layer (E=128 experts, top-8, H=2048, I=768, bf16, renormalized), random
weights scaled so activations stay near 1 and random router logits. For each batch of T tokens,
the whole layer (routing, alignment, both GEMMs, the activation and the weighted sum), four
lines side by side:

1. ch20 fused: chapter 20's ``FusedMoeBackend``. Its alignment reads a count back to the host,
   so it cannot be captured: it is timed eagerly, each call between two CUDA events with the
   queue drained first.
2. tuned baseline: ``moe_baseline.TunedBaselineMoe``, the approach of vLLM and SGLang with
   their published H200 configs, replayed from a CUDA graph.
3. roofline: max(bytes of the weights of the distinct experts the routing touched / copy
   bandwidth, FLOPs / bf16 peak); FLOPs = 2*T*k*H*2I + 2*T*k*I*H. Both ceilings are measured at
   the start of the run: a device-to-device copy of 4 GiB (read plus write bytes, best of 5) and
   an 8192^3 bf16 matmul (best of 10).
4. ch21 fast: chapter 21's ``SyncFreeMoeBackend``, replayed from a CUDA graph.

A timed call runs ``--layers`` layers back to back, each with its own weights, as a model's
consecutive MoE layers run in one decode step's graph; the time is per layer. Replaying a
one-layer graph instead would add the graph's own launch (about 5 us on the H200) to every
layer, which a captured decode step pays once for all its layers. Each layer reads other weights
than the one before (1.2 GB each, far more than the H200's 50 MB L2), so no layer finds its
weights in the cache. A time is the median of ``--iters`` calls or replays after a warm-up; the
lines take turns call by call, so that each meets the GPU as hot as the others do. For T <= 512
each line's output is also checked against the reference (``TorchMoeBackend`` in fp32): the
largest error relative to the largest output. A line whose chapter-21 module is missing prints
"not available", so the script also runs on chapter 20's tree. ``--json`` writes every number
(per-T arrays of ms for the four lines), the device, the versions, the date, the ceilings and
the command.

``--quick`` runs on a CPU in Triton's interpreter (or compiled on a GPU, without graphs): a
tiny shape (E=8, k=2, H=64, I=32, fp32, T in 1, 5, 33), a check that every line runs and agrees
with the reference; its times mean nothing.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable, Dict, List, Tuple

if "--quick" in sys.argv and not Path("/dev/nvidia0").exists():
    os.environ.setdefault("TRITON_INTERPRET", "1")  # before triton is imported

import torch  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "python"))

from minisgl.moe.base import select_experts  # noqa: E402
from minisgl.moe.torch_backend import TorchMoeBackend  # noqa: E402

# the modules chapter 21 adds: a line that needs one of them is "not available" without it
CH21_MODULES = {"minisgl.moe.sync_free", "minisgl.kernel.moe_routing"}
CHECKED_UP_TO = 512  # tokens: the fp32 reference is checked for T up to this
LINES = ["ch20 fused", "tuned baseline", "roofline", "ch21 fast"]
Forward = Callable[..., torch.Tensor]


@dataclass
class Shape:
    experts: int
    topk: int
    hidden: int
    inter: int
    dtype: torch.dtype
    tolerance: float  # largest error relative to the largest output that counts as agreeing

    def flops(self, tokens: int) -> int:
        """Both GEMMs over the T*k pairs: [T*k, H] @ [H, 2I], then [T*k, I] @ [I, H]."""
        pairs = tokens * self.topk
        return 2 * pairs * self.hidden * 2 * self.inter + 2 * pairs * self.inter * self.hidden

    def expert_bytes(self) -> int:
        """One expert's weights: gate_up [2I, H] and down [H, I]."""
        return 3 * self.inter * self.hidden * torch.finfo(self.dtype).bits // 8


QWEN3_30B_A3B = Shape(128, 8, 2048, 768, torch.bfloat16, 2e-2)
TINY = Shape(8, 2, 64, 32, torch.float32, 1e-4)
DEFAULT_TOKENS = [2**i for i in range(15)]  # 1 .. 16384


@dataclass
class Ceilings:
    copy_tbps: float  # bytes read plus bytes written per second, in TB/s
    peak_tflops: float  # dense bf16 matmul


def call_ms(run: Callable[[], object], device: str) -> float:
    """Milliseconds of one call of run: between CUDA events with the queue drained first, or by
    the clock on a CPU."""
    if device != "cuda":
        start_s = time.perf_counter()
        run()
        return (time.perf_counter() - start_s) * 1e3
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    start.record()
    run()
    end.record()
    end.synchronize()
    return start.elapsed_time(end)


def median_ms(run: Callable[[], object], device: str, iters: int, warmup: int = 3) -> float:
    """Median milliseconds of run(), each call alone (``call_ms``)."""
    return interleaved_median_ms({"run": run}, device, iters, warmup)["run"]


def interleaved_median_ms(
    runs: Dict[str, Callable[[], object]], device: str, iters: int, warmup: int
) -> Dict[str, float]:
    """Each run's median milliseconds, the runs taking turns call by call: a line timed after a
    heavy one would otherwise meet a hotter GPU at lower clocks than the one timed first."""
    for run in runs.values():
        for _ in range(warmup):
            run()
    times: Dict[str, List[float]] = {name: [] for name in runs}
    for _ in range(iters):
        for name, run in runs.items():
            times[name].append(call_ms(run, device))
    return {name: statistics.median(t) for name, t in times.items()}


def best_ms(run: Callable[[], object], device: str, tries: int) -> float:
    """The fastest of `tries` calls of run, after one to warm up."""
    return min(median_ms(run, device, 1, warmup=1 if i == 0 else 0) for i in range(tries))


def copy_tbps(device: str, nbytes: int) -> float:
    """A device-to-device copy's bytes read plus written per second, in TB/s (best of 5)."""
    src = torch.empty(nbytes, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    return 2 * nbytes / best_ms(lambda: dst.copy_(src), device, 5) / 1e9


def matmul_tflops(device: str, n: int) -> float:
    """An n x n x n matmul's TFLOP/s, in bf16 on a GPU (best of 10)."""
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    a = torch.randn(n, n, dtype=dtype, device=device)
    b = torch.randn(n, n, dtype=dtype, device=device)
    return 2 * n**3 / best_ms(lambda: a @ b, device, 10) / 1e9


def roofline_ms(shape: Shape, tokens: int, experts_touched: int, ceilings: Ceilings) -> float:
    memory_ms = experts_touched * shape.expert_bytes() / ceilings.copy_tbps / 1e9
    compute_ms = shape.flops(tokens) / ceilings.peak_tflops / 1e9
    return max(memory_ms, compute_ms)


def make_lines() -> Dict[str, Forward | None]:
    """Line name -> its forward, or None where the chapter-21 module it needs is missing."""
    from moe_baseline import TunedBaselineMoe

    from minisgl.moe.fused import FusedMoeBackend

    def load_fast() -> Forward:
        from minisgl.moe.sync_free import SyncFreeMoeBackend

        return SyncFreeMoeBackend().forward

    lines: Dict[str, Forward | None] = {"ch20 fused": FusedMoeBackend().forward}
    for name, load in [
        ("tuned baseline", lambda: TunedBaselineMoe().forward),
        ("ch21 fast", load_fast),
    ]:
        try:
            lines[name] = load()
        except ModuleNotFoundError as error:
            if error.name not in CH21_MODULES:
                raise  # a missing module of any other kind is a real error
            lines[name] = None
    return lines


def make_weights(shape: Shape, device: str) -> Tuple[torch.Tensor, torch.Tensor]:
    """Random w1 [E, 2I, H] and w2 [E, H, I] in the shape's dtype, scaled so that activations
    stay near 1."""
    w1 = torch.randn(shape.experts, 2 * shape.inter, shape.hidden, device=device)
    w2 = torch.randn(shape.experts, shape.hidden, shape.inter, device=device)
    return (w1 / shape.hidden**0.5).to(shape.dtype), (w2 / shape.inter**0.5).to(shape.dtype)


def graph_of(run: Callable[[], torch.Tensor]) -> Tuple[Callable[[], object], torch.Tensor]:
    """run captured in a CUDA graph -> (a replay, the tensor each replay writes its output to)."""
    run()  # compile the kernels outside the capture
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):  # the capture's allocations, warmed on a side stream
        run()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = run()
    return graph.replay, out


@dataclass
class Row:
    tokens: int
    experts_touched: int
    ms: Dict[str, float | None]
    errors: Dict[str, float | None]  # None: not checked at this T, or the line is missing


def measure_row(
    tokens: int,
    shape: Shape,
    weights: List[Tuple[torch.Tensor, torch.Tensor]],
    lines: Dict[str, Forward | None],
    ceilings: Ceilings,
    device: str,
    iters: int,
    warmup: int,
    graphs: bool,
) -> Row:
    """One T: each line's time per layer and its error. A timed call runs the layer once per
    set of weights, as consecutive layers of a model do (one graph holds them all); the output
    checked is the first layer's, against the reference on fp32 copies of its weights."""
    x = torch.randn(tokens, shape.hidden, device=device).to(shape.dtype)
    gating = torch.randn(tokens, shape.experts, device=device)
    touched = select_experts(gating, shape.topk, True)[1].unique().numel()
    reference = None
    if tokens <= CHECKED_UP_TO:
        w1, w2 = weights[0]
        reference = TorchMoeBackend().forward(
            x.float(), w1.float(), w2.float(), gating, shape.topk, True
        )
    row = Row(tokens, touched, {}, {})
    runs, outs = {}, {}
    for name, forward in lines.items():
        row.ms[name], row.errors[name] = None, None
        if name == "roofline":
            row.ms[name] = roofline_ms(shape, tokens, touched, ceilings)
        elif forward is not None:

            def layers(forward: Forward = forward) -> torch.Tensor:
                return [forward(x, w1, w2, gating, shape.topk, True) for w1, w2 in weights][0]

            if graphs and name != "ch20 fused":  # chapter 20 reads back to the host mid-layer
                runs[name], outs[name] = graph_of(layers)
            else:
                runs[name], outs[name] = layers, layers()
    timed = interleaved_median_ms(runs, device, iters, warmup)
    row.ms.update({name: ms / len(weights) for name, ms in timed.items()})
    for name, out in outs.items():  # out: what the timed graph (or call) wrote
        if reference is not None:
            error = (out.float() - reference).abs().max() / reference.abs().max()
            row.errors[name] = error.item()
    return row


def fmt(value: float | None, spec: str, width: int) -> str:
    return f"{'n/a':>{width}}" if value is None else f"{value:>{width}{spec}}"


def print_table(rows: List[Row], shape: Shape) -> None:
    measured = [name for name in LINES if name != "roofline"]
    print(
        f"\n{'T':>6} {'touched':>7} {'roofline':>9} |"
        + " |".join(f" {name:>26}" for name in measured)
        + f" | {'fast/base':>9}"
    )
    print(
        f"{'':>6} {'':>7} {'ms':>9} |"
        + " |".join(f" {'ms':>9} {'x roof':>7} {'TFLOP/s':>8}" for _ in measured)
        + f" | {'':>9}"
    )
    for row in rows:
        roof = row.ms["roofline"]
        cells = []
        for name in measured:
            ms = row.ms[name]
            if ms is None:
                cells.append(f" {'not available':>26}")
                continue
            tflops = shape.flops(row.tokens) / ms / 1e9
            cells.append(f" {ms:>9.4f} {ms / roof:>7.2f} {tflops:>8.1f}")
        fast, base = row.ms["ch21 fast"], row.ms["tuned baseline"]
        ratio = fast / base if fast is not None and base is not None else None
        print(
            f"{row.tokens:>6} {row.experts_touched:>7} {roof:>9.4f} |"
            + " |".join(cells)
            + f" | {fmt(ratio, '.2f', 9)}"
        )


def print_agreement(rows: List[Row], shape: Shape) -> bool:
    """Each line's largest error against the fp32 reference; True when every one is within."""
    checked = [row for row in rows if row.tokens <= CHECKED_UP_TO]
    if not checked:
        return True
    print(
        f"\nlargest error / largest output against the fp32 reference, T <= {CHECKED_UP_TO} "
        f"(agreeing: below {shape.tolerance:g})"
    )
    all_agree = True
    for name in LINES:
        if name == "roofline":
            continue
        errors = [row.errors[name] for row in checked]
        if any(error is None for error in errors):
            print(f"  {name:<15} not available")
            continue
        worst = max(errors)
        agrees = worst < shape.tolerance
        all_agree &= agrees
        cells = ", ".join(f"T={row.tokens} {error:.1e}" for row, error in zip(checked, errors))
        print(f"  {name:<15} {'agrees' if agrees else 'DISAGREES'}: {cells}")
    return all_agree


def write_json(
    path: Path, rows: List[Row], shape: Shape, ceilings: Ceilings, device_name: str
) -> None:
    import triton

    fields = asdict(shape) | {"dtype": str(shape.dtype).removeprefix("torch.")}
    data = {
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "device": device_name,
        "torch": torch.__version__,
        "triton": triton.__version__,
        "shape": fields,
        "ceilings": asdict(ceilings),
        "tokens": [row.tokens for row in rows],
        "experts_touched": [row.experts_touched for row in rows],
        "ms": {name: [row.ms[name] for row in rows] for name in LINES},
        "error": {name: [row.errors[name] for row in rows] for name in LINES if name != "roofline"},
    }
    path.write_text(json.dumps(data, indent=2) + "\n")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--tokens",
        default=",".join(map(str, DEFAULT_TOKENS)),
        help="batch sizes T, comma-separated",
    )
    parser.add_argument("--iters", type=int, default=50)
    parser.add_argument(
        "--layers",
        type=int,
        default=8,
        help="layers per timed call, each with its own weights (default 8)",
    )
    parser.add_argument("--json", type=Path, help="write every number to this file")
    parser.add_argument("--quick", action="store_true", help="tiny shape, for a crash check")
    args = parser.parse_args()
    cuda = torch.cuda.is_available()
    device = "cuda" if cuda else "cpu"
    torch.manual_seed(0)
    if args.quick:
        shape, tokens, iters, warmup, graphs = TINY, [1, 5, 33], 1, 0, False
        ceilings = Ceilings(copy_tbps(device, 64 << 20), matmul_tflops(device, 256))
    else:
        assert cuda, "the full run needs a GPU; --quick runs on a CPU"
        shape, iters, warmup, graphs = QWEN3_30B_A3B, args.iters, 3, True
        tokens = [int(t) for t in args.tokens.split(",")]
        ceilings = Ceilings(copy_tbps(device, 4 << 30), matmul_tflops(device, 8192))
    device_name = torch.cuda.get_device_name() if cuda else "CPU (Triton interpreter)"
    print(
        f"{device_name}; E {shape.experts}, top-{shape.topk}, H {shape.hidden}, "
        f"I {shape.inter}, {str(shape.dtype).removeprefix('torch.')}"
    )
    print(
        f"ceilings: copy {ceilings.copy_tbps:.2f} TB/s (read + write), "
        f"{'bf16' if cuda else 'fp32'} matmul {ceilings.peak_tflops:.1f} TFLOP/s"
    )
    if args.quick:
        print("quick: a crash and agreement check; its times mean nothing")
    weights = [make_weights(shape, device) for _ in range(2 if args.quick else args.layers)]
    lines = make_lines()
    lines["roofline"] = None
    rows = [
        measure_row(t, shape, weights, lines, ceilings, device, iters, warmup, graphs)
        for t in tokens
    ]
    print_table(rows, shape)
    all_agree = print_agreement(rows, shape)
    if args.json:
        write_json(args.json, rows, shape, ceilings, device_name)
        print(f"\nwrote {args.json}")
    return 0 if all_agree else 1


if __name__ == "__main__":
    sys.exit(main())
