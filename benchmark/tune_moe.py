"""Search the fast MoE's tile sizes on this GPU and write them where moe/configs.py finds them.

    PYTHONPATH=python python benchmark/tune_moe.py [--experts 128 --hidden 2048 --inter 768
        --topk 8] [--tokens 1,2,4,...] [--block-m 64,128] [--out DIR]
    PYTHONPATH=python python benchmark/tune_moe.py --quick   # on a CPU: a crash check only

For each token count T: route random logits once, then for each BLOCK_M that suits T (pairs
per expert, chapter 20's exercise 1) align the pairs and time every candidate of each GEMM
(BLOCK_N, BLOCK_K, GROUP_M, num_warps, num_stages, and each TAIL_SPLIT whose parts keep 16
rows) as CUDA-graph replays (``triton.testing.do_bench_cudagraph``); ``--block-m`` narrows the
tile heights to those given. The BLOCK_M whose two best GEMMs sum to the least time
wins; its two configs and their times go into the JSON, keyed by T. Token counts up to
``DECODE_MAX_TOKENS`` take the decode path instead, timed as the whole three-launch layer. An
existing file keeps the configs of the token counts not tuned in this run. The file is named by E, N
(= I), dtype and device (``moe/configs.config_file_name``), so a file tuned on another GPU is
never used on this one. Candidates that do not fit the GPU (shared memory) are skipped.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable, Dict, Iterator, List, Tuple

if "--quick" in sys.argv and not Path("/dev/nvidia0").exists():
    os.environ.setdefault("TRITON_INTERPRET", "1")  # before triton is imported

import torch  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "python"))

from minisgl.kernel.fused_moe import down, gate_up_silu  # noqa: E402
from minisgl.kernel.moe_routing import align, route  # noqa: E402
from minisgl.moe.configs import (  # noqa: E402
    CONFIG_DIR,
    DECODE_MAX_TOKENS,
    DTYPE_NAMES,
    MoeConfig,
    config_file_name,
    default_config,
)
from minisgl.moe.sync_free import SyncFreeMoeBackend  # noqa: E402

DEFAULT_TOKENS = [1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384]
Gemm = Dict[str, int]


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--experts", type=int, default=128)
    p.add_argument("--hidden", type=int, default=2048)
    p.add_argument("--inter", type=int, default=768, help="the intermediate size I (N)")
    p.add_argument("--topk", type=int, default=8)
    p.add_argument("--dtype", choices=["bf16", "fp16"], default="bf16")
    p.add_argument(
        "--tokens",
        default=None,
        help="token counts, comma-separated (default: 1, 2, 4 ... 16384; with --quick 1, 5, 33)",
    )
    p.add_argument(
        "--block-m",
        type=lambda s: [int(m) for m in s.split(",")],
        default=None,
        help="try only these tile heights (comma-separated) on the aligned path, of "
        "those that suit each token count",
    )
    p.add_argument(
        "--out",
        type=Path,
        default=None,
        help=f"where the JSON goes (default {CONFIG_DIR.relative_to(ROOT)}; with "
        "--quick a new temporary directory)",
    )
    p.add_argument(
        "--quick",
        action="store_true",
        help="tiny shape, two candidates, interpreted on a CPU: checks that it runs",
    )
    return p.parse_args()


def block_ms(
    num_tokens: int, topk: int, num_experts: int, only: List[int] | None = None
) -> List[int]:
    """The tile heights worth trying for the mean pairs per expert (chapter 20's exercise 1):
    16 (tl.dot's smallest) while experts get few pairs, 128 once they get many, 64 between;
    of those, the ones in ``only`` if given (a shorter search)."""
    per_expert = num_tokens * topk / num_experts
    suit = [
        m for m, lo, hi in ((16, 0, 32), (64, 4, 1e9), (128, 32, 1e9)) if lo <= per_expert <= hi
    ]
    return [m for m in suit if only is None or m in only]


def decode_candidates(kernel: str, topk: int, quick: bool) -> Iterator[Gemm]:
    """The decode path's tiles: the first kernel's (a dot of 16 rows), the second's (k
    matrix-vector products, [k, BLOCK_N, BLOCK_K] a step, held across a step: at most 64
    values a thread, past which registers spill); GROUP_M has no meaning there."""
    if quick:
        space = [(16, 16, 4, 2), (16, 32, 4, 2)]
    elif kernel == "gate_up":
        space = itertools.product((16, 32, 64), (64, 128), (4,), (3, 4))
    else:
        space = [
            (n, k, w, 2)
            for n, k, w in itertools.product((4, 8, 16), (64, 128, 256, 512), (2, 4, 8))
            if topk * n * k <= 64 * 32 * w
        ]
    for n, k, w, s in space:
        yield dict(BLOCK_N=n, BLOCK_K=k, GROUP_M=1, num_warps=w, num_stages=s)


def candidates(block_m: int, quick: bool) -> Iterator[Gemm]:
    """Each GEMM's tile widths, depths, swizzle groups, warps and pipeline stages for BLOCK_M."""
    if quick:
        yield from (
            dict(BLOCK_N=16, BLOCK_K=16, GROUP_M=g, num_warps=4, num_stages=2) for g in (1, 4)
        )
        return
    if block_m <= 32:  # few rows: read the weights in wide K steps with enough programs
        space = itertools.product((32, 64, 128), (64, 128, 256), (1,), (4,), (3, 4))
    elif block_m == 64:
        space = itertools.product((64, 128), (64, 128), (8,), (4, 8), (3, 4))
    else:
        space = itertools.product((64, 128, 256), (64, 128), (8, 32), (8,), (3, 4))
    for n, k, g, w, s in space:
        yield dict(BLOCK_N=n, BLOCK_K=k, GROUP_M=g, num_warps=w, num_stages=s)


def with_tail_splits(space: Iterator[Gemm], block_m: int) -> Iterator[Gemm]:
    """Each candidate as it is and with each TAIL_SPLIT whose parts keep 16 rows or more: an
    expert's last tile computes a half or a quarter when the rest is padding
    (kernel/fused_moe.py)."""
    for gemm in space:
        yield gemm
        yield from (dict(gemm, TAIL_SPLIT=split) for split in (2, 4) if block_m // split >= 16)


def time_us(fn: Callable[[], None], quick: bool) -> float:
    """Microseconds per call of fn, replayed in a CUDA graph; on a CPU one call's wall time."""
    if quick:
        start = time.perf_counter()
        fn()
        return (time.perf_counter() - start) * 1e6
    import triton.testing

    return triton.testing.do_bench_cudagraph(fn, rep=20) * 1e3


def best_of(
    make_call: Callable[[Gemm], Callable[[], None]], space: Iterator[Gemm], quick: bool
) -> Tuple[Gemm, float]:
    """The fastest candidate and its time; those that fail to compile (too much shared memory)
    are skipped."""
    best: Tuple[Gemm, float] | None = None
    for gemm in space:
        call = make_call(gemm)
        try:
            call()  # compiles; raises if the tiles do not fit
            us = time_us(call, quick)
        except Exception as err:  # triton's OutOfResources and the like: not this GPU's tiles
            if "OutOfResources" not in type(err).__name__ and "resources" not in str(err):
                raise
            continue
        if best is None or us < best[1]:
            best = (gemm, us)
    assert best is not None, "no candidate ran"
    return best


def tune_aligned(
    args: argparse.Namespace,
    x: torch.Tensor,
    gating: torch.Tensor,
    w1: torch.Tensor,
    w2: torch.Tensor,
) -> MoeConfig:
    """Per BLOCK_M each GEMM's best, then the BLOCK_M whose two sum to the least."""
    weights, topk_ids, block_counts = route(gating, args.topk, True)
    y = x.new_empty(x.shape[0] * args.topk, args.hidden)
    results = []
    heights = block_ms(x.shape[0], args.topk, args.experts, args.block_m)
    if not heights:
        raise SystemExit(
            f"--block-m {args.block_m}: none suits {x.shape[0]} tokens "
            f"({block_ms(x.shape[0], args.topk, args.experts)} would)"
        )
    for block_m in heights:
        sorted_ids, expert_ids, num_padded = align(topk_ids, block_counts, args.experts, block_m)
        h = x.new_empty(sorted_ids.numel(), args.inter)
        gate_up, gate_up_us = best_of(
            lambda g: (
                lambda: gate_up_silu(x, w1, h, sorted_ids, expert_ids, num_padded, args.topk, g)
            ),
            with_tail_splits(candidates(block_m, args.quick), block_m),
            args.quick,
        )
        down_cfg, down_us = best_of(
            lambda g: (
                lambda: down(h, w2, y, weights.view(-1), sorted_ids, expert_ids, num_padded, g)
            ),
            with_tail_splits(candidates(block_m, args.quick), block_m),
            args.quick,
        )
        results.append(
            dict(
                path="aligned",
                BLOCK_M=block_m,
                gate_up=gate_up,
                down=down_cfg,
                us=dict(gate_up=round(gate_up_us, 2), down=round(down_us, 2)),
            )
        )
    return min(results, key=lambda r: r["us"]["gate_up"] + r["us"]["down"])


def tune_decode(
    args: argparse.Namespace,
    x: torch.Tensor,
    gating: torch.Tensor,
    w1: torch.Tensor,
    w2: torch.Tensor,
) -> MoeConfig:
    """The first GEMM's best with the heuristic's second, then the second's best: each timed
    as the whole three-launch layer, routing included."""
    backend = SyncFreeMoeBackend()
    start = default_config(1, args.topk, args.experts)

    def layer(gate_up: Gemm, down_cfg: Gemm) -> Callable[[], None]:
        config = dict(path="decode", gate_up=gate_up, down=down_cfg)
        return lambda: backend.forward_with(config, x, w1, w2, gating, args.topk, True)

    gate_up, _ = best_of(
        lambda g: layer(g, start["down"]),
        decode_candidates("gate_up", args.topk, args.quick),
        args.quick,
    )
    down_cfg, us = best_of(
        lambda g: layer(gate_up, g), decode_candidates("down", args.topk, args.quick), args.quick
    )
    return dict(path="decode", gate_up=gate_up, down=down_cfg, us=dict(layer=round(us, 2)))


def tune_tokens(
    args: argparse.Namespace,
    num_tokens: int,
    w1: torch.Tensor,
    w2: torch.Tensor,
    device: torch.device,
) -> MoeConfig:
    """The best config for one token count, on the path moe/configs.py gives that count."""
    torch.manual_seed(num_tokens)
    x = torch.randn(num_tokens, args.hidden, device=device, dtype=w1.dtype)
    gating = torch.randn(num_tokens, args.experts, device=device)
    if num_tokens <= DECODE_MAX_TOKENS:
        return tune_decode(args, x, gating, w1, w2)
    return tune_aligned(args, x, gating, w1, w2)


def start_record(
    args: argparse.Namespace, dtype: torch.dtype, device_name: str, path: Path
) -> Dict[str, Any]:
    """The JSON to write: this run's shape, device, versions and command; an existing file's
    configs and commands are kept, so re-tuning some token counts keeps the others'."""
    import triton

    record: Dict[str, Any] = dict(
        experts=args.experts,
        inter=args.inter,
        hidden=args.hidden,
        topk=args.topk,
        dtype=DTYPE_NAMES[dtype],
        device=device_name,
        date=time.strftime("%Y-%m-%d"),
        torch=torch.__version__,
        triton=triton.__version__,
        commands=[" ".join(["PYTHONPATH=python python benchmark/tune_moe.py", *sys.argv[1:]])],
        configs={},
    )
    if path.exists():
        earlier = json.loads(path.read_text(encoding="utf-8"))
        record["configs"] = earlier["configs"]
        record["commands"] = list(dict.fromkeys(earlier.get("commands", []) + record["commands"]))
    return record


def main() -> None:
    args = parse_args()
    cuda = torch.cuda.is_available() and not args.quick
    device = torch.device("cuda" if cuda else "cpu")
    dtype = torch.bfloat16 if args.dtype == "bf16" else torch.float16
    tokens = [1, 5, 33] if args.quick else DEFAULT_TOKENS
    if args.quick:
        args.experts, args.hidden, args.inter, args.topk, dtype = 8, 32, 16, 2, torch.float32
    if args.tokens:
        tokens = [int(t) for t in args.tokens.split(",")]
    device_name = torch.cuda.get_device_name(device) if cuda else "CPU interpreter"
    w1 = (
        torch.randn(args.experts, 2 * args.inter, args.hidden, device=device) / args.hidden**0.5
    ).to(dtype)
    w2 = (torch.randn(args.experts, args.hidden, args.inter, device=device) / args.inter**0.5).to(
        dtype
    )
    print(
        f"{device_name}: E={args.experts}, top-{args.topk}, H={args.hidden}, "
        f"I={args.inter}, {DTYPE_NAMES[dtype]}"
    )
    out = args.out or (Path(tempfile.mkdtemp()) if args.quick else CONFIG_DIR)
    path = out / config_file_name(args.experts, args.inter, dtype, device_name)
    record = start_record(args, dtype, device_name, path)
    out.mkdir(parents=True, exist_ok=True)
    for num_tokens in tokens:
        best = tune_tokens(args, num_tokens, w1, w2, device)
        record["configs"][str(num_tokens)] = best
        record["configs"] = dict(sorted(record["configs"].items(), key=lambda kv: int(kv[0])))
        print(
            f"T={num_tokens:>6}: {best['path']} {best.get('BLOCK_M', '')} gate_up "
            f"{best['gate_up']}  down {best['down']}  {best['us']} us",
            flush=True,
        )
        # written after every T: an interrupted search keeps what it found
        path.write_text(json.dumps(record, indent=1) + "\n", encoding="utf-8")
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
