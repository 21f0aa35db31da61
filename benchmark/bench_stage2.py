"""What each idea of stage 2 buys, measured on a CPU: one subcommand per chapter.

    PYTHONPATH=python python benchmark/bench_stage2.py kvcache   # ch05: cache vs recompute
    PYTHONPATH=python python benchmark/bench_stage2.py batch     # ch06: batch size vs tokens/s
    PYTHONPATH=python python benchmark/bench_stage2.py continuous  # ch07: per step vs per batch
    PYTHONPATH=python python benchmark/bench_stage2.py radix     # ch08: prefill saved by hits
    PYTHONPATH=python python benchmark/bench_stage2.py chunked   # ch09: chunk budget vs step time
    PYTHONPATH=python python benchmark/bench_stage2.py llm       # ch10: one call against N calls

Every run uses one thread and takes the best (shortest) of ``--repeat`` runs, timed in CPU
seconds of this process (``--clock wall`` for wall time), since the machine may be shared.
Counts that do not depend on timing (tokens run through the model, steps) are printed beside
the times: they are the same on every machine. ``--model tiny`` is the tiny random-weight
Llama 3 of ``examples/tiny_models.py`` (hidden 64, 2 layers); ``--model small`` is a larger
random-weight Llama made here (hidden 512, 4 layers, 4096 positions), for effects that the tiny
model computes too little to show. Nothing is downloaded.

The script puts the ``python/`` folder beside its own ``benchmark/`` folder first on the path,
and each subcommand imports only what its chapter has written, so a copy of it in a chapter's
tree (``python tools/steps.py checkout N DIR``) measures that chapter's code.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Dict, List, Tuple

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "examples"))
sys.path.insert(0, str(ROOT / "python"))

import tiny_models  # noqa: E402

from minisgl.attention import create_attention_backend  # noqa: E402
from minisgl.core import Batch, Context, Req, SamplingParams, use_global_ctx  # noqa: E402
from minisgl.kvcache import create_kvcache_pool  # noqa: E402
from minisgl.models import generate_greedy_recompute, load_model  # noqa: E402

if TYPE_CHECKING:
    from minisgl.engine.engine import Engine

# CPU seconds of this process by default: other work on a shared machine stretches wall time,
# and with one thread and no waiting the two agree on an idle machine. --clock wall for wall time.
CLOCKS = {"cpu": time.process_time, "wall": time.perf_counter}
clock = CLOCKS["cpu"]
SMALL = dict(
    hidden_size=512,
    intermediate_size=1536,
    num_hidden_layers=4,
    num_attention_heads=8,
    num_key_value_heads=4,
    head_dim=64,
    max_position_embeddings=4096,
)


def make_model(kind: str, directory: str) -> str:
    """The tiny Llama 3, or the same tokenizer and family with the larger ``SMALL`` shape."""
    path = tiny_models.make_tiny_model("llama3", directory)
    if kind == "small":
        from transformers import AutoConfig, AutoModelForCausalLM

        config = AutoConfig.from_pretrained(path)
        for key, value in SMALL.items():
            setattr(config, key, value)
        torch.manual_seed(0)
        AutoModelForCausalLM.from_config(config, dtype=torch.float32).save_pretrained(path)
    return str(path)


def best_of(repeat: int, run: Callable[[], Any]) -> tuple[float, Any]:
    """The shortest time of ``repeat`` calls, and the last call's result."""
    best, result = float("inf"), None
    for _ in range(repeat):
        start = clock()
        result = run()
        best = min(best, clock() - start)
    return best, result


def count_tokens(model: Any) -> Dict[str, int]:
    """Wrap ``model.forward`` to count the tokens it runs: ``counter["tokens"]``."""
    counter, forward = {"tokens": 0}, model.forward

    def counted(input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        counter["tokens"] += input_ids.numel()
        return forward(input_ids, positions)

    model.forward = counted
    return counter


# ---- ch05: the KV cache against recomputation ----------------------------------------------


@torch.inference_mode()
def generate_greedy_cached(model: Any, prompt: List[int], n: int) -> List[int]:
    """Chapter 5's loop: the prompt runs once, then each step runs only the newest token."""
    length = len(prompt) + n
    ctx = Context(page_size=1)
    ctx.kv_cache = create_kvcache_pool(model.config, length, 1, torch.float32, "cpu")
    ctx.page_table = torch.arange(length, dtype=torch.int32)[None, :]
    ctx.attn_backend = create_attention_backend("torch", model.config, "cpu")
    req = Req(0, list(prompt), SamplingParams(max_tokens=n), table_idx=0)
    with use_global_ctx(ctx):
        while len(req.output_ids) < n:
            positions = torch.arange(req.cached_len, req.device_len)
            ids = torch.tensor(req.all_ids[req.cached_len : req.device_len])
            phase = "prefill" if req.cached_len == 0 else "decode"
            batch = Batch([req], phase, input_ids=ids, positions=positions, out_loc=positions)
            with ctx.forward_batch(batch):
                ctx.attn_backend.prepare_metadata(batch)
                logits = model.forward(ids, positions)
            req.complete_forward()
            req.append(int(logits[-1].argmax()))
    return req.output_ids


def bench_kvcache(path: str, args: argparse.Namespace) -> None:
    model = load_model(path)
    counter = count_tokens(model)
    prompt = list(range(10, 10 + args.prompt))
    print(f"greedy, prompt {args.prompt} tokens; best of {args.repeat}")
    print(
        f"{'new tokens':>10} {'method':>9} {'tokens run':>10} {'total s':>8} "
        f"{'ms/token':>8} {'speed-up':>8}"
    )
    for n in args.new_tokens:
        times = {}
        for name, generate in (
            ("recompute", generate_greedy_recompute),
            ("cache", generate_greedy_cached),
        ):
            counter["tokens"] = 0
            times[name], _ = best_of(args.repeat, lambda g=generate, n=n: g(model, prompt, n))
            run = counter["tokens"] // args.repeat
            speedup = times["recompute"] / times[name]
            print(
                f"{n:10d} {name:>9} {run:10d} {times[name]:8.3f} "
                f"{1e3 * times[name] / n:8.2f} {speedup:7.1f}x"
            )


# ---- ch06: batch size against decode throughput --------------------------------------------


def give_pages(engine: Engine, free: List[int], req: Req) -> None:
    """Pages for the request's positions [cached_len, device_len), written into its row."""
    size = engine.config.page_size
    for pos in range(req.cached_len, req.device_len):
        if pos % size == 0:
            page = free.pop()
            engine.page_table[req.table_idx, pos : pos + size] = torch.arange(
                page * size, (page + 1) * size
            )


def decode_seconds(engine: Engine, batch_size: int, prompt: int, steps: int) -> float:
    """Prefill ``batch_size`` prompts together, then time ``steps`` decode steps of them all."""
    free = list(range(engine.num_pages))
    reqs = [
        Req(i, [10 + i] * prompt, SamplingParams(max_tokens=steps + 1), table_idx=i)
        for i in range(batch_size)
    ]
    start = 0.0
    for step in range(steps + 1):
        if step == 1:
            start = clock()  # after the prefill
        for req in reqs:
            give_pages(engine, free, req)
        tokens = engine.forward_batch(Batch(reqs, "prefill" if step == 0 else "decode"))
        for req, token in zip(reqs, tokens.tolist()):
            req.append(token)
    return clock() - start


def bench_batch(path: str, args: argparse.Namespace) -> None:
    from minisgl.engine.config import EngineConfig  # chapter 6's: not in chapter 5's tree
    from minisgl.engine.engine import Engine

    top = max(args.batch_sizes)
    pages_a_request = -(-(args.prompt + args.steps + 1) // 16)  # pages of 16, rounded up
    engine = Engine(
        EngineConfig(
            path, device="cpu", page_size=16, num_pages=top * pages_a_request, max_running_req=top
        )
    )
    print(
        f"decode, prompt {args.prompt} tokens, {args.steps} decode steps timed; "
        f"best of {args.repeat}"
    )
    print(f"{'batch':>5} {'ms/step':>8} {'tokens/s':>9} {'vs batch 1':>10}")
    base = None
    for b in args.batch_sizes:
        best = min(decode_seconds(engine, b, args.prompt, args.steps) for _ in range(args.repeat))
        rate = b * args.steps / best
        base = base or rate
        print(f"{b:5d} {1e3 * best / args.steps:8.2f} {rate:9.0f} {rate / base:9.1f}x")


# ---- ch07: continuous batching against running each batch to completion ------------------


def serve(path: str, reqs: List[Tuple[List[int], SamplingParams]], rows: int, continuous: bool):
    """Serve ``reqs`` (all arrived at once) with ``rows`` rows of the page table. Continuous: all
    are queued and the scheduler admits one as soon as a row frees. To completion: ``rows`` are
    queued only when none is running, so a batch runs until its longest request ends. Returns
    the steps, the decode steps, the requests they ran, the seconds, and each request's wait
    for its first token."""
    from minisgl.scheduler import Scheduler, SchedulerConfig  # chapter 7's

    longest = max(len(ids) + p.max_tokens for ids, p in reqs)
    s = Scheduler(
        SchedulerConfig(
            path,
            device="cpu",
            page_size=16,
            num_pages=rows * -(-longest // 16),  # pages never limit admission: rows do
            max_running_req=rows,
        )
    )
    s.add_req([1, 2, 3], SamplingParams(max_tokens=2))  # warm up: the first forward is slow
    s.run_until_idle()
    queue, added, first = list(reqs), [], {}
    steps = decode_steps = decode_rows = 0
    start = clock()
    while queue or not s.idle:
        if queue and (continuous or s.idle):
            take = len(queue) if continuous else rows
            added += [s.add_req(ids, params) for ids, params in queue[:take]]
            del queue[:take]
        out = s.step()
        assert out is not None
        steps += 1
        if out.phase == "decode":
            decode_steps, decode_rows = decode_steps + 1, decode_rows + len(out.uids)
        now = clock()
        for req in added:
            if req.output_ids and req.uid not in first:
                first[req.uid] = now - start
    total = clock() - start
    s.shutdown()
    return steps, decode_steps, decode_rows, total, list(first.values())


def bench_continuous(path: str, args: argparse.Namespace) -> None:
    lengths = [args.output[i % len(args.output)] for i in range(args.requests)]
    reqs = [
        ([20 + i % 300] * args.prompt, SamplingParams(max_tokens=n, ignore_eos=True))
        for i, n in enumerate(lengths)
    ]
    print(
        f"{args.requests} requests of {args.prompt} prompt tokens, all at once, new tokens "
        f"{'/'.join(map(str, args.output))} in turn ({sum(lengths)} in all); "
        f"{args.rows} rows, pages of 16; best of {args.repeat}"
    )
    print(
        f"{'policy':>13} {'steps':>5} {'decode':>6} {'mean batch':>10} {'total s':>7} "
        f"{'tokens/s':>8} {'first token s: mean':>19} {'max':>5}"
    )
    for continuous in (False, True):
        runs = [serve(path, reqs, args.rows, continuous) for _ in range(args.repeat)]
        steps, decode_steps, decode_rows, _, _ = runs[0]
        total = min(r[3] for r in runs)
        firsts = min(runs, key=lambda r: r[3])[4]
        name = "continuous" if continuous else "to completion"
        print(
            f"{name:>13} {steps:5d} {decode_steps:6d} {decode_rows / decode_steps:10.1f} "
            f"{total:7.2f} {sum(lengths) / total:8.0f} {sum(firsts) / len(firsts):19.2f} "
            f"{max(firsts):5.2f}"
        )


# ---- ch08 and ch09: workloads through the scheduler ----------------------------------------


Arrivals = Dict[int, List[Tuple[List[int], SamplingParams]]]


def run_scheduler(path: str, arrivals: Arrivals, **config: Any) -> Dict[str, Any]:
    """Run requests through a fresh scheduler, ``arrivals[k]`` added before step k. Returns the
    prompt tokens run, each step's phase, tokens and seconds, and per request (in order of
    arrival) the times its tokens came out."""
    from minisgl.scheduler import Scheduler, SchedulerConfig  # chapter 7's

    s = Scheduler(SchedulerConfig(path, device="cpu", **config))
    s.add_req([1, 2, 3], SamplingParams(max_tokens=2))  # warm up: the first forward is slow
    s.run_until_idle()
    reqs: List[Req] = []
    token_times: List[List[float]] = []
    stats: Dict[str, Any] = {"prefill_tokens": 0, "steps": [], "token_times": token_times}
    step, start = 0, clock()
    while step <= max(arrivals) or not s.idle:
        reqs += [s.add_req(ids, params) for ids, params in arrivals.get(step, [])]
        t0 = clock()
        out = s.step()
        now = clock()
        step += 1
        if out is None:
            continue
        stats["steps"].append((out.phase, sum(out.extend_lens), now - t0))
        if out.phase == "prefill":
            stats["prefill_tokens"] += sum(out.extend_lens)
        token_times += [[] for _ in reqs[len(token_times) :]]
        for req, times in zip(reqs, token_times):
            times += [now] * (len(req.output_ids) - len(times))  # a chunk brings no token
    stats["total"] = clock() - start
    s.shutdown()
    return stats


def bench_radix(path: str, args: argparse.Namespace) -> None:
    system = [11 + i % 400 for i in range(args.system)]
    params = SamplingParams(max_tokens=args.output, ignore_eos=True)
    reqs = [(system + [20 + i] * args.question, params) for i in range(args.requests)]
    prompt_tokens = sum(len(ids) for ids, _ in reqs)
    print(
        f"{args.requests} requests: a shared system prompt of {args.system} tokens + "
        f"{args.question} of their own, {args.output} new tokens each;\n{prompt_tokens} "
        f"prompt tokens in all; pages of 16, budget 1024 tokens a prefill; "
        f"best of {args.repeat}"
    )
    print(f"{'arrival':>12} {'cache':>6} {'prompt tokens run':>17} {'total s':>8} {'speed-up':>8}")
    for arrival in ("one a step", "all at once"):
        arrivals = {i: [r] for i, r in enumerate(reqs)} if arrival == "one a step" else {0: reqs}
        naive = None
        for cache in ("naive", "radix"):
            best, stats = best_of(
                args.repeat,
                lambda c=cache: run_scheduler(
                    path,
                    arrivals,
                    page_size=16,
                    num_pages=2048,
                    max_running_req=64,
                    max_extend_tokens=1024,
                    cache_type=c,
                ),
            )
            naive = naive or best
            print(
                f"{arrival:>12} {cache:>6} {stats['prefill_tokens']:17d} {best:8.2f} "
                f"{naive / best:7.2f}x"
            )


def bench_chunked(path: str, args: argparse.Namespace) -> None:
    params = SamplingParams(max_tokens=args.output, ignore_eos=True)
    short = [([20 + i] * 16, params) for i in range(args.short)]
    long = ([30 + i % 300 for i in range(args.long)], params)
    arrivals = {0: short, 6: [long]}  # the long prompt comes while the short ones decode
    print(
        f"{args.short} requests of 16 tokens decoding, then one prompt of {args.long}; "
        f"{args.output} new tokens each;\npages of 16; best of {args.repeat} for each time"
    )
    print(
        f"{'budget':>6} {'steps':>5} {'prefill':>7} {'largest forward':>15} "
        f"{'longest step ms':>15} {'longest gap ms':>14} {'total s':>7}"
    )
    for budget in args.budgets:
        runs = [
            run_scheduler(
                path,
                arrivals,
                page_size=16,
                num_pages=1024,
                max_running_req=64,
                max_extend_tokens=budget,
            )
            for _ in range(args.repeat)
        ]
        steps = runs[0]["steps"]
        prefills = sum(phase == "prefill" for phase, _, _ in steps)
        largest = max(tokens for _, tokens, _ in steps)
        longest = min(max(t for *_, t in r["steps"]) for r in runs)
        gap = min(longest_gap(r["token_times"][: args.short]) for r in runs)
        total = min(r["total"] for r in runs)
        print(
            f"{budget:6d} {len(steps):5d} {prefills:7d} {largest:15d} {1e3 * longest:15.1f} "
            f"{1e3 * gap:14.1f} {total:7.2f}"
        )


def longest_gap(token_times: List[List[float]]) -> float:
    """The longest wait between two tokens of one request."""
    return max(b - a for times in token_times for a, b in zip(times, times[1:]))


# ---- ch10: one generate call for all prompts against one call per prompt -------------------


def bench_llm(path: str, args: argparse.Namespace) -> None:
    from minisgl.llm import LLM  # chapter 10's

    words = tiny_models.TEXT.split()
    # each prompt shorter than a page of 16 tokens: the prefix cache, which keeps whole pages,
    # has nothing to share, so only the batching differs
    starts = [7 * i % (len(words) - 8) for i in range(args.prompts)]
    prompts = [" ".join(words[s : s + 4 + i % 5]) for i, s in enumerate(starts)]
    params = SamplingParams(max_tokens=args.output, ignore_eos=True)
    llm = LLM(path, device="cpu", page_size=16, max_running_req=max(64, args.prompts))
    llm.generate(["Hello"], params)  # warm up: the first forward is slow
    forwards = count_forwards(llm)
    runs: Dict[str, List[float]] = {"one call": [], "a call each": []}
    results: Dict[str, List[List[int]]] = {}
    counts: Dict[str, int] = {}
    for _ in range(args.repeat):  # interleaved, so that a busy moment of the machine hits both
        for how in runs:
            forwards["n"] = 0
            start = clock()
            if how == "one call":
                outs = llm.generate(prompts, params)
            else:
                outs = [llm.generate([p], params)[0] for p in prompts]
            runs[how].append(clock() - start)
            results[how], counts[how] = [o["token_ids"] for o in outs], forwards["n"]
    llm.shutdown()
    tokens = args.prompts * args.output
    print(
        f"{args.prompts} prompts of {min(map(len, results['one call']))} new tokens each "
        f"({tokens} in all), greedy; best of {args.repeat}, interleaved"
    )
    print(f"{'how':>12} {'forwards':>8} {'total s':>8} {'tokens/s':>8} {'speed-up':>8}")
    one_by_one = min(runs["a call each"])
    for how, times in runs.items():
        best = min(times)
        print(
            f"{how:>12} {counts[how]:8d} {best:8.2f} {tokens / best:8.0f} {one_by_one / best:7.2f}x"
        )
    same = results["one call"] == results["a call each"]
    print(f"the same tokens either way: {same}")


def count_forwards(llm: Any) -> Dict[str, int]:
    """Wrap the engine's ``forward_batch`` to count the forwards it runs: ``counter["n"]``."""
    engine, counter = llm.scheduler.engine, {"n": 0}
    forward_batch = engine.forward_batch

    def counted(batch: Batch) -> torch.Tensor:
        counter["n"] += 1
        return forward_batch(batch)

    engine.forward_batch = counted
    return counter


def main() -> None:
    common = argparse.ArgumentParser(add_help=False)  # options every subcommand takes
    common.add_argument("--threads", type=int, default=1)
    common.add_argument("--clock", choices=tuple(CLOCKS), default="cpu")
    common.add_argument("--repeat", type=int, default=3, help="runs per setting; the best")
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("kvcache", parents=[common], help="ch05: KV cache against recompute")
    p.add_argument("--model", choices=("tiny", "small"), default="tiny")
    p.add_argument("--prompt", type=int, default=16)
    p.add_argument("--new-tokens", type=int, nargs="+", default=[64, 256])
    p = sub.add_parser("batch", parents=[common], help="ch06: decode tokens/s by batch size")
    p.add_argument("--model", choices=("tiny", "small"), default="tiny")
    p.add_argument("--prompt", type=int, default=32)
    p.add_argument("--steps", type=int, default=32)
    p.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 2, 4, 8, 16, 32, 64])
    p = sub.add_parser("continuous", parents=[common], help="ch07: continuous vs to completion")
    p.add_argument("--model", choices=("tiny", "small"), default="tiny")
    p.add_argument("--requests", type=int, default=32)
    p.add_argument("--prompt", type=int, default=16)
    p.add_argument("--output", type=int, nargs="+", default=[8, 128, 16, 64, 32, 96, 24, 48])
    p.add_argument("--rows", type=int, default=8)
    p = sub.add_parser("radix", parents=[common], help="ch08: prompt tokens saved by hits")
    p.add_argument("--model", choices=("tiny", "small"), default="tiny")
    p.add_argument("--requests", type=int, default=32)
    p.add_argument("--system", type=int, default=256)
    p.add_argument("--question", type=int, default=16)
    p.add_argument("--output", type=int, default=8)
    p = sub.add_parser("chunked", parents=[common], help="ch09: chunk budget vs step time")
    p.add_argument("--model", choices=("tiny", "small"), default="small")
    p.add_argument("--short", type=int, default=8)
    p.add_argument("--long", type=int, default=2048)
    p.add_argument("--output", type=int, default=16)
    p.add_argument("--budgets", type=int, nargs="+", default=[2048, 512, 128, 32])
    p = sub.add_parser("llm", parents=[common], help="ch10: one call against a call a prompt")
    p.add_argument("--model", choices=("tiny", "small"), default="tiny")
    p.add_argument("--prompts", type=int, default=32)
    p.add_argument("--output", type=int, default=32)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    global clock
    clock = CLOCKS[args.clock]
    bench = dict(
        kvcache=bench_kvcache,
        batch=bench_batch,
        continuous=bench_continuous,
        radix=bench_radix,
        chunked=bench_chunked,
        llm=bench_llm,
    )[args.command]
    with tempfile.TemporaryDirectory() as tmp:
        path = make_model(args.model, f"{tmp}/{args.model}")
        print(
            f"{args.model} llama3 (random weights), CPU, {args.threads} thread(s), "
            f"{args.clock} time"
        )
        bench(path, args)


if __name__ == "__main__":
    main()
