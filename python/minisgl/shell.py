"""``python -m minisgl --model PATH --shell``: chat with the model in a terminal.

The same worker processes as the server (``start_workers``), and in this process a
prompt instead of the HTTP API. Each line is a user turn: the conversation so far goes to the
tokenizer worker as chat messages (so through the chat template), and the reply is printed
piece by piece as the detokenizer sends it. Ctrl-C stops the reply (the request is aborted and
its pages go back) but not the shell; ``/exit`` or Ctrl-D stop the shell and every worker.

The conversation grows each turn, and the context does not: before a turn is sent, its oldest
turns are left out (a system message stays) until the conversation leaves room for a whole
reply, and the shell says how many went. The count is the tokenizer worker's own: the shell
loads the same tokenizer and calls the same ``tokenize_request``. A turn the scheduler still
refuses (one line longer than the context) is reported in one line, and the shell goes on.

Sampling is set for the whole session from the environment: ``MINISGL_SHELL_TEMPERATURE``
(0.6), ``MINISGL_SHELL_TOP_K`` (-1), ``MINISGL_SHELL_TOP_P`` (1.0), ``MINISGL_SHELL_MAX_TOKENS``.
A fixed reply length of 2048 tokens would fill a 512-token context in one reply and leave no
room for the next line; the default is a quarter of the context, 2048 at most (128 tokens on
the tiny models, 2048 from an 8,192-token context on), so that three quarters stay for the
conversation: several turns of it.

While the workers load the model, one line says what loads and how long it has taken. After
each reply a line gives its speed: tokens per second and the time to the first token
(``MINISGL_SHELL_TIMING=0`` leaves it out, for a session whose prints must not vary).
"""

from __future__ import annotations

import itertools
import os
import signal
import sys
import threading
import time
from contextlib import closing, contextmanager
from dataclasses import dataclass, field
from functools import partial
from typing import Callable, Dict, Iterator, List, TextIO, Tuple

from transformers import AutoTokenizer, PreTrainedTokenizerBase

from minisgl import env
from minisgl.core import SamplingParams
from minisgl.message import (
    AbortMsg,
    BaseFrontendMsg,
    BaseTokenizerMsg,
    BatchFrontendMsg,
    TokenizeMsg,
    UserReply,
)
from minisgl.models import ModelConfig
from minisgl.server.args import ServerArgs
from minisgl.server.launch import SchedulerStats, send_exit_msg, start_workers
from minisgl.tokenizer import tokenize_request
from minisgl.utils.hf import read_hf_config, resolve_model_dir, safetensors_files
from minisgl.utils.mp import WorkerDied, Workers, ZmqPullQueue, ZmqPushQueue

PROMPT = ">>> "
HELP = "/reset forgets the conversation, /stats shows the pool, /exit (or Ctrl-D) leaves"
RANDOM_WEIGHTS = (
    "(a model with random weights, as examples/tiny_models.py makes, writes random text)"
)
RANDOM_WEIGHTS_FILE = "random_weights.txt"  # examples/tiny_models.py writes it beside the weights
Message = Dict[str, str]


class RequestRefused(ValueError):
    """The tokenizer worker or the scheduler refused the request; the message says why."""


def shell_sampling_params(context: int) -> SamplingParams:
    """The session's sampling, from ``MINISGL_SHELL_*`` (by default a reply of a quarter of
    the ``context``, 2048 tokens at most)."""
    get = os.environ.get
    reply_len = min(2048, context // 4)
    return SamplingParams(
        temperature=float(get("MINISGL_SHELL_TEMPERATURE", "0.6")),
        top_k=int(get("MINISGL_SHELL_TOP_K", "-1")),
        top_p=float(get("MINISGL_SHELL_TOP_P", "1.0")),
        max_tokens=int(get("MINISGL_SHELL_MAX_TOKENS", str(reply_len))),
    )


def shell_timing() -> bool:
    """Whether a line of timing follows each reply: yes unless ``MINISGL_SHELL_TIMING=0``."""
    return os.environ.get("MINISGL_SHELL_TIMING", "1") != "0"


def context_length(args: ServerArgs, stats: SchedulerStats) -> int:
    """The longest sequence the scheduler takes (its ``max_seq_len``): the model's context, but
    no more tokens than the KV pool holds (as the engine caps it)."""
    config = ModelConfig.from_dict(read_hf_config(resolve_model_dir(args.model_path)))
    model_len = args.max_seq_len or config.max_position_embeddings
    return min(model_len, stats.read()["kv_pages_total"] * args.page_size)


def prompt_length(tokenizer: PreTrainedTokenizerBase, messages: List[Message]) -> int:
    """The conversation's prompt tokens as the tokenizer worker makes them: the same tokenizer
    files, the same chat template, the same ``tokenize_request``."""
    return len(tokenize_request(tokenizer, messages=messages))


def fit_to_context(
    messages: List[Message], count_tokens: Callable[[List[Message]], int], budget: int
) -> Tuple[List[Message], int]:
    """``messages`` less as many of their oldest turns (a user line and its reply) as bring the
    templated conversation to ``budget`` tokens. A system message first stays, and so does the
    new line, even alone too long (the scheduler then refuses it). Returns the messages kept and
    how many turns were left out."""
    system = messages[:1] if messages and messages[0]["role"] == "system" else []
    turns, dropped = messages[len(system) :], 0
    while len(turns) > 2 and count_tokens(system + turns) > budget:
        turns, dropped = turns[2:], dropped + 1
    return system + turns, dropped


class ChatClient:
    """The shell's end of the queues, synchronous (one request at a time needs no event loop):
    requests to the tokenizer worker, reply pieces from the detokenizer."""

    def __init__(self, workers: Workers):
        self.workers = workers
        self._send = ZmqPushQueue(
            workers.addr("tokenizer"), create=False, encoder=BaseTokenizerMsg.encoder
        )
        self._recv = ZmqPullQueue(
            workers.addr("frontend"), create=True, decoder=BaseFrontendMsg.decoder
        )
        self._uids = itertools.count()

    def stream(self, messages: List[Message], params: SamplingParams) -> Iterator[UserReply]:
        """The reply, piece by piece: each piece's text and the tokens it came from. Closed
        before its end (Ctrl-C), it aborts the request, so the scheduler drops it and frees its
        pages."""
        uid, finished = next(self._uids), False
        self._send.put(TokenizeMsg(uid, messages, params))
        try:
            while not finished:
                for reply in self._replies(uid):
                    finished = reply.finished
                    if reply.error:  # finished too: there is nothing to abort
                        raise RequestRefused(reply.error)
                    yield reply
        finally:
            if not finished:
                self._send.put(AbortMsg(uid))

    def _replies(self, uid: int) -> List[UserReply]:
        """The next message's pieces of request ``uid``; those of an aborted request that were
        already on their way are dropped. A dead worker raises ``WorkerDied``, naming it."""
        msg = self._recv.get(watch=self.workers.sentinels)
        if msg is None:  # a worker ended
            self.workers.check(timeout=5.0)
            raise WorkerDied("a worker ended")
        replies = msg.data if isinstance(msg, BatchFrontendMsg) else [msg]
        return [r for r in replies if isinstance(r, UserReply) and r.uid == uid]

    def close(self) -> None:
        self._send.close()
        self._recv.close()


@dataclass
class ReplyTiming:
    """When one reply's tokens came, from the moment its request was sent."""

    sent: float = field(default_factory=time.monotonic)
    first: float = 0.0  # when the first token came: prefill, and any wait before it
    last: float = 0.0
    tokens: int = 0

    def add(self, reply: UserReply) -> None:
        now = time.monotonic()
        if reply.token_ids and not self.tokens:
            self.first = now
        self.tokens += len(reply.token_ids)
        self.last = now

    def line(self) -> str:
        """``(64 tokens, 17.2 tokens/s; the first after 412 ms)``: the speed is that of decoding,
        the tokens after the first over the time after the first."""
        to_first = f"the first after {1000 * (self.first - self.sent):.0f} ms"
        if self.tokens < 2:
            return f"({self.tokens} token{'s' * (self.tokens != 1)}; {to_first})"
        rate = (self.tokens - 1) / max(self.last - self.first, 1e-9)
        return f"({self.tokens} tokens, {rate:.1f} tokens/s; {to_first})"


class Shell:
    """The conversation, and what each line of input does with it."""

    def __init__(
        self,
        client: ChatClient,
        params: SamplingParams,
        stats: SchedulerStats,
        count_tokens: Callable[[List[Message]], int],
        context: int,
        out: TextIO = sys.stdout,
        timing: bool = True,
    ):
        self.client, self.params, self.stats, self.out = client, params, stats, out
        self.count_tokens, self.context, self.timing = count_tokens, context, timing
        self.history: List[Message] = []  # the turns so far, user and assistant in turn

    def run(self, read_line: Callable[[], str]) -> None:
        """Until /exit or Ctrl-D (EOFError). Ctrl-C at the prompt only clears the line."""
        while True:
            try:
                line = read_line().strip()
            except KeyboardInterrupt:
                continue
            except EOFError:
                return
            if not self.handle(line):
                return

    def handle(self, line: str) -> bool:
        """One line of input; False when the shell should stop."""
        if line == "/exit":
            return False
        if line == "/reset":
            self.history = []
            self.say("(the conversation is forgotten)")
        elif line == "/stats":
            s = self.stats.read()
            in_use = s["kv_pages_total"] - s["kv_pages_free"] - s["kv_pages_cached"]
            self.say(
                f"(requests running: {s['num_running_reqs']}; KV pages in use: {in_use}, "
                f"cached: {s['kv_pages_cached']}, of {s['kv_pages_total']})"
            )
        elif line.startswith("/"):
            self.say(f"(unknown command {line}; {HELP})")
        elif line:
            self.turn(line)
        return True

    def turn(self, text: str) -> None:
        """One chat turn, streamed, its conversation cut to leave room for a whole reply (half
        the context at most: a longer one the scheduler cuts anyway), then its timing line.
        Stopped by Ctrl-C or refused, it is left out of the conversation (and the turns it would
        have cut stay); after a Ctrl-C the next prompt waits until the scheduler has dropped the
        request."""
        room = min(self.params.max_tokens, self.context // 2)  # for the reply
        messages, dropped = fit_to_context(
            self.history + [{"role": "user", "content": text}],
            self.count_tokens,
            self.context - room,
        )
        if dropped:
            self.say(
                f"({dropped} earlier turn{'s' * (dropped > 1)} left out, to leave {room} "
                f"of the context's {self.context} tokens for the reply)"
            )
        pieces: List[str] = []
        timing = ReplyTiming()
        try:
            with closing(self.client.stream(messages, self.params)) as stream:
                for reply in stream:
                    timing.add(reply)
                    pieces.append(reply.incremental_output)
                    self.out.write(reply.incremental_output)
                    self.out.flush()
        except KeyboardInterrupt:
            self.say("\n(stopped)")
            self._wait_idle()
            return
        except RequestRefused as e:
            self.say(("\n" if pieces else "") + f"(refused: {e})")
            return
        self.say("")
        if self.timing:
            self.say(timing.line())
        self.history = messages + [{"role": "assistant", "content": "".join(pieces)}]

    def say(self, text: str) -> None:
        print(text, file=self.out, flush=True)

    def _wait_idle(self, timeout: float = 30.0) -> None:
        """Until the scheduler runs no request (the aborted one is gone), ``timeout`` at most."""
        deadline = time.monotonic() + timeout
        while self.stats.read()["num_running_reqs"] and time.monotonic() < deadline:
            time.sleep(0.01)


def prompt_reader() -> Callable[[], str]:
    """prompt_toolkit on a terminal (line editing, up/down through this session's lines, kept
    in memory only); plain ``input`` otherwise (a pipe)."""
    if not sys.stdin.isatty():
        return partial(input, PROMPT)
    from prompt_toolkit import PromptSession
    from prompt_toolkit.history import InMemoryHistory

    session: PromptSession[str] = PromptSession(PROMPT, history=InMemoryHistory())
    return session.prompt


def describe_model(path: str) -> str:
    """What the workers load: ``PATH (LlamaForCausalLM, 538 MB of weights)``."""
    arch = read_hf_config(path)["architectures"][0]
    size = sum(f.stat().st_size for f in safetensors_files(path))
    return f"{path} ({arch}, {size / 1e6:.0f} MB of weights)"


def has_random_weights(path: str) -> bool:
    """Whether the model directory says that its weights are random: examples/tiny_models.py
    writes ``random_weights.txt`` beside them. Nothing else in the files tells them apart."""
    return (resolve_model_dir(path) / RANDOM_WEIGHTS_FILE).is_file()


@contextmanager
def loading_line(what: str, out: TextIO, every_s: float = 5.0) -> Iterator[Callable[[], float]]:
    """``minisgl shell: loading WHAT...``, then the seconds so far every ``every_s`` on the same
    line while the body runs: a real model takes tens of seconds to load on a CPU. Yields the
    seconds since the start; the caller ends the line, or a failure does."""
    start, done = time.monotonic(), threading.Event()

    def tick() -> None:
        while not done.wait(every_s):
            out.write(f" {time.monotonic() - start:.0f} s...")
            out.flush()

    out.write(f"minisgl shell: loading {what}...")
    out.flush()
    ticker = threading.Thread(target=tick, name="minisgl-loading", daemon=True)
    ticker.start()
    failed = True
    try:
        yield lambda: time.monotonic() - start
        failed = False
    finally:
        done.set()
        ticker.join()
        if failed:  # the error's own line follows
            out.write("\n")
            out.flush()


def run_shell(args: ServerArgs) -> None:
    """Start the workers, chat until /exit or Ctrl-D, stop the workers: no process or socket
    file stays. SIGTERM ends it too (``Workers``' handler); SIGINT here means "stop the reply"."""
    with Workers() as workers:
        stats = SchedulerStats()
        with loading_line(describe_model(args.model_path), sys.stdout) as elapsed:
            start_workers(workers, args, stats)
            tokenizer = AutoTokenizer.from_pretrained(args.model_path)  # as the worker loads it
            try:
                workers.wait_ready(timeout=env.ready_timeout_s())
            except (WorkerDied, TimeoutError) as e:  # the worker has logged why
                raise SystemExit(f"minisgl: {e}; the shell could not start") from None
        signal.signal(signal.SIGINT, signal.default_int_handler)  # KeyboardInterrupt again
        client = ChatClient(workers)
        context = context_length(args, stats)
        pids = ", ".join(f"{name} (pid {p.pid})" for name, p in workers.procs.items())
        notes = [HELP, RANDOM_WEIGHTS] if has_random_weights(args.model_path) else [HELP]
        print(f" ready in {elapsed():.1f} s; workers: {pids}", *notes, sep="\n", flush=True)
        try:
            Shell(
                client,
                shell_sampling_params(context),
                stats,
                partial(prompt_length, tokenizer),
                context,
                timing=shell_timing(),
            ).run(prompt_reader())
        except WorkerDied as e:  # the watcher has stopped the other workers
            raise SystemExit(f"minisgl: {e}; the shell has stopped") from None
        finally:
            client.close()
            workers.stop(send_exit=partial(send_exit_msg, workers.addr("tokenizer")))
