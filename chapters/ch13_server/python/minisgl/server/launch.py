"""Start the server: the tokenizer worker and the scheduler process (chapter 12's ``Workers``),
then the HTTP API in this process, until a signal or a dying worker stops everything.

    API server --TokenizeMsg--> tokenizer --UserMsg--> scheduler
    API server <--UserReply-- detokenizer <--DetokenizeMsg-- scheduler
"""

from __future__ import annotations

import asyncio
import sys
import threading
import time
from functools import partial
from multiprocessing.connection import wait
from typing import Any, Callable

import uvicorn
from minisgl import env
from minisgl.message import BaseTokenizerMsg, ExitMsg
from minisgl.scheduler import Scheduler, SchedulerConfig
from minisgl.scheduler.io import SchedulerIO, SchedulerLoop
from minisgl.tokenizer.server import tokenizer_worker
from minisgl.utils.logger import init_logger
from minisgl.utils.mp import Stopped, Workers, ZmqPushQueue

from .api_server import Frontend, Metrics, SchedulerStats, create_app
from .args import ServerArgs

logger = init_logger(__name__)


class _PublishingLoop(SchedulerLoop):
    """Chapter 12's loop, which also writes the scheduler's gauges after every step."""

    def __init__(self, scheduler: Scheduler, stats: SchedulerStats):
        super().__init__(scheduler)
        self.stats = stats
        stats.publish(scheduler)

    def step(self) -> Any:
        out = super().step()
        self.stats.publish(self.scheduler)
        return out


def run_scheduler(config: SchedulerConfig, backend_addr: str, detokenizer_addr: str,
                  stats: Any, ready: Callable[[], None]) -> None:
    """The scheduler process, as chapter 12 runs it, with its gauges shared with /metrics."""
    scheduler = Scheduler(config)
    io = SchedulerIO(backend_addr, detokenizer_addr)
    loop = _PublishingLoop(scheduler, SchedulerStats(stats))
    ready()
    try:
        loop.run(io)
    finally:
        io.close()
        scheduler.shutdown()


def start_workers(workers: Workers, args: ServerArgs, stats: SchedulerStats) -> None:
    """The scheduler and the tokenizer worker, their sockets in the run's own directory."""
    workers.start("scheduler", run_scheduler, config=args.scheduler_config(),
                  backend_addr=workers.addr("scheduler"),
                  detokenizer_addr=workers.addr("tokenizer"), stats=stats.array)
    workers.start("tokenizer", tokenizer_worker, model_path=args.model_path,
                  inbox_addr=workers.addr("tokenizer"), backend_addr=workers.addr("scheduler"),
                  frontend_addr=workers.addr("frontend"))


def watch_workers(workers: Workers, frontend: Frontend, server: uvicorn.Server) -> None:
    """A thread: once a worker ends while we serve, every request gets a 503 saying which
    died; after a grace period the server stops (and ``launch_server`` exits non-zero)."""
    wait(workers.sentinels)
    if server.should_exit:  # we are stopping anyway: a signal
        return
    deadline = time.monotonic() + 5.0
    while workers.failure is None and time.monotonic() < deadline:
        time.sleep(0.01)  # chapter 12's watcher reaps the worker and names it; only it joins
    message = workers.failure or "a worker process ended"
    logger.error("%s: answering 503 for %.1f s, then stopping", message, env.failure_grace_s())
    frontend.fail(message)
    time.sleep(env.failure_grace_s())
    server.should_exit = True


CUT_GRACE_S = 2.0  # after the cut: for the cut replies' last events, then uvicorn cancels


class DrainingServer(uvicorn.Server):
    """uvicorn's server with a bounded shutdown. On SIGTERM or SIGINT uvicorn stops accepting
    connections and waits for the replies under way. After ``drain_s`` seconds the frontend
    cuts those still running (each ends with a 503 naming why, its request aborted); uvicorn's
    own timeout, CUT_GRACE_S later, cancels whatever still hangs (a client that reads nothing).
    A second Ctrl-C stops waiting at once (uvicorn's force exit)."""

    def __init__(self, config: uvicorn.Config, frontend: Frontend, drain_s: float):
        config.timeout_graceful_shutdown = drain_s + CUT_GRACE_S
        super().__init__(config)
        self.frontend, self.drain_s = frontend, drain_s

    async def shutdown(self, sockets: Any = None) -> None:
        logger.warning("stopping: no new requests; replies under way: %d, given %.1f s",
                       self.frontend.num_running, self.drain_s)
        timer = asyncio.get_running_loop().call_later(self.drain_s, self._cut)
        try:
            await super().shutdown(sockets)
        finally:
            timer.cancel()

    def _cut(self) -> None:
        n = self.frontend.cut(f"the reply was cut after {self.drain_s:g} s (--shutdown-timeout)")
        if n:
            logger.warning("replies still running after %.1f s: %d, cut", self.drain_s, n)


def launch_server(args: ServerArgs) -> None:
    """Serve until SIGINT/SIGTERM or a worker's death; no process or socket file stays.

    A signal is how a server is meant to stop: new requests are refused, the replies under way
    get ``args.shutdown_timeout`` seconds, the workers stop, and we return (exit status 0). A
    worker's death, or a port we cannot bind, is a SystemExit naming it (status 1)."""
    try:
        _serve(args)
    except Stopped as stop:  # uvicorn's drain is over: it passes the signal on to Workers'
        print(f"minisgl: {stop.signal_name} received; the server has stopped", file=sys.stderr,
              flush=True)


def _serve(args: ServerArgs) -> None:
    with Workers() as workers:
        stats = SchedulerStats()
        start_workers(workers, args, stats)
        workers.wait_ready(timeout=env.ready_timeout_s())
        frontend = Frontend(workers.addr("tokenizer"), workers.addr("frontend"), Metrics(stats))
        config = uvicorn.Config(create_app(args, frontend), host=args.host, port=args.port,
                                log_level="warning", access_log=False)
        server = DrainingServer(config, frontend, args.shutdown_timeout)
        threading.Thread(target=watch_workers, args=(workers, frontend, server),
                         name="minisgl-server-watcher", daemon=True).start()
        pids = ", ".join(f"{name} (pid {p.pid})" for name, p in workers.procs.items())
        print(f"minisgl: serving {args.model_path} on http://{args.host}:{args.port}; "
              f"workers: {pids}", file=sys.stderr, flush=True)
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
