"""Chapter 22's fused kernels against the torch paths they replace, at Qwen3-0.6B's shapes.

    PYTHONPATH=python python benchmark/bench_fused.py [--hbm-tbps 4.8]

One table: for each case, the median time of torch's path and of the fused kernel
(``triton.testing.do_bench``, return_mode="median", from the host's call to the device's end, so
launches count), torch / fused, and the fused kernel's share of the HBM bandwidth (the bytes it
must move at ``--hbm-tbps``). Cases:
- add + RMSNorm: ``RMSNormFused.forward(x, residual)`` (an add and torch's fused RMSNorm, then the
  weight) against ``add_rms_norm``, hidden 1024 in bf16, 256 tokens (a decode step) and 8,192
  (a prefill chunk);
- q/k RMSNorm: ``rms_norm`` over [256, 16, 128] bf16 (the query heads of a decode step);
- sampling over [256, 151,936] float32 logits (the engine samples from float32): ``Sampler``
  against ``FusedSampler``, all rows greedy, all at T = 0.7, half greedy and half at T = 0.7,
  and all at T = 0.7 with top-p 0.9 (the fused sampler's filter rows take the torch sort too).
  An all-greedy batch takes torch's argmax in both, so a last case times the race kernel
  (``race_sample``) on greedy rows against that argmax.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Callable, List, Tuple

import torch
import triton

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "python"))

from minisgl.core import SamplingParams  # noqa: E402
from minisgl.engine.fused_sampler import FusedSampler  # noqa: E402
from minisgl.engine.sample import BatchSamplingArgs, Sampler  # noqa: E402
from minisgl.kernel.fused_norm import add_rms_norm, rms_norm  # noqa: E402
from minisgl.kernel.fused_sample import race_sample  # noqa: E402
from minisgl.layers.norm import RMSNormFused  # noqa: E402
from minisgl.layers.norm import rms_norm as torch_rms_norm  # noqa: E402

HIDDEN, HEADS, HEAD_DIM, VOCAB, BATCH, EPS = 1024, 16, 128, 151_936, 256, 1e-6

Case = Tuple[str, Callable[[], object], Callable[[], object], int]  # name, torch, fused, bytes


def median_us(fn: Callable[[], object]) -> float:
    return triton.testing.do_bench(fn, warmup=25, rep=200, return_mode="median") * 1e3


def norm_cases() -> List[Case]:
    cases: List[Case] = []
    for tokens in (BATCH, 8192):
        x = torch.randn(tokens, HIDDEN, device="cuda", dtype=torch.bfloat16)
        residual = torch.randn_like(x)
        norm = RMSNormFused(HIDDEN, EPS)
        norm.weight = torch.randn(HIDDEN, device="cuda", dtype=torch.bfloat16)
        # the fused kernel adds into residual in place: a stream that grows is still timed right
        cases.append(
            (
                f"add + RMSNorm [{tokens}, {HIDDEN}] bf16",
                lambda x=x, r=residual, n=norm: n.forward(x, r),
                lambda x=x, r=residual, n=norm: add_rms_norm(x, r, n.weight, EPS),
                4 * x.numel() * x.element_size(),
            )
        )  # x, residual in; residual, out back
    q = torch.randn(BATCH, HEADS, HEAD_DIM, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(HEAD_DIM, device="cuda", dtype=torch.bfloat16)
    cases.append(
        (
            f"q RMSNorm [{BATCH}, {HEADS}, {HEAD_DIM}] bf16",
            lambda: torch_rms_norm(q, w, EPS),
            lambda: rms_norm(q, w, EPS),
            2 * q.numel() * q.element_size(),
        )
    )
    return cases


def sample_cases() -> List[Case]:
    logits = torch.randn(BATCH, VOCAB, device="cuda") * 3.0
    hot = SamplingParams(temperature=0.7)
    batches = {
        "greedy": [SamplingParams()] * BATCH,
        "T = 0.7": [hot] * BATCH,
        "half greedy": [SamplingParams(), hot] * (BATCH // 2),
        "T = 0.7, top-p 0.9": [SamplingParams(temperature=0.7, top_p=0.9)] * BATCH,
    }
    cases: List[Case] = []
    for name, params in batches.items():
        args = BatchSamplingArgs.from_params(params, "cuda")
        args.row_seeds = [None] * BATCH
        torch_sampler, fused = Sampler("cuda", seed=0), FusedSampler("cuda", seed=0)
        cases.append(
            (
                f"sample [{BATCH}, {VOCAB}], {name}",
                lambda s=torch_sampler, a=args: s.sample(logits, a),
                lambda s=fused, a=args: s.sample(logits, a),
                logits.numel() * logits.element_size(),
            )
        )
    greedy = torch.ones(BATCH, dtype=torch.bool, device="cuda")
    ones, seeds = torch.ones(BATCH, device="cuda"), torch.zeros_like(greedy, dtype=torch.int64)
    cases.append(
        (
            f"race kernel [{BATCH}, {VOCAB}], greedy",
            lambda: logits.argmax(dim=-1),
            lambda: race_sample(logits, ones, greedy, seeds),
            logits.numel() * logits.element_size(),
        )
    )
    return cases


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hbm-tbps", type=float, default=4.8, help="HBM bandwidth, TB/s")
    args = parser.parse_args()
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}, triton {triton.__version__}")
    print(f"{'case':<40} {'torch us':>9} {'fused us':>9} {'ratio':>6} {'HBM share':>9}")
    for name, torch_fn, fused_fn, num_bytes in norm_cases() + sample_cases():
        torch_us, fused_us = median_us(torch_fn), median_us(fused_fn)
        share = num_bytes / (fused_us * 1e-6) / (args.hbm_tbps * 1e12)
        print(f"{name:<40} {torch_us:9.1f} {fused_us:9.1f} {torch_us / fused_us:6.2f} {share:9.0%}")


if __name__ == "__main__":
    main()
