"""Chapter 21's MoE layer beside upstream mini-sglang's fused MoE kernel, run as published.

    PYTHONPATH=python python benchmark/bench_moe_upstream.py --upstream CLONE
        [--tokens 1,2,4,...,16384] [--iters 50] [--layers 8] [--repeats 3] [--json OUT]
    TRITON_INTERPRET=1 PYTHONPATH=python python benchmark/bench_moe_upstream.py \
        --upstream CLONE --quick      # on a CPU: runs and agrees; its times mean nothing

CLONE is a clone of upstream at the commit the book pins:

    git clone https://github.com/sgl-project/mini-sglang && git -C mini-sglang checkout 20fcd7f

Nothing of upstream is copied into this repository. The script loads from CLONE, at run time:

- ``python/minisgl/kernel/triton/fused_moe.py``: ``fused_moe_kernel`` (vLLM's grouped GEMM as
  upstream vendors it) and ``moe_sum_reduce_kernel`` (the sum over the k choices);
- ``python/minisgl/kernel/moe_impl.py``: their launchers, ``fused_moe_kernel_triton`` and
  ``moe_sum_reduce_triton``;
- from ``python/minisgl/moe/fused.py``, the functions ``get_default_config`` and
  ``try_get_optimal_moe_config`` (upstream's tile choice: two configs, by whether the tokens
  exceed the experts; upstream has no tuned files), and ``fused_topk`` and
  ``moe_align_block_size``, which call sgl_kernel's CUDA routing and alignment.

and calls them in the order of upstream's ``fused_experts_impl`` (the same file): route, align,
GEMM 1 into ``[T, k, 2I]``, ``silu_and_mul``, GEMM 2 times the routing weight into ``[T, k,
H]``, the k-sum. Where a package upstream calls is missing, a stand-in takes its place and the
table at the start says so: chapter 20's ``select_experts`` (torch's softmax, top-k and
renormalization) for sgl_kernel's ``topk_softmax``; chapter 21's ``align`` kernels, on pair
counts made with torch, for sgl_kernel's alignment (both keep the used size on the device, as
upstream's does); torch's ``silu(gate) * up`` for FlashInfer's ``silu_and_mul``. Upstream's
``fused_experts_impl`` writes the sum over its input ``hidden_states``; here it goes into a
tensor of its own, so that every replay reads the same input.

Lines, on the same inputs (Qwen3-30B-A3B's MoE layer as in bench_moe.py: 128 experts, top-8,
H 2,048, I 768, bf16, renormalized, random weights and router logits):

1. ch21: chapter 21's ``SyncFreeMoeBackend`` (its tuned file on the GPU it was tuned on, its
   heuristic elsewhere);
2. upstream: the kernels above with upstream's own configs;
3. upstream, vLLM's H200 configs: the same, with the tile sizes of vLLM's published file for
   this shape on an H200 (``results/moe_baseline_configs_h200.json``, the key nearest to T).

Every line is captured in a CUDA graph of ``--layers`` layers, each with its own weights, as in
bench_moe.py; the time is per layer, the median of ``--iters`` replays, the lines taking turns
replay by replay. The whole measurement runs ``--repeats`` times and the table gives the median
of the repeats and their spread. For T <= 512 every line is checked against the fp32 reference
(``TorchMoeBackend``) and ch21 against upstream directly (largest difference over the largest
reference output); the script exits 1 if one disagrees.
"""

from __future__ import annotations

import argparse
import ast
import datetime
import functools
import importlib
import importlib.util
import json
import os
import statistics
import subprocess
import sys
import types
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Dict, List, Tuple

if "--quick" in sys.argv and not Path("/dev/nvidia0").exists():
    os.environ.setdefault("TRITON_INTERPRET", "1")  # before triton is imported

import torch  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "python"))

from bench_moe import (  # noqa: E402
    QWEN3_30B_A3B,
    TINY,
    Shape,
    graph_of,
    interleaved_median_ms,
    make_weights,
)
from moe_baseline import CONFIG_FILE, count_pairs, load_configs, nearest_config  # noqa: E402

from minisgl.moe.torch_backend import TorchMoeBackend  # noqa: E402

PINNED = "20fcd7f"  # the upstream commit the book cites
KERNEL_FILE = "python/minisgl/kernel/triton/fused_moe.py"
LAUNCHER_FILE = "python/minisgl/kernel/moe_impl.py"
MOE_FILE = "python/minisgl/moe/fused.py"
MOE_FUNCTIONS = ("get_default_config", "try_get_optimal_moe_config", "fused_topk")
MOE_FUNCTIONS += ("moe_align_block_size",)
CHECKED_UP_TO = 512  # tokens: outputs are checked for T up to this
# Upstream's launcher computes in bf16 for bf16 inputs and in fp16 for anything else, so the
# tiny fp32 shape of --quick rounds its GEMMs' outputs to fp16 (about 5e-4 of a value).
QUICK_TOLERANCE = 5e-3
LINES = ["ch21", "upstream", "upstream, vLLM's H200 configs"]
Forward = Callable[..., torch.Tensor]


@dataclass
class Upstream:
    """What the script takes from the clone, and what stands in for what is missing."""

    commit: str
    fused_moe_kernel_triton: Callable[..., None]
    moe_sum_reduce_triton: Callable[..., None]
    try_get_optimal_moe_config: Callable[..., dict]
    fused_topk: Callable[..., Tuple[torch.Tensor, torch.Tensor]] | None  # None: no sgl_kernel
    moe_align_block_size: Callable[..., Tuple[torch.Tensor, ...]] | None
    silu_and_mul: Callable[[torch.Tensor, torch.Tensor], object] | None  # None: no FlashInfer


def clone_commit(root: Path) -> str:
    """The clone's commit, or 'unknown' for a tree without git of its own (an archive, which
    may sit inside another repository: that one's commit is not the clone's)."""
    done = subprocess.run(
        ["git", "-C", str(root), "rev-parse", "--show-toplevel", "HEAD"],
        capture_output=True,
        text=True,
    )
    lines = done.stdout.split()
    if done.returncode != 0 or len(lines) != 2 or Path(lines[0]).resolve() != root.resolve():
        return "unknown"
    return lines[1]


def functions_of(path: Path, names: Tuple[str, ...], namespace: dict) -> dict:
    """The top-level functions ``names`` of the Python file at path, defined in namespace as
    written there. Only these run: the file's own imports name upstream's package, which is
    not the one on this script's path."""
    tree = ast.parse(path.read_text(), str(path))
    found = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name in names]
    missing = set(names) - {n.name for n in found}
    if missing:
        raise SystemExit(f"{path} has no {', '.join(sorted(missing))}: is it upstream's file?")
    exec(compile(ast.Module(body=found, type_ignores=[]), str(path), "exec"), namespace)
    return {name: namespace[name] for name in names}


def can_import(module: str) -> bool:
    try:
        importlib.import_module(module)
    except Exception:  # a missing package, or one built for another torch or CUDA
        return False
    return True


def load_upstream(root: Path, device: str) -> Upstream:
    """Upstream's MoE kernels and launchers from the clone at root, as a package of their own
    (moe_impl.py imports the kernels by a relative import)."""
    for name in (KERNEL_FILE, LAUNCHER_FILE, MOE_FILE):
        if not (root / name).is_file():
            raise SystemExit(
                f"{root / name} not found: --upstream takes a clone of "
                f"https://github.com/sgl-project/mini-sglang at {PINNED}"
            )
    package, kernel_dir = "upstream_minisgl_kernel", root / "python/minisgl/kernel"
    for name, folder in [(package, kernel_dir), (f"{package}.triton", kernel_dir / "triton")]:
        module = types.ModuleType(name)
        module.__path__ = [str(folder)]
        sys.modules[name] = module
    launchers = importlib.import_module(f"{package}.moe_impl")
    namespace = {
        "torch": torch,
        "functools": functools,
        "Dict": Dict,
        "Tuple": Tuple,
        "div_ceil": lambda a, b: (a + b - 1) // b,  # upstream's minisgl.utils.div_ceil
    }
    moe = functions_of(root / MOE_FILE, MOE_FUNCTIONS, namespace)
    cuda = device == "cuda"
    has_sgl_kernel = cuda and can_import("sgl_kernel")
    silu_and_mul = None
    if cuda and can_import("flashinfer"):
        from flashinfer import silu_and_mul as flashinfer_silu_and_mul

        def silu_and_mul(x: torch.Tensor, out: torch.Tensor) -> object:
            return flashinfer_silu_and_mul(x, out=out)  # upstream's layers/activation.py

    return Upstream(
        commit=clone_commit(root),
        fused_moe_kernel_triton=launchers.fused_moe_kernel_triton,
        moe_sum_reduce_triton=launchers.moe_sum_reduce_triton,
        try_get_optimal_moe_config=moe["try_get_optimal_moe_config"],
        fused_topk=moe["fused_topk"] if has_sgl_kernel else None,
        moe_align_block_size=moe["moe_align_block_size"] if has_sgl_kernel else None,
        silu_and_mul=silu_and_mul,
    )


def includes(upstream: Upstream) -> List[Tuple[str, str, str]]:
    """(step, ch21, upstream) for the table that says what each line runs."""
    routing = (
        "upstream's fused_topk: sgl_kernel's topk_softmax, a torch division"
        if upstream.fused_topk
        else "STAND-IN (no sgl_kernel): chapter 20's select_experts, torch (4 launches)"
    )
    alignment = (
        "upstream's moe_align_block_size: sgl_kernel's CUDA kernel"
        if upstream.moe_align_block_size
        else "STAND-IN (no sgl_kernel): pair counts in torch, chapter 21's align (3 launches)"
    )
    activation = (
        "FlashInfer's silu_and_mul, as upstream's layers/activation.py"
        if upstream.silu_and_mul
        else "STAND-IN (no FlashInfer): torch's silu(gate) * up"
    )
    return [
        ("routing", "route: one Triton launch (with the counts)", routing),
        ("alignment", "align: three Triton launches (none for T <= 16)", alignment),
        ("GEMM 1", "gate_up_silu: writes [slots, I], SiLU inside", "fused_moe_kernel: [T*k, 2I]"),
        ("activation", "inside GEMM 1", activation),
        ("GEMM 2", "down, x routing weight", "fused_moe_kernel, x routing weight"),
        ("k-sum", "sum_choices (inside GEMM 2 for T <= 16)", "moe_sum_reduce_kernel"),
        ("tiles", "its tuned file for this GPU, else its heuristic", "get_default_config"),
    ]


def upstream_forward(upstream: Upstream, configs: Dict[int, dict] | None) -> Forward:
    """An MoE layer through upstream's kernels in the order of its fused_experts_impl, with the
    configs given (batch size -> tile config, nearest key) or upstream's own."""

    def forward(
        hidden_states: torch.Tensor,
        w1: torch.Tensor,
        w2: torch.Tensor,
        gating_output: torch.Tensor,
        topk: int,
        renormalize: bool,
    ) -> torch.Tensor:
        num_tokens, hidden = hidden_states.shape
        num_experts, two_inter, _ = w1.shape
        if configs is None:
            config = upstream.try_get_optimal_moe_config(w1.shape, w2.shape, topk, num_tokens)
        else:
            config = nearest_config(configs, num_tokens)
        if upstream.fused_topk is not None:
            weights, ids = upstream.fused_topk(hidden_states, gating_output, topk, renormalize)
            sorted_ids, expert_ids, num_padded = upstream.moe_align_block_size(
                ids, config["BLOCK_SIZE_M"], num_experts
            )
        else:
            from minisgl.kernel.moe_routing import align
            from minisgl.moe.base import select_experts

            weights, ids = select_experts(gating_output, topk, renormalize)
            ids = ids.to(torch.int32)
            counts = count_pairs(ids, num_experts)
            sorted_ids, expert_ids, num_padded = align(
                ids, counts, num_experts, config["BLOCK_SIZE_M"]
            )
        pairs = num_tokens * topk
        cache = hidden_states.new_empty(pairs * max(two_inter, hidden))  # as upstream's
        gate_up = cache[: pairs * two_inter].view(num_tokens, topk, two_inter)
        activated = hidden_states.new_empty(pairs, two_inter // 2)
        down = cache[: pairs * hidden].view(num_tokens, topk, hidden)
        routing = (weights, ids, sorted_ids, expert_ids, num_padded)
        dtype = hidden_states.dtype
        upstream.fused_moe_kernel_triton(
            hidden_states, w1, gate_up, *routing, False, topk, config, compute_type=dtype
        )
        if upstream.silu_and_mul is not None:
            upstream.silu_and_mul(gate_up.view(-1, two_inter), activated)
        else:
            gate, up = gate_up.view(-1, two_inter).chunk(2, dim=-1)
            torch.mul(torch.nn.functional.silu(gate), up, out=activated)
        upstream.fused_moe_kernel_triton(
            activated, w2, down, *routing, True, 1, config, compute_type=dtype
        )
        out = torch.empty_like(hidden_states)
        upstream.moe_sum_reduce_triton(down, out)
        return out

    return forward


def ch21_forward() -> Forward:
    from minisgl.moe.sync_free import SyncFreeMoeBackend

    return SyncFreeMoeBackend().forward


@dataclass
class Point:
    ms: Dict[str, List[float]]  # line -> per-layer ms of each repeat
    error: Dict[str, float | None]  # line (and "ch21 vs upstream") -> relative difference


def measure(
    tokens: int,
    shape: Shape,
    weights: List[Tuple[torch.Tensor, torch.Tensor]],
    lines: Dict[str, Forward],
    device: str,
    iters: int,
    repeats: int,
    graphs: bool,
) -> Point:
    """One T: every line's time per layer in each repeat, and its outputs' agreement."""
    x = torch.randn(tokens, shape.hidden, device=device).to(shape.dtype)
    gating = torch.randn(tokens, shape.experts, device=device)
    runs, outs = {}, {}
    for name, forward in lines.items():

        def layers(forward: Forward = forward) -> torch.Tensor:
            return [forward(x, w1, w2, gating, shape.topk, True) for w1, w2 in weights][0]

        runs[name], outs[name] = graph_of(layers) if graphs else (layers, layers())
    point = Point({name: [] for name in lines}, {})
    for _ in range(repeats):
        timed = interleaved_median_ms(runs, device, iters, warmup=3 if graphs else 0)
        for name, ms in timed.items():
            point.ms[name].append(ms / len(weights))
    if tokens <= CHECKED_UP_TO:
        w1, w2 = weights[0]
        ref = TorchMoeBackend().forward(x.float(), w1.float(), w2.float(), gating, shape.topk, True)
        scale = ref.abs().max()
        for name, out in outs.items():
            point.error[name] = ((out.float() - ref).abs().max() / scale).item()
        if "ch21" in outs and "upstream" in outs:
            diff = (outs["ch21"].float() - outs["upstream"].float()).abs().max() / scale
            point.error["ch21 vs upstream"] = diff.item()
    return point


def print_includes(upstream: Upstream) -> None:
    rows = includes(upstream)
    width = max(len(ch21) for _, ch21, _ in rows)
    print(f"\n{'':<10} | {'ch21':<{width}} | upstream at {upstream.commit[:7]}")
    for step, ch21, theirs in rows:
        print(f"{step:<10} | {ch21:<{width}} | {theirs}")
    print(f"{'':<10} | {'':<{width}} | (vLLM line: the tiles of {CONFIG_FILE.name})")


def print_table(tokens: List[int], points: List[Point], lines: List[str]) -> None:
    print(f"\n{'T':>6} |" + " |".join(f" {name:>29}" for name in lines), end="")
    print(" | ch21 / upstream | ch21 / vLLM configs")
    print(f"{'':>6} |" + " |".join(f" {'ms (median)':>19} {'spread':>9}" for _ in lines))
    for t, point in zip(tokens, points):
        medians = {name: statistics.median(point.ms[name]) for name in lines}
        cells = []
        for name in lines:
            ms = point.ms[name]
            spread = (max(ms) - min(ms)) / medians[name]
            cells.append(f" {medians[name]:>19.4f} {spread:>9.1%}")
        ratios = [medians["ch21"] / medians[name] for name in lines[1:]]
        print(f"{t:>6} |" + " |".join(cells) + "".join(f" | {r:>15.2f}" for r in ratios))


def print_agreement(tokens: List[int], points: List[Point], tolerance: float) -> bool:
    print(
        f"\nlargest difference / largest fp32 reference output, T <= {CHECKED_UP_TO} "
        f"(agreeing: below {tolerance:g})"
    )
    agree = True
    names = list(points[0].error) if points and points[0].error else []
    for name in names:
        errors = [
            (t, p.error[name]) for t, p in zip(tokens, points) if p.error.get(name) is not None
        ]
        worst = max(e for _, e in errors)
        agree &= worst < tolerance
        cells = ", ".join(f"T={t} {e:.1e}" for t, e in errors)
        print(f"  {name:<30} {'agrees' if worst < tolerance else 'DISAGREES'}: {cells}")
    return agree


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--upstream", type=Path, required=True, help="a clone at " + PINNED)
    parser.add_argument("--tokens", default=",".join(str(2**i) for i in range(15)))
    parser.add_argument("--iters", type=int, default=50)
    parser.add_argument("--layers", type=int, default=8, help="layers per timed graph")
    parser.add_argument("--repeats", type=int, default=3, help="whole measurements, median")
    parser.add_argument("--json", type=Path, help="write every number to this file")
    parser.add_argument("--quick", action="store_true", help="tiny shape, for a CPU check")
    args = parser.parse_args()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    upstream = load_upstream(args.upstream.resolve(), device)
    torch.manual_seed(0)
    if args.quick:
        shape, tokens, iters, graphs = TINY, [1, 5, 33], 1, False
        tolerance = QUICK_TOLERANCE
    else:
        assert device == "cuda", "the full run needs a GPU; --quick runs on a CPU"
        shape, iters, graphs = QWEN3_30B_A3B, args.iters, True
        tokens, tolerance = [int(t) for t in args.tokens.split(",")], shape.tolerance
    device_name = torch.cuda.get_device_name() if device == "cuda" else "CPU (Triton interpreter)"
    print(
        f"{device_name}; E {shape.experts}, top-{shape.topk}, H {shape.hidden}, I {shape.inter}, "
        f"{str(shape.dtype).removeprefix('torch.')}; upstream {upstream.commit}"
    )
    if not upstream.commit.startswith(PINNED):
        print(f"note: the clone is not at {PINNED}, the commit the book cites")
    if args.quick:
        print("quick: a crash and agreement check; its times mean nothing")
    print_includes(upstream)
    lines: Dict[str, Forward] = {
        "ch21": ch21_forward(),
        "upstream": upstream_forward(upstream, None),
        "upstream, vLLM's H200 configs": upstream_forward(upstream, load_configs()),
    }
    weights = [make_weights(shape, device) for _ in range(2 if args.quick else args.layers)]
    points = [
        measure(t, shape, weights, lines, device, iters, args.repeats, graphs) for t in tokens
    ]
    print_table(tokens, points, LINES)
    agree = print_agreement(tokens, points, tolerance)
    if args.json:
        import triton

        record = {
            "command": " ".join([Path(sys.executable).name, *sys.argv]),
            "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "device": device_name,
            "torch": torch.__version__,
            "triton": triton.__version__,
            "upstream_commit": upstream.commit,
            "includes": includes(upstream),
            "tokens": tokens,
            "ms": {name: [p.ms[name] for p in points] for name in LINES},
            "error": [p.error for p in points],
        }
        args.json.write_text(json.dumps(record, indent=2) + "\n")
        print(f"\nwrote {args.json}")
    return 0 if agree else 1


if __name__ == "__main__":
    sys.exit(main())
