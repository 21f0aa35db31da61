"""The shell's decode speed on a CPU, against the offline ``LLM`` and ``transformers``, on an idle
machine or beside busy processes.

    PYTHONPATH=python python benchmark/bench_shell_cpu.py MODEL [--busy 0 2] [--threads 0 1]

For each number of busy neighbours (``--neighbour loops``: ``python -c 'while True: pass'``, one
core each; ``torch``: a process multiplying matrices on two torch threads; stopped after) and
each thread setting (0: the shell's default, no ``--threads``), it runs
``python -m minisgl --model MODEL --shell --threads N`` with two greedy lines through a pipe and
reads the shell's own timing line after each reply (the second is reported: the first reply
also warms the caches); then the same chat prompt through ``LLM.generate`` and through
``transformers``' ``generate`` in this process, with ``torch.set_num_threads`` as the shell's
scheduler got it. Each reply is ``--tokens`` tokens long (EOS ignored offline; the shell's
replies stop at EOS, so the line asks for a long story). Decode speed is the tokens after the
first over the time after the first, as the shell's line counts it.

MODEL is a model directory: ``python examples/real_model.py DIR`` makes SmolLM2-135M-Instruct.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Iterator

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "python"))

from minisgl.core import SamplingParams  # noqa: E402
from minisgl.llm import LLM  # noqa: E402
from minisgl.server.args import parse_args  # noqa: E402
from minisgl.server.launch import engine_threads  # noqa: E402
from minisgl.tokenizer import tokenize_request  # noqa: E402

LINE = "Tell me a long story about a dragon who learns to bake bread."
TIMING = re.compile(r"\((\d+) tokens, ([\d.]+) tokens/s; the first after (\d+) ms\)")


NEIGHBOURS = {  # kind: (the cores one keeps busy, its program)
    "loops": (1, "while True: pass"),
    "torch": (2, "import torch; torch.set_num_threads(2); a = torch.ones(512, 512)\nwhile 1: a@a"),
}


@contextmanager
def busy_neighbours(n: int, kind: str) -> Iterator[None]:
    """``n`` busy processes of ``kind`` while the body runs, started early enough that the
    1-minute load average (what the shell's default threads read) has seen them: it rises
    towards the cores they keep busy with a time constant of a minute, so this waits until it
    is within half a core of that, three minutes at most."""
    cores, program = NEIGHBOURS[kind]
    procs = [subprocess.Popen([sys.executable, "-c", program]) for _ in range(n)]
    try:
        deadline = time.monotonic() + 180
        while n and os.getloadavg()[0] < n * cores - 0.5 and time.monotonic() < deadline:
            time.sleep(5)
        yield
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()


def shell_speed(model: str, threads: int, tokens: int) -> str:
    """The shell's timing line for the second of two replies to ``LINE``."""
    flags = ["--threads", str(threads)] if threads else []
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT / "python"),
        "MINISGL_SHELL_TEMPERATURE": "0",
        "MINISGL_SHELL_MAX_TOKENS": str(tokens),
    }
    env.pop("OMP_NUM_THREADS", None)  # the shell's own choice, or --threads
    out = subprocess.run(
        [sys.executable, "-m", "minisgl", "--model", model, "--shell", *flags],
        input=f"{LINE}\n/reset\n{LINE}\n/exit\n",
        capture_output=True,
        text=True,
        env=env,
        timeout=900,
    ).stdout
    lines = TIMING.findall(out)
    if len(lines) != 2:
        raise RuntimeError(f"no timing lines in the shell's output:\n{out}")
    n, rate, first = lines[1]
    return f"{n} tokens, {float(rate):.1f} tokens/s, first token {int(first) / 1000:.2f} s"


def decode_rate(run: Callable[[int], None], tokens: int) -> str:
    """Tokens/s after the first: a run of ``tokens`` less a run of 1, best of two."""
    run(1)  # warm-up
    times = []
    for n in (1, tokens, 1, tokens):
        start = time.perf_counter()
        run(n)
        times.append(time.perf_counter() - start)
    first = min(times[0], times[2])
    rate = (tokens - 1) / (min(times[1], times[3]) - first)
    return f"{tokens} tokens, {rate:.1f} tokens/s, first token {first:.2f} s"


def offline_speed(model: str, tokens: int) -> str:
    llm = LLM(model, device="cpu")
    ids = tokenize_request(llm.tokenizer, messages=[{"role": "user", "content": LINE}])
    try:
        return decode_rate(
            lambda n: llm.generate([ids], SamplingParams(max_tokens=n, ignore_eos=True)), tokens
        )
    finally:
        llm.shutdown()


def transformers_speed(model: str, tokens: int) -> str:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model)
    hf = AutoModelForCausalLM.from_pretrained(model, dtype=torch.float32)
    ids = tokenize_request(tok, messages=[{"role": "user", "content": LINE}])
    x = torch.tensor([ids])

    def run(n: int) -> None:
        with torch.inference_mode():
            hf.generate(x, max_new_tokens=n, min_new_tokens=n, do_sample=False)

    return decode_rate(run, tokens)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("model")
    p.add_argument("--busy", type=int, nargs="+", default=[0, 2], help="busy processes beside")
    p.add_argument("--neighbour", choices=sorted(NEIGHBOURS), default="loops")
    p.add_argument("--threads", type=int, nargs="+", default=[0, 1], help="0: the default")
    p.add_argument("--tokens", type=int, default=64)
    p.add_argument("--no-offline", action="store_true", help="the shell alone")
    args = p.parse_args()
    print(f"{os.cpu_count()} CPUs; load average before: {os.getloadavg()[0]:.2f}")
    for busy in args.busy:
        with busy_neighbours(busy, args.neighbour):
            for threads in args.threads:
                # the shell's default, as it reads the load average when it starts
                chosen = threads or engine_threads(parse_args(["--model", args.model]))
                load = os.getloadavg()[0]  # what the default read
                setting = f"threads {threads or 'default'} ({chosen})"
                label = f"{args.neighbour} {busy} (load {load:.1f}), {setting}"
                print(f"{label:<44} shell:        {shell_speed(args.model, threads, args.tokens)}")
                if not args.no_offline:
                    offline_rows(args.model, args.tokens, chosen, label)


def offline_rows(model: str, tokens: int, threads: int, label: str) -> None:
    """The offline ``LLM`` and ``transformers`` on ``threads`` torch threads in this process."""
    default = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        for name, speed in (("LLM", offline_speed), ("transformers", transformers_speed)):
            print(f"{label:<44} {name + ':':<13} {speed(model, tokens)}", flush=True)
    finally:
        torch.set_num_threads(default)


if __name__ == "__main__":
    main()
