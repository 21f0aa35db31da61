"""Chapter 25: the API that real tools speak.

Starts ``python -m minisgl --model PATH --served-model-name tiny`` on a free port and sends, with
the official ``openai`` client and ``httpx``, requests in the shapes that real tools send: a
loglikelihood request (token ids, echo and logprobs, as lm-evaluation-harness sends it), a chat
with the top alternatives of each token, ``n`` choices for each prompt of a batch, penalties and
a logit bias, a forced tool call, a prompt of token ids, content as text parts, and SGLang's
native ``/generate``. Log-probabilities are checked against transformers on the same weights.
First, inside the engine (``LLM`` on the same model): which logits rows a prefill computes and
which prefix it matched, for a prompt asked plainly, with echo, and plainly again.
"""

from __future__ import annotations

import json
import math
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import jsonschema
import openai
import tiny_models
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer
from transformers.utils import logging

import minisgl

logging.set_verbosity_error()
NAME = "tiny"
CONTEXT = 2048  # the tiny model's 512, raised: see main
FLAGS = ["--device", "cpu", "--page-size", "4", "--num-pages", "512", "--served-model-name", NAME]
CHAT = [{"role": "user", "content": "What is the weather today?"}]
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "pattern": "^[A-Za-z]{1,8}$"},
                "days": {"type": "integer", "minimum": 1, "maximum": 7},
            },
            "required": ["city", "days"],
            "additionalProperties": False,
        },
    },
}


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


def hf_logprobs(hf, ids: list) -> torch.Tensor:
    """transformers' float32 log-softmax: row i scores the token after ids[: i + 1]."""
    with torch.inference_mode():
        return torch.log_softmax(hf(torch.tensor([ids])).logits[0].float(), dim=-1)


def show_inside_the_engine(model: Path, tok) -> None:
    """One prompt three times through ``LLM``: the prefix each request matched in the radix cache
    and the logits rows its prefill computed, seen by wrapping the two methods that decide them."""
    from minisgl.core import SamplingParams
    from minisgl.llm import LLM

    llm = LLM(str(model), device="cpu", page_size=4, num_pages=64)
    engine, cache, seen = llm.scheduler.engine, llm.scheduler.cache_manager, {}
    match_req, forward_batch = cache.match_req, engine.forward_batch

    def matching(req):
        handle = match_req(req)
        seen["matched"] = handle.cached_len
        return handle

    def forward(batch, *rest):
        tokens = forward_batch(batch, *rest)  # prepares the batch: its rows are known after
        seen["rows"] = len(batch.reqs) if batch.logits_rows is None else len(batch.logits_rows)
        return tokens

    cache.match_req, engine.forward_batch = matching, forward
    ids = tok("Once upon a time, in a land far away, there lived a cat")["input_ids"]
    print(f"inside the engine: a {len(ids)}-token prompt, pages of 4, the radix cache")
    for name, extra in [("plain", {}), ("echo", {"prompt_logprobs": 1}), ("plain again", {})]:
        out = llm.generate([ids], [SamplingParams(max_tokens=1, **extra)])[0]
        entries = len(out["prompt_logprobs"]) - 1 if "prompt_logprobs" in out else 0
        print(
            f"  {name:12s} matched {seen['matched']:2d} tokens, computed {seen['rows']:2d} "
            f"logits row{'s' * (seen['rows'] != 1)}, {entries:2d} prompt entries"
        )
    llm.shutdown()


def show_card(client: openai.OpenAI) -> None:
    card = client.models.retrieve(NAME)
    print(f"\nmodel: id={card.id!r} max_model_len={card.model_extra['max_model_len']}")
    try:
        client.models.retrieve("gpt-4o")
    except openai.NotFoundError as e:
        print(f"another name: {e.status_code} {e.body['code']}")


def show_loglikelihood(client: openai.OpenAI, hf, tok) -> None:
    """lm-evaluation-harness's request for a context and a continuation, as its
    ``local-completions`` model sends it: the ids of both as one prompt, ``max_tokens`` 1,
    ``logprobs`` 1, ``echo``; it reads the entries from the continuation's first token up to the
    last, which is the token drawn. Their sum, and whether each was the likeliest."""
    print("\nloglikelihood, as lm-evaluation-harness asks it (token ids, max_tokens 1, echo):")
    for context, continuation in [("Once upon a", " time"), ("Hello", " world of dogs")]:
        ctx = tok(context)["input_ids"]
        ids = tok(context + continuation)["input_ids"]
        reply = client.completions.create(
            model=NAME, prompt=[ids], max_tokens=1, logprobs=1, echo=True, temperature=0
        )
        lp = reply.choices[0].logprobs
        tokens, values = lp.tokens[len(ctx) : -1], lp.token_logprobs[len(ctx) : -1]
        greedy = all(
            max(top, key=top.get) == token
            for token, top in zip(tokens, lp.top_logprobs[len(ctx) : -1])
        )
        ref = hf_logprobs(hf, ids)
        ref_total = sum(ref[i - 1, ids[i]].item() for i in range(len(ctx), len(ids)))
        same = math.isclose(sum(values), ref_total, abs_tol=1e-4)
        n = len(tokens)
        print(
            f"  {context!r} + {continuation!r}: {n} token{'s' * (n != 1)} {tokens}, "
            f"as transformers: {same}, greedy: {greedy}"
        )


def show_chat_alternatives(client: openai.OpenAI) -> None:
    reply = client.chat.completions.create(
        model=NAME, messages=CHAT, max_tokens=5, temperature=0, logprobs=True, top_logprobs=3
    )
    print("\nchat, logprobs=true, top_logprobs=3: each token, then its alternatives")
    for entry in reply.choices[0].logprobs.content:
        alternatives = [t.token for t in entry.top_logprobs]
        chosen = alternatives[0] == entry.token
        print(f"  {entry.token!r:>10}  {alternatives}  the first is the token: {chosen}")


def show_choices(client: openai.OpenAI) -> None:
    prompts = ["Hello world", "Once upon a time"]
    batch = client.completions.create(
        model=NAME, prompt=prompts, n=2, max_tokens=6, temperature=1.0, seed=7
    )
    print("\nn=2 for each of 2 prompts, seed 7: indices in prompt order")
    for c in batch.choices:
        print(f"  {c.index}  {prompts[c.index // 2]!r:>18} -> {c.text!r}")
    alone = client.completions.create(
        model=NAME, prompt=prompts[1], n=2, max_tokens=6, temperature=1.0, seed=7
    )
    same = [c.text for c in alone.choices] == [c.text for c in batch.choices[2:]]
    print(f"  the second prompt asked alone gives its two: {same}")
    print(
        f"  usage: {batch.usage.prompt_tokens} prompt + {batch.usage.completion_tokens} completion"
    )


def show_penalties(client: openai.OpenAI, tok) -> None:
    print("\npenalties and bias, greedy, 24 tokens:")
    for label, extra in [
        ("none", {}),
        ("frequency_penalty=1.5", {"frequency_penalty": 1.5}),
        ("repetition_penalty=1.3", {"extra_body": {"repetition_penalty": 1.3}}),
    ]:
        text = (
            client.completions.create(
                model=NAME, prompt="Once upon a time", max_tokens=24, temperature=0, **extra
            )
            .choices[0]
            .text
        )
        ids = tok(text)["input_ids"]
        print(f"  {label:<22} {len(set(ids)):>2} distinct tokens: {text[:40]!r}")
    token = tok(" time")["input_ids"][-1]
    forced = client.completions.create(
        model=NAME, prompt="Hello", max_tokens=4, temperature=0, logit_bias={str(token): 100}
    )
    print(f"  logit_bias {{{token} (' time'): 100}}: {forced.choices[0].text!r}")


def show_tool_call(client: openai.OpenAI) -> None:
    kwargs = dict(model=NAME, messages=CHAT, tools=[WEATHER], tool_choice="required", max_tokens=80)
    reply = client.chat.completions.create(temperature=0, **kwargs).choices[0]
    [call] = reply.message.tool_calls
    args = json.loads(call.function.arguments)
    try:
        jsonschema.validate(args, WEATHER["function"]["parameters"])
        valid = True
    except jsonschema.ValidationError:
        valid = False
    print(
        f"\ntool_choice='required': {call.function.name}({call.function.arguments}), "
        f"content={reply.message.content!r}, finish_reason={reply.finish_reason!r}, "
        f"arguments fit the schema: {valid}"
    )
    arguments = ""
    for chunk in client.chat.completions.create(temperature=0, stream=True, **kwargs):
        for c in chunk.choices:
            for d in c.delta.tool_calls or []:
                arguments += (d.function.arguments or "") if d.function else ""
    print(f"  streamed as deltas, the same arguments: {arguments == call.function.arguments}")


def show_shapes(client: openai.OpenAI, port: int) -> None:
    ids = client.completions.create(
        model=NAME, prompt=[[5, 17, 260], [300, 41]], max_tokens=3, temperature=0
    )
    print(f"\ntoken-id prompts, a batch of 2: {len(ids.choices)} choices, ", end="")
    print(f"{ids.usage.prompt_tokens} prompt tokens")
    parts = [{"role": "user", "content": [{"type": "text", "text": CHAT[0]["content"]}]}]
    a, b = (
        client.chat.completions.create(model=NAME, messages=m, max_tokens=6, temperature=0)
        for m in (CHAT, parts)
    )
    same = a.choices[0].message.content == b.choices[0].message.content
    print(f"content as text parts, the same reply as a string: {same}")
    native = httpx.post(
        f"http://127.0.0.1:{port}/generate",
        json={"text": "Hello world", "sampling_params": {"temperature": 0, "max_new_tokens": 6}},
        timeout=30,
    ).json()
    plain = client.completions.create(model=NAME, prompt="Hello world", max_tokens=6, temperature=0)
    print(
        f"SGLang's /generate: {native['meta_info']['completion_tokens']} tokens, "
        f"the same text as /v1/completions: {native['text'] == plain.choices[0].text}"
    )


def main() -> None:
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as tmp:
        model = tiny_models.make_tiny_model("qwen3", f"{tmp}/qwen3")
        # a tool's schema, written into the prompt, takes ~500 of this tiny vocabulary's tokens
        config = json.loads((model / "config.json").read_text())
        config["max_position_embeddings"] = CONTEXT
        (model / "config.json").write_text(json.dumps(config))
        hf = AutoModelForCausalLM.from_pretrained(model, dtype=torch.float32).eval()
        tok = AutoTokenizer.from_pretrained(model)
        show_inside_the_engine(model, tok)
        port = free_port()
        with open(f"{tmp}/server.log", "wb") as log:
            proc = start_server(model, port, log)
        client = openai.OpenAI(
            base_url=f"http://127.0.0.1:{port}/v1", api_key="none", max_retries=0
        )
        try:
            show_card(client)
            show_loglikelihood(client, hf, tok)
            show_chat_alternatives(client)
            show_choices(client)
            show_penalties(client, tok)
            show_tool_call(client)
            show_shapes(client, port)
        finally:  # the server stops even when a request fails
            proc.send_signal(signal.SIGTERM)
            code = proc.wait(timeout=60)
        print(f"\nSIGTERM: exit code {code}")


if __name__ == "__main__":
    main()
