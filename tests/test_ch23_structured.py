"""Chapter 23: structured output. Every constrained output parses and validates; greedy
constrained tokens equal transformers' with xgrammar's own logits processor; free rows beside
constrained ones keep their tokens; overlap scheduling changes nothing; bad constraints get one
clear error and lose nothing."""

from __future__ import annotations

import json
import re
from typing import Any, List

import pytest
import torch
from helpers import DENSE, assert_pages_all_back, encode, hf_model, hf_tokenizer

xgrammar = pytest.importorskip("xgrammar")
jsonschema = pytest.importorskip("jsonschema")

# a pattern, not maxLength: xgrammar 0.2.9 compiles maxLength to [^"\\\r\n]{0,n}, which
# lets control characters into the string, where JSON forbids them
PERSON = {
    "type": "object",
    "additionalProperties": False,
    "required": ["name", "age", "ok"],
    "properties": {
        "name": {"type": "string", "pattern": "^[A-Za-z ]{1,8}$"},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "ok": {"type": "boolean"},
    },
}
DATE = r"20[0-9]{2}-(0[1-9]|1[0-2])-[0-3][0-9]"
YES_NO = 'root ::= answer " because " reason\nanswer ::= "yes" | "no"\nreason ::= [a-z]{1,6}'
PROMPTS = ["the weather", "a b c", "hello world", "x y z", "one two", "the red fox"]


def _llm(path: Any, **options: Any) -> Any:
    from minisgl.llm import LLM

    return LLM(str(path), device="cpu", page_size=4, num_pages=256, **options)


def _params(n: int = 120, **options: Any) -> Any:
    from minisgl.core import SamplingParams

    return SamplingParams(max_tokens=n, **options)


def _sampled(**constraint: Any) -> List[Any]:
    """Greedy, then sampled rows at two temperatures, seeded and not."""
    return [
        _params(**constraint),
        _params(temperature=1.0, seed=1, **constraint),
        _params(temperature=0.7, seed=2, top_p=0.9, **constraint),
        _params(temperature=1.3, **constraint),
    ]


@pytest.mark.parametrize("family", DENSE)
def test_json_outputs_validate_against_their_schema(tiny_models, family):
    llm = _llm(tiny_models[family])
    params = _sampled(json_schema=json.dumps(PERSON))
    outs = llm.generate(PROMPTS[: len(params)], params)
    eos = llm.scheduler.eos_token_ids
    for out in outs:
        jsonschema.validate(json.loads(out["text"]), PERSON)
        assert out["token_ids"][-1] in eos  # the grammar ended it, not max_tokens
    assert_pages_all_back(llm.scheduler)


def test_regex_and_ebnf_outputs_match(tiny_models):
    llm = _llm(tiny_models["qwen3"])
    for out in llm.generate(PROMPTS[:4], _sampled(regex=DATE)):
        assert re.fullmatch(DATE, out["text"]), out["text"]
    for out in llm.generate(PROMPTS[:4], _sampled(ebnf=YES_NO)):
        assert re.fullmatch(r"(yes|no) because [a-z]{1,6}", out["text"]), out["text"]


def test_any_json_parses(tiny_models):
    llm = _llm(tiny_models["llama3"])
    outs = llm.generate(PROMPTS[:4], _sampled(n=400, json_schema="{}"))
    for out in outs:
        if out["token_ids"][-1] in llm.scheduler.eos_token_ids:  # JSON of any size may not end
            json.loads(out["text"])
        else:
            assert len(out["token_ids"]) == 400


@torch.inference_mode()
def _hf_constrained(path: Any, prompt: str, grammar: Any, n: int) -> List[int]:
    """transformers' greedy generate under xgrammar's own logits processor, EOS ending it."""
    from xgrammar.contrib.hf import LogitsProcessor

    model, tokenizer = hf_model(path), hf_tokenizer(path)
    ids = torch.tensor([tokenizer(prompt)["input_ids"]])
    out = model.generate(
        ids,
        attention_mask=torch.ones_like(ids),
        max_new_tokens=n,
        do_sample=False,
        logits_processor=[LogitsProcessor(grammar)],
        eos_token_id=model.generation_config.eos_token_id,
        pad_token_id=0,
    )
    return out[0, ids.shape[1] :].tolist()


@pytest.mark.parametrize("family", ["qwen3", "llama3"])
def test_greedy_constrained_tokens_equal_transformers_with_xgrammar(tiny_models, family):
    from minisgl.structured import Constraint

    llm = _llm(tiny_models[family])
    compiler = llm.scheduler.grammars.compiler
    for kind, text in [("json_schema", json.dumps(PERSON)), ("regex", DATE), ("ebnf", YES_NO)]:
        grammar = compiler.compile(Constraint(kind, text))
        for prompt in PROMPTS[:2]:
            ours = llm.generate([prompt], [_params(**{kind: text})])[0]["token_ids"]
            assert ours == _hf_constrained(tiny_models[family], prompt, grammar, 120), kind


def test_free_rows_keep_their_tokens_beside_constrained_ones(tiny_models):
    """The mask touches only constrained rows: a free row's tokens, greedy or seeded, are the
    same alone and in a batch where every other row is constrained."""
    llm = _llm(tiny_models["qwen3"])
    free = [_params(40), _params(40, temperature=0.9, seed=7)]
    alone = [out["token_ids"] for out in llm.generate(PROMPTS[:2], free)]
    mixed = [free[0], _params(json_schema=json.dumps(PERSON)), free[1], _params(regex=DATE)]
    outs = llm.generate([PROMPTS[0], PROMPTS[2], PROMPTS[1], PROMPTS[3]], mixed)
    assert [outs[0]["token_ids"], outs[2]["token_ids"]] == alone
    jsonschema.validate(json.loads(outs[1]["text"]), PERSON)
    assert re.fullmatch(DATE, outs[3]["text"])


def test_overlap_scheduling_gives_the_same_tokens(tiny_models):
    """With overlap (chapter 18) a row's mask needs the token still in flight: the tokens must
    be the ones of a run without it, chunked prefill and a page boundary included."""
    prompts = PROMPTS + ["a much longer prompt that runs in two chunks of prefill " * 3]
    seeded = lambda **c: _sampled(**c)[:3]  # noqa: E731 (unseeded draws follow the batches)
    params = seeded(json_schema=json.dumps(PERSON)) + seeded(regex=DATE) + [_params(30)]
    runs = []
    for overlap in (False, True):
        llm = _llm(tiny_models["qwen3"], overlap_scheduling=overlap, max_extend_tokens=32)
        runs.append([out["token_ids"] for out in llm.generate(prompts, params)])
        assert_pages_all_back(llm.scheduler)
    assert runs[0] == runs[1]


def test_overlaps_first_decode_sees_the_prefills_token(tiny_models):
    """The first step launches a prefill and at once the decode after it: that decode's mask
    needs the prefill's token, still in flight. Short prompts, so the second launch decodes."""
    params = [_params(regex=DATE), _params(json_schema=json.dumps(PERSON))]
    runs = []
    for overlap in (False, True):
        llm = _llm(tiny_models["qwen3"], overlap_scheduling=overlap)
        runs.append([out["token_ids"] for out in llm.generate(PROMPTS[:2], params)])
    assert runs[0] == runs[1]


@pytest.mark.parametrize(
    "constraint, message",
    [
        (dict(json_schema="{not json"), "json_schema cannot be compiled: .*Failed to parse JSON"),
        (dict(json_schema='{"type": "nope"}'), "json_schema cannot be compiled: .*nope"),
        (dict(regex="(ab"), "regex cannot be compiled: .*parenthesis"),
        (dict(ebnf='start ::= "a"'), "ebnf cannot be compiled: .*root"),
        (dict(regex="[^\\s\\S]"), "regex accepts no text"),
        (dict(json_schema=" "), "json_schema is empty"),
    ],
)
def test_a_bad_constraint_gets_one_clear_error_and_loses_nothing(tiny_models, constraint, message):
    from minisgl.core import SamplingParams

    llm = _llm(tiny_models["qwen3"])
    before = llm.generate(PROMPTS[:1], [_params(10)])
    bad = SamplingParams(max_tokens=10, regex="a")
    bad.regex = None
    for field, text in constraint.items():  # set after construction: validated again on arrival
        setattr(bad, field, text)
    with pytest.raises(ValueError, match=f"request 1: {message}"):
        llm.generate(PROMPTS[:2], [_params(10), bad])
    assert not llm.scheduler.waiting  # the good request was not queued either
    assert llm.generate(PROMPTS[:1], [_params(10)]) == before


def test_one_constraint_at_most():
    from minisgl.core import SamplingParams

    with pytest.raises(ValueError, match="at most one of json_schema, regex, ebnf"):
        SamplingParams(regex="a", ebnf='root ::= "a"')


def test_grammars_compile_once_and_leave_with_their_requests(tiny_models):
    llm = _llm(tiny_models["qwen3"])
    compiler = llm.scheduler.grammars.compiler
    llm.generate(PROMPTS[:3], [_params(regex=DATE)] * 3)
    assert len(compiler._compiled) == 1  # three requests, one text: compiled once
    assert llm.scheduler.grammars.grammars == {}  # finished requests keep no matcher


def test_the_grammars_end_finishes_a_request_that_ignores_eos(tiny_models):
    """A request with ignore_eos runs to max_tokens, unless a grammar ends it: the stop token
    that completes the grammar is its last."""
    llm = _llm(tiny_models["qwen3"])
    for out in llm.generate(PROMPTS[:3], _sampled(n=60, ignore_eos=True, regex=DATE)[:3]):
        assert re.fullmatch(DATE, out["text"])
        assert out["token_ids"][-1] in llm.scheduler.eos_token_ids
        assert len(out["token_ids"]) < 60


def test_the_scheduler_says_a_grammars_end_finished_it(tiny_models):
    """Why each request finished comes from the scheduler's step: the grammar's end for those
    that ignore EOS, max_tokens for a free one that runs out; the server's loop calls the first
    "stop" and the second "length"."""
    pytest.importorskip("zmq")  # the server's loop lives beside its sockets
    from minisgl.message import UserMsg
    from minisgl.scheduler.io import SchedulerLoop

    path = tiny_models["qwen3"]
    params = _sampled(n=60, ignore_eos=True, regex=DATE)[:2] + [_params(n=3, ignore_eos=True)]
    ids = [encode(path, p) for p in PROMPTS[:3]]
    scheduler = _llm(path).scheduler
    reqs = [scheduler.add_req(i, p) for i, p in zip(ids, params)]
    finished = scheduler.run_until_idle()
    assert [finished[r] for r in reqs] == ["grammar", "grammar", "length"]
    loop = SchedulerLoop(scheduler)
    for uid, (one_ids, one_params) in enumerate(zip(ids, params)):
        loop.handle(UserMsg(uid, torch.tensor(one_ids, dtype=torch.int32), one_params))
    msgs = []
    while not scheduler.idle:
        msgs += loop.step()
    ends = sorted((m.uid, m.finish_reason) for m in msgs if m.finished)
    assert ends == [(0, "stop"), (1, "stop"), (2, "length")]


def test_a_batch_with_no_row_sampling_under_a_grammar_gets_no_mask(tiny_models):
    """Free rows cost nothing: no mask at all when no row samples under a grammar, as for a
    constrained prompt's first chunk, which samples no token."""
    from minisgl.core import Batch, Req

    manager = _llm(tiny_models["qwen3"]).scheduler.grammars
    free = Req(0, [1, 2, 3], _params(5))
    chunked = Req(1, [1, 2, 3, 4, 5, 6], _params(regex=DATE), device_len=3)  # a first chunk
    last_chunk = Req(2, [1, 2, 3, 4, 5, 6], _params(regex=DATE), cached_len=3)
    for req in (free, chunked, last_chunk):
        manager.add(req)
    assert manager.mask_for(Batch([free, chunked], "prefill"), lambda: {}) is None
    assert manager.mask_for(Batch([free, last_chunk], "prefill"), lambda: {}) is not None


def test_a_real_model_answers_in_its_schema(real_model):
    """SmolLM2-135M-Instruct, asked through its chat template for a person as JSON: greedy and
    sampled answers parse and validate, and the greedy one equals transformers' under
    xgrammar's processor."""
    from minisgl.structured import Constraint

    llm = _llm(real_model)
    tokenizer = hf_tokenizer(real_model)
    chat = [{"role": "user", "content": "Describe a person called Ada as JSON: name, age, ok."}]
    ids = tokenizer.apply_chat_template(chat, add_generation_prompt=True)["input_ids"]
    schema = json.dumps(PERSON)
    params = [
        _params(60, json_schema=schema),
        _params(60, json_schema=schema, temperature=0.8, seed=3),
    ]
    outs = llm.generate([ids, ids], params)
    for out in outs:
        jsonschema.validate(json.loads(out["text"]), PERSON)
    grammar = llm.scheduler.grammars.compiler.compile(Constraint("json_schema", schema))
    prompt = tokenizer.decode(ids)
    assert tokenizer(prompt)["input_ids"] == ids  # the same prompt tokens on both sides
    assert outs[0]["token_ids"] == _hf_constrained(real_model, prompt, grammar, 60)


on_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


@on_cuda
@pytest.mark.parametrize("vocab", [7, 300, 151_936])
def test_the_gpu_mask_kernel_masks_as_the_cpu_loop_does(vocab):
    """xgrammar's CUDA kernel and its CPU loop give the same logits for a random bitmask, on
    the rows asked for only (the rest untouched), padding bits past the vocabulary set."""
    from minisgl.structured import apply_bitmask, fill_bitmask

    torch.manual_seed(0)
    words = -(-vocab // 32)
    bitmask = torch.randint(-(2**31), 2**31 - 1, (5, words), dtype=torch.int32)
    logits = torch.randn(5, vocab)
    rows = [0, 2, 3]
    on_cpu, on_gpu = logits.clone(), logits.cuda()
    apply_bitmask(on_cpu, bitmask, rows)
    apply_bitmask(on_gpu, bitmask, rows)
    assert torch.equal(on_gpu.cpu(), on_cpu)
    pinned, rows_filled = fill_bitmask([], 5, vocab, pin_memory=True)  # its copy does not wait
    assert pinned.is_pinned() and rows_filled == []  # nothing filled: nothing to read
    assert torch.equal(on_cpu[[1, 4]], logits[[1, 4]])
    assert torch.isinf(on_cpu[rows]).any()


@on_cuda
def test_json_outputs_validate_on_cuda(tiny_models):
    """The whole path on a GPU (overlap scheduling on, the fused sampler, xgrammar's kernel)."""
    from minisgl.llm import LLM

    llm = LLM(str(tiny_models["qwen3"]), device="cuda", page_size=4, num_pages=256)
    outs = llm.generate(PROMPTS[:4], _sampled(json_schema=json.dumps(PERSON)))
    for out in outs:
        jsonschema.validate(json.loads(out["text"]), PERSON)
    assert_pages_all_back(llm.scheduler)
    llm.shutdown()


class _FakeMatcher:
    """Fills a bitmask row with the given tokens' bits, whatever lies past the vocabulary."""

    def __init__(self, tokens: List[int]):
        self.tokens = tokens

    def fill_next_token_bitmask(self, bitmask: torch.Tensor, row: int) -> None:
        words = [0] * bitmask.shape[1]
        for t in self.tokens:
            words[t // 32] |= 1 << (t % 32)
        signed = [w - (1 << 32) if w >= 1 << 31 else w for w in words]  # int32's bits
        bitmask[row] = torch.tensor(signed, dtype=torch.int32)


# 62: a multiple of 31, not of 32; 64: a multiple of 32, whose last word is all vocabulary
@pytest.mark.parametrize("vocab", [40, 62, 64])
def test_bits_past_the_vocabulary_are_no_tokens_a_grammar_allows(vocab):
    """xgrammar may leave the bits past the vocabulary set in the last word of a row: a grammar
    whose only 'tokens' are there allows nothing, and one allowing the first or the last token
    of that word allows something. (A fake matcher: no tokenizer or compiled grammar needed.)"""
    from minisgl.structured.grammar import RequestGrammar

    def allows_any(tokens: List[int]) -> bool:
        grammar = RequestGrammar.__new__(RequestGrammar)
        grammar._matcher, grammar.vocab_size, grammar.accepted = _FakeMatcher(tokens), vocab, 0
        return grammar.allows_any()

    words = -(-vocab // 32)
    last_word = range(32 * (words - 1), 32 * words)
    assert not allows_any([t for t in last_word if t >= vocab])
    assert allows_any([last_word[0]]) and allows_any([vocab - 1])
    assert allows_any([0]) and not allows_any([])
