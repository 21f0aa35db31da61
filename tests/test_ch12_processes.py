"""Chapter 12: processes and messages. Every message type survives msgpack; replies through real
processes and sockets equal LLM.generate; an abort frees its pages; a dead worker, SIGTERM or an
exit message stops every process with no socket file left; an idle scheduler sleeps. Every wait
is on an event (a message, a process's end, a line), with a bound that a loaded machine meets."""

from __future__ import annotations

import pytest

# the server's packages (pip install -e .[server]): without them this file is skipped
for _package in ("zmq", "msgpack"):
    pytest.importorskip(_package)

import collections
import os
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

import msgpack
import torch
from helpers import (
    ROOT,
    START_TIMEOUT,
    assert_pages_all_back,
    build_llm,
    greedy,
    hf_greedy,
    modules_imported,
)

from minisgl.core import SamplingParams
from minisgl.message import (
    AbortBackendMsg,
    AbortMsg,
    BaseBackendMsg,
    BaseFrontendMsg,
    BaseTokenizerMsg,
    BatchBackendMsg,
    BatchFrontendMsg,
    BatchTokenizerMsg,
    DetokenizeMsg,
    ExitMsg,
    TokenizeMsg,
    UserMsg,
    UserReply,
)
from minisgl.scheduler import Scheduler, SchedulerConfig
from minisgl.scheduler.io import SchedulerLoop, run_scheduler
from minisgl.tokenizer.server import TokenizerServer, tokenizer_worker
from minisgl.utils.mp import WorkerDied, Workers, ZmqPullQueue, ZmqPushQueue

OPTIONS = dict(device="cpu", page_size=4, num_pages=256, max_running_req=8)
PROMPTS = [
    "Hello world",
    "The quick brown fox jumps over the lazy dog.",
    "Once upon a time",
    "1 2 3 4 5",
]
TIMEOUT = 30.0  # seconds a reply or a process's end may take (a start: START_TIMEOUT)


# ---- messages --------------------------------------------------------------------------------


def _same(a, b) -> bool:
    """Equal, field by field; tensors equal in dtype, shape and values."""
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b)
    if hasattr(a, "__dataclass_fields__"):
        return type(a) is type(b) and all(
            _same(getattr(a, f), getattr(b, f)) for f in a.__dataclass_fields__
        )
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    return type(a) is type(b) and a == b


def _round_trip(msg, base):
    raw = msgpack.packb(base.encoder(msg), use_bin_type=True)
    assert isinstance(raw, bytes)
    return base.decoder(msgpack.unpackb(raw, raw=False))


SAMPLED = SamplingParams(temperature=0.7, top_k=20, top_p=0.9, max_tokens=5, ignore_eos=True)
TENSORS = [
    torch.tensor([1, 2, 3], dtype=torch.int32),
    torch.tensor([-1, 2**40], dtype=torch.int64),
    torch.tensor([0.5, -1e-30, float("inf")]),
    torch.tensor([1.5, -2.25], dtype=torch.bfloat16),
    torch.tensor([0.1, 65504.0], dtype=torch.float16),
    torch.tensor([True, False]),
    torch.tensor([0, 255], dtype=torch.uint8),
    torch.empty(0, dtype=torch.int32),
]


@pytest.mark.parametrize("ids", TENSORS, ids=lambda t: str(t.dtype))
def test_user_msg_round_trips_tensors_of_every_dtype(ids):
    msg = UserMsg(3, ids, SAMPLED)
    back = _round_trip(msg, BaseBackendMsg)
    assert _same(back, msg) and back.input_ids.is_contiguous()


BACKEND = [
    AbortBackendMsg(9),
    ExitMsg(),
    UserMsg(0, TENSORS[0], SamplingParams()),
    BatchBackendMsg([UserMsg(1, TENSORS[1], SAMPLED), AbortBackendMsg(1), ExitMsg()]),
]
TOKENIZER = [
    TokenizeMsg(0, "Héllo 你好 😀", SAMPLED),
    TokenizeMsg(1, [5, 6, 7], greedy(3), stop=["\n", "."]),
    TokenizeMsg(2, [{"role": "user", "content": "Hi"}], SamplingParams()),
    DetokenizeMsg(4, 17, False),
    DetokenizeMsg(4, 2, True, "stop"),
    DetokenizeMsg(5, -1, True, "error", "the prompt is empty"),
    AbortMsg(6),
    ExitMsg(),
    BatchTokenizerMsg([DetokenizeMsg(1, 3, False), AbortMsg(2)]),
]
FRONTEND = [
    UserReply(0, "wörld 😀", False, token_ids=[3, 4], num_prompt_tokens=5),
    UserReply(1, "", True, "error", error="bad"),
    BatchFrontendMsg([UserReply(2, "a", False), UserReply(2, "b", True, "length", [9])]),
]


@pytest.mark.parametrize(
    "base, msg",
    [(BaseBackendMsg, m) for m in BACKEND]
    + [(BaseTokenizerMsg, m) for m in TOKENIZER]
    + [(BaseFrontendMsg, m) for m in FRONTEND],
    ids=repr,
)
def test_every_message_type_round_trips(base, msg):
    assert _same(_round_trip(msg, base), msg)


def test_messages_refuse_what_they_cannot_carry():
    with pytest.raises(ValueError, match="1-D"):
        BaseBackendMsg.encoder(UserMsg(0, torch.zeros(2, 2), SamplingParams()))
    with pytest.raises(TypeError, match="cannot send a object"):
        BaseBackendMsg.encoder(AbortBackendMsg(object()))
    # a queue decodes only its own family: a reply sent to the scheduler is refused by name
    with pytest.raises(TypeError, match="unexpected message type 'UserReply'"):
        BaseBackendMsg.decoder(BaseFrontendMsg.encoder(UserReply(0, "", True)))


# ---- the scheduler's loop and the tokenizer server, in this process ----------------------------


def test_abort_frees_the_pages_of_waiting_prefilling_and_decoding_requests(tiny_models):
    path = tiny_models["llama3"]
    s = Scheduler(
        SchedulerConfig(
            str(path),
            device="cpu",
            page_size=4,
            num_pages=64,
            max_running_req=2,
            max_extend_tokens=6,
        )
    )
    loop = SchedulerLoop(s)
    long = list(range(20, 40))  # 20 tokens: chunks of at most 6
    for uid, ids in enumerate([[5, 6, 7], long, [8, 9, 10, 11]]):
        loop.handle(UserMsg(uid, torch.tensor(ids, dtype=torch.int32), greedy(30)))
    sent = loop.step() + loop.step()  # prefill 0 and a chunk of 1; the next chunk of 1
    reqs = {r.uid: r for r in s.decode_manager.running_reqs + s.waiting}
    assert [m.uid for m in sent] == [0] and 0 < reqs[1].cached_len < len(long)
    assert reqs[0] in s.decode_manager.running_reqs  # 0 decodes
    assert reqs[1].table_idx >= 0 and reqs[2].table_idx < 0  # 1 mid-prefill, 2 not admitted
    free_before = s.cache_manager.num_free_pages
    for uid in (1, 0, 2, 99):  # 99: unknown, ignored
        assert loop.handle(AbortBackendMsg(uid)) == []
    assert s.cache_manager.num_free_pages > free_before and s.idle
    assert_pages_all_back(s)
    assert loop.step() == []  # nothing left to run, nothing sent
    # the pool serves the next request correctly, its pages back afterwards
    loop.handle(UserMsg(7, torch.tensor([5, 6, 7], dtype=torch.int32), greedy(4)))
    msgs = []
    while step := loop.step():
        msgs += step
    assert [m.next_token for m in msgs] == hf_greedy(path, [[5, 6, 7]], 4)[0]
    assert [(m.uid, m.finished, m.finish_reason) for m in msgs][-1] == (7, True, "length")
    assert_pages_all_back(s)


def test_a_refused_request_gets_an_error_and_the_loop_goes_on(tiny_models):
    s = Scheduler(SchedulerConfig(str(tiny_models["qwen2"]), **OPTIONS))
    loop = SchedulerLoop(s)
    vocab = s.engine.model_config.vocab_size
    [msg] = loop.handle(UserMsg(3, torch.tensor([1, vocab], dtype=torch.int32), greedy(2)))
    assert (msg.uid, msg.next_token, msg.finished, msg.finish_reason) == (3, -1, True, "error")
    assert f"input_ids[1] is {vocab}" in msg.error and s.idle


def test_tokenizer_server_stop_string_eos_and_late_tokens(tiny_models):
    llm = build_llm(tiny_models["qwen3"])
    ref = llm.generate(["Hello world"], greedy(10))[0]  # 'Everyearageion lazyion lazy...'
    server = TokenizerServer(llm.tokenizer)
    to_backend, replies = server.handle(
        [
            TokenizeMsg(0, "Hello world", greedy(10), ["lazy"]),
            TokenizeMsg(1, "Hello world", greedy(10)),
            TokenizeMsg(2, [], greedy(10)),
        ]
    )
    assert [type(m).__name__ for m in to_backend] == ["UserMsg"] * 3
    assert to_backend[0].input_ids.dtype == torch.int32
    assert to_backend[0].input_ids.tolist() == ref["prompt_token_ids"]
    assert to_backend[2].input_ids.numel() == 0  # the empty prompt goes on: the scheduler
    assert replies == []  # refuses it by name (test_a_refused_request_gets_an_error...)
    pieces = {0: [], 1: []}
    for i, token in enumerate(ref["token_ids"]):
        last = i == len(ref["token_ids"]) - 1  # request 1 ends at this token, as at an EOS
        msgs = [
            DetokenizeMsg(0, token, last),
            DetokenizeMsg(1, token, last, "stop" if last else ""),
        ]
        to_backend, replies = server.handle(msgs)
        for reply in replies:
            pieces[reply.uid].append(reply)
        if any(r.uid == 0 and r.finished for r in replies):
            # the stop string frees its pages at once (chapter 25 adds which choice it ended)
            assert [(type(m), m.uid) for m in to_backend] == [(AbortBackendMsg, 0)]
    text0 = "".join(r.incremental_output for r in pieces[0])
    assert text0 == ref["text"].split("lazy")[0] and pieces[0][-1].finish_reason == "stop"
    assert [r.finished for r in pieces[0]].count(True) == 1  # later tokens are dropped
    # a worker that fell behind gets all the steps at once: the same reply, cut at the same token
    server.handle([TokenizeMsg(3, "Hello world", greedy(10), ["lazy"])])
    to_backend, [late] = server.handle([DetokenizeMsg(3, t, False) for t in ref["token_ids"]])
    assert late.incremental_output == text0 and late.finished
    assert [(type(m), m.uid) for m in to_backend] == [(AbortBackendMsg, 3)]
    assert late.token_ids == [t for r in pieces[0] for t in r.token_ids]
    text1 = "".join(r.incremental_output for r in pieces[1])
    tok = llm.tokenizer
    assert text1 == tok.decode(ref["token_ids"][:-1])  # the EOS that ended it is not text
    assert [t for r in pieces[1] for t in r.token_ids] == ref["token_ids"]  # but is a token
    assert pieces[1][-1].num_prompt_tokens == len(ref["prompt_token_ids"])


# ---- real processes --------------------------------------------------------------------------


def _start(workers: Workers, path, **options) -> ZmqPullQueue:
    recv = ZmqPullQueue(workers.addr("frontend"), create=True, decoder=BaseFrontendMsg.decoder)
    workers.start(
        "scheduler",
        run_scheduler,
        config=SchedulerConfig(str(path), **options),
        backend_addr=workers.addr("scheduler"),
        detokenizer_addr=workers.addr("tokenizer"),
    )
    workers.start(
        "tokenizer",
        tokenizer_worker,
        model_path=str(path),
        inbox_addr=workers.addr("tokenizer"),
        backend_addr=workers.addr("scheduler"),
        frontend_addr=workers.addr("frontend"),
    )
    workers.wait_ready(timeout=START_TIMEOUT)
    return recv


def _collect(workers: Workers, recv: ZmqPullQueue, uids) -> dict:
    """Every reply, per uid, until each of ``uids`` has finished; bounded."""
    replies: dict = collections.defaultdict(list)  # a stray reply for another uid is kept too
    open_uids = set(uids)
    while open_uids:
        msg = recv.get(timeout=TIMEOUT, watch=workers.sentinels)
        if msg is None:
            workers.check(timeout=5.0)
        for reply in msg.data if isinstance(msg, BatchFrontendMsg) else [msg]:
            replies[reply.uid].append(reply)
            open_uids.discard(reply.uid) if reply.finished else None
    return replies


@pytest.fixture(scope="module")
def served(tiny_models):
    """The two workers on the tiny Qwen3, and the frontend's two queues."""
    path = tiny_models["qwen3"]
    with Workers() as workers:
        recv = _start(workers, path, **OPTIONS)
        send = ZmqPushQueue(
            workers.addr("tokenizer"), create=False, encoder=BaseTokenizerMsg.encoder
        )
        try:
            yield path, workers, send, recv
            workers.stop(send_exit=lambda: send.put(ExitMsg()), grace=TIMEOUT)
            assert [p.exitcode for p in workers.procs.values()] == [0, 0]  # on the message
        finally:  # closed even when an assertion fails
            send.close()
            recv.close()
    assert not os.path.exists(workers.ipc_dir)


def test_greedy_replies_through_the_processes_equal_llm_generate(served):
    path, workers, send, recv = served
    params = [greedy(10), greedy(3), SamplingParams(max_tokens=7), greedy(12)]
    send.put(
        BatchTokenizerMsg(
            [TokenizeMsg(10 + i, p, s) for i, (p, s) in enumerate(zip(PROMPTS, params))]
        )
    )
    replies = _collect(workers, recv, range(10, 14))
    ref = build_llm(path).generate(PROMPTS, params)
    for i, out in enumerate(ref):
        pieces = replies[10 + i]
        assert [t for r in pieces for t in r.token_ids] == out["token_ids"]
        assert "".join(r.incremental_output for r in pieces) == out["text"]
        assert [r.finished for r in pieces].count(True) == 1 and pieces[-1].finished
        assert pieces[-1].finish_reason == "length"
        assert pieces[-1].num_prompt_tokens == len(out["prompt_token_ids"])


def test_errors_aborts_and_stop_strings_through_the_processes(served):
    path, workers, send, recv = served
    send.put(
        BatchTokenizerMsg(
            [
                TokenizeMsg(20, "", greedy(3)),
                TokenizeMsg(21, [{"role": "user"}], greedy(3)),
                TokenizeMsg(22, PROMPTS[0], greedy(200)),
                AbortMsg(22),
                TokenizeMsg(23, PROMPTS[0], greedy(10), stop=["lazy"]),
            ]
        )
    )
    send.put(TokenizeMsg(24, PROMPTS[2], greedy(2)))  # served after the abort, correctly
    replies = _collect(workers, recv, [20, 21, 23, 24])
    assert "prompt is empty" in replies[20][-1].error  # the scheduler's check
    assert "messages[0]['content']" in replies[21][-1].error  # the tokenizer's
    assert replies[22] == []  # aborted before any token reached the frontend
    ref = build_llm(path).generate([PROMPTS[0], PROMPTS[2]], [greedy(10), greedy(2)])
    assert "".join(r.incremental_output for r in replies[23]) == ref[0]["text"].split("lazy")[0]
    assert replies[23][-1].finish_reason == "stop"
    assert [t for r in replies[24] for t in r.token_ids] == ref[1]["token_ids"]


def _cpu_seconds(pid: int) -> float:
    fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime + stime


@pytest.mark.skipif(not os.path.exists("/proc/self/stat"), reason="needs Linux's /proc")
def test_idle_workers_sleep_on_their_sockets(served):
    _, workers, _, _ = served
    pids = [p.pid for p in workers.procs.values()]
    before = [_cpu_seconds(pid) for pid in pids]
    time.sleep(1.0)
    used = [_cpu_seconds(pid) - b for pid, b in zip(pids, before)]
    assert max(used) < 0.1, f"idle workers used {used} s of CPU in 1 s: a busy loop"


def test_a_killed_worker_stops_the_others_and_leaves_no_socket_file(tiny_models, caplog):
    with pytest.raises(WorkerDied, match="the scheduler process was killed by SIGKILL"):
        with Workers() as workers:
            recv = _start(workers, tiny_models["llama3"], **OPTIONS)
            assert len(os.listdir(workers.ipc_dir)) == 3  # frontend, scheduler, tokenizer
            os.kill(workers.procs["scheduler"].pid, signal.SIGKILL)
            assert recv.get(timeout=TIMEOUT, watch=workers.sentinels) is None  # woken
            workers.watcher.join(TIMEOUT)  # it stops the tokenizer and reaps it
            assert workers.procs["tokenizer"].exitcode == -signal.SIGTERM
            workers.check(timeout=5.0)
    recv.close()
    assert not os.path.exists(workers.ipc_dir)
    assert "the scheduler process was killed by SIGKILL: stopping the other" in caplog.text


SIGTERM_MAIN = """
import sys
sys.path[:0] = [{python!r}]
from minisgl.scheduler import SchedulerConfig
from minisgl.scheduler.io import run_scheduler
from minisgl.tokenizer.server import tokenizer_worker
from minisgl.utils.mp import Workers

if __name__ == "__main__":
    with Workers() as workers:
        workers.start("scheduler", run_scheduler, config=SchedulerConfig({path!r}, device="cpu",
                      num_pages=64), backend_addr=workers.addr("scheduler"),
                      detokenizer_addr=workers.addr("tokenizer"))
        workers.start("tokenizer", tokenizer_worker, model_path={path!r},
                      inbox_addr=workers.addr("tokenizer"),
                      backend_addr=workers.addr("scheduler"),
                      frontend_addr=workers.addr("frontend"))
        workers.wait_ready(timeout={timeout})
        print(workers.ipc_dir, *[p.pid for p in workers.procs.values()], flush=True)
        sys.stdin.read()  # serve until the test signals us (or its end closes our stdin)
"""


@pytest.fixture(scope="module")
def serving_mains(tiny_models, tmp_path_factory):
    """Two copies of SIGTERM_MAIN, each a main process serving with its two workers: one for
    SIGTERM, one for SIGKILL. Both start at once (most of a start is imports, on one core) and
    each test waits only for its own."""
    folder = tmp_path_factory.mktemp("mains")
    script = folder / "serve.py"
    script.write_text(
        SIGTERM_MAIN.format(
            python=str(ROOT / "python"), timeout=START_TIMEOUT, path=str(tiny_models["mistral"])
        )
    )
    mains = {how: Main(folder / f"{how}.log", script) for how in ("SIGTERM", "SIGKILL")}
    yield mains
    for main in mains.values():  # a test that failed before its signal leaves its main running
        main.proc.kill()
        main.proc.wait()
        main.proc.stdin.close()
        main.proc.stdout.close()


class Main:
    """SIGTERM_MAIN in a subprocess, its stderr (and its workers') in a file."""

    def __init__(self, log: Path, script: Path):
        self.log = log
        with open(log, "w") as err:
            self.proc = subprocess.Popen(
                [sys.executable, str(script)],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=err,
                text=True,
            )

    def serving(self) -> tuple[str, list[int]]:
        """The socket directory and the workers' pids, once the main says it serves."""
        bound = START_TIMEOUT + 10
        ready, _, _ = select.select([self.proc.stdout], [], [], bound)
        assert ready, f"no line from the main in {bound} s:\n{self.log.read_text()}"
        ipc_dir, *pids = self.proc.stdout.readline().split()
        assert pids, f"the main exited first:\n{self.log.read_text()}"
        return ipc_dir, [int(pid) for pid in pids]


CYCLE_MAIN = """
import gc, os, sys
sys.path[:0] = [{python!r}]
from minisgl.message import BaseFrontendMsg
from minisgl.utils.mp import Workers, ZmqPullQueue

def failing_test():
    with Workers():
        recv = ZmqPullQueue("ipc://{path}", create=True, decoder=BaseFrontendMsg.decoder)
        raise AssertionError("a test failed with its queue open")

def run():
    try:
        failing_test()
    except AssertionError as e:
        failure = e  # its traceback holds this frame, which holds it: a cycle, as pytest keeps

run()
print("open", os.path.exists({path!r}), flush=True)
gc.collect()  # the queue is collected inside the cycle
print("closed", not os.path.exists({path!r}), flush=True)
"""


def test_a_queue_left_open_by_a_failure_is_closed_when_collected(tmp_path):
    """A test that fails inside ``with Workers()`` leaves its queue in a reference cycle. The
    collector must close it (its socket file goes) and not hang in the context's term()."""
    script = tmp_path / "cycle.py"
    script.write_text(CYCLE_MAIN.format(python=str(ROOT / "python"), path=str(tmp_path / "q")))
    try:
        out = subprocess.run(
            [sys.executable, str(script)], capture_output=True, text=True, timeout=START_TIMEOUT
        )
    except subprocess.TimeoutExpired as e:
        pytest.fail(f"the collector hung on the open queue: {e.stdout!r}")
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["open", "True", "closed", "True"]


def test_sigterm_stops_every_process_with_a_message(serving_mains):
    main = serving_mains["SIGTERM"]
    ipc_dir, pids = main.serving()
    main.proc.send_signal(signal.SIGTERM)
    assert main.proc.wait(timeout=TIMEOUT) == 1
    assert "SIGTERM received, stopping every process" in main.log.read_text()
    assert len(pids) == 2 and not os.path.exists(ipc_dir)
    for pid in pids:
        with pytest.raises(ProcessLookupError):  # gone, and reaped
            os.kill(pid, 0)


def _wait_ended(pid: int, timeout: float) -> bool:
    """Whether the process ``pid`` (not our child: an orphan now) ends within ``timeout``: its
    pidfd becomes readable when it exits, whoever reaps it."""
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return True
    try:
        return bool(select.select([fd], [], [], timeout)[0])
    finally:
        os.close(fd)


@pytest.mark.skipif(not hasattr(os, "pidfd_open"), reason="needs Linux's pidfd_open")
def test_workers_of_a_killed_main_process_exit_and_remove_their_socket_files(serving_mains):
    main = serving_mains["SIGKILL"]
    ipc_dir, pids = main.serving()
    assert sorted(os.listdir(ipc_dir)) == ["scheduler", "tokenizer"]
    main.proc.kill()  # SIGKILL: nothing of it runs any more
    main.proc.wait()
    deadline = time.monotonic() + TIMEOUT
    for pid in pids:  # they notice their parent's end
        assert _wait_ended(pid, max(0.0, deadline - time.monotonic())), f"{pid} still runs"
    assert os.listdir(ipc_dir) == []  # each removed the file it bound; the directory stays
    os.rmdir(ipc_dir)


def test_the_offline_path_imports_no_server_package():
    offline = "minisgl.llm, minisgl.scheduler.scheduler, minisgl.tokenizer"
    assert modules_imported(offline, ["zmq", "msgpack"]) == []


def test_stop_reaps_the_workers_under_the_watchers_lock():
    """``stop`` joins and ends each worker holding the lock the watcher reaps under: of two
    ``waitpid`` calls on one process the second gets no status, which would leave that
    ``Process``'s exitcode None and is_alive() True after the stop."""
    from minisgl.utils.mp import Workers

    held: list = []

    class Worker:  # a stand-in that records whether the lock is held as it is reaped
        def join(self, timeout: float | None = None) -> None:
            held.append(("join", workers._reaping.locked()))

        def is_alive(self) -> bool:
            held.append(("is_alive", workers._reaping.locked()))
            return False

    workers = Workers()
    workers.procs["worker"] = Worker()  # type: ignore[assignment]
    workers.stop(grace=0.0)
    assert held == [("join", True), ("is_alive", True)]
