"""A warm Python for a chapter's main and tests: the book's heavy imports done once, then forked.

Importing torch and transformers' model classes costs about 9 s of CPU in every new process, and
a cold `check` starts two such processes for each of its chapters. The server started here imports
the modules that steps.yaml's `preload` names, once. Each job is a child forked from it that looks
like a fresh `python SCRIPT ARGS` or `python -m MODULE ARGS`: its own environment, working
directory, argv, sys.path, standard streams, random seeds and process group, and it exits through
the interpreter's own shutdown. The server never imports the package under test: every chapter's
tree has its own.

`python warm.py SOCKET MODULE...` serves until its stdin closes (when the tool that started it
exits, even by a crash), then kills the jobs still running. One job per connection:
  client -> server: a JSON line {"argv": [...], "cwd": ..., "env": {...}}, with the job's stdout
                    and stderr as two file descriptors (SCM_RIGHTS)
  server -> client: {"pid": N} once forked, then {"returncode": N} when the child has exited.
"""

from __future__ import annotations

import builtins
import importlib
import importlib.machinery
import json
import locale
import os
import select
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import tokenize
import traceback
import types
from pathlib import Path

START_TIMEOUT = 120  # seconds for the server to import its modules and listen


# --- the server -------------------------------------------------------------------------------


def serve(path: str, preload: list[str]) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C ends the tool, and so closes stdin
    for name in preload:
        try:
            __import__(name)
        except ImportError:
            pass  # a job that needs it meets the error itself, as it would in a new process
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen()
    print("ready", flush=True)  # the client waits for this line
    jobs: dict[int, tuple[int, socket.socket]] = {}  # pidfd -> (pid, connection)
    try:
        while True:
            ready, _, _ = select.select([sys.stdin, listener, *jobs], [], [])
            if sys.stdin in ready and not sys.stdin.buffer.read1(1):
                break  # the tool has gone
            if listener in ready:
                started = _start(listener, jobs)
                if started is not None:
                    jobs[started[0]] = started[1:]
            for pidfd in [fd for fd in ready if isinstance(fd, int)]:
                _finish(pidfd, *jobs.pop(pidfd))
    finally:
        for pid, _ in jobs.values():
            _kill_group(pid)


def _start(listener: socket.socket, jobs: dict) -> tuple[int, int, socket.socket] | None:
    """Fork the job a new connection brings; None, and nothing lost, if it brings none."""
    connection, _ = listener.accept()
    try:
        job, fds = _receive(connection)
    except (OSError, ValueError):  # a client gone mid-message: the other jobs run on
        connection.close()
        return None
    sys.stdout.flush(), sys.stderr.flush()  # nothing buffered is written twice
    pid = os.fork()
    if pid == 0:
        _leave_server(listener, jobs)
        connection.close()
        _become(job, fds)
        _run(job["argv"][1:])  # never returns: the child exits by SystemExit
    _own_group(pid)  # here too, so that a kill right after the fork finds the group
    for fd in fds:
        os.close(fd)
    connection.sendall(json.dumps({"pid": pid}).encode() + b"\n")
    return os.pidfd_open(pid), pid, connection


def _receive(connection: socket.socket) -> tuple[dict, list[int]]:
    """A job: one JSON line, the two descriptors coming with its first bytes."""
    data, fds, _, _ = socket.recv_fds(connection, 1 << 16, 2)
    try:
        while not data.endswith(b"\n"):
            more = connection.recv(1 << 16)
            if not more:
                raise ConnectionError("the client went away mid-job")
            data += more
        if len(fds) != 2:
            raise ValueError(f"a job comes with 2 descriptors, not {len(fds)}")
        return json.loads(data), fds
    except (OSError, ValueError):
        for fd in fds:
            os.close(fd)
        raise


def _leave_server(listener: socket.socket, jobs: dict) -> None:
    """In a new child: let go of the server's socket and of its siblings' jobs."""
    listener.close()
    for pidfd, (_, connection) in jobs.items():
        os.close(pidfd)
        connection.close()
    jobs.clear()  # the server's `finally` must not kill the siblings from here


def _finish(pidfd: int, pid: int, connection: socket.socket) -> None:
    _, status = os.waitpid(pid, 0)
    os.close(pidfd)
    try:
        connection.sendall(json.dumps({"returncode": os.waitstatus_to_exitcode(status)}).encode())
    except OSError:
        pass  # the client gave up on it (a timeout)
    connection.close()


def _own_group(pid: int) -> None:
    """Make `pid` the leader of a process group of its own (it does so itself as well)."""
    try:
        os.setpgid(pid, pid)
    except OSError:
        pass  # it has done so already, or has exited: either way the group is settled


def _kill_group(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


# --- the child: a fresh-looking Python --------------------------------------------------------


def _become(job: dict, fds: list[int]) -> None:
    _own_group(0)  # its own group: a timeout kills it and whatever it started
    devnull = os.open(os.devnull, os.O_RDONLY)
    for target, fd in enumerate([devnull, *fds]):
        os.dup2(fd, target)
        os.close(fd)
    os.chdir(job["cwd"])
    os.environ.clear()
    os.environ.update(job["env"])
    signal.signal(signal.SIGINT, signal.default_int_handler)
    import random

    random.seed()  # a fresh process draws fresh seeds; a fork would share the server's
    if "numpy" in sys.modules:
        sys.modules["numpy"].random.seed()


def _run(argv: list[str]) -> None:
    """`argv` as Python's command line after the interpreter: `SCRIPT ...`, `-m MODULE ...` or
    `-c CODE ...`."""
    import runpy

    try:
        if argv[0] == "-m":
            _set_path(os.getcwd())
            sys.argv = [argv[1], *argv[2:]]  # runpy puts the module's path first, as -m does
            runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
        elif argv[0] == "-c":
            _set_path("")
            sys.argv = ["-c", *argv[2:]]
            _run_code(argv[1], "<string>")
        else:
            file = os.path.abspath(argv[0])
            _set_path(os.path.dirname(file))
            sys.argv = list(argv)
            with tokenize.open(file) as source:  # honours a coding line, as Python does
                _run_code(source.read(), file)
    except SystemExit:
        raise
    except BaseException as error:  # shown as Python shows it: from the job's first frame on
        tb = error.__traceback__
        while tb is not None and (
            tb.tb_frame.f_code.co_filename == __file__
            or tb.tb_frame.f_globals.get("__name__") == "runpy"
        ):
            tb = tb.tb_next
        traceback.print_exception(type(error), error, tb)
        raise SystemExit(1) from None
    raise SystemExit(0)


def _set_path(first: str) -> None:
    """sys.path as a new process builds it: `first`, PYTHONPATH's entries, the interpreter's."""
    python_path = [
        os.path.abspath(p) for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p
    ]
    sys.path[:] = [first, *python_path, *BASE_PATH]
    sys.path_importer_cache.clear()
    importlib.invalidate_caches()


def _run_code(source: str, file: str) -> None:
    """Run `source` as the process's own `__main__`, as `python FILE` does (runpy's `run_path`
    would put the absolute path in sys.argv[0] and keep the server's `__main__`)."""
    main = types.ModuleType("__main__")
    main.__dict__.update(__builtins__=builtins, __cached__=None)
    if file != "<string>":
        loader = importlib.machinery.SourceFileLoader("__main__", file)
        main.__dict__.update(__file__=file, __loader__=loader)
    sys.modules["__main__"] = main
    exec(compile(source, file, "exec"), main.__dict__)


# --- the client -------------------------------------------------------------------------------


class WarmGone(Exception):
    """The server is not there to take a job; the caller starts a new process instead."""


class WarmPython:
    """`run` is `subprocess.run(argv, cwd=, env=, capture_output=True, text=True, timeout=)` for
    `argv = [sys.executable, SCRIPT | -m MODULE, ...]`, answered by a forked child."""

    def __init__(self, env: dict[str, str], preload: tuple[str, ...]):
        self.folder = tempfile.TemporaryDirectory(prefix="steps-warm-")
        self.path = str(Path(self.folder.name) / "socket")
        self.server = subprocess.Popen(
            [sys.executable, __file__, self.path, *preload],
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
        )
        self.ready: bool | None = None  # None until the server's first line is read
        self.lock = threading.Lock()  # the jobs of several threads wait for that line once

    def usable(self) -> bool:
        """Whether the server started; a server that did not is never asked again."""
        with self.lock:
            if self.ready is None:
                ready, _, _ = select.select([self.server.stdout], [], [], START_TIMEOUT)
                self.ready = bool(ready) and self.server.stdout.readline().strip() == "ready"
            return self.ready

    def run(
        self, argv: list[str], cwd: Path, env: dict[str, str], timeout: float
    ) -> subprocess.CompletedProcess:
        with (
            tempfile.TemporaryFile() as out,
            tempfile.TemporaryFile() as err,
            socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as connection,
        ):
            replies = connection.makefile("r")
            try:
                pid = self._send(
                    {"argv": argv, "cwd": str(cwd), "env": env},
                    connection,
                    replies,
                    [out.fileno(), err.fileno()],
                )
            except (OSError, ValueError, KeyError) as e:
                self.ready = False
                raise WarmGone(f"the warm server did not take the job: {e}") from e
            connection.settimeout(timeout)
            try:
                returncode = json.loads(replies.readline())["returncode"]
            except (TimeoutError, socket.timeout):
                _kill_group(pid)
                raise subprocess.TimeoutExpired(argv, timeout) from None
            except (OSError, ValueError, KeyError) as e:  # the server died under the job
                self.ready = False
                _kill_group(pid)
                raise WarmGone(f"the warm server went away during the job: {e}") from e
            return subprocess.CompletedProcess(argv, returncode, _read(out), _read(err))

    def _send(self, job: dict, connection: socket.socket, replies, fds: list[int]) -> int:
        """The job's pid, once the server has forked it."""
        connection.connect(self.path)
        message = json.dumps(job).encode() + b"\n"
        sent = socket.send_fds(connection, [message], fds)
        connection.sendall(message[sent:])
        return json.loads(replies.readline())["pid"]

    def close(self) -> None:
        self.server.stdin.close()  # the server kills what still runs, then exits
        self.server.wait(timeout=30)
        self.folder.cleanup()


def _read(file) -> str:
    """What the job wrote, as `subprocess.run(text=True)` gives it: decoded in the locale's
    encoding, with universal newlines (\\r\\n and \\r become \\n)."""
    file.seek(0)
    text = file.read().decode(locale.getpreferredencoding(False))
    return text.replace("\r\n", "\n").replace("\r", "\n")


BASE_PATH = sys.path[1:]  # the interpreter's own entries, without this script's folder

if __name__ == "__main__":
    serve(sys.argv[1], sys.argv[2:])
