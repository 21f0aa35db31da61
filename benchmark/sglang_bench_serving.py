"""SGLang's own serving benchmark (``python -m sglang.bench_serving``) against minisgl's server.

    python benchmark/sglang_bench_serving.py --sglang-python PATH [--model PATH]
        [--prompts 8] [--input-len 64] [--output-len 16]

Starts ``python -m minisgl`` (this tree's package, this interpreter) on the real small model by
default, then runs SGLang's ``bench_serving`` with each of the backends that speak to an
SGLang server: ``sglang`` (the native ``POST /generate``, streamed), ``sglang-oai``
(``/v1/completions``) and ``sglang-oai-chat`` (``/v1/chat/completions``), on its
``random-ids`` dataset: prompts of exactly ``--input-len`` random token ids, each asking for
exactly ``--output-len`` tokens with ``ignore_eos``. For each backend it prints the requests that
succeeded and the input and output tokens bench_serving counted against what it asked for:
whether the server speaks SGLang's dialects, not how fast (bench_serving run by hand prints its
latencies too).

bench_serving runs in another interpreter, ``--sglang-python``: SGLang's package imports its
whole runtime (torchvision among it, whose PyPI wheel needs the CUDA build of torch), which does
not install beside the CPU build of torch that this repository uses. One way to make it:

    python3 -m venv ~/venv-sglang && ~/venv-sglang/bin/pip install torch torchvision \\
        sglang==0.5.23
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "examples")]

BACKENDS = ["sglang", "sglang-oai", "sglang-oai-chat"]
NAME = "smollm2"


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sglang-python", required=True, help="an interpreter with sglang installed")
    p.add_argument("--model", help="a checkpoint (default: the real small model)")
    p.add_argument("--prompts", type=int, default=8)
    p.add_argument("--input-len", type=int, default=64)
    p.add_argument("--output-len", type=int, default=16)
    return p.parse_args()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(model: str, port: int, log) -> subprocess.Popen:
    """minisgl's server, with the served name the benchmark asks for; back once it answers."""
    import httpx

    env = {**os.environ, "PYTHONPATH": str(ROOT / "python")}
    command = [sys.executable, "-m", "minisgl", "--model", model, "--port", str(port)]
    proc = subprocess.Popen([*command, "--served-model-name", NAME], stderr=log, env=env)
    for _ in range(600):
        if proc.poll() is not None:
            raise RuntimeError(f"the server exited with code {proc.returncode}")
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200:
                return proc
        except httpx.TransportError:
            time.sleep(0.2)
    raise TimeoutError("the server did not start in 120 s")


def bench(args: argparse.Namespace, model: str, port: int, backend: str, out: Path) -> dict:
    """One bench_serving run; its result record (the last line of its output file)."""
    command = [
        args.sglang_python, "-m", "sglang.bench_serving", "--backend", backend,
        "--host", "127.0.0.1", "--port", str(port), "--model", NAME, "--tokenizer", model,
        "--dataset-name", "random-ids", "--num-prompts", str(args.prompts),
        "--random-input-len", str(args.input_len), "--random-output-len", str(args.output_len),
        "--random-range-ratio", "1", "--output-file", str(out),
    ]  # fmt: skip
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    run = subprocess.run(command, env=env, capture_output=True, text=True, timeout=600)
    if run.returncode != 0:
        raise RuntimeError(f"bench_serving --backend {backend} failed:\n{run.stderr[-3000:]}")
    return json.loads(out.read_text().splitlines()[-1])


def report(backend: str, r: dict, args: argparse.Namespace) -> None:
    asked_in, asked_out = args.prompts * args.input_len, args.prompts * args.output_len
    print(
        f"{backend:16s} {r['completed']}/{args.prompts} succeeded, input tokens "
        f"{r['total_input_tokens']} (asked {asked_in}), output tokens {r['total_output_tokens']} "
        f"(asked {asked_out}; retokenized {r['total_output_tokens_retokenized']})"
    )


def main() -> None:
    args = parse_args()
    if args.model:
        model = args.model
    else:
        from real_model import cached_real_model

        model = str(cached_real_model())
    version = subprocess.run(
        [args.sglang_python, "-c", "import importlib.metadata as m; print(m.version('sglang'))"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    print(f"sglang {version} bench_serving against minisgl on {Path(model).name}, CPU")
    print(
        f"random-ids: {args.prompts} prompts of {args.input_len} token ids, "
        f"{args.output_len} tokens each, all sent at once"
    )
    port = free_port()
    with tempfile.TemporaryDirectory() as tmp, open(f"{tmp}/server.log", "wb") as log:
        proc = start_server(model, port, log)
        try:
            for backend in BACKENDS:
                report(backend, bench(args, model, port, backend, Path(tmp) / backend), args)
        finally:
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=60)


if __name__ == "__main__":
    main()
