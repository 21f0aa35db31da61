"""Chapter 23: the mask's host work under overlap scheduling. A large batch of constrained rows,
each under a constraint unlike its neighbours', matches its constraints and gives the tokens of a
run without overlap; the batched catch-up and fill treat every row as its own matcher would;
the mask follows each row's output as it was when the batch was launched."""

from __future__ import annotations

import re
from typing import Any, List

import pytest
import torch
from helpers import assert_pages_all_back

xgrammar = pytest.importorskip("xgrammar")

DATE = r"20[0-9]{2}-(0[1-9]|1[0-2])-[0-3][0-9]"
CODE = r"[0-9]{3}-[a-c]{2}"
YES_NO = 'root ::= answer " because " reason\nanswer ::= "yes" | "no"\nreason ::= [a-z]{1,6}'
MATCHES = [DATE, CODE, r"(yes|no) because [a-z]{1,6}"]  # what each constraint's text matches


def _constraint(i: int) -> dict:
    """Row i's constraint: neighbours differ, so a row masked by another's grammar shows."""
    return [{"regex": DATE}, {"regex": CODE}, {"ebnf": YES_NO}][i % 3]


def _llm(path: Any, **options: Any) -> Any:
    from minisgl.llm import LLM

    return LLM(str(path), device="cpu", page_size=4, num_pages=512, max_running_req=96, **options)


def test_a_large_constrained_batch_matches_and_overlap_changes_nothing(tiny_models):
    """72 rows sampled at temperature 1 with seeds: under overlap every row matches its own
    constraint and every token equals the run without overlap."""
    from minisgl.core import SamplingParams

    n = 72
    prompts = [[10 + (7 * i + j) % 400 for j in range(5)] for i in range(n)]
    params = [
        SamplingParams(max_tokens=24, temperature=1.0, seed=i, **_constraint(i)) for i in range(n)
    ]
    runs = []
    for overlap in (False, True):
        llm = _llm(tiny_models["qwen3"], overlap_scheduling=overlap)
        outs = llm.generate(prompts, params)
        for i, out in enumerate(outs):
            assert re.fullmatch(MATCHES[i % 3], out["text"]), (i, out["text"])
        runs.append([out["token_ids"] for out in outs])
        assert_pages_all_back(llm.scheduler)
    assert runs[0] == runs[1]


@pytest.fixture(scope="module")
def compiler(tiny_models):
    from transformers import AutoTokenizer

    path = tiny_models["qwen3"]
    compiler = _llm(path).scheduler.grammars.compiler  # the model's vocabulary, not the tokenizer's
    return compiler, AutoTokenizer.from_pretrained(str(path))


def _grammar(compiler: Any, i: int) -> Any:
    from minisgl.structured.grammar import Constraint

    kind, text = next(iter(_constraint(i).items()))
    return compiler.matcher(Constraint(kind, text))


def _texts() -> List[str]:
    return ["2024-1", "12", "no because ab", "20", "123-a", "yes"]


def test_catching_up_a_batch_accepts_each_rows_own_tokens_once(compiler):
    """Rows 0, 1 and 2 tokens behind, caught up together, end where each one caught up alone
    ends: the same count accepted, the same mask next; a token a grammar refuses raises."""
    from minisgl.structured import catch_up_all, fill_bitmask

    compiler, tokenizer = compiler
    texts = _texts()
    ids = [tokenizer.encode(t, add_special_tokens=False) for t in texts]
    together = [_grammar(compiler, i) for i in range(len(texts))]
    alone = [_grammar(compiler, i) for i in range(len(texts))]
    behind = []
    for i, (g, tokens) in enumerate(zip(together, ids)):
        ahead = len(tokens) - (i % 3)  # 0, 1 or 2 tokens left to accept
        g.catch_up(tokens[:ahead])
        in_flight = ahead < len(tokens)  # the last token as the in-flight one, where unseen
        behind.append((g, g.behind(tokens[:-1], tokens[-1]) if in_flight else g.behind(tokens)))
    catch_up_all(behind)
    for g, tokens in zip(alone, ids):
        g.catch_up(tokens)
    assert [g.accepted for g in together] == [g.accepted for g in alone] == [len(t) for t in ids]
    vocab = compiler.vocab_size
    rows = list(enumerate(together))
    got, _ = fill_bitmask(rows, len(rows), vocab)
    want, _ = fill_bitmask(list(enumerate(alone)), len(rows), vocab)
    assert torch.equal(got, want)
    with pytest.raises(RuntimeError, match="breaks the grammar"):
        bad = _grammar(compiler, 1)  # CODE starts with a digit
        catch_up_all([(bad, tokenizer.encode("x", add_special_tokens=False))])


def test_the_batch_fill_gives_each_row_its_own_matchers_mask(compiler):
    """Rows scattered in a batch, matchers in different states: each row is what its matcher
    fills alone, and a terminated grammar's row is left out."""
    from minisgl.structured import fill_bitmask

    compiler, tokenizer = compiler
    grammars = [_grammar(compiler, i) for i in range(6)]
    for g, text in zip(grammars, _texts()):
        g.catch_up(tokenizer.encode(text, add_special_tokens=False))
    done = _grammar(compiler, 1)
    done.catch_up(tokenizer.encode("123-ab", add_special_tokens=False) + [tokenizer.eos_token_id])
    assert done.is_terminated
    rows = [(7, grammars[0]), (2, grammars[1]), (5, done), (0, grammars[2]), (4, grammars[4])]
    rows += [(9, grammars[3]), (3, grammars[5])]
    vocab = compiler.vocab_size
    bitmask, live = fill_bitmask(rows, 10, vocab)
    assert sorted(live) == [0, 2, 3, 4, 7, 9]
    for row, g in rows:
        if row in live:
            alone = xgrammar.allocate_token_bitmask(1, vocab)
            g.fill(alone, 0)
            assert torch.equal(bitmask[row], alone[0]), row
    # neighbours' masks differ, so a swap or a row skipped would show above
    assert not torch.equal(bitmask[7], bitmask[2])


def test_the_mask_follows_the_output_as_mask_for_saw_it(tiny_models):
    """A verify step (chapter 24) appends its drafts to a row's output between mask_for and the
    callback: the matcher catches up with the output mask_for saw, not with the drafts, and the
    mask is applied (digits only, as the pattern's first character wants)."""
    from minisgl.core import Batch, Req, SamplingParams

    manager = _llm(tiny_models["qwen3"]).scheduler.grammars
    req = Req(0, [1, 2, 3], SamplingParams(max_tokens=8, regex=CODE), cached_len=3)
    manager.add(req)
    mask = manager.mask_for(Batch([req], "decode"), lambda: {})
    assert mask is not None
    req.output_ids.extend([7, 7, 7])  # drafts for the length of a forward: not the output's
    logits = torch.zeros(1, manager.vocab_size)
    mask(logits)
    assert manager.grammars[req].accepted == 0
    allowed = torch.isfinite(logits[0]).nonzero().flatten().tolist()
    assert allowed and len(allowed) < manager.vocab_size
