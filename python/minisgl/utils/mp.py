"""Processes and the queues between them: ZMQ PUSH/PULL sockets over ``ipc://`` paths carrying
msgpack'd messages, and worker processes that are spawned, say when they are ready, and stop
together.

A queue sends a message as ``msgpack(encoder(obj))`` and receives ``decoder(msgpack⁻¹(bytes))``;
the encoders and decoders are the message classes' (``minisgl.message``). One side of a queue
binds the address (``create=True``), the other connects; several PUSH sockets may connect to one
PULL socket, which then receives from all of them.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import shutil
import signal
import tempfile
import threading
import time
import traceback
import weakref
from multiprocessing.connection import Connection, wait
from multiprocessing.process import BaseProcess
from typing import TYPE_CHECKING, Any, Callable, Dict, Generic, List, Sequence, Tuple, TypeVar

from .logger import init_logger

if TYPE_CHECKING:
    import zmq

T = TypeVar("T")
LINGER_MS = 2000  # how long close() waits for messages not yet sent, so an exit never hangs
logger = init_logger(__name__)


class _ZmqQueue:
    """One ZMQ socket with its own context. ``close`` waits (LINGER_MS at most) for what was
    put to leave, and removes the socket file if this end bound it.

    A queue never left open is closed when it is collected too, or at exit. Without that, a
    queue dropped inside a reference cycle (a failed test's traceback holds its frame) could
    hang the collector: pyzmq's ``Context.__del__`` closes the sockets it knows through weak
    references, which the collector has already cleared, then terminates the context, which
    waits for ever for the socket still open. A ``weakref.finalize`` runs before that.
    """

    def __init__(self, kind: str, addr: str, create: bool, asyncio: bool = False):
        # imported here, not at the top: the offline API imports this module for ``Workers``
        # alone, on machines that may lack the server's packages
        import msgpack
        import zmq
        import zmq.asyncio

        self.zmq, self.msgpack = zmq, msgpack
        self.context = zmq.asyncio.Context() if asyncio else zmq.Context()
        self.socket = self.context.socket(getattr(zmq, kind))
        self.socket.setsockopt(zmq.LINGER, LINGER_MS)
        self.socket.bind(addr) if create else self.socket.connect(addr)
        bound_ipc = create and addr.startswith("ipc://")
        self._bound_file = addr.removeprefix("ipc://") if bound_ipc else None
        self._closer = weakref.finalize(self, _close_socket, self.socket, self._bound_file)

    def close(self) -> None:
        """Close the socket and its context; a second call does nothing."""
        self._closer()


def _close_socket(socket: zmq.Socket, bound_file: str | None) -> None:
    """The socket first: terminating a context waits until each of its sockets is closed."""
    socket.close()
    socket.context.term()
    if bound_file is not None and os.path.exists(bound_file):
        os.unlink(bound_file)


class ZmqPushQueue(_ZmqQueue, Generic[T]):
    """The sending end: ``put`` queues the message and returns (ZMQ sends it in the background)."""

    def __init__(self, addr: str, create: bool, encoder: Callable[[T], Any]):
        super().__init__("PUSH", addr, create)
        self.encoder = encoder

    def put(self, obj: T) -> None:
        self.socket.send(self.msgpack.packb(self.encoder(obj), use_bin_type=True), copy=False)


class ZmqPullQueue(_ZmqQueue, Generic[T]):
    """The receiving end. ``get`` blocks until a message comes, and can also watch file
    descriptors (a process's sentinel) so that a dead peer wakes it rather than hangs it."""

    def __init__(self, addr: str, create: bool, decoder: Callable[[Any], T]):
        super().__init__("PULL", addr, create)
        self.decoder = decoder

    def get(self, timeout: float | None = None, watch: Sequence[int] = ()) -> T | None:
        """The next message; None if a watched fd became readable first (a process ended);
        TimeoutError after ``timeout`` seconds (None: wait as long as it takes)."""
        poller = self.zmq.Poller()
        poller.register(self.socket, self.zmq.POLLIN)
        for fd in watch:
            poller.register(fd, self.zmq.POLLIN)
        ready = dict(poller.poll(None if timeout is None else int(timeout * 1000)))
        if self.socket in ready:
            return self.get_nowait()
        if ready:
            return None
        raise TimeoutError(f"no message in {timeout} s")

    def get_nowait(self) -> T | None:
        """The next message if one has arrived, else None."""
        try:
            raw = self.socket.recv(flags=self.zmq.NOBLOCK)
        except self.zmq.Again:
            return None
        return self.decoder(self.msgpack.unpackb(raw, raw=False))


class ZmqAsyncPushQueue(_ZmqQueue, Generic[T]):
    """``ZmqPushQueue`` for an asyncio program (the API server)."""

    def __init__(self, addr: str, create: bool, encoder: Callable[[T], Any]):
        super().__init__("PUSH", addr, create, asyncio=True)
        self.encoder = encoder

    async def put(self, obj: T) -> None:
        packed = self.msgpack.packb(self.encoder(obj), use_bin_type=True)
        await self.socket.send(packed, copy=False)


class ZmqAsyncPullQueue(_ZmqQueue, Generic[T]):
    """``ZmqPullQueue`` for an asyncio program: ``await get()`` lets other tasks run meanwhile."""

    def __init__(self, addr: str, create: bool, decoder: Callable[[Any], T]):
        super().__init__("PULL", addr, create, asyncio=True)
        self.decoder = decoder

    async def get(self) -> T:
        return self.decoder(self.msgpack.unpackb(await self.socket.recv(), raw=False))


def parent_sentinel() -> List[int]:
    """In a worker: a file descriptor that becomes readable when its parent process ends, to
    watch while waiting (so a worker never outlives its parent); [] in the main process."""
    parent = mp.parent_process()
    return [] if parent is None else [parent.sentinel]


class WorkerDied(RuntimeError):
    """A worker process ended while the others were serving."""


class Workers:
    """Worker processes that start ready and stop together.

    ``start(name, target, **kwargs)`` spawns ``target(ready=..., **kwargs)`` in a fresh
    interpreter (spawn: nothing of this process's state, threads or sockets is inherited);
    the target calls ``ready()`` once its sockets are bound and its model is loaded, and
    ``wait_ready`` returns when every worker has. The ``ipc://`` socket files live in a
    directory of their own, made per run (``addr(name)``) and removed by ``stop``.

    If one worker dies, a watcher thread stops the others and says which died and how;
    ``stop`` (or leaving the ``with`` block) ends them all. SIGINT and SIGTERM end the main
    process through ``Stopped`` (a ``SystemExit``), so its ``with`` block stops the workers on
    the way out.
    """

    def __init__(self) -> None:
        self.ipc_dir = tempfile.mkdtemp(prefix="minisgl-")
        self.procs: Dict[str, BaseProcess] = {}
        self.failure: str | None = None  # what ended the first worker that died, if any
        self._ready: Dict[str, Connection] = {}
        self._stopping = False
        # the watcher, check() and stop() may each reap one worker; two waitpid calls at once
        # leave the loser's exitcode None, and its is_alive() True
        self._reaping = threading.Lock()
        self._spawn = mp.get_context("spawn")
        self._old_handlers: Dict[int, Any] = {}

    def addr(self, name: str) -> str:
        return f"ipc://{self.ipc_dir}/{name}"

    def start(self, name: str, target: Callable[..., None], **kwargs: Any) -> None:
        receiver, sender = self._spawn.Pipe(duplex=False)
        proc = self._spawn.Process(
            target=_worker_main,
            args=(name, target, kwargs, sender),
            name=f"minisgl-{name}",
            daemon=True,
        )
        proc.start()
        sender.close()  # the child holds the sending end now
        self.procs[name], self._ready[name] = proc, receiver

    def wait_ready(self, timeout: float = 120.0) -> None:
        """Until every worker has called ready(); WorkerDied if one ends first, TimeoutError."""
        waiting = dict(self._ready)
        while waiting:
            events = wait([*waiting.values(), *self.sentinels], timeout)
            if not events:
                raise TimeoutError(f"not ready after {timeout} s: {', '.join(waiting)}")
            self.check()
            for name, conn in list(waiting.items()):
                if conn in events:
                    try:
                        conn.recv()
                    except EOFError:  # it ended without a word
                        self.check(timeout=5.0)
                    del waiting[name]
        self.watcher = threading.Thread(target=self._watch, name="minisgl-watcher", daemon=True)
        self.watcher.start()  # it reaps the workers: join it, not them, to read their exit codes

    @property
    def sentinels(self) -> List[int]:
        """One fd per worker, readable once it has ended: to watch while waiting for replies."""
        return [p.sentinel for p in self.procs.values()]

    def check(self, timeout: float = 0.0) -> None:
        """WorkerDied, naming the worker, if one has ended (or ends within ``timeout``), unless
        we are stopping them."""
        ended = self._ended(timeout)
        if ended and not self._stopping:
            name, proc = ended[0]
            self.failure = self.failure or _death_message(name, proc.exitcode)
            raise WorkerDied(self.failure)

    def stop(self, send_exit: Callable[[], None] | None = None, grace: float = 10.0) -> None:
        """Stop every worker: ``send_exit()`` (an exit message) and up to ``grace`` seconds for
        them to exit by themselves; then SIGTERM what is left. Remove the socket directory."""
        if self._stopping:
            return
        self._stopping = True  # from now on a worker that ends is no failure
        if send_exit is not None:
            send_exit()
        deadline = time.monotonic() + grace  # one grace period for all of them
        with self._reaping:  # the watcher may be reaping one of them right now
            for proc in self.procs.values():
                proc.join(max(0.0, deadline - time.monotonic()))
            _end_all(self.procs.values())
        shutil.rmtree(self.ipc_dir, ignore_errors=True)

    def __enter__(self) -> Workers:
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGINT, signal.SIGTERM):
                self._old_handlers[sig] = signal.signal(sig, _exit_on_signal)
        return self

    def __exit__(self, *_: Any) -> None:
        self.stop(grace=0.0)  # an orderly stop called stop(send_exit) already
        for sig, handler in self._old_handlers.items():
            signal.signal(sig, handler)

    def _ended(self, timeout: float | None) -> List[Tuple[str, BaseProcess]]:
        """The workers that have ended, waiting up to ``timeout`` seconds for one."""
        ready = wait(self.sentinels, timeout)
        ended = [(name, p) for name, p in self.procs.items() if p.sentinel in ready]
        with self._reaping:  # two threads reaping at once: the loser could read exitcode None
            for _, proc in ended:
                proc.join()  # the sentinel comes a moment before the exit code: wait for it
        return ended

    def _watch(self) -> None:
        """The watcher thread: when the first worker ends, unless we are stopping, the others
        are stopped with a message."""
        name, proc = self._ended(timeout=None)[0]
        if self._stopping:
            return
        self.failure = self.failure or _death_message(name, proc.exitcode)
        logger.error("%s: stopping the other workers", self.failure)
        _end_all(self.procs.values())


def _worker_main(
    name: str, target: Callable[..., None], kwargs: Dict[str, Any], ready: Connection
) -> None:
    """A worker's first frame: Ctrl-C goes to the whole terminal's process group, but only the
    main process decides when to stop, so the worker ignores SIGINT."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        target(ready=lambda: ready.send(name), **kwargs)
    except BaseException:
        logger.error("the %s process failed:\n%s", name, traceback.format_exc())
        os._exit(1)


def _death_message(name: str, exitcode: int) -> str:
    how = (
        f"was killed by {signal.Signals(-exitcode).name}"
        if exitcode < 0
        else f"exited with code {exitcode}"
    )
    return f"the {name} process {how}"


def _end_all(procs: Any) -> None:
    """SIGTERM every worker still alive, then SIGKILL those that do not end within 5 s."""
    procs = [p for p in procs if p.is_alive()]
    for proc in procs:
        proc.terminate()
    for proc in procs:
        proc.join(5.0)
        if proc.is_alive():
            proc.kill()
            proc.join()


class Stopped(SystemExit):
    """SIGINT or SIGTERM in the main process. Uncaught, it exits with status 1 and its line; a
    server that stops in order on a signal catches it and exits 0."""

    def __init__(self, signum: int):
        self.signal_name = signal.Signals(signum).name
        super().__init__(f"minisgl: {self.signal_name} received, stopping every process")


def _exit_on_signal(signum: int, _frame: Any) -> None:
    raise Stopped(signum)
