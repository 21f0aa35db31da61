"""``python -m minisgl --model PATH --shell``: chat with the model in a terminal.

The same worker processes as the server (chapter 13's ``start_workers``), and in this process a
prompt instead of the HTTP API. Each line is a user turn: the conversation so far goes to the
tokenizer worker as chat messages (so through the chat template), and the reply is printed
piece by piece as the detokenizer sends it. Ctrl-C stops the reply (the request is aborted and
its pages go back) but not the shell; ``/exit`` or Ctrl-D stop the shell and every worker.

Sampling is set for the whole session from the environment, as upstream does:
``MINISGL_SHELL_TEMPERATURE`` (0.6), ``MINISGL_SHELL_TOP_K`` (-1), ``MINISGL_SHELL_TOP_P`` (1.0),
``MINISGL_SHELL_MAX_TOKENS`` (2048, cut to what the context leaves).
"""

from __future__ import annotations

import itertools
import os
import signal
import sys
import time
from contextlib import closing
from functools import partial
from typing import Callable, Dict, Iterator, List, TextIO

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
from minisgl.server.api_server import SchedulerStats
from minisgl.server.args import ServerArgs
from minisgl.server.launch import send_exit_msg, start_workers
from minisgl.utils.mp import WorkerDied, Workers, ZmqPullQueue, ZmqPushQueue

PROMPT = ">>> "
HELP = "/reset forgets the conversation, /stats shows the pool, /exit (or Ctrl-D) leaves"
Message = Dict[str, str]


def shell_sampling_params() -> SamplingParams:
    """The session's sampling, from ``MINISGL_SHELL_*`` (upstream's defaults)."""
    get = os.environ.get
    return SamplingParams(temperature=float(get("MINISGL_SHELL_TEMPERATURE", "0.6")),
                          top_k=int(get("MINISGL_SHELL_TOP_K", "-1")),
                          top_p=float(get("MINISGL_SHELL_TOP_P", "1.0")),
                          max_tokens=int(get("MINISGL_SHELL_MAX_TOKENS", "2048")))


class ChatClient:
    """The shell's end of the queues, synchronous (one request at a time needs no event loop):
    requests to the tokenizer worker, reply pieces from the detokenizer."""

    def __init__(self, workers: Workers):
        self.workers = workers
        self._send = ZmqPushQueue(workers.addr("tokenizer"), create=False,
                                  encoder=BaseTokenizerMsg.encoder)
        self._recv = ZmqPullQueue(workers.addr("frontend"), create=True,
                                  decoder=BaseFrontendMsg.decoder)
        self._uids = itertools.count()

    def stream(self, messages: List[Message], params: SamplingParams) -> Iterator[str]:
        """The reply's text, piece by piece. Closed before its end (Ctrl-C), it aborts the
        request, so the scheduler drops it and frees its pages."""
        uid, finished = next(self._uids), False
        self._send.put(TokenizeMsg(uid, messages, params))
        try:
            while not finished:
                for reply in self._replies(uid):
                    if reply.error:
                        raise ValueError(reply.error)
                    finished = reply.finished
                    yield reply.incremental_output
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


class Shell:
    """The conversation, and what each line of input does with it."""

    def __init__(self, client: ChatClient, params: SamplingParams, stats: SchedulerStats,
                 out: TextIO = sys.stdout):
        self.client, self.params, self.stats, self.out = client, params, stats, out
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
            self.say(f"(requests running: {s['num_running_reqs']}; KV pages in use: {in_use}, "
                     f"cached: {s['kv_pages_cached']}, of {s['kv_pages_total']})")
        elif line.startswith("/"):
            self.say(f"(unknown command {line}; {HELP})")
        elif line:
            self.turn(line)
        return True

    def turn(self, text: str) -> None:
        """One chat turn, streamed. Stopped by Ctrl-C, it is left out of the conversation, and
        the next prompt waits until the scheduler has dropped the request."""
        messages = self.history + [{"role": "user", "content": text}]
        pieces: List[str] = []
        try:
            with closing(self.client.stream(messages, self.params)) as stream:
                for piece in stream:
                    pieces.append(piece)
                    self.out.write(piece)
                    self.out.flush()
        except KeyboardInterrupt:
            self.say("\n(stopped)")
            self._wait_idle()
            return
        self.say("")
        self.history = messages + [{"role": "assistant", "content": "".join(pieces)}]

    def say(self, text: str) -> None:
        print(text, file=self.out, flush=True)

    def _wait_idle(self, timeout: float = 5.0) -> None:
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


def run_shell(args: ServerArgs) -> None:
    """Start the workers, chat until /exit or Ctrl-D, stop the workers: no process or socket
    file stays. SIGTERM ends it too (chapter 12's handler); SIGINT here means "stop the reply"."""
    with Workers() as workers:
        stats = SchedulerStats()
        start_workers(workers, args, stats)
        workers.wait_ready(timeout=env.ready_timeout_s())
        signal.signal(signal.SIGINT, signal.default_int_handler)  # KeyboardInterrupt again
        client = ChatClient(workers)
        pids = ", ".join(f"{name} (pid {p.pid})" for name, p in workers.procs.items())
        print(f"minisgl shell: {args.model_path}; workers: {pids}\n{HELP}", flush=True)
        try:
            Shell(client, shell_sampling_params(), stats).run(prompt_reader())
        except WorkerDied as e:  # the watcher has stopped the other workers
            raise SystemExit(f"minisgl: {e}; the shell has stopped") from None
        finally:
            client.close()
            workers.stop(send_exit=partial(send_exit_msg, workers.addr("tokenizer")))
