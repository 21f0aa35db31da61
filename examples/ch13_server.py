"""Chapter 13: the OpenAI-compatible server.

Starts ``python -m minisgl --model PATH`` on a free port, as a user would, and talks to it with
the official ``openai`` client: a completion (plain, then streamed), a chat, a stop string, a
refused request, the metrics; then stops it with SIGTERM.
"""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import openai
import tiny_models
import torch
from transformers.utils import logging

import minisgl
from minisgl.core import SamplingParams
from minisgl.llm import LLM
from minisgl.tokenizer import tokenize_request

logging.set_verbosity_error()
FLAGS = ["--device", "cpu", "--page-size", "4", "--num-pages", "128"]
CHAT = [{"role": "user", "content": "What is the weather today?"}]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(model: Path, port: int, log) -> subprocess.Popen:
    """The server in its own process; back once /health answers (60 s at most)."""
    env = {**os.environ, "PYTHONPATH": str(Path(minisgl.__file__).parents[1])}
    proc = subprocess.Popen(
        [sys.executable, "-m", "minisgl", "--model", str(model), "--port", str(port), *FLAGS],
        stderr=log,
        env=env,
    )
    for _ in range(300):
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200:
                return proc
        except httpx.TransportError:
            time.sleep(0.2)
    raise TimeoutError("the server did not start")


def main() -> None:
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as tmp:
        model = tiny_models.make_tiny_model("qwen3", f"{tmp}/qwen3")
        port = free_port()
        with open(f"{tmp}/server.log", "wb") as log:
            proc = start_server(model, port, log)
        client = openai.OpenAI(
            base_url=f"http://127.0.0.1:{port}/v1", api_key="none", max_retries=0
        )
        print("models:", [m.id == str(model) for m in client.models.list()])
        greedy = dict(temperature=0, max_tokens=10, extra_body={"ignore_eos": True})

        out = client.completions.create(model="qwen3", prompt="Hello world", **greedy)
        u = out.usage
        print(
            f"\ncompletion: {out.choices[0].text!r}\n  finish_reason="
            f"{out.choices[0].finish_reason!r} usage: {u.prompt_tokens} prompt + "
            f"{u.completion_tokens} completion = {u.total_tokens} tokens"
        )
        # how the tokens group into events depends on timing; what they add up to does not
        pieces = [
            c.choices[0].text
            for c in client.completions.create(
                model="qwen3", prompt="Hello world", stream=True, **greedy
            )
            if c.choices
        ]
        print(f"streamed, joined == plain: {''.join(pieces) == out.choices[0].text}")

        chat = client.chat.completions.create(
            model="qwen3", messages=CHAT, max_tokens=12, temperature=0
        )
        print(
            f"\nchat: {chat.choices[0].message.content!r} "
            f"finish_reason={chat.choices[0].finish_reason!r}"
        )
        cut = client.completions.create(
            model="qwen3", prompt="Hello world", stop=["lazy"], **greedy
        )
        # the tokens up to the one that completed the stop string, whatever the timing
        print(
            f"stop='lazy': {cut.choices[0].text!r} "
            f"finish_reason={cut.choices[0].finish_reason!r} "
            f"completion_tokens={cut.usage.completion_tokens}"
        )

        llm = LLM(model, device="cpu", page_size=4, num_pages=128)
        ref = llm.generate(
            ["Hello world", tokenize_request(llm.tokenizer, messages=CHAT)],
            [SamplingParams(max_tokens=10, ignore_eos=True), SamplingParams(max_tokens=12)],
        )
        llm.shutdown()
        print(
            "same as LLM.generate:",
            out.choices[0].text == ref[0]["text"],
            chat.choices[0].message.content == ref[1]["text"],
        )

        try:
            client.completions.create(model="qwen3", prompt="Hello", n=2)
        except openai.BadRequestError as e:
            print(f"\nn=2: {e.status_code} {e.body['message']!r}")

        text = httpx.get(f"http://127.0.0.1:{port}/metrics").text
        m = {k: float(v) for k, v in re.findall(r"^minisgl:(\w+) (\S+)$", text, re.M)}
        # which pages the prefix cache keeps depends on when the stop string's abort landed
        print(
            f"\n/metrics, idle: {m['num_running_reqs']:.0f} running, "
            f"{m['kv_pages_total']:.0f} pages, free + cached == total: "
            f"{m['kv_pages_free'] + m['kv_pages_cached'] == m['kv_pages_total']}, "
            f"{m['prompt_tokens_total']:.0f} prompt tokens served"
        )

        proc.send_signal(signal.SIGTERM)
        code = proc.wait(timeout=30)
        said = Path(f"{tmp}/server.log").read_text().strip().splitlines()[-1]
        print(f"\nSIGTERM: exit code {code}, the server said {said!r}")


if __name__ == "__main__":
    main()
