"""Chapter 13: the OpenAI-compatible server, through real processes and sockets on 127.0.0.1
and the official ``openai`` client. One server per module (started once: it loads a model in two
processes), which the last of its tests stops with SIGTERM; the two tests that end a server in
their own way (a killed scheduler, a drain cut short) get one each, started together. Waits are on
events (a reply, a metric, a process's end), with bounds that a loaded machine meets."""

from __future__ import annotations

import pytest

# the server's packages (pip install -e .[server]): without them this file is skipped
for _package in ("zmq", "msgpack", "fastapi", "uvicorn", "openai", "httpx"):
    pytest.importorskip(_package)

import asyncio
import contextlib
import itertools
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import openai
import tiny_models as tm
import torch
from helpers import ROOT, START_TIMEOUT, modules_imported

from minisgl.core import SamplingParams
from minisgl.llm import LLM
from minisgl.tokenizer import tokenize_request

KEY = "sk-ch13-test"
MODEL = "qwen2bytes"  # the served model's name: its folder's, unless --served-model-name
PAGES = 2048  # 8192 tokens: more than the module's tests write, so nothing is ever evicted
OPTIONS = dict(device="cpu", page_size=4, num_pages=PAGES, max_running_req=16)
FLAGS = [
    "--device",
    "cpu",
    "--page-size",
    "4",
    "--num-pages",
    str(PAGES),
    "--max-running-requests",
    "16",
]
PROMPTS = ["Hello world", "Once upon a time", [5, 17, 260, 300, 41], tm.MULTIBYTE_TEXT[:40]]
CHAT = [{"role": "user", "content": "What is the weather today?"}]
WAIT = 60.0  # seconds a reply, a state of the server or a process's end may take
DRAIN = 180.0  # the module's server: longer than its replies under way take on a loaded machine
CUT_DRAIN = 0.5  # the drain of the server whose replies outlive it


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """``python -m minisgl`` in a subprocess, its stderr in a file, with faulthandler on: a
    server that does not stop is made to write every thread's stack there (``stop``)."""

    def __init__(
        self, model: Path, log: Path, *flags: str, env: dict | None = None, wait: bool = True
    ):
        """Start it; with ``wait``, return once it answers (else call ``wait_healthy``)."""
        self.port, self.log = _free_port(), log
        cmd = [
            sys.executable,
            "-X",
            "faulthandler",
            "-m",
            "minisgl",
            "--model",
            str(model),
            "--port",
            str(self.port),
            *FLAGS,
            *flags,
        ]
        full_env = {**os.environ, "PYTHONPATH": str(ROOT / "python"), **(env or {})}
        with open(log, "wb") as err:
            self.proc = subprocess.Popen(cmd, stdout=err, stderr=subprocess.STDOUT, env=full_env)
        self.url = f"http://127.0.0.1:{self.port}"
        if wait:
            self.wait_healthy()

    def wait_healthy(self, timeout: float = START_TIMEOUT) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, f"the server exited:\n{self.log.read_text()}"
            try:
                if httpx.get(self.url + "/health", timeout=1).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            time.sleep(0.2)
        raise TimeoutError(f"no server after {timeout} s:\n{self.log.read_text()}")

    def client(self, key: str = KEY) -> openai.OpenAI:
        return openai.OpenAI(base_url=self.url + "/v1", api_key=key, max_retries=0, timeout=30)

    def metrics(self) -> dict:
        text = httpx.get(self.url + "/metrics", timeout=5).text
        return {m[1]: float(m[2]) for m in re.finditer(r"^(minisgl:\w+) (\S+)$", text, re.M)}

    def wait_idle(self, timeout: float = WAIT) -> dict:
        """/metrics once no request runs or waits: every page is then free or cached."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            m = self.metrics()
            if m["minisgl:num_running_reqs"] == 0 and m["minisgl:num_waiting_reqs"] == 0:
                return m
            time.sleep(0.05)
        raise TimeoutError(f"still busy after {timeout} s: {m}")

    def worker_pid(self, name: str) -> int:
        return int(re.search(rf"{name} \(pid (\d+)\)", self.log.read_text())[1])

    def stop(self) -> int:
        """SIGTERM, then the exit status. A server still running ``WAIT`` s later gets SIGABRT,
        on which faulthandler writes each thread's stack to the log; its workers are killed and
        the test fails with the log's end, which shows where the shutdown hung."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout=WAIT)
        except subprocess.TimeoutExpired:
            self.proc.send_signal(signal.SIGABRT)
            self.proc.wait(timeout=WAIT)
            for name in ("scheduler", "tokenizer"):
                with contextlib.suppress(ProcessLookupError, TypeError):
                    os.kill(self.worker_pid(name), signal.SIGKILL)
            raise AssertionError(
                f"the server was still running {WAIT:g} s after SIGTERM; its log ends:\n"
                + self.log.read_text()[-8000:]
            ) from None


def test_the_command_line_takes_upstreams_flag_names():
    from minisgl.scheduler import SchedulerConfig
    from minisgl.server.args import parse_args

    args = parse_args(
        [
            "--model-path",
            "/m",
            "--host",
            "0.0.0.0",
            "--port",
            "8000",
            "--dtype",
            "bfloat16",
            "--page-size",
            "16",
            "--num-pages",
            "99",
            "--memory-ratio",
            "0.5",
            "--max-running-requests",
            "8",
            "--max-prefill-length",
            "256",
            "--cache-type",
            "naive",
            "--attn",
            "torch",
            "--device",
            "cpu",
            "--api-key",
            "k",
        ]
    )
    assert (
        args.model_path,
        args.host,
        args.port,
        args.dtype,
        args.page_size,
        args.num_pages,
        args.memory_ratio,
        args.max_running_req,
        args.max_extend_tokens,
        args.cache_type,
        args.attention_backend,
        args.device,
        args.api_key,
        args.shell,
    ) == (
        "/m",
        "0.0.0.0",
        8000,
        torch.bfloat16,
        16,
        99,
        0.5,
        8,
        256,
        "naive",
        "torch",
        "cpu",
        "k",
        False,
    )
    config = args.scheduler_config()
    assert type(config) is SchedulerConfig and (config.page_size, config.num_pages) == (16, 99)
    plain = parse_args(["--model", "/m"])
    assert (plain.host, plain.port, plain.dtype, plain.api_key, plain.shutdown_timeout) == (
        "127.0.0.1",
        1919,
        None,
        None,
        5.0,
    )
    assert parse_args(["--model", "/m", "--shutdown-timeout", "0.5"]).shutdown_timeout == 0.5
    for bad in (
        ["--page-size", "0"],
        ["--port", "70000"],
        ["--dtype", "int8"],
        ["--nope"],
        ["--shutdown-timeout", "-1"],
        ["--shutdown-timeout", "nan"],
    ):
        with pytest.raises(SystemExit):
            parse_args(["--model", "/m", *bad])
    with pytest.raises(SystemExit):
        parse_args([])  # --model is required


@pytest.fixture(scope="module")
def model(tiny_models) -> Path:
    return tiny_models["qwen2bytes"]


@pytest.fixture(scope="module")
def server(model, tmp_path_factory):
    """The module's server. A drain long enough for any reply: the last test stops it under
    load (test_sigterm_under_load_...), or this fixture does, idle."""
    srv = Server(
        model,
        tmp_path_factory.mktemp("server") / "server.log",
        "--api-key",
        KEY,
        "--shutdown-timeout",
        str(DRAIN),
    )
    yield srv
    assert srv.stop() == 0 and "SIGTERM received; the server has stopped" in srv.log.read_text()
    assert "Traceback" not in srv.log.read_text(), srv.log.read_text()


@pytest.fixture(scope="module")
def llm(model):
    engine = LLM(model, **OPTIONS)
    yield engine
    engine.shutdown()


def _greedy(n: int, **extra) -> dict:
    return dict(max_tokens=n, temperature=0, extra_body={"ignore_eos": True, **extra})


def test_greedy_completions_equal_llm_generate_with_exact_usage(server, llm):
    client = server.client()
    refs = llm.generate(PROMPTS, SamplingParams(max_tokens=12, ignore_eos=True))
    for prompt, ref in zip(PROMPTS, refs):
        out = client.completions.create(model=MODEL, prompt=prompt, **_greedy(12))
        assert out.choices[0].text == ref["text"]
        assert out.choices[0].finish_reason == "length"
        assert (out.usage.prompt_tokens, out.usage.completion_tokens, out.usage.total_tokens) == (
            len(ref["prompt_token_ids"]),
            12,
            len(ref["prompt_token_ids"]) + 12,
        )


def test_a_seeded_sampled_completion_equals_llm_generate_whatever_runs_beside_it(server, llm):
    """A request's seed gives it draws of its own: alone or among others, through the server or
    offline, the same text; another seed, another text."""
    sampled = dict(max_tokens=16, temperature=1.0, top_p=0.95)
    params = SamplingParams(max_tokens=16, temperature=1.0, top_p=0.95, ignore_eos=True, seed=7)
    ref = llm.generate([PROMPTS[0]], params)[0]["text"]
    client = server.client()

    def ask(seed: int) -> str:
        out = client.completions.create(
            model=MODEL, prompt=PROMPTS[0], seed=seed, extra_body={"ignore_eos": True}, **sampled
        )
        return out.choices[0].text

    with ThreadPoolExecutor(4) as pool:  # three unseeded requests beside a seeded one
        beside = [
            pool.submit(
                client.completions.create,
                model=MODEL,
                prompt=p,
                extra_body={"ignore_eos": True},
                **sampled,
            )
            for p in PROMPTS[1:4]
        ]
        assert ask(7) == ref
        [f.result(timeout=WAIT) for f in beside]
    assert ask(7) == ref and ask(8) != ref


def test_chat_equals_the_offline_api_on_the_chat_template(server, llm):
    ids = tokenize_request(llm.tokenizer, messages=CHAT)
    ref = llm.generate([ids], SamplingParams(max_tokens=40))[0]
    out = server.client().chat.completions.create(
        model=MODEL, messages=CHAT, max_tokens=40, temperature=0
    )
    assert out.choices[0].message.content == ref["text"]
    assert out.choices[0].message.role == "assistant"
    at_eos = len(ref["token_ids"]) < 40 or ref["token_ids"][-1] in llm.scheduler.eos_token_ids
    assert out.choices[0].finish_reason == ("stop" if at_eos else "length")
    assert out.usage.prompt_tokens == len(ids)
    assert out.usage.completion_tokens == len(ref["token_ids"])


def _stream_text(stream) -> tuple[str, str | None, object, int]:
    """Joined text, the last finish reason, the usage chunk's usage, and the number of chunks."""
    text, reason, usage, n = "", None, None, 0
    for chunk in stream:
        n += 1
        usage = chunk.usage or usage
        for choice in chunk.choices:
            piece = choice.delta.content if hasattr(choice, "delta") else choice.text
            text += piece or ""
            reason = choice.finish_reason or reason
    return text, reason, usage, n


@pytest.mark.parametrize("prompt", PROMPTS)
def test_streamed_completion_joined_equals_the_plain_one(server, prompt):
    client = server.client()
    plain = client.completions.create(model=MODEL, prompt=prompt, **_greedy(16))
    stream = client.completions.create(
        model=MODEL,
        prompt=prompt,
        stream=True,
        stream_options={"include_usage": True},
        **_greedy(16),
    )
    text, reason, usage, chunks = _stream_text(stream)
    assert (text, reason) == (plain.choices[0].text, "length")
    assert usage.model_dump() == plain.usage.model_dump()
    assert chunks > 2  # it did stream


def test_streamed_chat_joined_equals_the_plain_one(server):
    client = server.client()
    plain = client.chat.completions.create(model=MODEL, messages=CHAT, max_tokens=20, temperature=0)
    stream = client.chat.completions.create(
        model=MODEL,
        messages=CHAT,
        max_tokens=20,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
    )
    text, reason, usage, _ = _stream_text(stream)
    assert (text, reason) == (plain.choices[0].message.content, plain.choices[0].finish_reason)
    assert usage.model_dump() == plain.usage.model_dump()


def test_multibyte_text_streams_whole_characters(server, llm):
    """A byte-level model: its tokens split characters, yet every piece is whole text."""
    prompt = tm.MULTIBYTE_TEXT[:60]
    ref = llm.generate([prompt], SamplingParams(max_tokens=30, ignore_eos=True))[0]
    pieces = []
    for chunk in server.client().completions.create(
        model=MODEL, prompt=prompt, stream=True, **_greedy(30)
    ):
        pieces += [c.text for c in chunk.choices if c.text]
    assert "".join(pieces) == ref["text"]
    assert any(ord(ch) > 127 for ch in ref["text"])  # the test means something
    decoded = llm.tokenizer.decode(ref["token_ids"])  # the whole reply at once
    assert all(piece in decoded for piece in pieces)


@pytest.mark.parametrize("stream", [False, True])
def test_stop_strings_are_cut_and_finish_with_stop(server, stream):
    client = server.client()
    text = (
        client.completions.create(model=MODEL, prompt="Hello world", **_greedy(24)).choices[0].text
    )
    stop = text[6:9]
    assert len(stop) == 3 and text.index(stop) > 0
    out = client.completions.create(
        model=MODEL, prompt="Hello world", stop=[stop, "zzzz"], stream=stream, **_greedy(24)
    )
    got, reason, _, _ = (
        _stream_text(out) if stream else (out.choices[0].text, out.choices[0].finish_reason, 0, 0)
    )
    assert (got, reason) == (text[: text.index(stop)], "stop")


def _tokens_to_stop(tokenizer, ids: list, stop: str) -> int:
    """The rule for ``usage.completion_tokens`` after a stop string: the tokens up to and
    including the one whose text completed the stop string."""
    for k in range(1, len(ids) + 1):
        if stop in tokenizer.decode(ids[:k], skip_special_tokens=True):
            return k
    raise AssertionError(f"{stop!r} is not in the reply")


def _a_stop_string(text: str) -> str:
    """Three characters first met at least 8 characters into the reply."""
    starts = [a for a in range(8, len(text) - 3) if text.find(text[a : a + 3]) == a]
    assert starts, text
    return text[starts[0] : starts[0] + 3]


@pytest.mark.parametrize("prompt", ["Hello world", "Once upon a time", tm.MULTIBYTE_TEXT[:40]])
def test_usage_after_a_stop_string_is_exact_even_when_the_detokenizer_falls_behind(
    server, llm, prompt
):
    """completion_tokens counts the tokens up to the one that completed the stop string: the
    same streamed and not, and when the detokenizer falls behind. It is paused (SIGSTOP) once the
    replies have begun, until the scheduler has run them to their end, so the tokens past the
    stop string reach it in one batch with those before."""
    ref = llm.generate([prompt], SamplingParams(max_tokens=40, ignore_eos=True))[0]
    stop = _a_stop_string(ref["text"])
    expected = (
        ref["text"][: ref["text"].index(stop)],
        "stop",
        _tokens_to_stop(llm.tokenizer, ref["token_ids"], stop),
    )
    assert 1 < expected[2] < 40  # cut inside the reply, not at either end
    client = server.client()

    def plain() -> tuple:
        out = client.completions.create(model=MODEL, prompt=prompt, stop=stop, **_greedy(40))
        return out.choices[0].text, out.choices[0].finish_reason, out.usage.completion_tokens

    def streamed(started: threading.Event) -> tuple:
        out = client.completions.create(
            model=MODEL,
            prompt=prompt,
            stop=stop,
            stream=True,
            stream_options={"include_usage": True},
            **_greedy(40),
        )
        chunks = iter(out)
        first = next(chunks)
        started.set()
        text, reason, usage, _ = _stream_text(itertools.chain([first], chunks))
        return text, reason, usage.completion_tokens

    assert [plain(), streamed(threading.Event())] == [expected] * 2  # the detokenizer in step
    tokenizer, started = server.worker_pid("tokenizer"), threading.Event()
    with ThreadPoolExecutor(2) as pool:
        futures = [pool.submit(streamed, started), pool.submit(plain)]
        assert started.wait(timeout=WAIT)
        os.kill(tokenizer, signal.SIGSTOP)
        try:
            server.wait_idle()  # the scheduler ran on to the 40th token: nothing was aborted
        finally:
            os.kill(tokenizer, signal.SIGCONT)
        assert [f.result(timeout=WAIT) for f in futures] == [expected] * 2


def test_models_health_and_metric_names(server, model):
    # the path until chapter 25, which serves a model by its folder's name
    assert [m.id for m in server.client().models.list()] in ([str(model)], [model.name])
    assert httpx.get(server.url + "/health").status_code == 200
    names = set(server.metrics())
    for name in (
        "num_running_reqs",
        "num_waiting_reqs",
        "kv_pages_total",
        "kv_pages_free",
        "kv_pages_cached",
        "prompt_tokens_total",
        "generation_tokens_total",
        "time_to_first_token_seconds_count",
        "time_per_output_token_seconds_count",
        "e2e_request_latency_seconds_count",
    ):
        assert f"minisgl:{name}" in names
    m = server.wait_idle()
    assert m["minisgl:kv_pages_total"] == PAGES
    assert m["minisgl:kv_pages_free"] + m["minisgl:kv_pages_cached"] == PAGES


def test_a_finished_request_reaches_every_latency_histogram_and_token_counter(server):
    """Each count grows with a reply: a histogram that is never observed still shows its name
    (the test above), so the names alone say nothing of the numbers. Before the SIGTERM tests,
    which stop the module's server."""
    names = [
        "e2e_request_latency_seconds_count",
        "time_to_first_token_seconds_count",
        "time_per_output_token_seconds_count",
        "prompt_tokens_total",
        "generation_tokens_total",
    ]
    before = server.metrics()
    server.client().completions.create(model=MODEL, prompt=PROMPTS[0], **_greedy(4))
    after = server.metrics()
    for name in names:
        assert after[f"minisgl:{name}"] > before[f"minisgl:{name}"], name


# Refusals that chapter 25 lifts (a reply of no tokens, n choices, log-probabilities): tested on
# the trees that still make them, which are those whose SamplingParams has no n
_REFUSED_UNTIL_25 = "n" not in SamplingParams.__dataclass_fields__
BAD = [  # (route, body, status, the words the message must hold)
    ("/v1/completions", {"prompt": "Hi", "max_tokens": "many"}, 400, "max_tokens"),
    ("/v1/completions", {"prompt": "Hi", "temperature": -1}, 400, "temperature"),
    ("/v1/completions", {"prompt": "Hi", "top_p": 1.5}, 400, "top_p"),
    ("/v1/completions", {"prompt": "Hi", "top_p": 0}, 400, "top_p"),
    ("/v1/completions", {"prompt": "Hi", "top_k": 0}, 400, "top_k"),
    ("/v1/completions", {"prompt": "Hi", "stop": 5}, 400, "stop"),
    ("/v1/completions", {"prompt": "Hi", "stop": [""]}, 400, "stop"),
    ("/v1/completions", {"prompt": "Hi", "temperature": 0.5, "seed": -1}, 400, "seed"),
    ("/v1/chat/completions", {"messages": CHAT, "tools": [{"type": "function"}]}, 400, "tools"),
    ("/v1/completions", {"prompt": ""}, 400, "empty"),
    ("/v1/completions", {"prompt": []}, 400, "empty"),
    ("/v1/completions", {"max_tokens": 3}, 400, "prompt"),
    ("/v1/completions", {"prompt": "word " * 600}, 400, "max_seq_len"),
    ("/v1/completions", {"prompt": [1, 2, 512]}, 400, "vocab_size"),
    ("/v1/completions", {"prompt": [1, -2]}, 400, "token ids[1]"),
    ("/v1/completions", {"prompt": [1, 2.5]}, 400, "prompt"),
    ("/v1/chat/completions", {"messages": CHAT, "max_completion_tokens": 0}, 400, "max_tokens"),
    ("/v1/chat/completions", {"messages": []}, 400, "messages"),
    ("/v1/chat/completions", {"messages": [{"role": "user"}]}, 400, "content"),
    ("/v1/completions", b'{"prompt": "Hi", ', 400, "JSON"),
    ("/v1/completions", b"[1, 2]", 400, "body"),
    ("/v1/nothing", {"prompt": "Hi"}, 404, "/v1/nothing"),
]
if _REFUSED_UNTIL_25:
    BAD += [
        ("/v1/completions", {"prompt": "Hi", "max_tokens": 0}, 400, "max_tokens"),
        ("/v1/completions", {"prompt": "Hi", "n": 2}, 400, "n=2"),
        ("/v1/completions", {"prompt": "Hi", "logprobs": 3}, 400, "logprobs"),
    ]


@pytest.mark.parametrize("route,body,status,words", BAD, ids=[str(b[1])[:40] for b in BAD])
def test_bad_input_gets_an_openai_error_and_the_server_goes_on(server, route, body, status, words):
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    r = httpx.post(
        server.url + route,
        content=content,
        timeout=WAIT,
        headers={"Authorization": f"Bearer {KEY}", "Content-Type": "application/json"},
    )
    assert r.status_code == status, r.text
    error = r.json()["error"]
    assert words in error["message"] and "Traceback" not in r.text
    assert error["type"] and error["code"] == status
    out = server.client().completions.create(model=MODEL, prompt="Hi", **_greedy(2))
    assert out.usage.completion_tokens == 2


def test_streamed_bad_request_gets_its_status_before_any_event(server):
    with pytest.raises(openai.BadRequestError, match="vocab_size"):
        list(
            server.client().completions.create(
                model=MODEL, prompt=[7, 9999], stream=True, max_tokens=3
            )
        )


@pytest.mark.parametrize("key", ["wrong", KEY + "x", KEY[:-1]])
def test_a_wrong_or_missing_api_key_gets_401(server, key):
    with pytest.raises(openai.AuthenticationError, match="API key"):
        server.client(key=key).completions.create(model=MODEL, prompt="Hi", max_tokens=2)
    r = httpx.get(server.url + "/v1/models")  # no header at all
    assert r.status_code == 401 and r.json()["error"]["type"] == "authentication_error"
    assert httpx.get(server.url + "/health").status_code == 200  # probes need no key


def _disconnect_after(server: Server, n_events: int, max_tokens: int, chat: bool = False):
    """Open a stream, read ``n_events`` events, then close the connection."""
    body = ({"messages": CHAT} if chat else {"prompt": "Once upon a time"}) | {
        "max_tokens": max_tokens,
        "ignore_eos": True,
        "temperature": 0,
        "stream": True,
    }
    route = "/v1/chat/completions" if chat else "/v1/completions"
    with httpx.stream(
        "POST",
        server.url + route,
        json=body,
        timeout=WAIT,
        headers={"Authorization": f"Bearer {KEY}"},
    ) as r:
        assert r.status_code == 200
        lines = r.iter_lines()
        for _ in range(n_events):
            while not next(lines).startswith("data: "):
                pass


def _assert_aborted_early(server: Server, cached_before: float) -> None:
    """An ended request's tokens go to the prefix cache (nothing is evicted: the pool is large).
    Run to the end, the 400-token reply would add 100 pages; aborted, it adds a few."""
    m = server.wait_idle()
    assert m["minisgl:kv_pages_free"] + m["minisgl:kv_pages_cached"] == PAGES
    assert m["minisgl:kv_pages_cached"] - cached_before < 50


@pytest.mark.parametrize("chat", [False, True])
def test_a_client_that_disconnects_mid_stream_frees_its_pages(server, chat):
    cached = server.wait_idle()["minisgl:kv_pages_cached"]
    _disconnect_after(server, n_events=3, max_tokens=400, chat=chat)
    _assert_aborted_early(server, cached)


def test_a_disconnect_before_a_plain_reply_aborts_it(server):
    """A raw socket that sends a request and closes once the scheduler runs it."""
    cached = server.wait_idle()["minisgl:kv_pages_cached"]
    body = json.dumps(
        {"prompt": "Nobody waits for this reply", "max_tokens": 400, "ignore_eos": True}
    ).encode()
    head = (
        f"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {KEY}"
        f"\r\nContent-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
    )
    with socket.create_connection(("127.0.0.1", server.port), timeout=WAIT) as conn:
        conn.sendall(head.encode() + body)
        deadline = time.monotonic() + WAIT
        while server.metrics()["minisgl:num_running_reqs"] == 0:
            assert time.monotonic() < deadline
            time.sleep(0.01)
    _assert_aborted_early(server, cached)


async def _one_client(http: httpx.AsyncClient, i: int) -> str:
    """Client i: one in ten sends a malformed body, one in ten leaves after its first event,
    the others read their whole stream; returns what happened."""
    headers = {"Authorization": f"Bearer {KEY}"}
    if i % 10 == 3:
        r = await http.post("/v1/completions", content=b'{"prompt": [1,', headers=headers)
        return f"malformed {r.status_code}"
    body = {
        "prompt": f"Hello world {i}",
        "max_tokens": 8 + i % 5,
        "ignore_eos": True,
        "temperature": 0.8,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    async with http.stream("POST", "/v1/completions", json=body, headers=headers) as r:
        events = []
        async for line in r.aiter_lines():
            if line.startswith("data: "):
                events.append(line[6:])
                if i % 10 == 7:
                    return "left"
    assert events[-1] == "[DONE]", events[-3:]
    usage = json.loads(events[-2])["usage"]
    reasons = [json.loads(e)["choices"][0]["finish_reason"] for e in events[:-2]]
    return f"{usage['completion_tokens'] == 8 + i % 5} {reasons[-1]}"


# the full load of 200 clients: MINISGL_TEST_LOAD_CLIENTS=200 (about a minute on two cores)
LOAD_CLIENTS = int(os.environ.get("MINISGL_TEST_LOAD_CLIENTS", "40"))


def test_concurrent_streams_some_malformed_some_leaving(server):
    n = LOAD_CLIENTS

    async def run_all() -> list:
        limits = httpx.Limits(max_connections=n + 10)
        async with httpx.AsyncClient(base_url=server.url, timeout=WAIT + n, limits=limits) as http:
            return await asyncio.wait_for(
                asyncio.gather(*(_one_client(http, i) for i in range(n))), timeout=WAIT + n
            )

    results = asyncio.run(run_all())
    assert results.count("malformed 400") == n // 10 and results.count("left") == n // 10
    assert results.count("True length") == n - 2 * (n // 10), results
    m = server.wait_idle()
    assert m["minisgl:kv_pages_free"] + m["minisgl:kv_pages_cached"] == PAGES
    out = server.client().completions.create(model=MODEL, prompt="Hi", **_greedy(3))
    assert out.usage.completion_tokens == 3


@pytest.fixture(scope="module")
def own_servers(model, tmp_path_factory):
    """A server for each test that ends one in its own way, both started at once: most of a
    start is imports, each on one core. Each test waits for its own."""
    folder = tmp_path_factory.mktemp("own_servers")
    servers = {
        "fault": Server(
            model, folder / "fault.log", wait=False, env={"MINISGL_FAILURE_GRACE_S": "3"}
        ),
        "cut": Server(model, folder / "cut.log", "--shutdown-timeout", str(CUT_DRAIN), wait=False),
    }
    yield servers
    for srv in servers.values():  # stopped by their tests, unless one failed first
        srv.stop()


def test_the_scheduler_killed_mid_run_gives_503_then_a_nonzero_exit(own_servers):
    srv = own_servers["fault"]
    srv.wait_healthy()
    try:
        client, errors = srv.client(), []

        def long_request() -> None:
            try:
                client.completions.create(
                    model=MODEL, prompt="Hi", max_tokens=400, extra_body={"ignore_eos": True}
                )
            except openai.APIStatusError as e:
                errors.append(e)

        thread = threading.Thread(target=long_request)
        thread.start()
        deadline = time.monotonic() + WAIT
        while srv.metrics()["minisgl:num_running_reqs"] == 0:
            assert time.monotonic() < deadline
            time.sleep(0.02)
        os.kill(srv.worker_pid("scheduler"), signal.SIGKILL)
        thread.join(timeout=WAIT)
        assert not thread.is_alive() and len(errors) == 1
        assert errors[0].status_code == 503 and "scheduler" in errors[0].message
        late = httpx.post(  # the grace period: a new client, on a new connection, learns why
            srv.url + "/v1/completions",
            json={"model": MODEL, "prompt": "Hi", "max_tokens": 1},
            headers={"Authorization": f"Bearer {KEY}"},
            timeout=WAIT,
        )
        assert late.status_code == 503 and "scheduler" in late.json()["error"]["message"]
        assert srv.proc.wait(timeout=WAIT) != 0
        assert "answering 503 for 3.0 s, then stopping" in srv.log.read_text()
        log = srv.log.read_text()
        assert "the scheduler process was killed by SIGKILL" in log
        assert "Traceback" not in log, log
    finally:
        srv.stop()


def _noting_the_first(stream, event: threading.Event):
    """The stream's chunks, setting ``event`` when the first arrives."""
    for chunk in stream:
        event.set()
        yield chunk


def test_sigterm_under_load_finishes_the_replies_under_way_then_exits_0(server):
    """A drain longer than the replies need: each runs to its end, and the server exits as soon
    as they have, not when the drain time is over. The module's server: the last test to use
    it."""
    srv = server
    try:
        streams: list = []
        started = [threading.Event() for _ in range(6)]

        def stream_one(i: int) -> None:
            out = srv.client().completions.create(
                model=MODEL,
                prompt=f"Hello {i}",
                stream=True,
                stream_options={"include_usage": True},
                **_greedy(400),  # long enough to be under way when the signal lands
            )
            text, reason, usage, _ = _stream_text(_noting_the_first(out, started[i]))
            streams.append((reason, usage.completion_tokens))

        threads = [threading.Thread(target=stream_one, args=(i,)) for i in range(6)]
        for t in threads:
            t.start()
        # every reply has begun (accepted and streaming); on a loaded machine one may also end
        assert all(event.wait(timeout=WAIT) for event in started), "the replies never began"
        srv.proc.send_signal(signal.SIGTERM)
        drain_end = time.monotonic() + DRAIN
        for t in threads:
            t.join(timeout=drain_end - time.monotonic())
        assert streams == [("length", 400)] * 6  # every reply under way ran to its end
        # it did not wait out the drain: it exits before its end (a TimeoutExpired otherwise)
        assert srv.proc.wait(timeout=max(0.0, drain_end - time.monotonic() - 1.0)) == 0
        log = srv.log.read_text()
        # 6 ran at once, but on a loaded machine the first may end before the signal lands
        under_way = re.search(r"replies under way: (\d+),", log)
        assert under_way and 1 <= int(under_way.group(1)) <= 6, log
        assert "SIGTERM received; the server has stopped" in log
        assert "Traceback" not in log, log
    finally:
        srv.stop()


def _raw_stream(
    srv: Server, prompt: str, max_tokens: int, events: list, started: threading.Event
) -> None:
    """A stream's events as they come (the JSON strings after ``data: ``), until it ends."""
    body = {
        "prompt": prompt,
        "max_tokens": max_tokens,
        "ignore_eos": True,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    with httpx.stream("POST", srv.url + "/v1/completions", json=body, timeout=WAIT) as r:
        for line in r.iter_lines():
            if line.startswith("data: "):
                events.append(line[6:])
                started.set()


def test_sigterm_cuts_what_outlives_the_drain_and_exits_0_within_the_bound(own_servers):
    """A drain of 0.5 s, and the scheduler paused (SIGSTOP) so that no reply can finish in it:
    no new connection is accepted; at the drain's end each stream gets an error event after
    its valid chunks; the server exits 0 soon after."""
    drain, srv = CUT_DRAIN, own_servers["cut"]
    srv.wait_healthy()
    scheduler = srv.worker_pid("scheduler")
    try:
        runs = [(f"Hello {i}", 400, [], threading.Event()) for i in range(2)]
        threads = [threading.Thread(target=_raw_stream, args=(srv, *run)) for run in runs]
        for t in threads:
            t.start()
        for _, _, _, started in runs:
            assert started.wait(timeout=WAIT)
        os.kill(scheduler, signal.SIGSTOP)
        srv.proc.send_signal(signal.SIGTERM)
        start = time.monotonic()
        while True:  # new connections are refused while the replies under way wait
            try:
                httpx.get(srv.url + "/health", timeout=1)
            except (httpx.ConnectError, httpx.RemoteProtocolError, httpx.ReadError):
                break  # refused, or, caught in the socket's backlog as it closed, dropped unread
            # well inside the 10 s that the server then waits for the paused scheduler
            assert time.monotonic() - start < 5.0, "still accepting after SIGTERM"
            time.sleep(0.05)
        for t in threads:
            t.join(timeout=drain + 10)
        os.kill(scheduler, signal.SIGCONT)  # it takes the exit message
        code = srv.proc.wait(timeout=drain + 15)
        assert code == 0 and time.monotonic() - start < drain + 12
        for _, _, events, _ in runs:  # the text so far, then one error event, no [DONE]
            chunks = [json.loads(e) for e in events if e != "[DONE]"]  # every event is JSON
            assert "[DONE]" not in events and all("error" not in c for c in chunks[:-1])
            error = chunks[-1]["error"]
            assert error["code"] == 503 and "--shutdown-timeout" in error["message"]
        log = srv.log.read_text()
        assert "replies still running after 0.5 s: 2, cut" in log
        assert "SIGTERM received; the server has stopped" in log and "Traceback" not in log
    finally:
        with contextlib.suppress(ProcessLookupError):  # gone already, as it should be
            os.kill(scheduler, signal.SIGCONT)
        srv.stop()


def test_the_scheduler_processs_module_imports_no_web_server_or_tokenizer():
    """The scheduler process imports launch.py for its target: uvicorn, FastAPI and
    transformers would cost it 1.5 CPU-seconds of imports at each start, for nothing."""
    heavy = ["uvicorn", "fastapi", "transformers"]
    assert modules_imported("minisgl.server.launch", heavy) == []


# what an OpenAI client may send to ask for nothing more: each must pass, and any other value
# is refused naming the parameter (the SDKs fill some of these in by default)
NO_OP = {
    "n": 1,
    "best_of": 1,
    "logprobs": False,
    "top_logprobs": 0,
    "echo": False,
    "suffix": "",
    "tools": [],
    "tool_choice": "none",
    "functions": [],
    "logit_bias": {},
    "presence_penalty": 0,
    "frequency_penalty": 0,
}
SOMETHING = {
    "n": 2,
    "best_of": 2,
    "logprobs": True,
    "top_logprobs": 1,
    "echo": True,
    "suffix": "!",
    "tools": [{"type": "function"}],
    "tool_choice": "auto",
    "functions": [{"name": "f"}],
    "logit_bias": {"1": 5},
    "presence_penalty": 0.5,
    "frequency_penalty": -0.5,
}


def _unsupported() -> list:
    """The parameters this tree's server lists as unsupported (a later chapter serves some)."""
    from minisgl.server.api_server import UNSUPPORTED

    return sorted(UNSUPPORTED)


def test_every_unsupported_parameter_has_values_to_try():
    assert set(_unsupported()) <= set(NO_OP)


@pytest.mark.parametrize("name", [n for n in _unsupported() if n in NO_OP])
def test_an_unsupported_parameter_passes_at_its_no_op_value_only(name):
    """In process, no server: the request model and ``sampling_params`` alone."""
    from minisgl.server.api_server import APIError, CompletionRequest, sampling_params

    for value in (None, NO_OP[name]):
        sampling_params(CompletionRequest(prompt="Hi", **{name: value}), 4)
    with pytest.raises(APIError) as refused:
        sampling_params(CompletionRequest(prompt="Hi", **{name: SOMETHING[name]}), 4)
    assert refused.value.status == 400 and refused.value.param == name


@pytest.mark.parametrize("port,ok", [(-1, False), (0, True), (65535, True), (65536, False)])
def test_the_port_must_be_a_port(port, ok, capsys):
    from minisgl.server.args import parse_args

    argv = ["--model-path", "/m", "--port", str(port), "--device", "cpu"]
    if ok:
        assert parse_args(argv).port == port
    else:
        with pytest.raises(SystemExit):
            parse_args(argv)
        assert "--port must be in [0, 65536)" in capsys.readouterr().err
