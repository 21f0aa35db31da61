"""The warm Python: a forked job behaves as a new `python SCRIPT` or `python -m MODULE` would,
and a job that hangs, a tool that goes away or a server that is gone loses nothing."""

import json
import socket
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import yaml
from bookmaker import steps
from stepslib import check, runner
from stepslib.book import load_book
from stepslib.warm import WarmGone, WarmPython

SHOW = """\
import json, os, random, sys
print(json.dumps({"name": __name__, "argv": sys.argv, "path0": sys.path[0],
                  "in_path": os.environ.get("TOY_DIR", "") in sys.path, "cwd": os.getcwd(),
                  "env": os.environ.get("TOY_VALUE"), "random": random.random(),
                  "stdin": sys.stdin.read(), "preloaded": "decimal" in sys.modules}))
print("to stderr", file=sys.stderr)
"""


@pytest.fixture(scope="module")
def warm():
    server = WarmPython(runner.server_env(), ("json", "decimal"))
    assert server.usable()
    yield server
    server.close()


def _env(tmp_path: Path, **extra: str) -> dict[str, str]:
    env = runner.fixed_env(tmp_path / "lib")
    env.update(TOY_DIR=str(tmp_path / "lib"), **extra)
    return env


def _both(warm: WarmPython, argv: list[str], cwd: Path, env: dict[str, str]):
    forked = warm.run([sys.executable, *argv], cwd, env, 60)
    fresh = subprocess.run(
        [sys.executable, *argv],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        stdin=subprocess.DEVNULL,
    )
    return forked, fresh


def test_a_script_sees_what_a_new_process_sees(warm, tmp_path):
    (tmp_path / "show.py").write_text(SHOW)
    forked, fresh = _both(warm, ["show.py", "a b", "c"], tmp_path, _env(tmp_path, TOY_VALUE="7"))
    assert forked.returncode == fresh.returncode == 0, forked.stderr
    got, want = json.loads(forked.stdout), json.loads(fresh.stdout)
    assert got.pop("random") != want.pop("random")  # fresh seeds, not the server's
    assert got.pop("preloaded") is True and want.pop("preloaded") is False
    assert got == want
    assert want["argv"] == ["show.py", "a b", "c"] and want["in_path"] and want["env"] == "7"
    assert forked.stderr == fresh.stderr == "to stderr\n"


def test_output_is_read_as_subprocess_reads_text(warm, tmp_path):
    """Universal newlines: a progress bar's \\r and a Windows line end come back as \\n."""
    (tmp_path / "lines.py").write_text(
        "import sys\nsys.stdout.write('a\\r\\nb\\rc\\n')\nsys.stderr.write('é\\r')\n"
    )
    forked, fresh = _both(warm, ["lines.py"], tmp_path, _env(tmp_path))
    assert (forked.stdout, forked.stderr) == (fresh.stdout, fresh.stderr) == ("a\nb\nc\n", "é\n")


def test_a_client_gone_mid_message_loses_no_other_job(warm, tmp_path):
    """A connection that closes before its job is whole: the server goes on serving."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as half:
        half.connect(warm.path)
        half.sendall(b'{"argv": ')
    done = warm.run([sys.executable, "-c", "print('served')"], tmp_path, _env(tmp_path), 60)
    assert done.stdout == "served\n"


def test_a_server_that_dies_under_a_job_says_so_and_kills_the_job(tmp_path):
    server = WarmPython(runner.server_env(), ())
    assert server.usable()
    marker = tmp_path / "job.pid"
    (tmp_path / "waits.py").write_text(
        f"import os, time\nopen({str(marker)!r}, 'w').write(str(os.getpid()))\ntime.sleep(600)\n"
    )
    killer = threading.Thread(target=_kill_when_started, args=(server, marker), daemon=True)
    killer.start()
    with pytest.raises(WarmGone):
        server.run([sys.executable, "waits.py"], tmp_path, _env(tmp_path), 120)
    assert server.ready is False and _gone(int(marker.read_text()))
    server.close()


def _kill_when_started(server: WarmPython, marker: Path) -> None:
    for _ in range(600):  # bounded: at most 60 s for the job to start
        if marker.is_file() and marker.read_text():
            break
        time.sleep(0.1)
    server.server.kill()


def test_two_jobs_draw_different_random_numbers(warm, tmp_path):
    (tmp_path / "show.py").write_text(SHOW)
    runs = [warm.run([sys.executable, "show.py"], tmp_path, _env(tmp_path), 60) for _ in range(2)]
    assert runs[0].stdout != runs[1].stdout


def test_a_module_runs_as_with_dash_m(warm, tmp_path):
    package = tmp_path / "lib" / "toy"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "__main__.py").write_text(SHOW)
    forked, fresh = _both(warm, ["-m", "toy", "x"], tmp_path, _env(tmp_path))
    assert forked.returncode == fresh.returncode == 0, forked.stderr
    got, want = json.loads(forked.stdout), json.loads(fresh.stdout)
    for key in ("name", "argv", "path0", "cwd", "in_path"):
        assert got[key] == want[key], key
    assert want["argv"][0].endswith("__main__.py") and want["argv"][1:] == ["x"]


def test_exit_codes_and_tracebacks_are_python_s_own(warm, tmp_path):
    (tmp_path / "exits.py").write_text("import sys\nprint('before')\nsys.exit(3)\n")
    (tmp_path / "raises.py").write_text("def f():\n    raise KeyError('lost')\n\nf()\n")
    for script, code in (("exits.py", 3), ("raises.py", 1)):
        forked, fresh = _both(warm, [script], tmp_path, _env(tmp_path))
        assert forked.returncode == fresh.returncode == code
        assert forked.stdout == fresh.stdout
        assert forked.stderr == fresh.stderr  # no frame of the server's in the traceback


def test_a_job_can_spawn_processes_from_its_main(warm, tmp_path):
    (tmp_path / "spawns.py").write_text(
        "import multiprocessing as mp\n\n"
        "def square(x):\n    return x * x\n\n"
        "if __name__ == '__main__':\n"
        "    with mp.get_context('spawn').Pool(1) as pool:\n"
        "        print(pool.map(square, [2, 3]))\n"
    )
    forked = warm.run([sys.executable, "spawns.py"], tmp_path, _env(tmp_path), 120)
    assert (forked.returncode, forked.stdout) == (0, "[4, 9]\n"), forked.stderr


def test_jobs_of_several_threads_are_all_forked(tmp_path):
    """Jobs that arrive together, before the server is ready, wait for it and are all forked."""
    server = WarmPython(runner.server_env(), ("decimal",))
    probe = ["-c", "import sys; print('decimal' in sys.modules)"]
    with ThreadPoolExecutor(3) as pool:
        runs = list(
            pool.map(lambda _: runner.python(probe, tmp_path, _env(tmp_path), 60, server), range(3))
        )
    server.close()
    assert [run.stdout for run in runs] == ["True\n"] * 3


def test_a_timeout_kills_the_job_and_what_it_started(warm, tmp_path):
    marker = tmp_path / "child.pid"
    (tmp_path / "hangs.py").write_text(
        "import subprocess, sys, time\n"
        "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)'])\n"
        f"open({str(marker)!r}, 'w').write(str(child.pid))\n"
        "time.sleep(600)\n"
    )
    with pytest.raises(subprocess.TimeoutExpired):
        warm.run([sys.executable, "hangs.py"], tmp_path, _env(tmp_path), 3)
    child = int(marker.read_text())
    assert _gone(child), "the job's own child outlived the timeout"
    ok = warm.run([sys.executable, "-c", "print('still serving')"], tmp_path, _env(tmp_path), 60)
    assert ok.stdout == "still serving\n"


def test_closing_the_tool_kills_running_jobs(tmp_path):
    server = WarmPython(runner.server_env(), ())
    assert server.usable()
    marker = tmp_path / "job.pid"
    (tmp_path / "waits.py").write_text(
        f"import os, time\nopen({str(marker)!r}, 'w').write(str(os.getpid()))\ntime.sleep(600)\n"
    )
    job = threading.Thread(target=_run_quietly, args=(server, tmp_path), daemon=True)
    job.start()
    for _ in range(600):  # bounded: at most 60 s for the job to start
        if marker.is_file() and marker.read_text():
            break
        time.sleep(0.1)
    server.close()
    assert _gone(int(marker.read_text()))


def _run_quietly(server: WarmPython, cwd: Path) -> None:
    try:
        server.run([sys.executable, "waits.py"], cwd, _env(cwd), 600)
    except Exception:
        pass  # the server went away under it, as intended


def test_a_server_that_is_gone_falls_back_to_a_new_process(tmp_path):
    server = WarmPython(runner.server_env(), ())
    assert server.usable()
    server.server.kill()
    server.server.wait()
    done = runner.python(["-c", "print('fresh')"], tmp_path, _env(tmp_path), 60, server)
    assert done.stdout == "fresh\n" and server.ready is False
    server.close()


def test_check_gives_the_same_verdicts_warm_and_cold(book):
    """A toy chapter checked with a warm server (preload named) and without: the same table."""
    cold = steps(book, "check", "2", "--no-cache")
    data = yaml.safe_load((book / "steps.yaml").read_text())
    data["preload"] = ["json"]
    (book / "steps.yaml").write_text(yaml.safe_dump(data, sort_keys=False))
    warm = steps(book, "check", "2", "--no-cache")
    assert cold.returncode == warm.returncode == 0, warm.stderr
    assert cold.stdout == warm.stdout and "passed" in warm.stdout


KERNEL = """\
import os
os.environ.setdefault("TRITON_INTERPRET", "1")  # as the book's conftest and mains choose
import torch, triton, triton.language as tl

@triton.jit
def row_max(x, out, n: tl.constexpr):
    tl.store(out, tl.max(tl.load(x + tl.arange(0, n)), axis=0))  # tl.max is a jit function

x, out = torch.arange(8.0), torch.empty(1)
row_max[(1,)](x, out, 8)
print(out.item())
"""


@pytest.mark.skipif(runner.has_gpu(), reason="the interpreter is chosen only without a GPU")
def test_triton_imported_by_the_server_runs_in_the_interpreter_as_jobs_choose(tmp_path):
    """torch._dynamo imports triton in the server, before any job could choose the interpreter."""
    pytest.importorskip("triton")
    server = WarmPython(runner.server_env(), ("torch", "triton"))
    (tmp_path / "kernel.py").write_text(KERNEL)
    done = runner.python(["kernel.py"], tmp_path, _env(tmp_path), 120, server)
    server.close()
    assert (done.returncode, done.stdout) == (0, "7.0\n"), done.stderr[-2000:]


def _gone(pid: int) -> bool:
    """Whether `pid` has exited (bounded wait: 10 s); a zombie counts as gone."""
    for _ in range(100):
        try:
            with open(f"/proc/{pid}/stat") as stat:
                if stat.read().split(") ")[1].startswith("Z"):
                    return True
        except FileNotFoundError:
            return True
        time.sleep(0.1)
    return False


def test_the_book_preloads_only_outside_packages():
    root = Path(__file__).resolve().parents[2]
    preload = yaml.safe_load((root / "steps.yaml").read_text())["preload"]
    assert preload and not [m for m in preload if m.split(".")[0] == "minisgl"]


def test_check_runs_the_longest_chapters_first_and_records_what_each_took(book):
    """Unknown chapters go first, later ones before earlier; then by the seconds last recorded."""
    first = steps(book, "check", "2-3", "--no-cache", "-j", "1")
    assert first.returncode == 0, first.stderr
    assert _order(first.stderr) == ["ch03", "ch02"]
    recorded = json.loads((book / ".steps-cache" / "seconds.json").read_text())
    assert sorted(recorded) == ["ch02", "ch03"] and all(s > 0 for s in recorded.values())
    (book / ".steps-cache" / "seconds.json").write_text(
        json.dumps({"ch01": 50.0, "ch02": 1.0, "ch03": 9.0})
    )
    recorded = check._seconds(load_book(book))
    ordered = sorted(
        load_book(book).chapters, key=lambda c: check._expected_seconds(recorded, c), reverse=True
    )
    assert [c.id for c in ordered] == ["ch01", "ch03", "ch02"]


def _order(progress: str) -> list[str]:
    """The chapters in the order the progress lines finished them: `[1/3] ch02 pass (0.4 s)`."""
    return [line.split()[1] for line in progress.splitlines() if line.startswith("[")]
