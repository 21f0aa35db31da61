"""Chapter 14: the interactive shell, as a person uses it: ``python -m minisgl --shell`` in a
pseudo-terminal (pexpect), on the tiny byte-level model, its replies checked against the offline
API on the chat template. One shell for the module (it loads the model in two processes); the
Ctrl-D test starts its own, since leaving ends it."""

from __future__ import annotations

import pytest

# the server's packages (pip install -e .[server]): without them this file is skipped
for _package in ("zmq", "msgpack", "fastapi", "uvicorn", "prompt_toolkit", "pexpect"):
    pytest.importorskip(_package)

import os
import re
import signal
import sys
from pathlib import Path

import pexpect
from helpers import ROOT
from minisgl.core import SamplingParams
from minisgl.llm import LLM
from minisgl.tokenizer import tokenize_request

PROMPT = ">>> "
MAX_TOKENS = 24
OPTIONS = dict(device="cpu", page_size=4, num_pages=512)
FLAGS = ["--device", "cpu", "--page-size", "4", "--num-pages", "512"]


class ShellProcess:
    """``python -m minisgl --shell`` in a pseudo-terminal; its socket directory under ``tmp``."""

    def __init__(self, model: Path, tmp: Path, max_tokens: int = MAX_TOKENS):
        self.tmp = tmp
        env = {**os.environ, "PYTHONPATH": str(ROOT / "python"), "TMPDIR": str(tmp),
               "TERM": "dumb", "PROMPT_TOOLKIT_NO_CPR": "1", "MINISGL_SHELL_TEMPERATURE": "0",
               "MINISGL_SHELL_MAX_TOKENS": str(max_tokens)}
        self.child = pexpect.spawn(sys.executable, ["-m", "minisgl", "--model", str(model),
                                                    "--shell", *FLAGS],
                                   env=env, timeout=20, encoding="utf-8")
        self.banner = self.wait_prompt()  # its first line names the workers and their pids
        self.workers = _children(self.child.pid)
        # the scheduler, the tokenizer worker (and multiprocessing's resource tracker)
        assert len(self.workers) >= 2, self.workers

    def wait_prompt(self) -> str:
        """What was printed before the next prompt, once prompt_toolkit has taken the terminal
        (a Ctrl-D typed before that is the line discipline's, not the prompt's). Its raw mode
        turns the terminal's echo off: ``waitnoecho`` polls for that, 10 s at most."""
        self.child.expect_exact(PROMPT)
        assert self.child.waitnoecho(timeout=10), "prompt_toolkit never took the terminal"
        return self.child.before

    def say(self, line: str) -> str:
        """The reply to one line: what the shell printed after the echoed line."""
        self.child.sendline(line)
        out = self.wait_prompt()
        echo, _, reply = out.partition("\r\r\n")  # the dumb terminal echoes the line so
        assert echo == line, out
        assert reply.endswith("\r\n"), out
        return reply[:-2].replace("\r\n", "\n")

    def stats(self) -> dict:
        """The scheduler's numbers, as /stats prints them."""
        line = self.say("/stats")
        match = re.fullmatch(r"\(requests running: (\d+); KV pages in use: (\d+), "
                             r"cached: (\d+), of (\d+)\)", line)
        assert match, line
        return dict(zip(["running", "in use", "cached", "total"], map(int, match.groups())))

    def expect_exit(self) -> int:
        """Waits for the end; its exit status, once no worker is alive and no socket is left."""
        self.child.expect(pexpect.EOF, timeout=20)
        self.child.close()
        assert [pid for pid in self.workers if _alive(pid)] == []
        assert list(self.tmp.rglob("*")) == [], list(self.tmp.rglob("*"))
        return self.child.exitstatus


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
    engine = LLM(model, **OPTIONS)
    yield engine
    engine.shutdown()


@pytest.fixture(scope="module")
def shell(model, tmp_path_factory):
    sh = ShellProcess(model, tmp_path_factory.mktemp("shell"))
    yield sh
    if sh.child.isalive():
        sh.child.terminate(force=True)


def _offline(llm, messages: list, max_tokens: int = MAX_TOKENS) -> str:
    ids = tokenize_request(llm.tokenizer, messages=messages)
    return llm.generate([ids], SamplingParams(max_tokens=max_tokens))[0]["text"]


def _user(text: str) -> dict:
    return {"role": "user", "content": text}


def test_a_greedy_turn_equals_the_offline_api_on_the_chat_template(shell, llm):
    assert shell.say("Hello there") == _offline(llm, [_user("Hello there")])


def test_the_second_turn_sees_the_first_and_reset_forgets_it(shell, llm):
    shell.say("/reset")
    first = shell.say("What is the weather today?")
    second = shell.say("And tomorrow?")
    history = [_user("What is the weather today?"), {"role": "assistant", "content": first},
               _user("And tomorrow?")]
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
    history = [_user("Hello there"), {"role": "assistant", "content": first},
               _user("Hello there")]
    assert reply == _offline(llm, history)


def test_ctrl_c_stops_the_reply_frees_its_pages_and_the_shell_goes_on(model, tmp_path, llm):
    sh = ShellProcess(model, tmp_path, max_tokens=100_000)  # cut to the context: 490 or so
    try:
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
        sh.child.sendline("/exit")
        assert sh.expect_exit() == 0
    finally:
        sh.child.terminate(force=True)


def test_exit_leaves_with_status_0_and_nothing_behind(shell):
    shell.child.sendline("/exit")
    assert shell.expect_exit() == 0


def test_a_dying_worker_stops_the_shell_with_a_message(model, tmp_path):
    sh = ShellProcess(model, tmp_path, max_tokens=100_000)
    try:
        scheduler = int(re.search(r"scheduler \(pid (\d+)\)", sh.banner)[1])
        sh.child.sendline("Tell me a long story")
        sh.child.expect(r"\S{8}")  # the reply is under way
        os.kill(scheduler, signal.SIGKILL)
        sh.child.expect_exact("minisgl: the scheduler process was killed by SIGKILL; "
                              "the shell has stopped")
        assert sh.expect_exit() == 1
        assert "Traceback" not in sh.child.before
    finally:
        sh.child.terminate(force=True)


def test_ctrl_d_leaves_with_status_0_and_nothing_behind(model, tmp_path):
    sh = ShellProcess(model, tmp_path)
    try:
        sh.child.sendeof()
        assert sh.expect_exit() == 0
    finally:
        sh.child.terminate(force=True)
