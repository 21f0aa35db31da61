"""Chapter 14: the interactive shell, as a person uses it: ``python -m minisgl --shell`` in a
pseudo-terminal (pexpect), on the tiny byte-level model, its replies checked against the offline
API on the chat template. Each shell loads the model in two processes, so three serve the
module: one with short replies (its last test leaves it with Ctrl-D), one whose replies only the
context cuts (Ctrl-C, then a scheduler killed under it), one with the shell's defaults (long
turns until the context is full, then /exit), one on a copy of the model that does not say its
weights are random, with ``--threads 2``. Then the same long turns through the server's chat
endpoint, and model paths that cannot be served, through the command line and ``LLM``. Every
wait is on the terminal's output (pexpect), bounded generously for a loaded machine."""

from __future__ import annotations

import pytest

# the server's packages (pip install -e .[server]): without them this file is skipped
for _package in ("zmq", "msgpack", "fastapi", "uvicorn", "prompt_toolkit", "pexpect"):
    pytest.importorskip(_package)

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
from pathlib import Path

import openai
import pexpect
import torch
from helpers import ROOT

from minisgl.core import SamplingParams
from minisgl.llm import LLM
from minisgl.tokenizer import tokenize_request

PROMPT = ">>> "
MAX_TOKENS = 24
MODEL = "qwen2bytes"  # the served model's name: its folder's, unless --served-model-name
CONTEXT = 512  # the tiny models' max_position_embeddings; the pool holds 2048 tokens
DEFAULT_REPLY = CONTEXT // 4  # the shell's default max_tokens
OPTIONS = dict(device="cpu", page_size=4, num_pages=512)
FLAGS = ["--device", "cpu", "--page-size", "4", "--num-pages", "512"]
WAIT_S = 120  # any one wait on the terminal: loading the model on a loaded 2-core machine
TRIMMED = re.compile(
    r"\((\d+) earlier turns? left out, to leave (\d+) of the context's (\d+) "
    r"tokens for the reply\)\r\n"
)
TIMING = re.compile(r"\((\d+) tokens?(?:, ([\d.]+) tokens/s)?; the first after (\d+) ms\)")
LOADING = re.compile(
    r"minisgl shell: loading (.+) \((\w+), (\d+) MB of weights\)\.\.\.(?: \d+ s\.\.\.)* "
    r"ready in [\d.]+ s; workers: scheduler \(pid \d+\), tokenizer \(pid \d+\)"
)


class ShellProcess:
    """``python -m minisgl --shell`` in a pseudo-terminal; its socket directory under ``tmp``.
    ``max_tokens=None``: the shell's own default reply length; ``flags``: more options;
    ``environ``: variables that replace the workers' defaults."""

    def __init__(
        self,
        model: Path,
        tmp: Path,
        max_tokens: int | None = MAX_TOKENS,
        flags: tuple = (),
        environ: dict | None = None,
    ):
        self.tmp = tmp
        self.timing: re.Match | None = None  # the timing line of the last reply
        env = {
            **_worker_env(tmp),
            "TERM": "dumb",
            "PROMPT_TOOLKIT_NO_CPR": "1",
            "MINISGL_SHELL_TEMPERATURE": "0",
            **(environ or {}),
        }
        env.pop("MINISGL_SHELL_MAX_TOKENS", None)
        if max_tokens is not None:
            env["MINISGL_SHELL_MAX_TOKENS"] = str(max_tokens)
        self.child = pexpect.spawn(
            sys.executable,
            ["-m", "minisgl", "--model", str(model), "--shell", *FLAGS, *flags],
            env=env,
            timeout=WAIT_S,
            encoding="utf-8",
        )
        self.banner = self.wait_prompt()  # its first line names the workers and their pids
        self.workers = _children(self.child.pid)
        # the scheduler, the tokenizer worker (and multiprocessing's resource tracker)
        assert len(self.workers) >= 2, self.workers

    def wait_prompt(self) -> str:
        """What was printed before the next prompt, once prompt_toolkit has taken the terminal
        (a Ctrl-D typed before that is the line discipline's, not the prompt's). Its raw mode
        turns the terminal's echo off: ``waitnoecho`` polls for that, 60 s at most."""
        self.child.expect_exact(PROMPT)
        assert self.child.waitnoecho(timeout=60), "prompt_toolkit never took the terminal"
        return self.child.before

    def say(self, line: str) -> str:
        """The reply to one line: what the shell printed after the echoed line, less a chat
        reply's timing line."""
        self.child.sendline(line)
        out = self.wait_prompt()
        echo, _, reply = out.partition("\r\r\n")  # the dumb terminal echoes the line so
        assert echo == line, out
        assert reply.endswith("\r\n"), out
        return self.without_timing(reply[:-2].replace("\r\n", "\n"))

    def without_timing(self, printed: str) -> str:
        """``printed`` less its last line if that is a reply's timing (kept in ``timing``)."""
        reply, _, last = printed.rpartition("\n")
        self.timing = TIMING.fullmatch(last)
        return reply if self.timing else printed

    def stats(self) -> dict:
        """The scheduler's numbers, as /stats prints them."""
        line = self.say("/stats")
        match = re.fullmatch(
            r"\(requests running: (\d+); KV pages in use: (\d+), "
            r"cached: (\d+), of (\d+)\)",
            line,
        )
        assert match, line
        return dict(zip(["running", "in use", "cached", "total"], map(int, match.groups())))

    def expect_exit(self) -> int:
        """Waits for the end; its exit status, once no worker is alive and no socket is left."""
        self.child.expect(pexpect.EOF, timeout=WAIT_S)
        self.child.close()
        assert [pid for pid in self.workers if _alive(pid)] == []
        assert list(self.tmp.rglob("*")) == [], list(self.tmp.rglob("*"))
        return self.child.exitstatus


def _worker_env(tmp: Path) -> dict:
    """This tree's package; sockets under ``tmp``; one thread per process. A tiny model gains
    nothing from a second thread, and on a loaded machine the threads of three processes wait
    for each other: 128 tokens took 7.6 s with two threads and 0.5 s with one, beside other
    jobs on 2 cores."""
    return {
        **os.environ,
        "PYTHONPATH": str(ROOT / "python"),
        "TMPDIR": str(tmp),
        "OMP_NUM_THREADS": "1",
    }


def _children(pid: int) -> list[int]:
    """The processes whose parent is ``pid`` (Linux's /proc)."""
    kids = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:  # it ended meanwhile
            continue
        if int(fields[1]) == pid:
            kids.append(int(stat.parent.name))
    return kids


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


@pytest.fixture(scope="module")
def model(tiny_models) -> Path:
    return tiny_models["qwen2bytes"]


@pytest.fixture(scope="module")
def llm(model):
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as the shell's processes run (_worker_env)
    engine = LLM(model, **OPTIONS)
    yield engine
    engine.shutdown()
    torch.set_num_threads(threads)


def _shell_fixture(max_tokens: int | None):
    """A shell for the module's tests; whatever a test left of it is ended after the last."""

    @pytest.fixture(scope="module")
    def fixture(model, tmp_path_factory):
        sh = ShellProcess(model, tmp_path_factory.mktemp("shell"), max_tokens)
        yield sh
        sh.child.terminate(force=True)

    return fixture


shell = _shell_fixture(MAX_TOKENS)  # short replies
long_shell = _shell_fixture(100_000)  # cut to the context: 490 tokens or so


def _offline(llm, messages: list, max_tokens: int = MAX_TOKENS) -> str:
    ids = tokenize_request(llm.tokenizer, messages=messages)
    return llm.generate([ids], SamplingParams(max_tokens=max_tokens))[0]["text"]


def _user(text: str) -> dict:
    return {"role": "user", "content": text}


def _assistant(text: str) -> dict:
    return {"role": "assistant", "content": text}


def test_a_greedy_turn_equals_the_offline_api_on_the_chat_template(shell, llm):
    assert shell.say("Hello there") == _offline(llm, [_user("Hello there")])


def test_the_second_turn_sees_the_first_and_reset_forgets_it(shell, llm):
    shell.say("/reset")
    first = shell.say("What is the weather today?")
    second = shell.say("And tomorrow?")
    history = [_user("What is the weather today?"), _assistant(first), _user("And tomorrow?")]
    assert second == _offline(llm, history)
    assert shell.say("/reset") == "(the conversation is forgotten)"
    alone = shell.say("And tomorrow?")
    assert alone == _offline(llm, [_user("And tomorrow?")])
    assert alone != second  # so the comparison above did see the history


def test_up_arrow_brings_back_an_earlier_line(shell, llm):
    shell.say("/reset")
    first = shell.say("Hello there")
    shell.say("/stats")
    shell.child.send("\x1b[A\x1b[A\r")  # up twice: "Hello there" again, a second turn
    reply = shell.wait_prompt().partition("\r\r\n")[2][:-2].replace("\r\n", "\n")
    reply = shell.without_timing(reply)
    history = [_user("Hello there"), _assistant(first), _user("Hello there")]
    assert reply == _offline(llm, history)


def test_the_banner_says_what_loaded_and_that_its_weights_are_random(shell, model):
    """The first line, begun before the workers start, says what loads and ends once they are
    ready; the tiny model's directory says that its weights are random, and so does the shell."""
    from minisgl.shell import HELP, RANDOM_WEIGHTS

    first, *rest = shell.banner.split("\r\n")
    loading = LOADING.fullmatch(first)
    assert loading, first
    megabytes = f"{(model / 'model.safetensors').stat().st_size / 1e6:.0f}"
    assert loading.groups() == (str(model), "Qwen2ForCausalLM", megabytes)
    assert rest[:2] == [HELP, RANDOM_WEIGHTS]  # then prompt_toolkit's escape sequences


def test_each_reply_ends_with_its_speed(shell, llm):
    """After a reply: its tokens (as many as the offline API makes), tokens per second and the
    time to the first token. A command gets no such line."""
    shell.say("/reset")
    reply = shell.say("What is the weather today?")
    ids = tokenize_request(llm.tokenizer, messages=[_user("What is the weather today?")])
    offline = llm.generate([ids], SamplingParams(max_tokens=MAX_TOKENS))[0]
    assert reply == offline["text"]
    assert shell.timing, reply
    tokens, per_second, first = shell.timing.groups()
    assert int(tokens) == len(offline["token_ids"]) > 1
    assert float(per_second) > 0 and int(first) >= 0  # a tiny model's prefill: 0 ms or so
    shell.say("/stats")
    assert shell.timing is None


def test_ctrl_d_leaves_with_status_0_and_nothing_behind(shell):
    shell.child.sendeof()
    assert shell.expect_exit() == 0


def test_ctrl_c_stops_the_reply_frees_its_pages_and_the_shell_goes_on(long_shell, llm):
    sh = long_shell
    sh.child.sendline("Tell me a long story")
    sh.child.expect_exact("Tell me a long story\r\r\n")
    sh.child.expect(r"\S{8}")  # a few pieces of the reply have come
    sh.child.sendintr()
    partial = sh.child.before + sh.child.after
    assert sh.wait_prompt().endswith("^C\r\n(stopped)\r\n")
    ids = tokenize_request(llm.tokenizer, messages=[_user("Tell me a long story")])
    full = llm.generate([ids], SamplingParams(max_tokens=100_000))[0]
    assert len(full["token_ids"]) > 400 and len(partial) < len(full["text"]) // 2
    stats = sh.stats()
    assert stats["running"] == 0 and stats["in use"] == 0  # the aborted request's pages
    # are back, in the prefix cache: the prompt and the tokens made before the abort, not
    # the whole reply (which a request left running would have written). Less than half of
    # it: on a loaded CPU a few hundred tokens can come before the Ctrl-C is handled
    assert stats["cached"] * 4 < len(ids) + len(full["token_ids"]) // 2
    # the next line is answered, and the stopped turn is not in the conversation
    assert sh.say("Tell me a long story") == full["text"]


def test_a_dying_worker_stops_the_shell_with_a_message(long_shell):
    sh = long_shell
    scheduler = int(re.search(r"scheduler \(pid (\d+)\)", sh.banner)[1])
    sh.say("/reset")
    sh.child.sendline("Tell me a long story")
    sh.child.expect_exact("Tell me a long story\r\r\n")
    sh.child.expect(r"\S{8}")  # the reply is under way
    os.kill(scheduler, signal.SIGKILL)
    sh.child.expect_exact(
        "minisgl: the scheduler process was killed by SIGKILL; the shell has stopped"
    )
    assert sh.expect_exit() == 1
    assert "Traceback" not in sh.child.before


# ---------------------------------------------------------------- a full context
def test_the_oldest_turns_go_first_and_a_system_message_stays():
    """``fit_to_context`` with a count of one token per character of content."""
    from minisgl.shell import fit_to_context

    def count(messages: list) -> int:
        return sum(len(m["content"]) for m in messages)

    system = {"role": "system", "content": "s" * 10}
    turns = [_user("a" * 10), _assistant("b" * 10), _user("c" * 10), _assistant("d" * 10)]
    new = _user("e" * 10)
    assert fit_to_context([system, *turns, new], count, 60) == ([system, *turns, new], 0)
    assert fit_to_context([system, *turns, new], count, 59) == ([system, *turns[2:], new], 1)
    assert fit_to_context([system, *turns, new], count, 40) == ([system, *turns[2:], new], 1)
    assert fit_to_context([system, *turns, new], count, 39) == ([system, new], 2)
    assert fit_to_context([*turns, new], count, 30) == ([*turns[2:], new], 1)
    # the new line stays even when it alone is too long: the scheduler refuses it
    assert fit_to_context([*turns, new], count, 5) == ([new], 2)
    assert fit_to_context([system, new], count, 5) == ([system, new], 0)


LINES = [
    "Tell me a long story",
    "What happened next?",
    "And then?",
    "Tell me about the robot",
    "What did the children ask?",
    "And the weather?",
]


def test_long_turns_on_the_shells_defaults_trim_the_history_and_never_end_it(model, llm, tmp_path):
    """The shell as it starts without MINISGL_SHELL_*_TOKENS: replies of a quarter of the
    context, so that after a few turns the conversation no longer fits. Each turn's reply is
    printed; the oldest turns are left out, as few as fit, and the shell says so; the reply is
    the offline API's on what is left; a line longer than the context is refused in one line;
    /exit still leaves cleanly."""
    sh = ShellProcess(model, tmp_path, max_tokens=None)
    try:
        assert "random weights" in sh.banner and "random text" in sh.banner
        history: list = []
        trims = []
        for line in LINES:
            sh.child.sendline(line)
            sh.child.expect_exact(f"{line}\r\r\n")
            printed = sh.wait_prompt()
            match = TRIMMED.match(printed)
            dropped = int(match[1]) if match else 0
            if match:
                assert (int(match[2]), int(match[3])) == (DEFAULT_REPLY, CONTEXT), printed
                trims.append(dropped)
            reply = printed[match.end() if match else 0 :]
            assert reply.endswith("\r\n") and "Traceback" not in printed, printed
            reply = sh.without_timing(reply[:-2].replace("\r\n", "\n"))
            assert sh.timing, printed  # every finished reply ends with its timing line
            assert reply, printed  # the greedy reply runs on: no EOS at once
            kept = history[2 * dropped :] + [_user(line)]
            # the fewest turns left out that leave room for a whole reply
            assert _prompt_len(llm, kept) <= CONTEXT - DEFAULT_REPLY
            if dropped:
                assert (
                    _prompt_len(llm, history[2 * dropped - 2 :] + [_user(line)])
                    > CONTEXT - DEFAULT_REPLY
                )
            if match and len(trims) == 1:  # what the model saw: the kept turns, nothing else
                assert reply == _offline(llm, kept, DEFAULT_REPLY)
            history = kept + [_assistant(reply)]
        assert trims and sum(trims) >= 2, trims
        # a line longer than the context alone: refused in one line, and the shell goes on
        too_long = "7" * (CONTEXT + 10)  # one token per digit
        assert _prompt_len(llm, [_user(too_long)]) >= CONTEXT
        sh.child.sendline(too_long)
        sh.child.expect(
            r"\(refused: the prompt has (\d+) tokens: the context holds "
            rf"max_seq_len={CONTEXT}, so a prompt has at most {CONTEXT - 1}\)\r\n"
        )
        assert int(sh.child.match[1]) == _prompt_len(llm, [_user(too_long)])
        assert "Traceback" not in sh.child.before
        sh.wait_prompt()
        assert sh.say("/reset") == "(the conversation is forgotten)"
        assert sh.say(LINES[0]) == _offline(llm, [_user(LINES[0])], DEFAULT_REPLY)
        sh.child.sendline("/exit")
        assert sh.expect_exit() == 0
        assert "Traceback" not in sh.child.before
    finally:
        sh.child.terminate(force=True)


def _prompt_len(llm, messages: list) -> int:
    return len(tokenize_request(llm.tokenizer, messages=messages))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_the_chat_endpoint_refuses_a_too_long_conversation_with_400_and_goes_on(
    model, llm, tmp_path
):
    """Long turns through ``/v1/chat/completions`` (the official client): the server keeps
    no history of its own, so the conversation outgrows the context. That request gets a 400
    naming the prompt's length and the context, streamed or not; the next is served."""
    port = _free_port()
    server = pexpect.spawn(
        sys.executable,
        ["-m", "minisgl", "--model", str(model), "--port", str(port), *FLAGS],
        env=_worker_env(tmp_path),
        timeout=WAIT_S,
        encoding="utf-8",
    )
    try:
        server.expect_exact(f"minisgl: serving {model} on http://127.0.0.1:{port}")
        # the port is bound just after that line: the client retries a refused connection
        client = openai.OpenAI(
            base_url=f"http://127.0.0.1:{port}/v1", api_key="none", max_retries=5, timeout=WAIT_S
        )
        messages: list = []
        for line in LINES:
            messages.append(_user(line))
            if _prompt_len(llm, messages) >= CONTEXT:
                break
            reply = client.chat.completions.create(
                model=MODEL, messages=messages, max_tokens=200, temperature=0
            )
            assert reply.usage.prompt_tokens == _prompt_len(llm, messages)
            messages.append(_assistant(reply.choices[0].message.content))
        n = _prompt_len(llm, messages)
        assert len(messages) > 3 and n >= CONTEXT  # two turns and more, then too long
        expected = (
            f"the prompt has {n} tokens: the context holds max_seq_len={CONTEXT}, so "
            f"a prompt has at most {CONTEXT - 1}"
        )
        for stream in (False, True):
            with pytest.raises(openai.BadRequestError) as refused:
                client.chat.completions.create(
                    model=MODEL, messages=messages, max_tokens=8, stream=stream
                )
            assert refused.value.status_code == 400
            assert refused.value.body["message"] == expected
        after = client.chat.completions.create(
            model=MODEL, messages=messages[-1:], max_tokens=8, temperature=0
        )
        assert after.choices[0].message.content == _offline(llm, messages[-1:], 8)
        server.kill(signal.SIGTERM)
        server.expect_exact("minisgl: SIGTERM received; the server has stopped")
        server.expect(pexpect.EOF)
        server.close()
        assert server.exitstatus == 0 and list(tmp_path.rglob("*")) == []
    finally:
        server.terminate(force=True)


class _IdleStats:
    """The scheduler's numbers as an idle scheduler's shared array reads them."""

    def read(self) -> dict:
        return {"num_running_reqs": 0}


def _bare_shell() -> tuple:
    """A Shell with no workers behind it (lines that never reach the scheduler), its output."""
    import io

    from minisgl.shell import Shell

    out = io.StringIO()
    return Shell(None, None, _IdleStats(), len, CONTEXT, out=out), out  # type: ignore[arg-type]


def test_an_unknown_command_gets_the_help_line_and_no_turn():
    """In process: no reply is asked for, the conversation stays as it was, the shell goes on;
    an empty line says nothing."""
    from minisgl.shell import HELP

    shell, out = _bare_shell()
    assert shell.handle("/nope") and shell.handle("")
    assert out.getvalue() == f"(unknown command /nope; {HELP})\n"
    assert shell.history == [] and not shell.handle("/exit")


def test_waiting_for_an_idle_scheduler_does_not_wait():
    """After Ctrl-C the shell waits for the scheduler to drop the request, and no longer: an idle
    one is not waited on for the whole timeout."""
    import time

    shell, _ = _bare_shell()
    started = time.monotonic()
    shell._wait_idle(timeout=5.0)
    assert time.monotonic() - started < 1.0


def test_a_shell_on_a_pipe_reads_plain_lines(monkeypatch):
    """Not a terminal (``python -m minisgl --shell < lines.txt``): plain ``input``, no
    prompt_toolkit, which would refuse a pipe."""
    import io

    from minisgl.shell import prompt_reader

    monkeypatch.setattr(sys, "stdin", io.StringIO("/stats\n"))
    assert prompt_reader()() == "/stats"


def _shell_after_three_turns(new_line: int) -> str:
    """A Shell whose client streams "ok", tokens counted as characters, 100 of context and 20
    for the reply: three turns of 12 tokens, then a line of ``new_line`` tokens. Its output."""
    import io

    from minisgl.core import SamplingParams
    from minisgl.message import UserReply
    from minisgl.shell import Shell

    class Client:
        def stream(self, messages: list, params: SamplingParams):
            yield UserReply(0, "ok", True, token_ids=[7])

    def count(messages: list) -> int:
        return sum(len(m["content"]) for m in messages)

    out = io.StringIO()
    shell = Shell(Client(), SamplingParams(max_tokens=20), _IdleStats(), count, 100, out=out)
    for _ in range(3):
        shell.handle("a" * 10)
    shell.handle("b" * new_line)
    return out.getvalue()


def test_the_turns_left_out_are_counted_in_words():
    """36 tokens of history and a line of 50 leave out one turn to fit 80; of 60, two."""
    note = "left out, to leave 20 of the context's 100 tokens for the reply)\n"
    assert f"(1 earlier turn {note}" in _shell_after_three_turns(50)
    assert f"(2 earlier turns {note}" in _shell_after_three_turns(60)


def test_the_timing_line_counts_the_tokens_after_the_first(monkeypatch):
    """Decode speed: the tokens after the first over the time after the first (a clock that
    reads 0 when the request is sent, 0.5 at the first token, 1.5 at the fifth)."""
    from minisgl.message import UserReply
    from minisgl.shell import ReplyTiming

    clock = iter([0.5, 1.0, 1.5])
    monkeypatch.setattr("minisgl.shell.time.monotonic", lambda: next(clock))
    timing = ReplyTiming(sent=0.0)
    for ids in ([1], [2, 3], [4, 5]):
        timing.add(UserReply(0, "x", False, token_ids=ids))
    assert timing.line() == "(5 tokens, 4.0 tokens/s; the first after 500 ms)"
    one = ReplyTiming(sent=0.0, first=0.25, last=0.25, tokens=1)
    assert one.line() == "(1 token; the first after 250 ms)"


def test_minisgl_shell_timing_0_leaves_the_timing_line_out(monkeypatch):
    """A session whose prints must not vary (the chapter's main) turns the line off."""
    import io

    from minisgl.core import SamplingParams
    from minisgl.message import UserReply
    from minisgl.shell import Shell, shell_timing

    class Client:
        def stream(self, messages: list, params: SamplingParams):
            yield UserReply(0, "hi", False, token_ids=[1])
            yield UserReply(0, "!", True, token_ids=[2])

    def printed(timing: bool) -> str:
        out = io.StringIO()
        shell = Shell(Client(), SamplingParams(), _IdleStats(), len, CONTEXT, out, timing)
        shell.handle("hello")
        return out.getvalue()

    assert printed(False) == "hi!\n"
    assert TIMING.fullmatch(printed(True).split("\n")[1]), printed(True)
    monkeypatch.setenv("MINISGL_SHELL_TIMING", "0")
    assert not shell_timing()
    monkeypatch.delenv("MINISGL_SHELL_TIMING")
    assert shell_timing()


def test_the_loading_line_ticks_while_the_workers_load_and_a_failure_ends_it():
    import io
    import time

    from minisgl.shell import loading_line

    out = io.StringIO()
    with loading_line("MODEL", out, every_s=0.05) as elapsed:
        time.sleep(0.3)
    assert elapsed() >= 0.3
    assert re.fullmatch(r"minisgl shell: loading MODEL\.\.\.(?: 0 s\.\.\.)+", out.getvalue())
    out = io.StringIO()
    with pytest.raises(TimeoutError), loading_line("MODEL", out):
        raise TimeoutError("not ready")
    assert out.getvalue() == "minisgl shell: loading MODEL...\n"  # the error's line is its own


def test_threads_is_a_positive_count():
    from minisgl.server.args import parse_args

    assert parse_args(["--model", "/m", "--threads", "3"]).threads == 3
    assert parse_args(["--model", "/m"]).threads is None
    with pytest.raises(SystemExit):
        parse_args(["--model", "/m", "--threads", "0"])


def test_the_default_threads_are_the_cores_left_idle(monkeypatch):
    """No ``--threads``: OMP_NUM_THREADS if set, else torch's cores less the whole part of the
    1-minute load average, at least one; ``--threads`` wins over both."""
    from minisgl.server import launch
    from minisgl.server.args import parse_args

    args = parse_args(["--model", "/m"])
    monkeypatch.setattr(launch.torch, "get_num_threads", lambda: 4)
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    for load, threads in ((0.6, 4), (1.4, 3), (2.9, 2), (9.0, 1)):
        monkeypatch.setattr(launch.os, "getloadavg", lambda load=load: (load, 0.0, 0.0))
        assert launch.engine_threads(args) == threads, load
    monkeypatch.setenv("OMP_NUM_THREADS", "4")  # the user's own choice: the load is not read
    assert launch.engine_threads(args) == 4
    assert launch.engine_threads(parse_args(["--model", "/m", "--threads", "2"])) == 2


# ---------------------------------------------------------------- a model that says nothing
@pytest.fixture(scope="module")
def plain_shell(model, tmp_path_factory):
    """A shell on a copy of the tiny model without its ``random_weights.txt`` (as a trained
    checkpoint has none), started with ``--threads 2``."""
    from minisgl.shell import RANDOM_WEIGHTS_FILE

    copy = tmp_path_factory.mktemp("plain") / "model"
    shutil.copytree(model, copy, ignore=shutil.ignore_patterns(RANDOM_WEIGHTS_FILE))
    sh = ShellProcess(
        copy,
        tmp_path_factory.mktemp("shell"),
        flags=("--threads", "2"),
        environ={"OMP_NUM_THREADS": "3"},  # neither worker may keep the shell's own
    )
    yield sh
    sh.child.terminate(force=True)


def test_a_model_that_does_not_say_its_weights_are_random_gets_no_such_line(plain_shell):
    from minisgl.shell import HELP

    first, *rest = plain_shell.banner.split("\r\n")
    assert LOADING.fullmatch(first), first
    assert rest[0] == HELP and "random" not in plain_shell.banner


def test_threads_go_to_the_scheduler_and_one_to_the_tokenizer(plain_shell):
    """``--threads 2``: torch in the scheduler process starts with OMP_NUM_THREADS=2, in the
    tokenizer worker with 1 (the shell's own environment says 3)."""
    pids = dict(re.findall(r"(\w+) \(pid (\d+)\)", plain_shell.banner))
    assert _environ(pids["scheduler"])["OMP_NUM_THREADS"] == "2"
    assert _environ(pids["tokenizer"])["OMP_NUM_THREADS"] == "1"
    assert plain_shell.say("Hello there")  # the scheduler runs with them
    assert plain_shell.timing
    plain_shell.child.sendline("/exit")
    assert plain_shell.expect_exit() == 0


def _environ(pid: str) -> dict:
    """A process's environment as it started (Linux's /proc)."""
    raw = Path(f"/proc/{pid}/environ").read_bytes().decode(errors="replace")
    return dict(item.split("=", 1) for item in raw.split("\0") if "=" in item)


# ---------------------------------------------------------------- model paths not served
MAKE = "python examples/real_model.py"
KNOWN = "LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM, Qwen3ForCausalLM, " + (
    "Qwen3MoeForCausalLM"
)


@pytest.fixture(scope="module")
def bad_models(model, tmp_path_factory) -> dict:
    """Paths that cannot be served, each with the one line that says so."""
    from safetensors.torch import load_file

    root = tmp_path_factory.mktemp("bad")
    missing, file, empty = root / "nowhere", root / "file.txt", root / "empty"
    file.write_text("x")
    empty.mkdir()
    gpt2, pickled, bare = (
        shutil.copytree(model, root / name) for name in ("gpt2", "pickled", "bare")
    )
    config = json.loads((gpt2 / "config.json").read_text())
    (gpt2 / "config.json").write_text(json.dumps({**config, "architectures": ["GPT2LMHeadModel"]}))
    torch.save(load_file(pickled / "model.safetensors"), pickled / "pytorch_model.bin")
    (pickled / "model.safetensors").unlink()
    (bare / "model.safetensors").unlink()
    convert = (
        f"from transformers import AutoModelForCausalLM as M; "
        f"M.from_pretrained('{pickled}').save_pretrained('{pickled}')"
    )
    return {
        "missing": (
            missing,
            f"model path '{missing}' does not exist; to make a model there: {MAKE} {missing}",
        ),
        "file": (file, f"model path '{file}' is not a directory; to make one: {MAKE} DIR"),
        "empty": (
            empty,
            f"model directory '{empty}' has no config.json: not a Hugging Face model directory; "
            f"to make a model there: {MAKE} {empty}",
        ),
        "gpt2": (
            gpt2,
            f"model directory '{gpt2}': unknown model architecture 'GPT2LMHeadModel'; known: "
            f"{KNOWN}; to make a model of one: {MAKE} DIR",
        ),
        "pickled": (
            pickled,
            f"model directory '{pickled}' has no *.safetensors files: pytorch_model.bin is in "
            f"torch.save's format, which minisgl does not read; to convert it to safetensors: "
            f'python -c "{convert}"',
        ),
        "bare": (
            bare,
            f"model directory '{bare}' has no *.safetensors files: no weights; to make a model "
            f"there: {MAKE} {bare}",
        ),
    }


def _command_line(bad_models: dict, case: str, *flags: str) -> tuple:
    """``python -m minisgl --model PATH *flags`` on a bad path, in a pseudo-terminal: what it
    printed, as lines, and its exit status."""
    path, _ = bad_models[case]
    child = pexpect.spawn(
        sys.executable,
        ["-m", "minisgl", "--model", str(path), *flags, *FLAGS],
        env=_worker_env(path.parent),
        timeout=WAIT_S,
        encoding="utf-8",
    )
    child.expect(pexpect.EOF)
    child.close()
    return child.before.splitlines(), child.exitstatus


@pytest.mark.parametrize("case", ["missing", "file", "empty", "gpt2", "pickled", "bare"])
def test_a_path_the_shell_cannot_serve_is_one_line_and_status_1(bad_models, case):
    """Before any worker starts: one line that names the path and the command that fixes it."""
    lines, status = _command_line(bad_models, case, "--shell")
    assert lines == [f"minisgl: {bad_models[case][1]}"]
    assert status == 1


def test_the_server_says_the_same_line(bad_models):
    for case in ("missing", "pickled"):
        assert _command_line(bad_models, case) == ([f"minisgl: {bad_models[case][1]}"], 1)


@pytest.mark.parametrize("case", ["missing", "file", "empty", "gpt2", "pickled", "bare"])
def test_llm_raises_the_same_message(bad_models, case):
    path, message = bad_models[case]
    with pytest.raises((OSError, ValueError)) as refused:
        LLM(str(path), **OPTIONS)
    assert str(refused.value) == message


def test_the_command_in_the_line_converts_a_pickled_checkpoint(bad_models, llm, tmp_path):
    """The conversion the line names, run as printed on a copy of the pickled checkpoint: the
    copy then loads, and answers as the model it was made from."""
    from minisgl.models.register import MODELS
    from minisgl.utils.hf import check_model_dir

    path = shutil.copytree(bad_models["pickled"][0], tmp_path / "pickled")
    with pytest.raises(FileNotFoundError) as refused:
        check_model_dir(path, MODELS.names())
    command = str(refused.value).split('python -c "', 1)[1][:-1]
    subprocess.run([sys.executable, "-c", command], check=True, capture_output=True)
    converted = LLM(str(path), **OPTIONS)
    try:
        params = SamplingParams(max_tokens=8)
        assert converted.generate(["Hello"], params) == llm.generate(["Hello"], params)
    finally:
        converted.shutdown()
