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
import subprocess
import sys
import tempfile
from pathlib import Path
from urllib.parse import urlsplit

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "examples"), str(ROOT / "benchmark")]

from online import launched  # noqa: E402  (the server on a free port, until /health answers)

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
    with (
        tempfile.TemporaryDirectory() as tmp,
        launched(model, f"--served-model-name {NAME}") as url,
    ):
        port = urlsplit(url).port
        for backend in BACKENDS:
            report(backend, bench(args, model, port, backend, Path(tmp) / backend), args)


if __name__ == "__main__":
    main()
