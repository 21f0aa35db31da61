"""What speculative decoding buys (chapter 24): decode throughput with and without drafts.

    PYTHONPATH=python python benchmark/bench_speculative.py [--model PATH | --shape NAME]
        [--batches 1,8] [--k 4] [--tokens 128] [--draft self|PATH] [--device auto]

By default the real small model of the book (SmolLM2-135M-Instruct, ``examples/real_model.py``)
on the CPU, its prompts through its chat template; or ``--shape`` (``examples/ch15_measure.py``'s
shapes, random weights, prompts of token ids). Two kinds of prompt: "copy", where the answer
repeats the prompt's text (an edit of a given passage), so n-grams repeat, and "fresh", where it
does not (a story). Each engine setting (no drafts; n-gram drafts; with ``--draft``, a draft
model, ``self`` for the target as its own draft: every draft right, the upper bound of
acceptance) builds its own engine and runs every prompt kind and batch size three times, greedy,
``--tokens`` new tokens a request at most; a figure is the median of the three. Throughput is
output tokens over the wall time of the ``generate``, the prefill included (the same prompts in
every setting). Beside it: the speed-up over no drafts, the share of drafts kept and the tokens
a request gets per target forward. On a GPU one more setting, no drafts with neither CUDA graphs
nor overlap scheduling, runs each decode step as speculation runs its verify steps, so that the
cost of the execution mode and the gain of the drafts can be told apart.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Dict, List, Tuple

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "python"), str(ROOT / "examples"), str(ROOT / "benchmark")]

from minisgl.core import SamplingParams  # noqa: E402
from minisgl.llm import LLM  # noqa: E402

PASSAGE = (
    "The engine keeps every request's keys and values in pages of a shared pool. A "
    "request that finishes gives its pages back, and a request that shares a prefix "
    "with an earlier one reads the earlier one's pages instead of computing them again. "
    "When the pool runs short, the prefix cache evicts the pages no request is using."
)
COPY = [
    f"Rewrite this text with 'pool' replaced by 'store', changing nothing else:\n\n{PASSAGE}",
    f"Copy this paragraph exactly, then stop:\n\n{PASSAGE}",
]
FRESH = [
    "Write a short story about a lighthouse keeper who finds a map.",
    "Explain to a child why the sky is blue, in your own words.",
]


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    which = p.add_mutually_exclusive_group()
    which.add_argument("--model", help="a checkpoint (default: the real small model)")
    which.add_argument("--shape", help="random weights of this shape, with token-id prompts")
    p.add_argument("--batches", default="1,8")
    p.add_argument("--k", type=int, default=4, help="draft tokens a request per step")
    p.add_argument("--tokens", type=int, default=128, help="new tokens a request at most")
    p.add_argument("--draft", help="also a draft model: a checkpoint, or 'self'")
    p.add_argument("--device", default="auto")
    return p.parse_args()


def prompts_for(llm: LLM, kind: str, batch: int, text: bool) -> List[Any]:
    """``batch`` prompts of one kind: chat-templated text (``text``), or for a shape token ids
    (copy: a random passage said twice; fresh: random ids throughout)."""
    if text:
        texts = COPY if kind == "copy" else FRESH
        chats = [[{"role": "user", "content": texts[i % len(texts)]}] for i in range(batch)]
        return [
            llm.tokenizer.apply_chat_template(
                c, add_generation_prompt=True, tokenize=True, return_dict=True
            )["input_ids"]
            for c in chats
        ]
    generator = torch.Generator().manual_seed(0)
    span = min(llm.scheduler.engine.model_config.vocab_size, 10000)
    out = []
    for _ in range(batch):
        ids = torch.randint(span, (96,), generator=generator).tolist()
        out.append(ids[:48] * 2 if kind == "copy" else ids)
    return out


def run_once(llm: LLM, prompts: List[Any], tokens: int) -> Tuple[float, int]:
    params = SamplingParams(max_tokens=tokens)
    start = time.perf_counter()
    outs = llm.generate(prompts, params)
    seconds = time.perf_counter() - start
    return seconds, sum(len(o["token_ids"]) for o in outs)


def measure(
    path: str, args: argparse.Namespace, spec: Dict[str, Any], batches: List[int]
) -> Dict[Tuple[str, int], Dict[str, float]]:
    """Every prompt kind and batch size under one engine setting: the medians of three runs."""
    llm = LLM(path, device=args.device, max_running_req=max(batches), **spec)
    results = {}
    for kind in ("copy", "fresh"):
        for batch in batches:
            prompts = prompts_for(llm, kind, batch, text=not args.shape)
            run_once(llm, prompts, min(args.tokens, 8))  # warm: kernels compiled, caches filled
            speculator = llm.scheduler.speculator
            before = (
                (speculator.stats.proposed, speculator.stats.accepted, speculator.stats.steps)
                if speculator
                else (0, 0, 0)
            )
            runs = [run_once(llm, prompts, args.tokens) for _ in range(3)]
            seconds = statistics.median(s for s, _ in runs)
            made = runs[0][1]
            row = {"tok/s": made / seconds, "tokens": made}
            if speculator:
                proposed, accepted, steps = (
                    now - then
                    for now, then in zip(
                        (
                            speculator.stats.proposed,
                            speculator.stats.accepted,
                            speculator.stats.steps,
                        ),
                        before,
                    )
                )
                row["kept"] = accepted / proposed if proposed else 0.0
                row["per step"] = (accepted + steps) / steps if steps else 0.0
            results[kind, batch] = row
    llm.shutdown()
    del llm
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    return results


def model_path(args: argparse.Namespace, tmp: str) -> str:
    if args.model:
        return args.model
    if args.shape:
        from make_checkpoint import make_checkpoint

        device = "cuda" if torch.cuda.is_available() and args.device != "cpu" else "cpu"
        return str(make_checkpoint(args.shape, Path(tmp) / args.shape, device))
    from real_model import cached_real_model

    return str(cached_real_model())


def settings(args: argparse.Namespace, path: str, on_gpu: bool) -> List[Tuple[str, Dict[str, Any]]]:
    """The settings compared: no drafts (the default a user has), on a GPU also no drafts run
    as speculation runs (no CUDA graphs, no overlap), then the drafts."""
    out: List[Tuple[str, Dict[str, Any]]] = [("no drafts", {})]
    if on_gpu:
        out.append(("no drafts, eager", {"cuda_graph_max_bs": 0, "overlap_scheduling": False}))
    out.append((f"n-gram k={args.k}", {"speculative": "ngram", "speculative_k": args.k}))
    if args.draft:
        draft = path if args.draft == "self" else args.draft
        out.append(
            (
                f"draft {'self' if args.draft == 'self' else Path(draft).name} k={args.k}",
                {"speculative": "draft", "draft_model": draft, "speculative_k": args.k},
            )
        )
    return out


def main() -> None:
    args = parse_args()
    batches = [int(b) for b in args.batches.split(",")]
    with tempfile.TemporaryDirectory() as tmp:
        path = model_path(args, tmp)
        on_gpu = torch.cuda.is_available() and args.device != "cpu"
        where = torch.cuda.get_device_name() if on_gpu else "CPU"
        print(
            f"{Path(path).name} on {where}, torch {torch.__version__}, "
            f"{torch.get_num_threads()} threads; greedy, {args.tokens} new tokens at most"
        )
        table = {
            label: measure(path, args, spec, batches)
            for label, spec in settings(args, path, on_gpu)
        }
    base = table["no drafts"]
    print(
        f"{'setting':>22} {'prompts':>7} {'batch':>5} {'tok/s':>9} {'speed-up':>8} "
        f"{'kept':>6} {'tok/fwd':>7}   (medians of 3)"
    )
    for label, results in table.items():
        for (kind, batch), row in results.items():
            speedup = row["tok/s"] / base[kind, batch]["tok/s"]
            kept = f"{row['kept']:6.1%}" if "kept" in row else f"{'-':>6}"
            per_step = f"{row['per step']:7.2f}" if "per step" in row else f"{'1':>7}"
            print(
                f"{label:>22} {kind:>7} {batch:>5} {row['tok/s']:9.1f} {speedup:7.2f}x "
                f"{kept} {per_step}"
            )


if __name__ == "__main__":
    main()
