"""Chapter 14: the interactive shell.

Runs ``python -m minisgl --model PATH --shell`` in a pseudo-terminal (pexpect), as a person at a
terminal would, and types into it: two chat turns and /reset; then, in a second shell whose
replies only the context cuts, a long reply stopped by Ctrl-C, /stats, /exit. Prints the
transcript, each reply checked against the offline API on the chat template; then what is left
of the processes and sockets.
"""

from __future__ import annotations

import os
import re
import sys
import tempfile
from pathlib import Path

import pexpect
import tiny_models
import torch
from transformers.utils import logging

import minisgl
from minisgl.core import SamplingParams
from minisgl.llm import LLM
from minisgl.tokenizer import tokenize_request

logging.set_verbosity_error()
torch.set_num_threads(1)  # as the shells' processes (OMP_NUM_THREADS): a tiny model needs no more
FLAGS = ["--device", "cpu", "--page-size", "4", "--num-pages", "128"]
MAX_TOKENS = 64  # the chat turns' replies (shown cut); the second shell's are as long as the
LONG_REPLY = 100_000  # context allows (about 480 tokens), so that Ctrl-C lands mid-reply
QUESTION, FOLLOW_UP = "What is the weather today?", "And tomorrow?"  # the first shell's lines
LONG_LINE = "Tell me a very long story"  # the second shell's, stopped by Ctrl-C


def shell_settings(max_tokens: int) -> dict[str, str]:
    """The shells' settings, as ``MINISGL_SHELL_*`` variables: greedy, ``max_tokens`` a reply, and
    no timing line after a reply (its speeds would change the prints from run to run)."""
    return {
        "MINISGL_SHELL_TEMPERATURE": "0",
        "MINISGL_SHELL_MAX_TOKENS": str(max_tokens),
        "MINISGL_SHELL_TIMING": "0",
    }


def start_shell(model: Path, tmp: str, max_tokens: int) -> pexpect.spawn:
    env = {
        **os.environ,
        "PYTHONPATH": str(Path(minisgl.__file__).parents[1]),
        "TMPDIR": tmp,
        "TERM": "dumb",
        "PROMPT_TOOLKIT_NO_CPR": "1",
        **shell_settings(max_tokens),
        "OMP_NUM_THREADS": "1",
    }
    # bounds for a loaded machine, where loading the model takes tens of seconds
    return pexpect.spawn(
        sys.executable,
        ["-m", "minisgl", "--model", str(model), "--shell", *FLAGS],
        env=env,
        timeout=120,
        encoding="utf-8",
    )


def wait_prompt(shell: pexpect.spawn) -> str:
    """What the shell printed up to its next prompt, once prompt_toolkit has taken the terminal
    (its raw mode turns the echo off; what is typed before that goes to the line discipline)."""
    shell.expect_exact(">>> ")
    assert shell.waitnoecho(timeout=60), "prompt_toolkit never took the terminal"
    return shell.before


def next_prompt(shell: pexpect.spawn) -> str:
    """What the shell printed after the typed line, up to its next prompt."""
    return wait_prompt(shell).partition("\r\r\n")[2][:-2].replace("\r\n", "\n")


def say(shell: pexpect.spawn, line: str) -> str:
    """Types a line; prints it and the reply (a chat reply quoted and cut)."""
    shell.sendline(line)
    reply = next_prompt(shell)
    if line.startswith("/"):
        print(f">>> {line}\n" + re.sub(r"cached: \d+", "cached: N", reply))
        return reply
    shown = repr(reply[:50]) + (f" ... ({len(reply)} characters)" if len(reply) > 50 else "")
    print(f">>> {line}\n{shown}")
    return reply


def stat(path: Path) -> list[str]:
    """A process's state and parent pid, from /proc (["", ""] once it is gone)."""
    try:
        return path.read_text().rsplit(")", 1)[1].split()[:2]
    except OSError:
        return ["", ""]


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        model = tiny_models.make_tiny_model("qwen3", f"{tmp}/qwen3")
        llm = LLM(str(model), device="cpu", page_size=4, num_pages=128)

        def offline(messages: list) -> str:
            ids = tokenize_request(llm.tokenizer, messages=messages)
            return llm.generate([ids], SamplingParams(max_tokens=MAX_TOKENS))[0]["text"]

        sockets = Path(tmp, "sockets")
        sockets.mkdir()
        shell = start_shell(model, str(sockets), MAX_TOKENS)
        banner = wait_prompt(shell).split("\r\n")[1]  # the first: paths, pids, load time
        print(f"(the shell starts: {banner})\n")

        turns = [{"role": "user", "content": QUESTION}]
        first = say(shell, QUESTION)
        turns += [{"role": "assistant", "content": first}, {"role": "user", "content": FOLLOW_UP}]
        second = say(shell, FOLLOW_UP)
        print(
            f"  (equal to LLM.generate on the template of all {len(turns)} messages: "
            f"{[first, second] == [offline(turns[:1]), offline(turns)]})\n"
        )
        say(shell, "/reset")
        alone = say(shell, FOLLOW_UP)
        print(
            f"  (a new conversation: equal to LLM.generate on 1 message: "
            f"{alone == offline(turns[2:])}; differs from the turn with history: "
            f"{alone != second})\n"
        )

        shell.sendline("/exit")
        shell.expect(pexpect.EOF)
        shell.close()
        assert shell.exitstatus == 0, shell.exitstatus

        # a reply that ends early (EOS, or the first shell's 64 tokens) can be over before a
        # Ctrl-C lands on a busy machine; this line's greedy reply runs to the context's end
        shell = start_shell(model, str(sockets), LONG_REPLY)
        wait_prompt(shell)
        print("(a second shell, whose replies only the context cuts: about 480 tokens)")
        shell.sendline(LONG_LINE)  # Ctrl-C once its first piece has come
        shell.expect_exact(f"{LONG_LINE}\r\r\n")
        shell.expect(r"\S")
        shell.sendintr()
        print(f">>> {LONG_LINE}   [Ctrl-C as the reply starts]")
        print(wait_prompt(shell).splitlines()[-1])
        stats = say(shell, "/stats")
        print(f"  (the aborted request's pages are back: {'in use: 0,' in stats})\n")

        workers = [p for p in Path("/proc").glob("[0-9]*/stat") if stat(p)[1] == str(shell.pid)]
        shell.sendline("/exit")
        shell.expect(pexpect.EOF)
        shell.close()
        print(
            f">>> /exit\nexit status {shell.exitstatus}; child processes: {len(workers)} "
            f"before, {sum(stat(p)[0] not in ['', 'Z'] for p in workers)} alive after; "
            f"files left in the socket directory: {len(list(sockets.iterdir()))}"
        )
        llm.shutdown()


if __name__ == "__main__":
    main()
