"""Chapter 12: processes and messages.

The main process (the frontend, here a plain loop; chapter 13 makes it an API server) starts two
workers: the tokenizer/detokenizer and the scheduler. They talk through ZMQ sockets in a
directory made for this run, each message a dataclass turned into a dict and msgpack'd.

    frontend --TokenizeMsg--> tokenizer --UserMsg--> scheduler
    frontend <--UserReply-- detokenizer <--DetokenizeMsg-- scheduler
"""

from __future__ import annotations

import os
import pprint
import tempfile
from typing import Dict, List

import msgpack
import tiny_models
import torch
from transformers.utils import logging

from minisgl.core import SamplingParams
from minisgl.llm import LLM
from minisgl.message import (
    AbortMsg,
    BaseBackendMsg,
    BaseFrontendMsg,
    BaseTokenizerMsg,
    BatchFrontendMsg,
    BatchTokenizerMsg,
    ExitMsg,
    TokenizeMsg,
    UserMsg,
    UserReply,
)
from minisgl.scheduler import SchedulerConfig
from minisgl.scheduler.io import run_scheduler
from minisgl.tokenizer import tokenize_request
from minisgl.tokenizer.server import tokenizer_worker
from minisgl.utils.mp import Workers, ZmqPullQueue, ZmqPushQueue

logging.set_verbosity_error()
OPTIONS = dict(device="cpu", page_size=4, num_pages=128, max_running_req=4)
CHAT = [{"role": "user", "content": "What is the weather today?"}]


def one_message() -> None:
    """A message on its way: dataclass -> dict -> msgpack bytes -> dict -> dataclass."""
    msg = UserMsg(
        uid=7,
        input_ids=torch.tensor([12, 34, 56], dtype=torch.int32),
        sampling_params=SamplingParams(max_tokens=4),
    )
    as_dict = BaseBackendMsg.encoder(msg)
    raw = msgpack.packb(as_dict, use_bin_type=True)
    print("a UserMsg as a dict:")
    print(pprint.pformat(as_dict, width=100, sort_dicts=False))
    back = BaseBackendMsg.decoder(msgpack.unpackb(raw, raw=False))
    same = (
        back.uid == msg.uid
        and back.sampling_params == msg.sampling_params
        and back.input_ids.dtype == msg.input_ids.dtype
        and torch.equal(back.input_ids, msg.input_ids)
    )
    print(
        f"msgpack'd: {len(raw)} bytes; decoded again: a {type(back).__name__}, "
        f"equal field by field: {same}"
    )


def serve(
    workers: Workers,
    send: ZmqPushQueue,
    recv: ZmqPullQueue,
    requests: List[TokenizeMsg],
    abort: List[int],
) -> Dict[int, List[UserReply]]:
    """Send the requests (and aborts) in one batch; every reply piece, per uid, until each
    request not aborted has finished."""
    send.put(BatchTokenizerMsg(data=[*requests, *(AbortMsg(uid) for uid in abort)]))
    replies: Dict[int, List[UserReply]] = {r.uid: [] for r in requests}
    open_uids = {r.uid for r in requests} - set(abort)
    while open_uids:
        msg = recv.get(timeout=60, watch=workers.sentinels)  # bounded; a dead worker wakes it
        if msg is None:
            workers.check(timeout=5)  # raises WorkerDied, naming the worker
        for reply in msg.data if isinstance(msg, BatchFrontendMsg) else [msg]:
            replies[reply.uid].append(reply)
            if reply.finished:
                open_uids.discard(reply.uid)
    return replies


def compare(llm: LLM, req: TokenizeMsg, pieces: List[UserReply]) -> str:
    """One request's reply, its pieces joined, against LLM.generate on the same prompt."""
    if not pieces:
        return "(aborted at once: no reply)"
    last, text = pieces[-1], "".join(p.incremental_output for p in pieces)
    if last.error:
        return f"error: {last.error}"
    ids = [t for p in pieces for t in p.token_ids]
    is_chat = isinstance(req.text, list) and isinstance(req.text[0], dict)
    prompt = tokenize_request(llm.tokenizer, messages=req.text) if is_chat else req.text
    ref = llm.generate([prompt], req.sampling_params)[0]
    if req.stop:  # the reply ends at the stop string: a prefix of LLM.generate's
        same = ids == ref["token_ids"][: len(ids)] and text == ref["text"].split(req.stop[0])[0]
    else:
        same = ids == ref["token_ids"] and text == ref["text"]
    return (
        f"{last.num_prompt_tokens} + {len(ids)} tokens, {last.finish_reason!r}, the same as "
        f"LLM.generate: {same}\n  {text!r}"
    )


if __name__ == "__main__":
    torch.set_num_threads(1)
    one_message()
    with tempfile.TemporaryDirectory() as tmp:
        path = str(tiny_models.make_tiny_model("qwen3", f"{tmp}/qwen3"))
        greedy = SamplingParams(max_tokens=10, ignore_eos=True)
        requests = [
            TokenizeMsg(0, "Hello world", greedy),
            TokenizeMsg(1, "Hello world", greedy, stop=["lazy"]),
            TokenizeMsg(2, CHAT, greedy),
            TokenizeMsg(3, [133, 423, 343, 193], SamplingParams(max_tokens=6)),
            TokenizeMsg(4, "", greedy),
            TokenizeMsg(5, "Once upon a time", greedy),
        ]
        with Workers() as workers:
            recv = ZmqPullQueue(
                workers.addr("frontend"), create=True, decoder=BaseFrontendMsg.decoder
            )
            workers.start(
                "scheduler",
                run_scheduler,
                config=SchedulerConfig(path, **OPTIONS),
                backend_addr=workers.addr("scheduler"),
                detokenizer_addr=workers.addr("tokenizer"),
            )
            workers.start(
                "tokenizer",
                tokenizer_worker,
                model_path=path,
                inbox_addr=workers.addr("tokenizer"),
                backend_addr=workers.addr("scheduler"),
                frontend_addr=workers.addr("frontend"),
            )
            workers.wait_ready(timeout=120)
            print(
                f"\nworkers ready: {', '.join(workers.procs)}; their sockets:",
                sorted(os.listdir(workers.ipc_dir)),
            )
            send = ZmqPushQueue(
                workers.addr("tokenizer"), create=False, encoder=BaseTokenizerMsg.encoder
            )
            replies = serve(workers, send, recv, requests, abort=[5])
            # the tokenizer passes the exit message on to the scheduler; both exit
            workers.stop(send_exit=lambda: send.put(ExitMsg()))
            send.close()
            recv.close()
        print(
            "exit codes:",
            {name: p.exitcode for name, p in workers.procs.items()},
            "| socket directory left behind:",
            os.path.exists(workers.ipc_dir),
        )

        llm = LLM(path, **OPTIONS)
        print()
        for req in requests:
            prompt = "chat: 1 message" if req.uid == 2 else repr(req.text)
            stop = f", stop {req.stop}" if req.stop else ""
            print(f"request {req.uid} ({prompt}{stop}): {compare(llm, req, replies[req.uid])}")
        llm.shutdown()
