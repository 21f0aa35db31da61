"""Start the server: the tokenizer worker and the scheduler process (``Workers``),
then the HTTP API in this process, until a signal or a dying worker stops everything.

    API server --TokenizeMsg--> tokenizer --UserMsg--> scheduler
    API server <--UserReply-- detokenizer <--DetokenizeMsg-- scheduler

With ``--tp-size N`` the scheduler is N processes, one per rank: rank 0 is the one above, and
it hands every message on to ranks 1..N-1.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import sys
import threading
import time
from contextlib import contextmanager
from dataclasses import replace
from functools import partial
from multiprocessing.connection import wait
from typing import TYPE_CHECKING, Any, Dict, Iterator

import torch

from minisgl import env
from minisgl.message import BaseTokenizerMsg, ExitMsg
from minisgl.scheduler.io import run_follower, run_scheduler
from minisgl.utils.logger import init_logger
from minisgl.utils.mp import Stopped, Workers, ZmqPushQueue

from .args import ServerArgs

if TYPE_CHECKING:
    import uvicorn

    from .api_server import Frontend

logger = init_logger(__name__)

STAT_NAMES = (
    "num_running_reqs",
    "num_waiting_reqs",
    "kv_pages_total",
    "kv_pages_free",
    "kv_pages_cached",
)


class SchedulerStats:
    """The scheduler's state, in memory shared by the scheduler process, which writes it after
    each step (``publish``), and the API server, whose ``/metrics`` reads it. Each number is
    written whole; a read during a step may mix two steps' numbers, which a gauge tolerates."""

    def __init__(self, array: Any = None):
        self.array = (
            array
            if array is not None
            else mp.get_context("spawn").Array("q", len(STAT_NAMES), lock=False)
        )

    def publish(self, scheduler: Any) -> None:
        """In the scheduler process. A request holds a row of the table from its admission;
        cached pages are those only the prefix cache holds (it may evict them)."""
        s, cache = scheduler, scheduler.cache_manager
        running = s.config.max_running_req - s.table_manager.available_size
        waiting = sum(1 for req in s.waiting if req.table_idx < 0)
        cached = cache.prefix_cache.size_info.evictable_size // cache.page_size
        self.array[:] = [running, waiting, cache.num_pages, cache.num_free_pages, cached]

    def read(self) -> Dict[str, int]:
        return dict(zip(STAT_NAMES, self.array[:]))


def engine_threads(args: ServerArgs) -> int:
    """The torch threads of each scheduler process: ``--threads``; else OMP_NUM_THREADS if set;
    else torch's default (one per physical core) less the cores that the 1-minute load average
    says are busy, shared between the ranks, at least one: threads that share a core with
    another busy process wait on each other, and decode slows down more than with fewer."""
    if args.threads:
        return args.threads
    cores = torch.get_num_threads()
    if not os.environ.get("OMP_NUM_THREADS"):
        cores -= int(os.getloadavg()[0])
    return max(1, cores // args.tp_size)


@contextmanager
def omp_threads(n: int) -> Iterator[None]:
    """OMP_NUM_THREADS=n for the processes started in the body: torch reads it as it starts."""
    old = os.environ.get("OMP_NUM_THREADS")
    os.environ["OMP_NUM_THREADS"] = str(n)
    try:
        yield
    finally:
        if old is None:
            del os.environ["OMP_NUM_THREADS"]
        else:
            os.environ["OMP_NUM_THREADS"] = old


def start_workers(workers: Workers, args: ServerArgs, stats: SchedulerStats) -> None:
    """The scheduler (one process per rank) and the tokenizer worker, their sockets in the
    run's own directory; the ranks meet at a file there too. Each rank gets ``engine_threads``
    threads, the tokenizer worker one."""
    from minisgl.tokenizer.server import tokenizer_worker  # here: see _serve

    config = replace(args.scheduler_config(), dist_init_addr=f"file://{workers.ipc_dir}/tp")
    with omp_threads(engine_threads(args)):
        workers.start(
            "scheduler",
            run_scheduler,
            config=config,
            backend_addr=workers.addr("scheduler"),
            detokenizer_addr=workers.addr("tokenizer"),
            after_step=stats.publish,
        )
        for rank in range(1, config.tp_size):
            workers.start(f"scheduler-{rank}", run_follower, config=replace(config, tp_rank=rank))
    with omp_threads(1):  # it runs no torch kernel
        workers.start(
            "tokenizer",
            tokenizer_worker,
            model_path=args.model_path,
            inbox_addr=workers.addr("tokenizer"),
            backend_addr=workers.addr("scheduler"),
            frontend_addr=workers.addr("frontend"),
        )


def watch_workers(workers: Workers, frontend: Frontend, server: uvicorn.Server) -> None:
    """A thread: once a worker ends while we serve, every request gets a 503 saying which
    died; after a grace period the server stops (and ``launch_server`` exits non-zero)."""
    wait(workers.sentinels)
    if server.should_exit:  # we are stopping anyway: a signal
        return
    deadline = time.monotonic() + 5.0
    while workers.failure is None and time.monotonic() < deadline:
        time.sleep(0.01)  # the Workers' watcher reaps the worker and names it; only it joins
    message = workers.failure or "a worker process ended"
    logger.error("%s: answering 503 for %.1f s, then stopping", message, env.failure_grace_s())
    frontend.fail(message)
    time.sleep(env.failure_grace_s())
    server.should_exit = True


def launch_server(args: ServerArgs) -> None:
    """Serve until SIGINT/SIGTERM or a worker's death; no process or socket file stays.

    A signal is how a server is meant to stop: new requests are refused, the replies under way
    get ``args.shutdown_timeout`` seconds, the workers stop, and we return (exit status 0). A
    worker's death, or a port we cannot bind, is a SystemExit naming it (status 1)."""
    try:
        _serve(args)
    except Stopped as stop:  # uvicorn's drain is over: it passes the signal on to Workers'
        print(
            f"minisgl: {stop.signal_name} received; the server has stopped",
            file=sys.stderr,
            flush=True,
        )


def _serve(args: ServerArgs) -> None:
    # The HTTP server and the tokenizer are imported where they are used, not at the top: the
    # scheduler process imports this module for its target and needs neither (about 1.5
    # CPU-seconds of imports at each start).
    import uvicorn

    from .api_server import DrainingServer, Frontend, Metrics, create_app

    with Workers() as workers:
        stats = SchedulerStats()
        start_workers(workers, args, stats)
        workers.wait_ready(timeout=env.ready_timeout_s())
        frontend = Frontend(workers.addr("tokenizer"), workers.addr("frontend"), Metrics(stats))
        config = uvicorn.Config(
            create_app(args, frontend),
            host=args.host,
            port=args.port,
            log_level="warning",
            access_log=False,
        )
        server = DrainingServer(config, frontend, args.shutdown_timeout)
        threading.Thread(
            target=watch_workers,
            args=(workers, frontend, server),
            name="minisgl-server-watcher",
            daemon=True,
        ).start()
        pids = ", ".join(f"{name} (pid {p.pid})" for name, p in workers.procs.items())
        print(
            f"minisgl: serving {args.model_path} on http://{args.host}:{args.port}; "
            f"workers: {pids}",
            file=sys.stderr,
            flush=True,
        )
        try:
            server.run()
        finally:
            if frontend.failure is None:  # an orderly stop: the workers exit by themselves
                workers.stop(send_exit=partial(send_exit_msg, workers.addr("tokenizer")))
        if frontend.failure is not None:
            raise SystemExit(f"minisgl: {frontend.failure}; the server has stopped")
        if not server.started:
            raise SystemExit(f"minisgl: could not serve on {args.host}:{args.port}")


def send_exit_msg(tokenizer_addr: str) -> None:
    """The exit message: the tokenizer worker passes it on to the scheduler, and both exit."""
    queue = ZmqPushQueue(tokenizer_addr, create=False, encoder=BaseTokenizerMsg.encoder)
    queue.put(ExitMsg())
    queue.close()
