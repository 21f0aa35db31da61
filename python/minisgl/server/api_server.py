"""The OpenAI-compatible HTTP API: the routes, the request models, errors in OpenAI's shape, the
API key, the Prometheus metrics, the frontend's end of the queues to the tokenizer worker, and
uvicorn's server with a bounded shutdown.

A request's path: the route checks it and makes its ``SamplingParams``; ``Frontend.generate``
sends a ``TokenizeMsg`` and yields the ``UserReply`` pieces the detokenizer sends back, for each
of the request's ``n`` choices, which the route returns whole (JSON) or one by one (server-sent
events, ending with ``data: [DONE]``).
"""

from __future__ import annotations

import asyncio
import itertools
import json
import secrets
import time
from contextlib import aclosing, asynccontextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, AsyncIterator, Dict, List, Sequence, Tuple

import uvicorn
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    disable_created_metrics,
    generate_latest,
)
from pydantic import BaseModel, ConfigDict, Field, StrictInt
from starlette.exceptions import HTTPException

from minisgl.core import SamplingParams
from minisgl.function_call import ToolCallFormat
from minisgl.message import (
    AbortMsg,
    BaseFrontendMsg,
    BaseTokenizerMsg,
    BatchFrontendMsg,
    TokenizeMsg,
    UserReply,
)
from minisgl.utils.logger import init_logger
from minisgl.utils.mp import ZmqAsyncPullQueue, ZmqAsyncPushQueue

from .args import ServerArgs, served_model_name
from .choices import Choice, Stretch, rendered_logprobs
from .lark import ebnf_of
from .protocol import (
    RequestError,
    check_model,
    has_tool_turns,
    max_model_len,
    messages_of,
    model_card,
    prompts_of,
)
from .tool_calls import ChatChoice, ToolRequest, ToolTemplates, tools_of

if TYPE_CHECKING:
    from .launch import SchedulerStats

logger = init_logger(__name__)


# ---------------------------------------------------------------- errors in OpenAI's shape
class APIError(Exception):
    """An error the client gets as ``{"error": {"message", "type", "param", "code"}}``."""

    def __init__(
        self,
        status: int,
        message: str,
        kind: str = "invalid_request_error",
        param: str | None = None,
        code: str | None = None,
    ):
        super().__init__(message)
        self.status, self.message, self.kind, self.param = status, message, kind, param
        self.code = code  # OpenAI's error code ("model_not_found"); None: the status

    def body(self) -> Dict[str, Any]:
        return {
            "error": {
                "message": self.message,
                "type": self.kind,
                "param": self.param,
                "code": self.status if self.code is None else self.code,
            }
        }

    def response(self) -> JSONResponse:
        return JSONResponse(self.body(), status_code=self.status)


def _validation_message(exc: RequestValidationError) -> APIError:
    """The first problem pydantic found, as one line naming the field."""
    err = exc.errors()[0]
    if err["type"] == "json_invalid":
        return APIError(400, f"the body is not valid JSON: {err.get('ctx', {}).get('error')}")
    loc = [str(p) for p in err["loc"] if p != "body"]
    param = ".".join(loc) or None
    return APIError(400, f"{param or 'body'}: {err['msg']}", param=param)


def install_error_handlers(app: FastAPI) -> None:
    """Every error leaves as an OpenAI error body; a bug gives a bare 500, its traceback only in
    the server's log."""

    @app.exception_handler(APIError)
    async def api_error(_: Request, exc: APIError) -> JSONResponse:
        return exc.response()

    @app.exception_handler(RequestError)
    async def refused(_: Request, exc: RequestError) -> JSONResponse:
        return APIError(exc.status, str(exc), param=exc.param, code=exc.code).response()

    @app.exception_handler(RequestValidationError)
    async def invalid(_: Request, exc: RequestValidationError) -> JSONResponse:
        return _validation_message(exc).response()

    @app.exception_handler(HTTPException)
    async def http_error(request: Request, exc: HTTPException) -> JSONResponse:
        message = (
            f"no route {request.method} {request.url.path}"
            if exc.status_code == 404
            else str(exc.detail)
        )
        return APIError(exc.status_code, message).response()

    @app.exception_handler(Exception)
    async def internal(_: Request, exc: Exception) -> JSONResponse:
        logger.exception("internal error")
        return APIError(500, "internal server error", "internal_error").response()


# ---------------------------------------------------------------- requests
class _Sampling(BaseModel):
    """The fields both endpoints share. Fields no route reads (``user`` ...) are accepted and
    ignored; those that would change the reply but are not supported get a 400 (UNSUPPORTED)."""

    model_config = ConfigDict(extra="allow")
    model: str = ""
    max_tokens: StrictInt | None = None
    temperature: float = 1.0  # OpenAI's default; 0 is greedy
    top_p: float = 1.0
    top_k: StrictInt = -1
    seed: StrictInt | None = None
    stop: str | List[str] | None = None
    stream: bool = False
    stream_options: Dict[str, Any] | None = None
    ignore_eos: bool = False
    # structured output: OpenAI's response_format, or SGLang's regex and ebnf
    response_format: Dict[str, Any] | None = None
    regex: str | None = None
    ebnf: str | None = None
    n: StrictInt = 1  # choices
    # penalties and bias: OpenAI's, and SGLang's and vLLM's repetition_penalty
    presence_penalty: float | None = 0.0
    frequency_penalty: float | None = 0.0
    repetition_penalty: float | None = 1.0
    logit_bias: Dict[str, float] | None = None  # token id (a string in JSON) -> bias


class CompletionRequest(_Sampling):
    prompt: Any  # text, token ids, or a batch of either: prompts_of reads it
    max_tokens: StrictInt | None = 16  # OpenAI's default for completions
    logprobs: StrictInt | None = None  # k: each token's and its k most likely (0: none)
    echo: bool = False  # the prompt first, its log-probabilities too with logprobs


class ChatRequest(_Sampling):
    messages: List[Dict[str, Any]] = Field(min_length=1)
    max_completion_tokens: StrictInt | None = None  # the newer name of max_tokens
    logprobs: bool | None = False
    top_logprobs: StrictInt | None = None  # with logprobs: k alternatives a token
    tools: Any = None  # checked by tools_of
    tool_choice: Any = None


UNSUPPORTED: Dict[str, tuple] = {  # parameter -> the values that ask for nothing
    "best_of": (None, 1),
    "suffix": (None, ""),
    "tools": (None, []),
    "tool_choice": (None, "none"),
    "functions": (None, []),
}


def sampling_params(
    req: _Sampling,
    max_tokens: int | None,
    logprobs: int | None = None,
    prompt_logprobs: int | None = None,
) -> SamplingParams:
    """The request's ``SamplingParams``, with the log-probabilities its endpoint asks for; an
    APIError naming the parameter it cannot honour."""
    for name, value in (req.model_extra or {}).items():
        if name in UNSUPPORTED and value not in UNSUPPORTED[name]:
            raise APIError(400, f"{name}={value!r} is not supported by this server", param=name)
    if max_tokens is None:
        max_tokens = 1 << 30  # as many as the context leaves (the scheduler cuts it)
    constraint = constraint_fields(req)
    try:
        return SamplingParams(
            temperature=req.temperature,
            top_k=req.top_k,
            top_p=req.top_p,
            max_tokens=max_tokens,
            ignore_eos=req.ignore_eos,
            seed=req.seed,
            **constraint,
            logprobs=logprobs,
            prompt_logprobs=prompt_logprobs,
            n=req.n,
            presence_penalty=_or(req.presence_penalty, 0.0),
            frequency_penalty=_or(req.frequency_penalty, 0.0),
            repetition_penalty=_or(req.repetition_penalty, 1.0),
            logit_bias=req.logit_bias,
        )
    except ValueError as e:
        raise APIError(400, str(e), param=str(e).split()[0]) from None


def _or(value: float | None, default: float) -> float:
    return default if value is None else value  # a client may send null for "no penalty"


def chat_top_logprobs(req: ChatRequest) -> int | None:
    """What the chat request asks: None (no log-probabilities), or k alternatives a token."""
    if not req.logprobs:
        if req.top_logprobs:  # OpenAI: top_logprobs needs logprobs
            raise APIError(400, "top_logprobs needs logprobs: true", param="top_logprobs")
        return None
    return req.top_logprobs or 0


def constraint_fields(req: _Sampling) -> Dict[str, str]:
    """The request's constraint as ``SamplingParams`` fields: response_format's JSON schema
    (json_object: any JSON object), or regex, or ebnf (GBNF, or guidance's Lark translated);
    at most one of them."""
    try:
        ebnf = ebnf_of(req.ebnf)
    except ValueError as e:
        raise APIError(400, f"ebnf: {e}", param="ebnf") from None
    fields = {
        name: text for name, text in (("regex", req.regex), ("ebnf", ebnf)) if text is not None
    }
    schema = json_schema_of(req.response_format)
    if schema is not None:
        fields["json_schema"] = schema
    if len(fields) > 1:
        names = ", ".join("response_format" if f == "json_schema" else f for f in fields)
        raise APIError(
            400,
            f"at most one of response_format, regex, ebnf, got {names}",
            param="response_format",
        )
    return fields


def json_schema_of(response_format: Dict[str, Any] | None) -> str | None:
    """response_format -> the JSON schema's text; None for free text."""
    kind = (response_format or {}).get("type", "text")
    if kind == "text":
        return None
    if kind == "json_object":
        return json.dumps({"type": "object"})
    if kind != "json_schema":
        raise APIError(
            400,
            f"response_format.type={kind!r}: expected text, json_object or json_schema",
            param="response_format",
        )
    spec = (response_format or {}).get("json_schema")
    schema = spec.get("schema") if isinstance(spec, dict) else None
    if not isinstance(schema, dict):
        raise APIError(
            400,
            "response_format.json_schema.schema: a JSON schema (an object) is required",
            param="response_format",
        )
    return json.dumps(schema)


def stop_strings(stop: str | List[str] | None) -> List[str]:
    stops = [stop] if isinstance(stop, str) else list(stop or [])
    if any(s == "" for s in stops):
        raise APIError(400, "stop: a stop string cannot be empty", param="stop")
    return stops


# ---------------------------------------------------------------- metrics
@dataclass
class Timing:
    """One request's clock, for the latency histograms."""

    start: float = field(default_factory=time.perf_counter)
    first_token: float | None = None
    prompt_tokens: int = 0
    output_tokens: int = 0


class Metrics:
    """Prometheus metrics with the names dashboards read (``minisgl:...``)."""

    def __init__(self, stats: SchedulerStats):
        disable_created_metrics()  # no *_created series: they only repeat the start time
        self.stats = stats
        self.registry = r = CollectorRegistry()
        self.gauges = {
            name: Gauge(f"minisgl:{name}", name.replace("_", " "), registry=r)
            for name in stats.read()
        }
        self.prompt_tokens = Counter(
            "minisgl:prompt_tokens", "prompt tokens of finished requests", registry=r
        )
        self.generation_tokens = Counter(
            "minisgl:generation_tokens", "tokens generated", registry=r
        )
        buckets = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)
        self.ttft = Histogram(
            "minisgl:time_to_first_token_seconds",
            "time to first token",
            buckets=buckets,
            registry=r,
        )
        self.tpot = Histogram(
            "minisgl:time_per_output_token_seconds",
            "time per output token after the first",
            buckets=buckets,
            registry=r,
        )
        self.e2e = Histogram(
            "minisgl:e2e_request_latency_seconds", "request latency", buckets=buckets, registry=r
        )

    def observe(self, t: Timing) -> None:
        """A request that ended (finished, or its client left)."""
        now = time.perf_counter()
        self.prompt_tokens.inc(t.prompt_tokens)
        self.generation_tokens.inc(t.output_tokens)
        self.e2e.observe(now - t.start)
        if t.first_token is not None:
            self.ttft.observe(t.first_token - t.start)
            if t.output_tokens > 1:
                self.tpot.observe((now - t.first_token) / (t.output_tokens - 1))

    def render(self) -> bytes:
        for name, value in self.stats.read().items():
            self.gauges[name].set(value)
        return generate_latest(self.registry)


# ---------------------------------------------------------------- the frontend's queues
class Frontend:
    """The API server's end of the queues: it sends each request to the tokenizer worker and
    routes every reply to the request waiting for it (by uid)."""

    def __init__(self, tokenizer_addr: str, frontend_addr: str, metrics: Metrics):
        self.tokenizer_addr, self.frontend_addr, self.metrics = (
            tokenizer_addr,
            frontend_addr,
            metrics,
        )
        self.failure: str | None = None  # set once a worker has died: every request gets a 503
        self.cut_reason: str | None = None  # set when a shutdown's drain time is over
        self._waiting: Dict[int, asyncio.Queue[UserReply | None]] = {}
        self._uids = itertools.count()
        self._tasks: set[asyncio.Task] = set()
        self._closed = False

    async def start(self) -> None:
        """In the server's event loop: bind the reply socket and route replies from now on."""
        self.loop = asyncio.get_running_loop()
        self._send = ZmqAsyncPushQueue(
            self.tokenizer_addr, create=False, encoder=BaseTokenizerMsg.encoder
        )
        self._recv = ZmqAsyncPullQueue(
            self.frontend_addr, create=True, decoder=BaseFrontendMsg.decoder
        )
        self._spawn(self._route_replies())

    def close(self) -> None:
        self._closed = True  # a stream cancelled by the shutdown after this sends no abort
        for task in self._tasks:
            task.cancel()
        self._send.close()
        self._recv.close()

    @property
    def num_running(self) -> int:
        """Requests whose reply has not finished."""
        return len(self._waiting)

    def fail(self, message: str) -> None:
        """From any thread: a worker died, so every waiting request ends with a 503."""

        def wake_all() -> None:
            self.failure = message
            self._wake_all()

        self.loop.call_soon_threadsafe(wake_all)

    def cut(self, message: str) -> int:
        """In the event loop: a shutdown's drain time is over, so every reply still running
        ends with a 503 naming why (a stream, with an error event) and its request is aborted.
        Returns how many were cut."""
        self.cut_reason = message
        return self._wake_all()

    def _wake_all(self) -> int:
        for queue in self._waiting.values():
            queue.put_nowait(None)  # None: look at failure and cut_reason
        return len(self._waiting)

    async def generate(
        self,
        text: str | Sequence[int] | List[Dict[str, Any]],
        params: SamplingParams,
        stop: List[str],
        echo: bool = False,
    ) -> AsyncIterator[UserReply]:
        """One request's reply pieces, each naming its choice (``index``), until every one of
        the ``n`` choices has had its ``finished`` piece. An APIError if the request is refused
        (400) or a worker dies (503). Left early (the client went away), it aborts the request,
        so the scheduler frees its pages."""
        self._check_alive()
        uid, queue, timing = next(self._uids), asyncio.Queue(), Timing()
        self._waiting[uid] = queue
        running = params.n
        finished = False
        try:
            await self._send.put(TokenizeMsg(uid, text, params, stop, echo))
            while not finished:
                reply = await queue.get()
                if reply is None:
                    self._check_alive()
                assert reply is not None
                if reply.error:
                    raise APIError(400, reply.error)
                running -= reply.finished
                finished = running == 0
                self._time(timing, reply)
                yield reply
        finally:
            del self._waiting[uid]
            if not finished and self.failure is None and not self._closed:
                # no await in here: we may be cancelled, and a cancelled scope cancels it too
                self._spawn(self._send.put(AbortMsg(uid)))
            if timing.prompt_tokens:
                self.metrics.observe(timing)

    def _check_alive(self) -> None:
        reason = self.failure or self.cut_reason
        if reason is not None:
            raise APIError(503, f"the server is shutting down: {reason}", "service_unavailable")

    def _time(self, timing: Timing, reply: UserReply) -> None:
        timing.prompt_tokens = reply.num_prompt_tokens
        timing.output_tokens += len(reply.token_ids)
        if timing.first_token is None and reply.token_ids:
            timing.first_token = time.perf_counter()

    async def _route_replies(self) -> None:
        while True:
            msg = await self._recv.get()
            for reply in msg.data if isinstance(msg, BatchFrontendMsg) else [msg]:
                queue = self._waiting.get(reply.uid)
                if queue is not None:  # else its client left; the reply is dropped
                    queue.put_nowait(reply)

    def _spawn(self, coro: Any) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)  # a reference, so the task is not collected mid-run
        task.add_done_callback(self._tasks.discard)


# ---------------------------------------------------------------- replies
@dataclass
class ReplyFormat:
    """How one endpoint writes its replies: text completions, or chat messages (with tools, the
    calls their text holds); ``n`` choices for each prompt, the ``n`` of prompt ``p`` at indices
    ``p * n`` to ``p * n + n - 1``; with or without log-probabilities, echo (completions), or the
    output (``max_tokens: 0``)."""

    chat: bool
    model: str
    n: int = 1
    logprobs: bool = False  # the request asked for log-probabilities
    echo: bool = False  # completions: each choice starts with the prompt
    drop_output: bool = False  # max_tokens 0: the prompt alone, scored
    tools: ToolRequest | None = None
    tool_format: ToolCallFormat | None = None
    id: str = field(default_factory=lambda: secrets.token_hex(12))
    created: int = field(default_factory=lambda: int(time.time()))

    def choices(self, num_prompts: int) -> List[Choice]:
        return [Choice(i, self.echo, self.drop_output) for i in range(num_prompts * self.n)]

    def chat_choice(self) -> ChatChoice:
        return ChatChoice(self.tools, self.tool_format)

    def _envelope(self, obj: str, choices: List[Dict[str, Any]]) -> Dict[str, Any]:
        prefix = "chatcmpl-" if self.chat else "cmpl-"
        return {
            "id": prefix + self.id,
            "object": obj,
            "created": self.created,
            "model": self.model,
            "choices": choices,
        }

    def _logprobs(self, stretches: List[Stretch]) -> Dict[str, Any] | None:
        return rendered_logprobs(stretches, self.chat) if self.logprobs else None

    def whole(self, choices: List[Choice], usage: Dict[str, int]) -> Dict[str, Any]:
        obj = "chat.completion" if self.chat else "text_completion"
        return {**self._envelope(obj, [self._whole(c) for c in choices]), "usage": usage}

    def _whole(self, c: Choice) -> Dict[str, Any]:
        reason = c.finish_reason
        if self.chat:
            chat = self.chat_choice()
            shown = {"message": chat.message(c.text)}
            reason = chat.finish_reason(reason)  # type: ignore[arg-type]
        else:
            shown = {"text": c.text}
        return {
            "index": c.index,
            **shown,
            "logprobs": self._logprobs(c.stretches),
            "finish_reason": reason,
        }

    def chunks(self, choice: Choice, chat: ChatChoice, reply: UserReply) -> List[Dict[str, Any]]:
        """One reply piece of ``choice`` as chunks, the last carrying the finish reason. Chat: a
        piece may give no delta (text held: it may begin a call), or several; the piece's
        log-probabilities go with its first chunk."""
        piece = choice.add(reply)
        logprobs = self._logprobs(piece.stretches)
        reason = choice.finish_reason if reply.finished else None
        if not self.chat:
            if not (piece.text or piece.stretches or reply.finished):
                return []
            text = {"text": piece.text, "logprobs": logprobs, "finish_reason": reason}
            return [self._chunk({"index": choice.index, **text})]
        deltas = chat.deltas(piece.text)
        if reply.finished:
            deltas += chat.finish()
            reason = chat.finish_reason(reason)  # type: ignore[arg-type]
        if not deltas and (reply.finished or piece.stretches):
            deltas = [{}]
        last = len(deltas) - 1
        return [
            self._chunk(
                {
                    "index": choice.index,
                    "delta": d,
                    "logprobs": logprobs if i == 0 else None,
                    "finish_reason": reason if i == last else None,
                }
            )
            for i, d in enumerate(deltas)
        ]

    def role_chunk(self, index: int) -> Dict[str, Any]:
        delta = {"role": "assistant", "content": ""}
        return self._chunk(
            {"index": index, "delta": delta, "logprobs": None, "finish_reason": None}
        )

    def _chunk(self, choice: Dict[str, Any]) -> Dict[str, Any]:
        return self._envelope("chat.completion.chunk" if self.chat else "text_completion", [choice])

    def usage_chunk(self, usage: Dict[str, int]) -> Dict[str, Any]:
        return {**self._chunk({}), "choices": [], "usage": usage}


def _usage(prompt_tokens: int, completion_tokens: int) -> Dict[str, int]:
    """``completion_tokens`` is the number of token ids the reply's pieces carry, over every
    choice: every token generated, EOS included, or after a stop string the tokens up to and
    including the one whose text completed it (the detokenizer's rule), streamed or not,
    whatever the timing. A prompt counts once however many choices it has; a batch's usage is
    the sum over its prompts."""
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }


def sse(data: Any) -> str:
    return f"data: {json.dumps(data, ensure_ascii=False)}\n\n"


async def all_of(coros: Sequence[Any]) -> List[Any]:
    """``asyncio.gather``, except that when one fails (a refused prompt) or the whole is
    cancelled (the client left), the others are cancelled and waited for: their requests are
    aborted now, not when they would have finished."""
    tasks = [asyncio.ensure_future(c) for c in coros]
    try:
        return await asyncio.gather(*tasks)
    except BaseException:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        raise


async def first_pieces(streams: Sequence[AsyncIterator[UserReply]]) -> List[UserReply]:
    """Every prompt's first piece; if one is refused, every stream is closed (and aborted)."""
    try:
        return await all_of([anext(s) for s in streams])
    except BaseException:
        for s in streams:
            await s.aclose()  # type: ignore[attr-defined]
        raise


async def merged(
    firsts: Sequence[UserReply], streams: Sequence[AsyncIterator[UserReply]]
) -> AsyncIterator[Tuple[int, UserReply]]:
    """Every prompt's pieces as they come, with the prompt's index; a stream ends after the last
    of its choices. One stream is read in place; several by a task each, so that none waits for
    another. Left early, each is closed."""
    if len(streams) == 1:
        async with aclosing(streams[0]) as replies:  # type: ignore[type-var]
            yield 0, firsts[0]
            async for reply in replies:
                yield 0, reply
        return
    queue: asyncio.Queue[Tuple[int, UserReply | APIError | None]] = asyncio.Queue()
    tasks = [
        asyncio.ensure_future(_pump(i, f, s, queue))
        for i, (f, s) in enumerate(zip(firsts, streams))
    ]
    try:
        live = len(tasks)
        while live:
            index, item = await queue.get()
            if isinstance(item, APIError):
                raise item
            if item is None:  # that stream is over
                live -= 1
                continue
            yield index, item
    finally:
        for task in tasks:
            task.cancel()  # no await: we may be cancelled; each task closes its stream


async def _pump(
    index: int,
    reply: UserReply,
    replies: AsyncIterator[UserReply],
    queue: asyncio.Queue[Tuple[int, UserReply | APIError | None]],
) -> None:
    try:
        queue.put_nowait((index, reply))
        async for reply in replies:
            queue.put_nowait((index, reply))
        queue.put_nowait((index, None))
    except APIError as e:
        queue.put_nowait((index, e))
    finally:
        await replies.aclose()  # type: ignore[attr-defined]


async def stream_events(
    firsts: List[UserReply],
    streams: Sequence[AsyncIterator[UserReply]],
    fmt: ReplyFormat,
    include_usage: bool,
) -> AsyncIterator[str]:
    """The reply as server-sent events: chunks of each choice as its pieces come, the finish
    reason on a choice's last, then ``data: [DONE]``. A worker dying mid-stream ends it with an
    error event."""
    choices = fmt.choices(len(streams))
    chats = [fmt.chat_choice() for _ in choices]
    if fmt.chat:
        for choice in choices:
            yield sse(fmt.role_chunk(choice.index))
    pieces = merged(firsts, streams)
    async with aclosing(pieces):  # type: ignore[type-var]
        try:
            async for prompt, reply in pieces:
                i = prompt * fmt.n + reply.index
                for chunk in fmt.chunks(choices[i], chats[i], reply):
                    yield sse(chunk)
        except APIError as e:
            yield sse(e.body())
            return
    if include_usage:
        prompt_tokens = sum(f.num_prompt_tokens for f in firsts)
        completion_tokens = sum(c.num_tokens for c in choices)
        yield sse(fmt.usage_chunk(_usage(prompt_tokens, completion_tokens)))
    yield "data: [DONE]\n\n"


async def all_pieces(replies: AsyncIterator[UserReply]) -> List[UserReply]:
    """One prompt's pieces, every choice's, to the last."""
    async with aclosing(replies):  # type: ignore[type-var]
        return [reply async for reply in replies]


async def whole_reply(
    streams: Sequence[AsyncIterator[UserReply]], fmt: ReplyFormat
) -> Dict[str, Any]:
    prompts = await all_of([all_pieces(s) for s in streams])
    choices = fmt.choices(len(streams))
    for p, replies in enumerate(prompts):
        for reply in replies:
            choices[p * fmt.n + reply.index].add(reply)
    prompt_tokens = sum(replies[0].num_prompt_tokens for replies in prompts)
    completion_tokens = sum(c.num_tokens for c in choices)
    return fmt.whole(choices, _usage(prompt_tokens, completion_tokens))


async def _until_disconnect(request: Request) -> None:
    while (await request.receive())["type"] != "http.disconnect":
        pass


async def unless_disconnected(request: Request, work: Any) -> Any:
    """``await work``, unless the client disconnects first: then cancel it (which aborts the
    request) and answer 499, which nobody reads."""
    task = asyncio.ensure_future(work)
    watch = asyncio.ensure_future(_until_disconnect(request))
    done, _ = await asyncio.wait({task, watch}, return_when=asyncio.FIRST_COMPLETED)
    watch.cancel()
    if task in done:
        return task.result()
    task.cancel()
    return Response(status_code=499)


class ClosingStreamingResponse(StreamingResponse):
    """A stream that is closed as soon as the response ends, however it ends. When the client
    leaves while an event is being written, Starlette cancels the send and leaves the generator
    suspended; closing it here runs its ``finally`` (the abort) now, not whenever it is
    collected."""

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            await self.body_iterator.aclose()  # type: ignore[union-attr]


async def respond(
    request: Request,
    streams: Sequence[AsyncIterator[UserReply]],
    fmt: ReplyFormat,
    stream: bool,
    include_usage: bool,
) -> Any:
    """The first piece of every choice is awaited before any byte is sent, so a refused request
    still gets its 400 status, streamed or not."""

    async def whole() -> JSONResponse:
        return JSONResponse(await whole_reply(streams, fmt))

    if not stream:
        return await unless_disconnected(request, whole())
    firsts = await unless_disconnected(request, first_pieces(streams))
    if isinstance(firsts, Response):
        return firsts
    return ClosingStreamingResponse(
        stream_events(firsts, streams, fmt, include_usage), media_type="text/event-stream"
    )


# ---------------------------------------------------------------- the app
def create_app(args: ServerArgs, frontend: Frontend) -> FastAPI:
    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        await frontend.start()
        yield
        frontend.close()

    app = FastAPI(title="minisgl", lifespan=lifespan)
    install_error_handlers(app)
    if args.api_key is not None:
        require_api_key(app, args.api_key)
    name = served_model_name(args)
    served = [name, args.model_path]  # clients that name the path are served too
    templates = ToolTemplates(args.model_path, args.tool_call_parser)

    @app.get("/health")
    async def health() -> Response:
        if frontend.failure is not None:
            return APIError(503, frontend.failure, "service_unavailable").response()
        return Response(status_code=200)

    @app.get("/metrics")
    async def metrics() -> Response:
        return Response(frontend.metrics.render(), media_type="text/plain; version=0.0.4")

    def card() -> Dict[str, Any]:
        return model_card(name, args.model_path, max_model_len(args, frontend.metrics.stats))

    @app.get("/v1/models")
    async def models() -> Dict[str, Any]:
        return {"object": "list", "data": [card()]}

    @app.get("/v1/models/{model_id:path}")
    async def model_info(model_id: str) -> Dict[str, Any]:
        check_model(model_id, served)
        return card()

    @app.post("/v1/completions")
    async def completions(req: CompletionRequest, request: Request) -> Any:
        check_model(req.model, served)
        prompts = prompts_of(req.prompt)
        # max_tokens 0 scores the prompt: one token is drawn, as ever, and not shown
        scoring = req.max_tokens == 0
        prompt_logprobs = req.logprobs if req.echo else None
        max_tokens = 1 if scoring else req.max_tokens
        params = sampling_params(req, max_tokens, req.logprobs, prompt_logprobs)
        stop = stop_strings(req.stop)
        streams = [frontend.generate(p, params, stop, req.echo) for p in prompts]  # n choices each
        fmt = ReplyFormat(False, name, req.n, req.logprobs is not None, req.echo, scoring)
        return await respond(request, streams, fmt, req.stream, _include_usage(req))

    @app.post("/v1/chat/completions")
    async def chat(req: ChatRequest, request: Request) -> Any:
        check_model(req.model, served)
        tools = tools_of(req.tools, req.tool_choice)
        messages = messages_of(req.messages)
        limit = req.max_tokens if req.max_completion_tokens is None else req.max_completion_tokens
        top = chat_top_logprobs(req)
        params = sampling_params(req, limit, top)
        prompt: Any = messages  # the tokenizer worker applies the chat template
        tool_format = None
        if tools is not None or has_tool_turns(messages):  # the template, here, with tools
            prompt, params, tool_format = await templates.prompt(messages, tools, params)
        replies = frontend.generate(prompt, params, stop_strings(req.stop))
        fmt = ReplyFormat(True, name, req.n, top is not None, tools=tools, tool_format=tool_format)
        return await respond(request, [replies], fmt, req.stream, _include_usage(req))

    from .native import install_native_routes  # here: native.py builds on this module

    install_native_routes(app, frontend)
    return app


def _include_usage(req: _Sampling) -> bool:
    return bool((req.stream_options or {}).get("include_usage"))


def require_api_key(app: FastAPI, api_key: str) -> None:
    """Every /v1 route needs ``Authorization: Bearer KEY`` (/health and /metrics stay open, for
    probes and scrapers)."""
    expected = f"Bearer {api_key}".encode()

    @app.middleware("http")
    async def check_key(request: Request, call_next: Any) -> Response:
        given = request.headers.get("authorization", "").encode()
        if request.url.path.startswith("/v1") and not secrets.compare_digest(given, expected):
            return APIError(
                401,
                "invalid or missing API key: send 'Authorization: Bearer <key>'",
                "authentication_error",
            ).response()
        return await call_next(request)


# ---------------------------------------------------------------- a bounded shutdown
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
        logger.warning(
            "stopping: no new requests; replies under way: %d, given %.1f s",
            self.frontend.num_running,
            self.drain_s,
        )
        timer = asyncio.get_running_loop().call_later(self.drain_s, self._cut)
        try:
            await super().shutdown(sockets)
        finally:
            timer.cancel()

    def _cut(self) -> None:
        n = self.frontend.cut(f"the reply was cut after {self.drain_s:g} s (--shutdown-timeout)")
        if n:
            logger.warning("replies still running after %.1f s: %d, cut", self.drain_s, n)
