"""SGLang's native API: ``POST /generate``, the route SGLang's own clients and its benchmark
(``python -m sglang.bench_serving --backend sglang``, the default backend) talk to.

A request is ``text`` (a string or a list of them) or ``input_ids`` (token ids, or a list of such
lists), with SGLang's ``sampling_params`` (``max_new_tokens`` ...) and ``stream``. A reply is
``{"text", "output_ids", "meta_info": {"id", "finish_reason", "prompt_tokens",
"completion_tokens", "e2e_latency"}}``, a list of them for a batch; streamed, every event
``data: {...}`` holds the text and ids so far (not the new piece), and ``data: [DONE]`` ends it.
"""

from __future__ import annotations

import secrets
import time
from typing import Any, AsyncIterator, Dict, List, Sequence

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict

from minisgl.core import SamplingParams
from minisgl.message import UserReply

from .api_server import (
    APIError,
    ClosingStreamingResponse,
    Frontend,
    all_of,
    all_pieces,
    first_pieces,
    merged,
    sse,
    stop_strings,
    unless_disconnected,
)
from .lark import ebnf_of
from .protocol import Prompt, RequestError, prompts_of

# SGLang's sampling_params -> SamplingParams' names (what the engine honours)
SAMPLING = {
    "max_new_tokens": "max_tokens",
    "temperature": "temperature",
    "top_p": "top_p",
    "top_k": "top_k",
    "ignore_eos": "ignore_eos",
    "sampling_seed": "seed",
    "regex": "regex",
    "ebnf": "ebnf",
    "json_schema": "json_schema",
    "frequency_penalty": "frequency_penalty",
    "presence_penalty": "presence_penalty",
    "repetition_penalty": "repetition_penalty",
    "logit_bias": "logit_bias",
}
# SGLang's sampling_params at the values that ask for nothing (bench_serving and SGLang's own
# client send some of them); any other value is refused, naming it
NEUTRAL: Dict[str, tuple] = {
    "stop": (),  # read apart: stop strings
    "min_p": (0, 0.0),
    "n": (1,),
    "min_new_tokens": (0,),
    "skip_special_tokens": (True,),
    "spaces_between_special_tokens": (True,),
    "no_stop_trim": (False,),
    "stop_token_ids": (None, []),
    "custom_params": (None,),
}
# the request's own fields that would change the reply, at their no-op values
UNSUPPORTED: Dict[str, tuple] = {
    "return_logprob": (None, False),
    "top_logprobs_num": (None, 0),
    "token_ids_logprob": (None,),
    "return_hidden_states": (None, False),
    "return_routed_experts": (None, False),
    "lora_path": (None,),
    "image_data": (None,),
    "audio_data": (None,),
    "video_data": (None,),
    "input_embeds": (None,),
}


class GenerateRequest(BaseModel):
    """SGLang's ``GenerateReqInput``, the fields this engine serves. Others (``rid``,
    ``logprob_start_len`` ...) are accepted and ignored, unless UNSUPPORTED lists them."""

    model_config = ConfigDict(extra="allow")
    text: Any = None
    input_ids: Any = None
    sampling_params: Any = None
    stream: bool = False


def native_prompts(req: GenerateRequest) -> List[Prompt]:
    """The batch: ``text`` or ``input_ids``, exactly one, each in the shapes of a completion's
    ``prompt``."""
    if (req.text is None) == (req.input_ids is None):
        raise RequestError("give exactly one of text and input_ids", "text")
    field = "text" if req.text is not None else "input_ids"
    value = req.text if req.text is not None else req.input_ids
    if field == "text" and not (isinstance(value, str) or isinstance(value, list)):
        raise RequestError("text: a string or a list of strings", "text")
    try:
        return prompts_of(value)
    except RequestError as e:
        raise RequestError(str(e).replace("prompt", field, 1), field) from None


def native_sampling(spec: Any, where: str = "sampling_params") -> tuple[SamplingParams, List[str]]:
    """SGLang's sampling_params as ``SamplingParams`` and stop strings; 128 new tokens unless
    ``max_new_tokens`` says otherwise, as in SGLang."""
    if spec is None:
        spec = {}
    if not isinstance(spec, dict):
        raise RequestError(f"{where}: an object, as SGLang's SamplingParams", "sampling_params")
    fields: Dict[str, Any] = {"max_tokens": 128}
    for key, value in spec.items():
        if key in SAMPLING:
            fields[SAMPLING[key]] = value
        elif key not in NEUTRAL or (key != "stop" and value not in NEUTRAL[key]):
            raise RequestError(
                f"{where}.{key}={value!r} is not supported by this server", "sampling_params"
            )
    try:
        if "ebnf" in fields:  # guidance's Lark, as on the OpenAI routes
            fields["ebnf"] = ebnf_of(fields["ebnf"])
        return SamplingParams(**fields), stop_strings(spec.get("stop"))
    except (TypeError, ValueError) as e:
        raise RequestError(f"{where}: {e}", "sampling_params") from None
    except APIError as e:
        raise RequestError(f"{where}.{e.message}", "sampling_params") from None


def _check_unsupported(req: GenerateRequest) -> None:
    for name, value in (req.model_extra or {}).items():
        if name in UNSUPPORTED and value not in UNSUPPORTED[name]:
            raise RequestError(f"{name}={value!r} is not supported by this server", name)


def _samplings(req: GenerateRequest, n: int) -> List[tuple[SamplingParams, List[str]]]:
    """One sampling per prompt: a list gives each its own, an object is shared."""
    spec = req.sampling_params
    if isinstance(spec, list):
        if len(spec) != n:
            raise RequestError(
                f"sampling_params: {len(spec)} given for {n} prompts", "sampling_params"
            )
        return [native_sampling(s, f"sampling_params[{i}]") for i, s in enumerate(spec)]
    return [native_sampling(spec)] * n


class NativeReply:
    """One prompt's reply in SGLang's shape, as it grows."""

    def __init__(self, start: float):
        self.id, self.start = secrets.token_hex(16), start
        self.text, self.ids, self.prompt_tokens = "", [], 0
        self.finish_reason: Dict[str, Any] | None = None

    def add(self, reply: UserReply) -> None:
        self.text += reply.incremental_output
        self.ids += reply.token_ids
        self.prompt_tokens = reply.num_prompt_tokens
        if reply.finished:
            kind = reply.finish_reason
            self.finish_reason = (
                {"type": "length", "length": len(self.ids)} if kind == "length" else {"type": kind}
            )

    def json(self) -> Dict[str, Any]:
        return {
            "text": self.text,
            "output_ids": list(self.ids),
            "meta_info": {
                "id": self.id,
                "finish_reason": self.finish_reason,
                "prompt_tokens": self.prompt_tokens,
                "completion_tokens": len(self.ids),
                "e2e_latency": time.perf_counter() - self.start,
            },
        }


async def _events(
    firsts: List[UserReply], streams: Sequence[AsyncIterator[UserReply]], start: float
) -> AsyncIterator[str]:
    """Each prompt's reply so far, after each of its pieces; a batch's events carry ``index``."""
    replies = [NativeReply(start) for _ in streams]
    pieces = merged(firsts, streams)
    try:
        async for index, piece in pieces:
            replies[index].add(piece)
            event = replies[index].json()
            yield sse(event if len(streams) == 1 else {**event, "index": index})
    except APIError as e:
        yield sse(e.body())
    finally:
        await pieces.aclose()  # type: ignore[attr-defined]
    yield "data: [DONE]\n\n"


def install_native_routes(app: FastAPI, frontend: Frontend) -> None:
    @app.post("/generate")
    async def generate(req: GenerateRequest, request: Request) -> Any:
        _check_unsupported(req)
        prompts = native_prompts(req)
        samplings = _samplings(req, len(prompts))
        start = time.perf_counter()
        streams = [
            frontend.generate(p, params, stop) for p, (params, stop) in zip(prompts, samplings)
        ]
        if req.stream:
            firsts = await unless_disconnected(request, first_pieces(streams))
            if not isinstance(firsts, list):
                return firsts  # the client left
            return ClosingStreamingResponse(
                _events(firsts, streams, start), media_type="text/event-stream"
            )

        async def whole() -> JSONResponse:
            replies = []
            for pieces in await all_of([all_pieces(s) for s in streams]):
                reply = NativeReply(start)
                for piece in pieces:
                    reply.add(piece)
                replies.append(reply.json())
            single = isinstance(req.text, str) or _is_one_ids(req.input_ids)
            return JSONResponse(replies[0] if single else replies)

        return await unless_disconnected(request, whole())


def _is_one_ids(input_ids: Any) -> bool:
    return isinstance(input_ids, list) and not any(isinstance(x, list) for x in input_ids)
