"""What speculative decoding buys (chapter 24): decode throughput with and without drafts.

    PYTHONPATH=python python benchmark/bench_speculative.py [--model PATH | --shape NAME]
        [--batches 1,8] [--k 4] [--tokens 128] [--draft self|PATH] [--device auto]
        [--max-batch N] [--min-tokens X] [--eager] [--breakdown] [--busy]

By default the real small model of the book (SmolLM2-135M-Instruct, ``examples/real_model.py``)
on the CPU, its prompts through its chat template; or ``--shape`` (``examples/ch15_measure.py``'s
shapes, random weights, prompts of token ids). Two kinds of prompt: "copy", where the answer
repeats the prompt's text (an edit of a given passage), so n-grams repeat, and "fresh", where it
does not (a story). Each engine setting (no drafts; n-gram drafts; with ``--draft``, a draft
model, ``self`` for the target as its own draft: every draft right, the upper bound of
acceptance) builds its own engine and runs every prompt kind and batch size three times, greedy,
``--tokens`` new tokens a request at most; a figure is the median of the three. Throughput is
output tokens over the wall time of the ``generate``, the prefill included (the same prompts in
every setting), and over the decode steps alone ("decode tok/s": from the end of the last step
that processed a prefill to the end of the last step, the tokens after each request's first).
Beside them: the speed-up over no drafts, the share of drafts kept, the tokens a request gets
per verify forward, the share of decode steps that verified drafts and the share of those that
ran padded to a graph's size. "n-gram" drafts at every step; "n-gram, rule" with the settings'
defaults (``speculative_max_batch``, ``speculative_min_tokens``; ``--max-batch`` and
``--min-tokens`` try others), which decode without drafts where they do not pay. With
``--eager`` on a GPU one more setting, no drafts with neither CUDA graphs nor overlap.

``--breakdown`` runs each case once more with the step timer on (the device synchronized at
every phase's edges, so its wall time is not the figures above): the host's and device's ms a
decode step by phase (draft, prepare, forward verify or decode, accept, sample, process,
schedule). ``--busy`` (a GPU) runs it under torch.profiler: the device's busy ms a forward (the
union of its kernels' intervals).
"""

from __future__ import annotations

import argparse
import gc
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, List, Tuple

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "python"), str(ROOT / "examples"), str(ROOT / "benchmark")]

from bench_structured import model_path, patched  # noqa: E402

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
    p.add_argument("--max-batch", type=int, help="the rule's speculative_max_batch")
    p.add_argument("--min-tokens", type=float, help="the rule's speculative_min_tokens")
    p.add_argument("--breakdown", action="store_true", help="ms a decode step by phase")
    p.add_argument("--busy", action="store_true", help="device busy ms a decode step (GPU)")
    p.add_argument("--eager", action="store_true", help="also no drafts, no graphs, no overlap")
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


@dataclass
class Run:
    seconds: float  # the generate's wall time
    tokens: int  # output tokens
    decode_seconds: float  # from the end of the last step that processed a prefill
    decode_tokens: int  # the tokens after each request's first


def run_once(llm: LLM, prompts: List[Any], tokens: int) -> Run:
    params = SamplingParams(max_tokens=tokens)
    scheduler, marks = llm.scheduler, []
    scheduler_step = scheduler.step

    def step() -> Any:  # the end of every step, and the phase of the batch it processed
        out = scheduler_step()
        if out is not None:
            marks.append((out.phase, time.perf_counter()))
        return out

    with patched(scheduler, "step", step):
        start = time.perf_counter()
        outs = llm.generate(prompts, params)
        seconds = time.perf_counter() - start
    made = sum(len(o["token_ids"]) for o in outs)
    prefilled = max(t for phase, t in marks if phase == "prefill")
    return Run(seconds, made, marks[-1][1] - prefilled, made - len(prompts))


def counters(llm: LLM) -> Dict[str, int]:
    """Counts so far: the speculator's (drafts proposed and kept, request-steps verified), and
    the engine's forwards by phase, and the verify batches padded to a graph's size (on a GPU:
    that replayed it)."""
    speculator = llm.scheduler.speculator
    counts = dict(llm._forwards)  # type: ignore[attr-defined]
    if speculator is not None:
        stats = speculator.stats
        counts.update(proposed=stats.proposed, accepted=stats.accepted, steps=stats.steps)
    return counts


def count_forwards(llm: LLM) -> None:
    """Count the engine's forwards by phase, and the verify batches the verify graphs ran, in
    ``llm._forwards``."""
    engine = llm.scheduler.engine
    counts = llm._forwards = {"decode": 0, "verify": 0, "prefill": 0, "graphed": 0}  # type: ignore
    forward = engine._forward

    def counted_forward(batch: Any) -> Any:
        counts[batch.phase] += 1
        return forward(batch)

    engine._forward = counted_forward  # type: ignore[method-assign]
    runner = engine.verify_runner
    if runner is not None:
        pad = runner.pad

        def counted_pad(batch: Any) -> Any:
            counts["graphed"] += 1
            return pad(batch)

        runner.pad = counted_pad  # type: ignore[method-assign]


def measure(
    path: str, args: argparse.Namespace, spec: Dict[str, Any], batches: List[int]
) -> Dict[Tuple[str, int], Dict[str, float]]:
    """Every prompt kind and batch size under one engine setting: the medians of three runs,
    then with ``--breakdown`` and ``--busy`` one more run each."""
    llm = LLM(path, device=args.device, max_running_req=max(batches), **spec)
    count_forwards(llm)
    results = {}
    for kind in ("copy", "fresh"):
        for batch in batches:
            prompts = prompts_for(llm, kind, batch, text=not args.shape)
            run_once(llm, prompts, min(args.tokens, 8))  # warm: kernels compiled, caches filled
            before = counters(llm)
            runs = [run_once(llm, prompts, args.tokens) for _ in range(3)]
            after = counters(llm)
            seconds = statistics.median(r.seconds for r in runs)
            decode = statistics.median(r.decode_seconds for r in runs)
            row = {
                "tok/s": runs[0].tokens / seconds,
                "decode tok/s": runs[0].decode_tokens / decode,
            }
            got = {name: after[name] - before[name] for name in after}
            if "proposed" in got:
                verified = got["verify"]
                row["kept"] = got["accepted"] / got["proposed"] if got["proposed"] else 0.0
                row["per step"] = (got["accepted"] + got["steps"]) / max(got["steps"], 1)
                row["drafted"] = verified / max(verified + got["decode"], 1)
                row["graphed"] = got["graphed"] / verified if verified else 0.0
            if args.breakdown:
                row["phases"] = breakdown(llm, prompts, args.tokens)  # type: ignore[assignment]
            if args.busy and llm.scheduler.engine.device.type == "cuda":
                row["busy ms"] = busy_ms(llm, prompts, args.tokens)
            results[kind, batch] = row
            # as it goes, so that a run cut short still tells what it measured
            print(f"  {spec or 'no drafts'} {kind} {batch}: {row}", file=sys.stderr, flush=True)
    llm.shutdown()
    del llm
    gc.collect()  # the counters' wrappers hold the engine in a cycle: free its KV pool now
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    return results


def breakdown(llm: LLM, prompts: List[Any], tokens: int) -> Dict[str, float]:
    """One more run with the step timer on: ms a decode step (a forward of the decode or verify
    phase) by phase, the prefill's phases left out."""
    timer = llm.scheduler.engine.timer
    timer.reset()
    timer.enabled = True
    try:
        run_once(llm, prompts, tokens)
    finally:
        timer.enabled = False
    steps = timer.counts.get("forward decode", 0) + timer.counts.get("forward verify", 0)
    phases = {
        name: seconds * 1e3 / max(steps, 1)
        for name, seconds in timer.seconds.items()
        if name != "forward prefill"
    }
    timer.reset()
    return phases


def busy_ms(llm: LLM, prompts: List[Any], tokens: int) -> float:
    """One more run under torch.profiler: the device's busy ms (the union of its kernels' and
    copies' intervals) a forward, the prefill's few among them."""
    from offline import busy_and_gaps
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    before = counters(llm)
    with torch_profile(activities=[ProfilerActivity.CUDA]) as prof:
        run_once(llm, prompts, tokens)
    spans = [
        (e.start_ns(), e.start_ns() + e.duration_ns())
        for e in prof.profiler.kineto_results.events()
        if e.device_type() == torch.autograd.DeviceType.CUDA
    ]
    after = counters(llm)
    steps = sum(after[phase] - before[phase] for phase in ("decode", "verify", "prefill"))
    return busy_and_gaps(spans)[0] / 1e6 / max(steps, 1)


def settings(args: argparse.Namespace, path: str, on_gpu: bool) -> List[Tuple[str, Dict[str, Any]]]:
    """The settings compared: no drafts (the default a user has), with ``--eager`` on a GPU
    also no drafts run without CUDA graphs or overlap, then n-gram drafts at every step,
    n-gram drafts under the rule, and the draft model."""
    out: List[Tuple[str, Dict[str, Any]]] = [("no drafts", {})]
    if on_gpu and args.eager:
        out.append(("no drafts, eager", {"cuda_graph_max_bs": 0, "overlap_scheduling": False}))
    always = {"speculative_max_batch": None, "speculative_min_tokens": 0.0}
    ngram = {"speculative": "ngram", "speculative_k": args.k}
    out.append((f"n-gram k={args.k}", {**ngram, **always}))
    rule = {
        name: value
        for name, value in (
            ("speculative_max_batch", args.max_batch),
            ("speculative_min_tokens", args.min_tokens),
        )
        if value is not None
    }
    out.append((f"n-gram k={args.k}, rule", {**ngram, **rule}))
    if args.draft:
        draft = path if args.draft == "self" else args.draft
        name = "self" if args.draft == "self" else Path(draft).name
        options = {"speculative": "draft", "draft_model": draft, "speculative_k": args.k}
        out.append((f"draft {name} k={args.k}", {**options, **always}))
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
    print_table(table)
    if args.breakdown or args.busy:
        print_phases(table)


def print_table(table: Dict[str, Dict[Tuple[str, int], Dict[str, Any]]]) -> None:
    base = table["no drafts"]
    print(
        f"{'setting':>24} {'prompts':>7} {'batch':>5} {'tok/s':>9} {'speed-up':>8} "
        f"{'decode':>9} {'speed-up':>8} {'kept':>6} {'tok/fwd':>7} {'drafted':>7} "
        f"{'graphed':>7}   (medians of 3)"
    )
    for label, results in table.items():
        for (kind, batch), row in results.items():
            plain = base[kind, batch]
            speedup = row["tok/s"] / plain["tok/s"]
            decode_speedup = row["decode tok/s"] / plain["decode tok/s"]
            cells = [
                f"{row[name]:{fmt}}" if name in row else f"{'-':>{width}}"
                for name, fmt, width in (
                    ("kept", "6.1%", 6),
                    ("per step", "7.2f", 7),
                    ("drafted", "7.0%", 7),
                    ("graphed", "7.0%", 7),
                )
            ]
            print(
                f"{label:>24} {kind:>7} {batch:>5} {row['tok/s']:9.1f} {speedup:7.2f}x "
                f"{row['decode tok/s']:9.1f} {decode_speedup:7.2f}x {' '.join(cells)}"
            )


def print_phases(table: Dict[str, Dict[Tuple[str, int], Dict[str, Any]]]) -> None:
    """ms a decode step by phase (the step timer's run), and the device's busy ms a forward."""
    names: List[str] = []
    for results in table.values():
        for row in results.values():
            names += [n for n in row.get("phases", {}) if n not in names]
    print("\nms a decode step by phase (a run with the device synchronized at each phase):")
    header = " ".join(f"{n[:9]:>9}" for n in names)
    print(f"{'setting':>24} {'prompts':>7} {'batch':>5} {header} {'busy':>6}")
    for label, results in table.items():
        for (kind, batch), row in results.items():
            phases = row.get("phases", {})
            cells = " ".join(f"{phases[n]:9.2f}" if n in phases else f"{'-':>9}" for n in names)
            busy = f"{row['busy ms']:6.2f}" if "busy ms" in row else f"{'-':>6}"
            print(f"{label:>24} {kind:>7} {batch:>5} {cells} {busy}")


if __name__ == "__main__":
    main()
