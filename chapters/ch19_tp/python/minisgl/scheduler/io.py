"""The scheduler process: requests come in over ZMQ, each step's new tokens go out to the
detokenizer. This file puts sockets around the Scheduler.

Under tensor parallelism there is one scheduler process per rank. Only rank 0 has
sockets: it passes every message it receives on to the other ranks by broadcast, so all ranks
run the same steps, and only rank 0 sends tokens back.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Dict, List

from minisgl.core import Req
from minisgl.distributed import (
    broadcast_objects,
    destroy_distributed,
    get_tp_info,
    init_distributed,
)
from minisgl.message import (
    AbortBackendMsg,
    BaseBackendMsg,
    BaseTokenizerMsg,
    BatchBackendMsg,
    BatchTokenizerMsg,
    DetokenizeMsg,
    ExitMsg,
    UserMsg,
)
from minisgl.utils.mp import ZmqPullQueue, ZmqPushQueue, parent_sentinel

from .config import SchedulerConfig
from .scheduler import Scheduler
from .utils import StepOutput


class SchedulerIO:
    """The scheduler's two sockets: it binds the one requests arrive on (the tokenizer worker
    connects) and connects to the detokenizer's."""

    def __init__(self, backend_addr: str, detokenizer_addr: str):
        self._recv = ZmqPullQueue(backend_addr, create=True, decoder=BaseBackendMsg.decoder)
        self._send = ZmqPushQueue(detokenizer_addr, create=False, encoder=BaseTokenizerMsg.encoder)
        self.tp_size = get_tp_info().size

    def receive(self, block: bool) -> List[BaseBackendMsg]:
        """Every message that has arrived, batches unpacked. With ``block`` (nothing to run), it
        first sleeps on the socket until one comes: no busy loop. If the parent process ends
        meanwhile, that is as good as an exit message."""
        msgs: List[BaseBackendMsg] = []
        if block:
            first = self._recv.get(watch=parent_sentinel())
            msgs.append(ExitMsg() if first is None else first)
        while (msg := self._recv.get_nowait()) is not None:
            msgs.append(msg)
        msgs = [
            m for msg in msgs for m in (msg.data if isinstance(msg, BatchBackendMsg) else [msg])
        ]
        return broadcast_objects(msgs) if self.tp_size > 1 else msgs  # the same to every rank

    def send(self, msgs: List[DetokenizeMsg]) -> None:
        """One step's messages in one send."""
        if len(msgs) == 1:
            self._send.put(msgs[0])
        elif msgs:
            self._send.put(BatchTokenizerMsg(data=list(msgs)))

    def close(self) -> None:
        self._recv.close()
        self._send.close()


class FollowerIO:
    """The I/O of a rank other than 0: rank 0's messages, by broadcast (it blocks until they
    come); its tokens are rank 0's too, which sends them, so it sends nothing."""

    def receive(self, block: bool) -> List[BaseBackendMsg]:
        return broadcast_objects(None)

    def send(self, msgs: List[DetokenizeMsg]) -> None:
        pass

    def close(self) -> None:
        pass


@dataclass
class _Running:
    uid: int  # the frontend's id of the request
    req: Req  # the scheduler's
    sent: int = 0  # output tokens already sent to the detokenizer


class SchedulerLoop:
    """Messages in, one scheduler step, new tokens out; again and again until an exit message.

    The frontend names a request by its own ``uid``; the scheduler numbers its ``Req``s itself,
    so the loop keeps the map between the two while the request runs.
    """

    def __init__(self, scheduler: Scheduler, after_step: Callable[[Scheduler], None] | None = None):
        self.scheduler = scheduler
        self.after_step = after_step  # e.g. the server's gauges, written after every step
        self._by_uid: Dict[int, _Running] = {}  # frontend uid -> running request
        self._by_req: Dict[int, _Running] = {}  # Req.uid -> running request

    def run(self, io: SchedulerIO | FollowerIO) -> None:
        while True:
            for msg in io.receive(block=self.scheduler.idle):
                if isinstance(msg, ExitMsg):
                    return
                io.send(self.handle(msg))
            io.send(self.step())

    def handle(self, msg: BaseBackendMsg) -> List[DetokenizeMsg]:
        """Queue a request or abort one; a refused request's error message to send back."""
        if isinstance(msg, UserMsg):
            try:
                req = self.scheduler.add_req(msg.input_ids.tolist(), msg.sampling_params)
            except ValueError as e:
                return [DetokenizeMsg(msg.uid, -1, True, finish_reason="error", error=str(e))]
            self._by_uid[msg.uid] = self._by_req[req.uid] = _Running(msg.uid, req)
        elif isinstance(msg, AbortBackendMsg):
            self.abort(msg.uid)
        else:
            raise TypeError(f"the scheduler cannot handle {type(msg).__name__}")
        return []

    def step(self) -> List[DetokenizeMsg]:
        """One scheduler step: a DetokenizeMsg per request that got a token."""
        out = self.scheduler.step()
        if self.after_step is not None:
            self.after_step(self.scheduler)
        if out is None:
            return []
        if self.scheduler.idle:  # every page is free or cached now: check it, it costs nothing
            self.scheduler.cache_manager.check_integrity()
        return self._new_tokens(out)

    def abort(self, uid: int) -> None:
        """Drop the request wherever it is (waiting, mid-prefill, decoding, in a launched batch)
        and give back its row and pages, as if it had finished; its computed prefix stays in
        the prefix cache."""
        run = self._by_uid.pop(uid, None)
        if run is None:
            return  # finished already, or refused
        del self._by_req[run.req.uid]
        self.scheduler.abort(run.req)  # with overlap, once the batch in flight is done

    def _new_tokens(self, out: StepOutput) -> List[DetokenizeMsg]:
        finished = {req.uid: why for req, why in out.finished.items()}
        msgs = []
        for req_uid in out.uids:
            run, done = self._by_req[req_uid], req_uid in finished
            new = run.req.output_ids[run.sent :]  # one token, or none for a chunk of a prompt
            for i, token in enumerate(new):
                last = done and i == len(new) - 1
                msgs.append(
                    DetokenizeMsg(
                        run.uid, token, last, _api_reason(finished[req_uid]) if last else ""
                    )
                )
            run.sent = len(run.req.output_ids)
            if done:
                del self._by_uid[run.uid], self._by_req[req_uid]
        return msgs


def _api_reason(why: str) -> str:
    """The API's word for why a request finished: "length" at max_tokens, else "stop" (an
    EOS)."""
    return "length" if why == "length" else "stop"


def run_scheduler(
    config: SchedulerConfig,
    backend_addr: str,
    detokenizer_addr: str,
    ready: Callable[[], None] = lambda: None,
    after_step: Callable[[Scheduler], None] | None = None,
) -> None:
    """The scheduler process (rank 0): build the engine, bind the socket, say ready, serve until
    an exit message (or the parent's end)."""
    scheduler = start_rank(config)
    io = SchedulerIO(backend_addr, detokenizer_addr)
    loop = SchedulerLoop(scheduler, after_step)
    if after_step is not None:  # before the first step too: the state it starts in
        after_step(scheduler)
    ready()
    try:
        loop.run(io)
    finally:
        io.close()
        stop_rank(scheduler)


def run_follower(config: SchedulerConfig, ready: Callable[[], None] = lambda: None) -> None:
    """The scheduler process of a rank other than 0: the same loop, fed by rank 0."""
    scheduler = start_rank(config)
    ready()
    try:
        SchedulerLoop(scheduler).run(FollowerIO())
    finally:
        stop_rank(scheduler)


def start_rank(config: SchedulerConfig) -> Scheduler:
    """Join the other ranks (under tensor parallelism), then build this rank's scheduler."""
    if config.tp_size > 1:
        assert config.dist_init_addr is not None, "the launcher gives the ranks an address"
        init_distributed(config.tp_rank, config.tp_size, config.dist_init_addr, config.device)
    return Scheduler(config)


def stop_rank(scheduler: Scheduler) -> None:
    scheduler.shutdown()
    if scheduler.config.tp_size > 1:
        destroy_distributed()
