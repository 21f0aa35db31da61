"""Chapter 24: speculative decoding. Greedy tokens with drafts (n-grams, another model, a
perturbed copy of the target) equal greedy tokens without, on every family, page size and k;
speculative sampling leaves the target's distribution as it was (and a wrong rule is caught);
refused drafts give their pages back, leave nothing in the prefix cache, and EOS, max_tokens
and aborts cut a run where they should; bad settings get one clear error each."""

from __future__ import annotations

import contextlib
import json
import re
import shutil
from pathlib import Path
from typing import Any, Callable, Dict, Iterator, List, Sequence

import pytest
import torch
from helpers import DENSE, assert_pages_all_back, greedy, hf_tokenizer, modules_imported

FAMILIES = (*DENSE, "qwen3moe")
# text that repeats its n-grams, as an edit or a quote of the prompt does: n-grams propose
PROMPTS = [
    "a b c d a b c d a b c d the quick brown fox the quick brown fox",
    "hello world hello world hello",
    "one two three four five one two three four five one two",
    "the weather today is sunny",
]
N = 24  # new tokens a row: enough steps for several runs, accepted and refused


def _llm(path: Any, page_size: int = 4, **options: Any) -> Any:
    """With drafts, the rule is off unless a test sets it: the tests of exactness need verify
    steps, which the rule's bar would often turn into decode steps on a tiny model."""
    from minisgl.llm import LLM

    if options.get("speculative"):
        options.setdefault("speculative_min_tokens", 0.0)
    return LLM(str(path), device="cpu", page_size=page_size, num_pages=256, **options)


def _tokens(llm: Any, params: Any = None, prompts: Sequence[Any] = PROMPTS) -> List[List[int]]:
    return [out["token_ids"] for out in llm.generate(list(prompts), params or greedy(N))]


@pytest.fixture(scope="session")
def perturbed(tiny_models, tmp_path_factory) -> Callable[[str], Path]:
    """family -> a copy of its tiny model with noise on every matrix: the same tokenizer and
    vocabulary, weights near enough that some drafts are right and others wrong."""
    from safetensors.torch import load_file, save_file

    made: Dict[str, Path] = {}

    def make(family: str) -> Path:
        if family not in made:
            source = tiny_models[family]
            target = tmp_path_factory.mktemp(f"{family}_perturbed")
            shutil.copytree(source, target, dirs_exist_ok=True)
            state = load_file(str(source / "model.safetensors"))
            generator = torch.Generator().manual_seed(0)
            noisy = {
                k: v + 0.1 * v.std() * torch.randn(v.shape, generator=generator)
                if v.dim() > 1
                else v
                for k, v in state.items()
            }
            save_file(noisy, str(target / "model.safetensors"), metadata={"format": "pt"})
            made[family] = target
        return made[family]

    return make


def _other_family(family: str) -> str:
    """A draft of another architecture with the same tokenizer (every family but qwen2bytes
    shares it, 450 tokens)."""
    return "qwen3" if family == "qwen3moe" else DENSE[(DENSE.index(family) + 1) % len(DENSE)]


@pytest.mark.parametrize("page_size", [1, 3, 4])
@pytest.mark.parametrize("family", FAMILIES)
def test_greedy_tokens_with_drafts_equal_greedy_tokens_without(
    tiny_models, perturbed, family, page_size
):
    """Every draft source and k: the same tokens, drafts crossing page boundaries; the
    n-gram and the perturbed drafts are right sometimes and wrong sometimes, so both the
    accepted runs and the rollback of refused drafts are exercised."""
    path = tiny_models[family]
    expected = _tokens(_llm(path, page_size))
    configs = [("ngram", None, k) for k in (1, 2, 5, 8)]
    configs += [
        ("draft", tiny_models[_other_family(family)], 3),
        ("draft", path, 4),  # its own draft: every draft accepted
        ("draft", perturbed(family), 2),
        ("draft", perturbed(family), 8),
    ]
    for method, draft, k in configs:
        llm = _llm(
            path, page_size, speculative=method, speculative_k=k, draft_model=draft and str(draft)
        )
        assert _tokens(llm) == expected, (method, draft, k)
        assert_pages_all_back(llm.scheduler)
        stats = llm.scheduler.speculator.stats
        assert stats.proposed > 0, (method, k)
        assert stats.acceptance == stats.accepted / stats.proposed
        if draft == path:
            assert stats.accepted == stats.proposed
        elif method == "ngram" or draft == perturbed(family):
            assert stats.proposed > stats.accepted > 0, (method, draft, k, stats)


def test_the_real_model_edits_a_text_as_fast_as_it_agrees(real_model):
    """SmolLM2-135M-Instruct asked to repeat a text with one word changed: the n-gram drafts
    copy from the prompt, many are right, and the tokens are greedy's own."""
    tokenizer = hf_tokenizer(real_model)
    text = "The robot read one book every night and told the children about it each morning."
    chat = [
        {"role": "user", "content": f"Repeat this text, with 'robot' replaced by 'cat': {text}"}
    ]
    ids = tokenizer.apply_chat_template(chat, add_generation_prompt=True)["input_ids"]
    expected = _tokens(_llm(real_model), greedy(32), [ids])
    llm = _llm(real_model, speculative="ngram", speculative_k=4)
    assert _tokens(llm, greedy(32), [ids]) == expected
    stats = llm.scheduler.speculator.stats
    assert stats.acceptance > 0 and stats.tokens_per_step > 1, stats


# --- speculative sampling: the target's distribution, exactly --------------------------------

V = 6
P = torch.tensor(
    [
        [0.40, 0.05, 0.25, 0.10, 0.15, 0.05],  # the target at each position
        [0.05, 0.30, 0.05, 0.20, 0.10, 0.30],
        [0.20, 0.20, 0.20, 0.10, 0.10, 0.20],
    ]
)
Q = torch.tensor(
    [
        [0.05, 0.40, 0.10, 0.30, 0.05, 0.10],  # the draft model's, far from P
        [0.30, 0.05, 0.30, 0.05, 0.25, 0.05],
    ]
)
DRAWS = 8000
TV_BOUND = 0.04  # the sampling noise of the TV distance at this many draws is about 0.01
Accept = Callable[..., List[int]]


def _tv_distances(accept: Accept, one_hot: bool) -> List[float]:
    """Total-variation distance from P of the first token of every run, and of the second
    of the runs that kept the first draft (then drawn from P[1], whatever happened before)."""
    generator = torch.Generator().manual_seed(1234)
    first, second = torch.zeros(V), torch.zeros(V)
    for i in range(DRAWS):
        if one_hot:  # drafts that are not draws: n-grams, a greedy draft model
            drafts, q = [i % V, (i // V) % V], None
        else:
            drafts = [int(torch.multinomial(Q[j], 1, generator=generator)) for j in range(2)]
            q = Q
        run = accept(drafts, P, generator, q)
        first[run[0]] += 1
        if len(run) > 1:
            assert run[0] == drafts[0]
            second[run[1]] += 1
    return [
        0.5 * float((counts / counts.sum() - P[j]).abs().sum())
        for j, counts in enumerate((first, second))
    ]


def _accept_with(rule: str) -> Accept:
    """accept_sampled with a wrong acceptance probability: to show that the statistic
    catches a rule that keeps drafts too often."""

    def accept(
        drafts: Sequence[int], p: torch.Tensor, generator: torch.Generator, q: torch.Tensor | None
    ) -> List[int]:
        run: List[int] = []
        for i, token in enumerate(drafts):
            q_i = torch.zeros(V).index_fill_(0, torch.tensor(token), 1.0) if q is None else q[i]
            chance = {"always": 1.0, "q/p": min(1.0, float(q_i[token] / p[i][token]))}[rule]
            if float(torch.rand((), generator=generator)) < chance:
                run.append(token)
                continue
            leftover = (p[i] - q_i).clamp_min(0.0)
            run.append(int(torch.multinomial(leftover / leftover.sum(), 1, generator=generator)))
            return run
        run.append(int(torch.multinomial(p[len(drafts)], 1, generator=generator)))
        return run

    return accept


@pytest.mark.parametrize("one_hot", [True, False])
def test_speculative_sampling_draws_from_the_target(one_hot):
    from minisgl.speculative import accept_sampled

    def ours(drafts, p, generator, q):
        return accept_sampled(drafts, p, generator, q)

    assert max(_tv_distances(ours, one_hot)) < TV_BOUND
    for wrong in ("always", "q/p"):  # the test's power: rules that keep too much fail it
        assert max(_tv_distances(_accept_with(wrong), one_hot)) > 2 * TV_BOUND, wrong


def test_a_seeded_sampled_run_repeats_itself(tiny_models):
    """Seeded rows draw from their own generators (their seed and step): the same tokens from
    a fresh engine, unseeded rows beside them or not."""
    from minisgl.core import SamplingParams

    seeded = [
        SamplingParams(temperature=0.8, top_p=0.9, seed=s, max_tokens=N, ignore_eos=True)
        for s in (1, 2)
    ]
    runs = []
    for extra in ([], [SamplingParams(temperature=1.0, max_tokens=N)]):
        llm = _llm(tiny_models["qwen3"], speculative="ngram", speculative_k=4)
        runs.append(_tokens(llm, seeded + extra, PROMPTS[: 2 + len(extra)])[:2])
        assert llm.scheduler.speculator.stats.proposed > 0
    assert runs[0] == runs[1] and runs[0][0] != runs[0][1]


# --- acceptance on the device: every request's run at once ---------------------------------


def _accept_batch(
    logits: torch.Tensor, drafts: Sequence[List[int]], params: Sequence[Any], seed: int = 0
) -> List[List[int]]:
    """accept_batch as the speculator calls it (a request's seed at its step 0), the runs read
    back as lists."""
    from minisgl.engine.sample import BatchSamplingArgs, row_seed
    from minisgl.speculative import accept_batch

    args = BatchSamplingArgs.from_params(params)
    args.row_seeds = [row_seed(p.seed, 0) for p in params]
    runs, lengths = accept_batch(logits, drafts, args, torch.Generator().manual_seed(seed))
    return [run[:n] for run, n in zip(runs.tolist(), lengths.tolist())]


def _greedy_drafts(
    target: List[int], lengths: Sequence[int], agree: Sequence[int]
) -> List[List[int]]:
    """Drafts of the given lengths, each equal to the target's argmax for its first ``agree``
    tokens, then one it refuses, then the argmax again: drafts after a refusal are not kept,
    even those the target agrees with."""
    drafts, start = [], 0
    for n, a in zip(lengths, agree):
        rows = target[start : start + n + 1]
        drafts.append([(rows[j] + 1) % V_BATCH if j == a else rows[j] for j in range(n)])
        start += n + 1
    return drafts


V_BATCH = 50


def test_batched_greedy_acceptance_is_accept_greedy():
    """Random logits, drafts of 0 to 6 tokens (none, all and some kept): each request's run from
    accept_batch is accept_greedy's on the argmax of its rows."""
    from minisgl.speculative import accept_greedy

    generator = torch.Generator().manual_seed(0)
    lengths = [0, 3, 3, 1, 6] + torch.randint(0, 7, (59,), generator=generator).tolist()
    agree = [0, 3, 0, 1, 6] + [
        int(torch.randint(0, n + 1, (), generator=generator)) for n in lengths[5:]
    ]
    logits = torch.randn(sum(lengths) + len(lengths), V_BATCH, generator=generator)
    target = logits.argmax(dim=-1).tolist()
    drafts = _greedy_drafts(target, lengths, agree)
    runs = _accept_batch(logits, drafts, [greedy(8)] * len(drafts))
    start = 0
    for draft, a, run in zip(drafts, agree, runs):
        assert run == accept_greedy(draft, target[start : start + len(draft) + 1])
        assert len(run) == a + 1
        start += len(draft) + 1
    assert {len(r) - 1 for r in runs} >= {0, 3, 6} and 0 in lengths


def _tv(counts: torch.Tensor, p: torch.Tensor) -> float:
    """Total-variation distance between the frequencies ``counts`` and ``p``; asserted under
    three times the bound on its expectation for n draws: E|f(x) - p(x)| <= sqrt(2 / pi) *
    sqrt(p(x) (1 - p(x)) / n), and the sum of sqrt(p (1 - p)) over V tokens is at most
    sqrt(V - 1), so E[TV] <= 0.4 * sqrt(V - 1) / sqrt(n) (0.0127 at V = 6, n = 5,000)."""
    n = float(counts.sum())
    tv = 0.5 * float((counts / n - p).abs().sum())
    assert n >= 4000, n  # enough draws that the bound is tight
    assert tv < 3 * 0.4 * (len(p) - 1) ** 0.5 / n**0.5, (tv, n, counts / n, p)
    return tv


def _filtered(logits: torch.Tensor, temperature: float, top_k: int, top_p: float) -> torch.Tensor:
    from minisgl.engine.sample import top_k_top_p_filter

    probs = torch.softmax(logits / temperature, dim=-1)
    kept = top_k_top_p_filter(
        probs, torch.tensor([top_k] * len(probs)), torch.tensor([top_p] * len(probs))
    )
    return kept / kept.sum(dim=-1, keepdim=True)


def test_batched_speculative_sampling_draws_from_the_target():
    """One batch of 111,500 requests at a vocabulary of 6, in shuffled order: sampled requests,
    in groups of one fixed draft each, and greedy ones. Whatever the draft, right or wrong, each
    sampled token is distributed as the target's p at its position: the first token of a run,
    the second after a kept draft (the next draft or its replacement), the token drawn after the
    last draft, and under a temperature, top-k and top-p, p renormalised after them. A draft
    must be fixed within a group: averaged over drafts that run through every token, a rule
    that forgets to take the draft out of its replacement gives p too. The greedy requests'
    runs are accept_greedy's."""
    from minisgl.core import SamplingParams
    from minisgl.speculative import accept_greedy

    generator = torch.Generator().manual_seed(1)
    plain = SamplingParams(temperature=1.0)
    filtered = SamplingParams(temperature=0.7, top_k=2, top_p=0.9)  # top-k leaves out 3
    sure = torch.tensor([0.90, 0.02, 0.02, 0.02, 0.02, 0.02])  # its draft, token 0, kept often
    log_p, log_sure = P.log(), sure.log()
    requests = []  # (group, draft, its rows' logits, params)
    for draft in ([0, 1], [0, 4], [3, 1]):  # p(x) 0.40 and 0.30; the second 0.10; the first 0.10
        requests += [(f"two {draft}", draft, log_p, plain)] * 15000
    # one draft nearly always kept: the next token is drawn at row 1
    requests += [("bonus", [0], torch.stack([log_sure, log_p[2]]), plain)] * 6000
    for draft in ([2], [3]):  # in top-k, and left out by it
        requests += [(f"filtered {draft}", draft, log_p[:2], filtered)] * 20000
    for _ in range(500):
        logits = torch.randn(3, V, generator=generator)
        draft = torch.randint(0, V, (2,), generator=generator).tolist()
        if torch.rand((), generator=generator) < 0.5:  # some kept
            draft[0] = int(logits[0].argmax())
        requests.append(("greedy", draft, logits, greedy(8)))
    order = torch.randperm(len(requests), generator=generator).tolist()
    groups, drafts, rows, params = zip(*[requests[i] for i in order])
    runs = _accept_batch(torch.cat(rows), drafts, params, seed=2)

    def counts(group: str, position: int) -> torch.Tensor:
        """How often each token comes out at ``position`` of the group's runs that kept every
        draft before it."""
        tokens = [r[position] for g, r in zip(groups, runs) if g == group and len(r) > position]
        return torch.bincount(torch.tensor(tokens), minlength=V).float()

    for draft, run in zip(drafts, runs):
        assert 1 <= len(run) <= len(draft) + 1 and run[:-1] == draft[: len(run) - 1]
    for pair in ("[0, 1]", "[0, 4]", "[3, 1]"):
        _tv(counts(f"two {pair}", 0), P[0])
    _tv(counts("two [0, 1]", 1), P[1])
    _tv(counts("two [0, 4]", 1), P[1])
    _tv(counts("bonus", 1), P[2])
    target = _filtered(log_p[:2], 0.7, 2, 0.9)
    for draft in ("[2]", "[3]"):
        _tv(counts(f"filtered {draft}", 0), target[0])
    _tv(counts("filtered [2]", 1), target[1])
    assert counts("filtered [3]", 0)[target[0] == 0].sum() == 0  # what top-k and top-p drop
    for group, draft, logits, run in zip(groups, drafts, rows, runs):
        if group == "greedy":
            assert run == accept_greedy(draft, logits.argmax(dim=-1).tolist())


def test_a_seeded_request_keeps_its_run_in_any_batch_and_row():
    """A seeded request's run from accept_batch alone, and at row 3 of a batch of requests with
    more drafts, greedy, unseeded and seeded with another seed, under another generator: the
    same run, for each of ten seeds, and the seeds do not all give the same."""
    from minisgl.core import SamplingParams

    generator = torch.Generator().manual_seed(3)
    logits = torch.randn(4, 100, generator=generator) * 3
    draft = logits[:3].argmax(dim=-1).tolist()  # the likeliest tokens: some kept, some not
    others = [
        (
            torch.randn(7, 100, generator=generator),
            [1, 2, 3, 4, 5, 6],
            SamplingParams(temperature=1.0),
        ),
        (torch.randn(1, 100, generator=generator), [], greedy(8)),
        (
            torch.randn(3, 100, generator=generator),
            [7, 8],
            SamplingParams(temperature=0.9, seed=99),
        ),
        (
            torch.randn(6, 100, generator=generator),
            [9, 9, 9, 9, 9],
            SamplingParams(temperature=1.0),
        ),
    ]
    alone_runs = []
    for seed in range(10):
        params = SamplingParams(temperature=0.8, top_p=0.9, seed=seed)
        alone = _accept_batch(logits, [draft], [params], seed=0)[0]
        batch = [*others[:3], (logits, draft, params), *others[3:]]
        rows, drafts, batch_params = zip(*batch)
        assert _accept_batch(torch.cat(rows), drafts, batch_params, seed=5)[3] == alone, seed
        alone_runs.append(alone)
    assert len({tuple(run) for run in alone_runs}) > 1


# --- pages, the prefix cache, aborts ----------------------------------------------------------


def _scheduler(path: Any, page_size: int = 3, **options: Any) -> Any:
    """As ``_llm``: with drafts, the rule is off unless a test sets it."""
    from minisgl.scheduler import Scheduler, SchedulerConfig

    if options.get("speculative"):
        options.setdefault("speculative_min_tokens", 0.0)
    return Scheduler(
        SchedulerConfig(str(path), device="cpu", page_size=page_size, num_pages=128, **options)
    )


def _ids(path: Any, text: str) -> List[int]:
    return hf_tokenizer(path)(text)["input_ids"]


@pytest.mark.parametrize("method", ["ngram", "draft"])
def test_pages_all_come_back_after_refusals_and_aborts(tiny_models, perturbed, method):
    """Requests aborted while they speculate, at several points, and the rest run to the end:
    no page lost or freed twice, in the target's pool or the draft's."""
    path = tiny_models["llama3"]
    draft = str(perturbed("llama3")) if method == "draft" else None
    s = _scheduler(path, cache_type="naive", speculative=method, speculative_k=5, draft_model=draft)
    reqs = [s.add_req(_ids(path, p), greedy(40)) for p in PROMPTS * 2]
    for step in range(1, 10):
        s.step()
        if step % 3 == 0:  # after the prefill: reqs[0..2] are mid-decode, speculating
            assert reqs[step // 3 - 1].output_ids and s.speculator.stats.steps > 0
            s.abort(reqs[step // 3 - 1])
    s.run_until_idle()
    assert s.speculator.stats.proposed > s.speculator.stats.accepted > 0
    s.cache_manager.check_integrity(exhaustive=True)
    s.speculator.check_integrity()
    assert s.cache_manager.num_free_pages == s.cache_manager.num_pages
    if method == "draft":
        drafter = s.speculator.drafter
        assert drafter.mirrors == {}
        drafter.cache.check_integrity(exhaustive=True)
        assert drafter.cache.num_free_pages == drafter.cache.num_pages
    assert all(len(r.output_ids) < 40 for r in reqs[:3])
    assert [len(r.output_ids) for r in reqs[3:]] == [40] * (len(reqs) - 3)


def test_a_mirror_drafts_only_when_the_draft_pool_has_all_its_pages(tiny_models, perturbed):
    """A draft mirror takes the pages for its tokens and its first k - 1 drafts at once, or
    none: one page short, the request decodes without drafts and the draft's pool keeps its
    free pages; with exactly enough free, it drafts k. Its tokens stay greedy's throughout."""
    from minisgl.utils.misc import div_ceil

    path, k, page = tiny_models["llama3"], 4, 3
    draft = str(perturbed("llama3"))
    s = _scheduler(
        path, page, cache_type="naive", speculative="draft", speculative_k=k, draft_model=draft
    )
    req = s.add_req(_ids(path, PROMPTS[1]), greedy(30))
    s.step()
    s.step()  # the prefill, then one speculative step: the mirror has run the prompt
    drafter, stats = s.speculator.drafter, s.speculator.stats
    pool = drafter.cache

    def step_with_free_pages(short: int) -> int:
        """One step with the draft pool's free pages cut to what the mirror needs, less
        ``short``: the drafts it proposed."""
        mirror = drafter.mirrors[req]
        end = len(req.all_ids) + k - 1
        needed = div_ceil(end, page) - div_ceil(mirror.cached_len, page)
        held = pool._take(pool.num_free_pages - (needed - short))
        proposed, free = stats.proposed, pool.num_free_pages
        s.step()
        if short:
            assert pool.num_free_pages == free, "a mirror that drafts nothing takes no page"
        pool._free((held[:, None] * page + torch.arange(page)).flatten())  # slots, by page
        return stats.proposed - proposed

    assert step_with_free_pages(short=1) == 0
    assert step_with_free_pages(short=0) == k
    s.run_until_idle()
    s.speculator.check_integrity()
    assert pool.num_free_pages == pool.num_pages
    pool._take(1)  # a page the draft's pool lost: the speculator's check sees it
    with pytest.raises(RuntimeError, match="pages lost"):
        s.speculator.check_integrity()
    plain = _scheduler(path, page, cache_type="naive")
    expected = plain.add_req(_ids(path, PROMPTS[1]), greedy(30))
    plain.run_until_idle()
    assert req.output_ids == expected.output_ids


def test_a_running_request_holds_only_the_pages_of_its_kept_tokens(tiny_models):
    """After each speculative step a request's pages are those of its cached tokens and the
    one it runs next: the pages a refused draft took are free again."""
    from minisgl.utils.misc import div_ceil

    path = tiny_models["qwen2"]
    s = _scheduler(path, page_size=2, cache_type="naive", speculative="ngram", speculative_k=8)
    req = s.add_req(_ids(path, PROMPTS[0]), greedy(60))
    refused = 0
    while not s.idle:
        before = s.speculator.stats
        proposed, accepted = before.proposed, before.accepted
        s.step()
        refused += (s.speculator.stats.proposed - proposed) - (
            s.speculator.stats.accepted - accepted
        )
        if req.table_idx >= 0 and len(req.output_ids) < 60:
            assert req.device_len == req.cached_len + 1 == len(req.all_ids)
            held = div_ceil(req.cached_len, s.cache_manager.page_size)
            assert s.cache_manager.num_free_pages == s.cache_manager.num_pages - held
    assert refused > 0
    assert s.cache_manager.num_free_pages == s.cache_manager.num_pages


def test_the_prefix_cache_keeps_only_accepted_tokens(tiny_models):
    """After a run full of refused drafts the radix cache holds the prompt and the tokens kept
    (whole pages, less the last token, never run): a prompt that extends them matches that
    far and gets greedy's tokens; one with a refused draft in it matches no further."""
    path, page = tiny_models["llama3"], 3
    prompt = _ids(path, PROMPTS[0])
    llm = _llm(path, page, speculative="ngram", speculative_k=6)
    out = _tokens(llm, greedy(N), [prompt])[0]
    stats = llm.scheduler.speculator.stats
    assert stats.proposed > stats.accepted > 0
    cache = llm.scheduler.cache_manager.prefix_cache
    kept = (len(prompt) + N - 1) // page * page
    assert cache.match_prefix(prompt + out).cached_len == kept
    assert cache.size_info.total_size == kept
    wrong = (out[5] + 1) % 450  # not the token greedy chose at position len(prompt) + 5
    assert (
        cache.match_prefix(prompt + out[:5] + [wrong] + out[6:]).cached_len
        == (len(prompt) + 5) // page * page
    )
    longer = prompt + out
    reference = _tokens(_llm(path, page, cache_type="naive"), greedy(8), [longer])
    assert _tokens(llm, greedy(8), [longer]) == reference
    assert_pages_all_back(llm.scheduler)


# --- where a run ends: max_tokens, EOS --------------------------------------------------------


def test_a_speculative_step_is_timed_as_draft_verify_and_accept_not_as_schedule(tiny_models):
    """With the step timer on, a verify step's work lands in phases of its own, none of them
    inside "schedule": a breakdown sums disjoint phases, and one nested in another counts
    twice."""
    llm = _llm(tiny_models["llama3"], speculative="ngram", speculative_k=4)
    timer, open_phases, nested = llm.scheduler.engine.timer, [], set()
    timed = timer._timed

    @contextlib.contextmanager
    def watched(name: str) -> Iterator[None]:
        nested.update((outer, name) for outer in open_phases)
        open_phases.append(name)
        try:
            with timed(name):
                yield
        finally:
            open_phases.pop()

    timer._timed, timer.enabled = watched, True
    _tokens(llm)
    steps = llm.scheduler.speculator.stats.forwards
    assert steps > 0 and timer.counts["accept"] == timer.counts["forward verify"] == steps
    assert timer.counts["draft"] >= steps  # a step whose drafts are all empty decodes instead
    assert not {pair for pair in nested if pair[0] == "schedule"}, nested
    timer.enabled = False


@pytest.mark.parametrize("k", [1, 3, 8, 16])
def test_max_tokens_is_never_exceeded(tiny_models, k):
    llm = _llm(tiny_models["llama3"], speculative="ngram", speculative_k=k)
    for max_tokens in (1, 2, 3, 5, 9):
        expected = _tokens(_llm(tiny_models["llama3"]), greedy(max_tokens))
        assert _tokens(llm, greedy(max_tokens)) == expected
    assert llm.scheduler.speculator.stats.accepted > 0
    assert_pages_all_back(llm.scheduler)


def test_a_run_that_holds_eos_ends_there(tiny_models, monkeypatch):
    """EOS as a draft the target accepts, inside a run: the output ends at it, the run's later
    tokens are dropped, and the text leaves it out. The target is its own draft, so its runs
    are long, and an n-gram would only propose a token seen before."""
    from minisgl.core import SamplingParams
    from minisgl.scheduler.speculator import Speculator

    path = tiny_models["llama3"]
    runs: List[List[int]] = []
    original = Speculator.decode

    def recording(self, *args):
        out = original(self, *args)
        runs.extend(out[0])
        return out

    monkeypatch.setattr(Speculator, "decode", recording)
    spec = dict(speculative="draft", draft_model=str(path), speculative_k=8)  # all accepted
    free = _tokens(_llm(path, **spec), greedy(N), PROMPTS[:1])[0]
    # a token that first appears inside a run, not at its end: made the EOS, it cuts that run
    starts = [1 + sum(len(r) for r in runs[:i]) for i in range(len(runs))]  # 1: the prefill's
    inside = [
        start + j
        for start, run in zip(starts, runs)
        for j in range(len(run) - 1)
        if free.index(run[j]) == start + j
    ]
    assert inside, runs
    eos, end = free[inside[0]], inside[0] + 1
    runs.clear()
    llm = _llm(path, **spec)
    llm.scheduler.eos_token_ids = {eos}
    out = llm.generate(PROMPTS[:1], SamplingParams(temperature=0.0, max_tokens=N))[0]
    assert out["token_ids"] == free[:end]
    assert out["text"] == llm.tokenizer.decode(free[: end - 1], skip_special_tokens=True)
    assert any(eos in run[:-1] for run in runs), runs  # the run went on past EOS: cut there
    assert_pages_all_back(llm.scheduler)


# --- speculation beside structured output -----------------------------------------------------


@pytest.mark.parametrize("graph_bs", [None, 8])
def test_constrained_rows_and_free_rows_share_a_speculative_batch(tiny_models, graph_bs):
    """A constrained request drafts nothing but runs in the same verify batch: its output is
    valid and equals its tokens without speculation, and the free rows keep greedy's. With
    verify batches padded (``graph_bs``), its row is padded to k drafts like the others, its
    first row masked and its run cut to one token."""
    pytest.importorskip("xgrammar")
    jsonschema = pytest.importorskip("jsonschema")
    from minisgl.core import SamplingParams

    date = r"20[0-9]{2}-(0[1-9]|1[0-2])-[0-3][0-9]"
    person = {
        "type": "object",
        "additionalProperties": False,
        "required": ["name", "ok"],
        "properties": {
            "name": {"type": "string", "pattern": "^[a-z]{1,6}$"},
            "ok": {"type": "boolean"},
        },
    }
    params = [
        greedy(N),
        SamplingParams(max_tokens=60, regex=date),
        greedy(N),
        SamplingParams(max_tokens=80, json_schema=json.dumps(person)),
    ]
    path = tiny_models["llama3"]
    expected = _llm(path).generate(PROMPTS, params)
    llm = _llm(path, speculative="ngram", speculative_k=4, cuda_graph_max_bs=graph_bs)
    outs = llm.generate(PROMPTS, params)
    assert [o["token_ids"] for o in outs] == [o["token_ids"] for o in expected]
    assert re.fullmatch(date, outs[1]["text"])
    jsonschema.validate(json.loads(outs[3]["text"]), person)
    assert llm.scheduler.speculator.stats.accepted > 0
    assert_pages_all_back(llm.scheduler)


# --- settings ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "options, message",
    [
        (dict(speculative="bad"), "speculative must be 'ngram' or 'draft', got 'bad'"),
        (dict(speculative="draft"), "draft_model goes with speculative='draft'"),
        (dict(speculative="ngram", draft_model="/m"), "draft_model goes with speculative='draft'"),
        (dict(draft_model="/m"), "draft_model goes with speculative='draft'"),
        (dict(speculative="ngram", speculative_k=0), r"speculative_k must be in \[1, 16\], got 0"),
        (
            dict(speculative="ngram", speculative_k=17),
            r"speculative_k must be in \[1, 16\], got 17",
        ),
        (dict(speculative="ngram", tp_size=2), "speculative decoding runs at tp_size=1 only"),
        (
            dict(speculative="ngram", speculative_max_batch=0),
            "speculative_max_batch must be >= 1 or None, got 0",
        ),
        (
            dict(speculative="ngram", speculative_min_tokens=5.5),
            r"speculative_min_tokens must be in \[0, speculative_k \+ 1\], got 5.5",
        ),
    ],
)
def test_a_bad_setting_gets_one_clear_error(tiny_models, options, message):
    from minisgl.scheduler import SchedulerConfig

    with pytest.raises(ValueError, match=message):
        SchedulerConfig(str(tiny_models["qwen3"]), device="cpu", **options)


def test_a_draft_with_another_vocabulary_is_refused(tiny_models):
    with pytest.raises(ValueError, match=r"has 512 tokens, the target 450"):
        _llm(tiny_models["llama3"], speculative="draft", draft_model=str(tiny_models["qwen2bytes"]))


def test_the_command_line_sets_speculation():
    from minisgl.server.args import parse_args

    config = parse_args(
        ["--model", "/m", "--speculative", "draft", "--draft-model", "/d", "--speculative-k", "3"]
    ).scheduler_config()
    assert (config.speculative, config.draft_model, config.speculative_k) == ("draft", "/d", 3)
    # SGLang's flags in SGLang's meanings: 6 tokens verified a step are the last token and 5 drafts
    upstream = parse_args(
        ["--model", "/m", "--speculative-algorithm", "NGRAM", "--speculative-num-draft-tokens", "6"]
    ).scheduler_config()
    assert (upstream.speculative, upstream.speculative_k, upstream.draft_model) == (
        "ngram",
        5,
        None,
    )
    standalone = parse_args(
        ["--model", "/m", "--speculative-algorithm", "standalone"]
        + ["--speculative-draft-model-path", "/d", "--speculative-num-draft-tokens", "4"]
    ).scheduler_config()
    assert (standalone.speculative, standalone.draft_model, standalone.speculative_k) == (
        "draft",
        "/d",
        3,
    )
    assert parse_args(["--model", "/m"]).scheduler_config().speculative is None
    rule = parse_args(
        ["--model", "/m", "--speculative", "ngram", "--speculative-max-batch", "16"]
        + ["--speculative-min-tokens", "2.5"]
    ).scheduler_config()
    assert (rule.speculative_max_batch, rule.speculative_min_tokens) == (16, 2.5)
    for bad in (
        ["--speculative", "eagle"],
        ["--speculative", "draft"],
        ["--speculative", "ngram", "--speculative-k", "0"],
        ["--speculative-algorithm", "EAGLE"],  # a draft head this engine does not build
        ["--speculative-algorithm", "NGRAM", "--speculative-num-draft-tokens", "1"],
        ["--speculative-algorithm", "NGRAM", "--speculative", "draft", "--draft-model", "/d"],
    ):
        with pytest.raises(SystemExit):
            parse_args(["--model", "/m", *bad])


# --- the n-gram drafter and the greedy rule, alone --------------------------------------------


def test_the_speculative_package_imports_first():
    """A fresh interpreter can import minisgl.speculative before anything else (an exercise,
    a notebook): no import cycle through the scheduler."""
    assert modules_imported("minisgl.speculative", ["minisgl.speculative.verify"]) == [
        "minisgl.speculative.verify"
    ]


def test_ngram_drafts_continue_the_latest_earlier_occurrence():
    from minisgl.speculative import propose_ngram

    tokens = [1, 2, 3, 9, 1, 2, 3, 7, 8, 1, 2, 3]
    assert propose_ngram(tokens, 3) == [7, 8, 1]  # the latest [1, 2, 3] before the suffix
    assert propose_ngram(tokens, 1) == [7]
    assert propose_ngram([5, 6, 5], 4) == [6, 5]  # what follows, as far as there is
    assert propose_ngram([1, 2, 3, 4], 4) == []  # no suffix seen before
    assert propose_ngram([4, 5, 6, 4, 5, 6, 4, 5], 2, max_n=2) == [6, 4]
    assert propose_ngram(tokens, 0) == []


def test_greedy_acceptance_keeps_the_agreeing_drafts_and_the_targets_next():
    from minisgl.speculative import accept_greedy

    assert accept_greedy([4, 5, 6], [4, 5, 9, 1]) == [4, 5, 9]  # refused at the third
    assert accept_greedy([4, 5, 6], [4, 5, 6, 1]) == [4, 5, 6, 1]  # all, and the bonus
    assert accept_greedy([4], [3, 8]) == [3]
    assert accept_greedy([], [7]) == [7]


on_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


@on_cuda
@pytest.mark.parametrize("method", ["ngram", "draft"])
def test_greedy_tokens_with_drafts_equal_without_on_cuda(tiny_models, method):
    """On a GPU in float32 (the Triton extend kernel verifies the drafts; the baseline decodes
    with CUDA graphs and overlap): the same tokens, and every page back."""
    from minisgl.core import SamplingParams
    from minisgl.llm import LLM

    path = str(tiny_models["llama3"])
    options = {"device": "cuda", "dtype": torch.float32, "page_size": 4, "num_pages": 256}
    base = LLM(path, **options)
    want = [o["token_ids"] for o in base.generate(PROMPTS, SamplingParams(max_tokens=N))]
    base.shutdown()
    extra = {"draft_model": path} if method == "draft" else {}
    llm = LLM(path, speculative=method, speculative_k=4, **options, **extra)
    got = [o["token_ids"] for o in llm.generate(PROMPTS, SamplingParams(max_tokens=N))]
    assert got == want
    assert llm.scheduler.speculator.stats.accepted > 0
    assert_pages_all_back(llm.scheduler)
    llm.shutdown()


@pytest.mark.parametrize("method", ["ngram", "draft"])
def test_padded_verify_batches_give_the_same_tokens(tiny_models, method):
    """With decode batches padded for CUDA graphs (here on a CPU, where nothing is captured),
    verify batches are padded too: every request's drafts made k long, dummy requests up to
    the captured size. The tokens are greedy's, and the padded path really ran."""
    path = tiny_models["llama3"]
    want = _tokens(_llm(path))
    extra = {"draft_model": str(path)} if method == "draft" else {}
    llm = _llm(path, cuda_graph_max_bs=8, speculative=method, speculative_k=3, **extra)
    runner = llm.scheduler.engine.verify_runner
    assert runner is not None and runner.width == 4
    padded: List[int] = []
    pad = runner.pad
    runner.pad = lambda batch: padded.append(batch.size) or pad(batch)  # type: ignore
    assert _tokens(llm) == want
    assert padded and all(size < 8 for size in padded)
    assert_pages_all_back(llm.scheduler)


def test_ngram_drafts_try_a_suffix_of_four_tokens_by_default():
    """The longest suffix looked up is 4 tokens unless asked otherwise, for the function and the
    drafter the scheduler makes: here a 5-token suffix, or a 3-token one, matches elsewhere and
    would draft other tokens."""
    from minisgl.core import Req, SamplingParams
    from minisgl.speculative import NgramDrafter, propose_ngram

    tokens = [1, 2, 3, 4, 5, 10, 2, 3, 4, 5, 20, 8, 3, 4, 5, 30, 1, 2, 3, 4, 5]
    assert propose_ngram(tokens, 2) == [20, 8]  # after the latest earlier [2, 3, 4, 5]
    assert propose_ngram(tokens, 2, max_n=5) == [10, 2]
    assert propose_ngram(tokens, 2, max_n=3) == [30, 1]
    req = Req(0, tokens, SamplingParams(max_tokens=4))
    assert NgramDrafter().propose([req], [2]) == [[20, 8]]


# --- where drafts do not pay: the n-gram index, the rule, steps without drafts -----------------


def test_the_ngram_index_drafts_what_the_scan_drafts():
    """Tokens arriving a few at a time, from a small vocabulary so that n-grams repeat: after
    every arrival the index proposes exactly what ``propose_ngram`` finds by scanning."""
    import random

    from minisgl.speculative import NgramIndex, propose_ngram

    rng = random.Random(0)
    for max_n in (1, 2, 4):
        for _ in range(20):
            tokens = [rng.randrange(5) for _ in range(rng.randrange(1, 60))]
            index, seen = NgramIndex(max_n), 0
            while seen < len(tokens):
                seen = min(len(tokens), seen + rng.randrange(1, 6))
                index.extend(tokens[:seen])
                for k in (0, 1, 3, 5):
                    assert index.propose(k) == propose_ngram(tokens[:seen], k, max_n), (
                        tokens[:seen],
                        k,
                        max_n,
                    )


def test_a_request_whose_drafts_do_not_pay_pauses_then_tries_again():
    from minisgl.core import Req, SamplingParams
    from minisgl.speculative import DraftRule

    rule = DraftRule(max_batch=4, min_tokens=2.0, warmup=2, pause_tokens=8)
    req, good = (Req(i, [1, 2, 3], SamplingParams(max_tokens=100)) for i in range(2))
    for r in (req, good):
        r.device_len = 4  # one token sampled

    def verified(r: Any, drafted: int, run: int) -> None:
        r.device_len += run
        rule.record(r, drafted, run)

    verified(req, 4, 1)
    assert rule.may_draft(req)  # one step is not yet a measure
    verified(req, 0, 1)  # nothing drafted: says nothing
    assert rule.may_draft(req)
    verified(req, 4, 2)  # average (1 + 2) / 2 = 1.5 < 2
    assert not rule.may_draft(req)
    req.device_len += 7
    assert not rule.may_draft(req)
    req.device_len += 1  # 8 tokens later
    assert rule.may_draft(req)
    verified(req, 4, 1)
    assert rule.may_draft(req)  # measured afresh after a pause
    verified(req, 4, 1)  # too few again, with no good measure between: twice as long
    req.device_len += 15
    assert not rule.may_draft(req)
    req.device_len += 1
    assert rule.may_draft(req)
    verified(req, 4, 3)
    verified(req, 4, 3)  # (3 + 3) / 2 >= 2: a good measure, the next pause is short again
    verified(req, 4, 1)
    verified(req, 4, 1)  # (1 + 1) / 2 < 2
    req.device_len += 8
    assert rule.may_draft(req)
    for _ in range(5):
        verified(good, 4, 3)
    assert rule.may_draft(good)
    edge = Req(2, [1, 2, 3], SamplingParams(max_tokens=100))
    edge.device_len = 4
    verified(edge, 4, 3)  # its first step counts in full: (3 + 1) / 2 = 2, not below the bar
    verified(edge, 4, 1)
    assert rule.may_draft(edge) and rule.records[edge].tokens == 2.0
    assert rule.batch_drafts(4) and not rule.batch_drafts(5)
    assert DraftRule(max_batch=None, min_tokens=0.0).batch_drafts(10_000)
    rule.remove(req)
    assert req not in rule.records


def test_a_batch_verifies_only_when_its_requests_are_expected_to_pay_for_the_step():
    from minisgl.core import Req, SamplingParams
    from minisgl.speculative import DraftRule

    rule = DraftRule(max_batch=None, min_tokens=2.0, warmup=1)
    reqs = [Req(i, [1, 2, 3], SamplingParams(max_tokens=100)) for i in range(6)]
    a = reqs[0]
    assert rule.batch_pays(reqs[:2], [True, True])  # unmeasured: the benefit of the doubt
    assert not rule.batch_pays(reqs[:2], [True, False])  # (2 + 1) / 2 < 2
    assert not rule.batch_pays(reqs[:1], [False])  # nothing to verify
    rule.record(a, 4, 5)
    assert rule.batch_pays(reqs[:4], [True, False, False, False])  # (5 + 3) / 4 = 2
    assert not rule.batch_pays(reqs[:5], [True, False, False, False, False])  # 8 / 5 < 2
    free = DraftRule(max_batch=None, min_tokens=0.0)
    assert free.batch_pays(reqs, [True] + [False] * 5)  # no bar: any draft verifies
    patient = DraftRule(max_batch=None, min_tokens=2.0, warmup=2)
    patient.record(a, 4, 1)  # one step is not yet a measure, for the batch as for the request
    assert patient.batch_pays(reqs[:2], [True, True])  # (2 + 2) / 2, not (1 + 2) / 2


def test_a_batch_mostly_paused_is_not_sent_to_the_speculator(tiny_models):
    """Before any draft is proposed: three of four requests paused, the one left expected to
    get the bar's 2 tokens: (2 + 3) / 4 < 2, so the step stays a decode step (overlapped where
    overlap is on); with all four free to draft it goes to the speculator."""
    from minisgl.core import Req, SamplingParams

    llm = _llm(tiny_models["llama3"], speculative="ngram", speculative_min_tokens=2.0)
    speculator = llm.scheduler.speculator
    reqs = [Req(i, [1, 2, 3], SamplingParams(max_tokens=100)) for i in range(4)]
    for req in reqs:
        req.device_len = 4  # one token sampled
    free = [False] * 4
    assert speculator.wants(reqs, free)
    for req in reqs[1:]:
        for _ in range(2):
            speculator.rule.record(req, 4, 1)  # 1 token a step: paused
    assert not any(speculator.rule.may_draft(r) for r in reqs[1:])
    assert not speculator.wants(reqs, free)
    assert speculator.wants(reqs[:1], free[:1])


@pytest.mark.parametrize("method", ["ngram", "draft"])
def test_one_request_with_drafts_in_a_batch_of_four_does_not_make_it_verify(
    tiny_models, perturbed, method
):
    """Drafts for one request of four: a verify step would cost all four for one request's
    gain, so under the bar of 2 tokens the batch decodes; with no bar it verifies. Greedy's
    tokens either way, and a draft model's mirrors, which computed drafts the step then does
    not verify, give back every page."""
    path = tiny_models["llama3"]
    want = _tokens(_llm(path))
    draft = str(perturbed("llama3")) if method == "draft" else None
    forwards = {}
    for bar in (2.0, 0.0):
        llm = _llm(
            path, speculative=method, speculative_k=4, draft_model=draft, speculative_min_tokens=bar
        )
        speculator = llm.scheduler.speculator
        propose = speculator.drafter.propose

        def first_only(reqs: Any, ks: Any, propose: Any = propose) -> List[List[int]]:
            drafts = propose(reqs, ks)
            return [d if i == 0 else [] for i, d in enumerate(drafts)] if len(reqs) > 1 else drafts

        speculator.drafter.propose = first_only  # type: ignore
        assert _tokens(llm) == want
        forwards[bar] = speculator.stats.forwards
        assert_pages_all_back(llm.scheduler)
        if method == "draft":
            drafter = speculator.drafter
            assert drafter.mirrors == {}
            assert drafter.cache.num_free_pages == drafter.cache.num_pages
    assert forwards[0.0] > forwards[2.0]


def test_a_step_with_no_drafts_runs_as_a_decode_step(tiny_models):
    """When no request has a draft, the step is an ordinary decode step: no verify forward,
    greedy's tokens, every page back."""
    path = tiny_models["llama3"]
    want = _tokens(_llm(path))
    llm = _llm(path, speculative="ngram", speculative_k=4)
    speculator = llm.scheduler.speculator
    speculator.drafter.propose = lambda reqs, ks: [[] for _ in reqs]  # type: ignore
    verified: List[int] = []
    verify = llm.scheduler.engine.verify_logits
    llm.scheduler.engine.verify_logits = lambda b: verified.append(b.size) or verify(b)
    assert _tokens(llm) == want
    assert not verified and speculator.stats.forwards == 0
    assert_pages_all_back(llm.scheduler)


def test_requests_whose_drafts_do_not_pay_stop_drafting(tiny_models):
    """A bar no verify step can clear (k + 1 tokens, every draft right, at every step):
    requests pause after their first measured steps, so far fewer verify forwards run; the
    tokens stay greedy's. One request at a time, so that the batch's bar is the request's."""
    path = tiny_models["llama3"]
    want = [_tokens(_llm(path), prompts=[p]) for p in PROMPTS]
    free = _llm(path, speculative="ngram", speculative_k=4)
    assert [_tokens(free, prompts=[p]) for p in PROMPTS] == want
    strict = _llm(path, speculative="ngram", speculative_k=4, speculative_min_tokens=5.0)
    assert [_tokens(strict, prompts=[p]) for p in PROMPTS] == want
    assert 0 < strict.scheduler.speculator.stats.forwards < free.scheduler.speculator.stats.forwards
    assert_pages_all_back(strict.scheduler)


def test_speculative_steps_and_overlapped_steps_take_turns(tiny_models):
    """With overlap on and drafts only for batches of 2 or fewer: the batch of 4 decodes
    overlapped, the host takes the in-flight tokens before the first speculative step, and
    none is launched while a batch is in flight. The tokens are greedy's at every length."""
    from minisgl.core import SamplingParams

    path = tiny_models["llama3"]
    params = [SamplingParams(max_tokens=n) for n in (6, 12, 18, 24)]
    want = [o["token_ids"] for o in _llm(path).generate(PROMPTS, params)]
    llm = _llm(path, speculative="ngram", speculative_max_batch=2, overlap_scheduling=True)
    scheduler = llm.scheduler
    assert scheduler.overlap
    overlapped, speculative = [], []
    launch, forward = scheduler._launch_speculative, scheduler.engine.forward_batch

    def launch_speculative(batch: Any) -> Any:
        speculative.append((batch.size, scheduler._in_flight is None))
        return launch(batch)

    def forward_batch(batch: Any, *args: Any) -> Any:
        if batch.phase == "decode" and scheduler._in_flight is not None:
            overlapped.append(batch.size)
        return forward(batch, *args)

    scheduler._launch_speculative = launch_speculative
    scheduler.engine.forward_batch = forward_batch
    assert [o["token_ids"] for o in llm.generate(PROMPTS, params)] == want
    assert speculative and all(size <= 2 and idle for size, idle in speculative)
    assert overlapped and max(overlapped) > 2
    assert scheduler.speculator.stats.forwards > 0
    assert_pages_all_back(scheduler)


def test_verify_graphs_cover_the_decode_graphs_within_a_token_budget(tiny_models):
    """Verify batches pad to every decode graph's size whose tokens fit 2,048: all 128 at
    k = 4; at k = 16 (17 tokens a request) up to 120."""
    path = tiny_models["llama3"]
    for k, largest in ((4, 128), (16, 120)):
        llm = _llm(path, cuda_graph_max_bs=128, speculative="ngram", speculative_k=k)
        engine = llm.scheduler.engine
        assert engine.graph_runner.max_bs == 128
        assert engine.verify_runner is not None and engine.verify_runner.max_bs == largest


def test_every_verify_step_pads_to_k_near_max_tokens(tiny_models):
    """Requests a few tokens from max_tokens still bring k drafts, so every verify step runs
    padded to a graph's size; the drafts past a request's last position go to the dummy page,
    no run is longer than max_tokens allows, and the tokens are greedy's with every page back."""
    from minisgl.core import SamplingParams

    path = tiny_models["llama3"]
    params = [SamplingParams(max_tokens=n) for n in (2, 3, 6, 11)]
    want = [o["token_ids"] for o in _llm(path).generate(PROMPTS, params)]
    llm = _llm(path, cuda_graph_max_bs=8, speculative="ngram", speculative_k=4)
    engine = llm.scheduler.engine
    padded, verified, dummy_tokens = [], [], []
    pad, verify, prepare = engine.verify_runner.pad, engine.verify_logits, engine.prepare_batch
    engine.verify_runner.pad = lambda batch: padded.append(batch.size) or pad(batch)
    engine.verify_logits = lambda batch: verified.append(batch.size) or verify(batch)

    def prepare_batch(batch: Any) -> None:
        prepare(batch)
        if batch.phase == "verify":  # the real requests' tokens come first, the padding after
            real = sum(r.extend_len for r in batch.reqs if r is not engine.verify_runner.dummy_req)
            dummy = batch.table_rows[:real] == engine.dummy_req.table_idx
            dummy_tokens.append(int(dummy.sum()))

    engine.prepare_batch = prepare_batch
    got = [o["token_ids"] for o in llm.generate(PROMPTS, params)]
    assert got == want
    assert verified and len(padded) == len(verified)
    assert any(n > 0 for n in dummy_tokens)  # some request's drafts ran past its last position
    assert_pages_all_back(llm.scheduler)


def test_a_request_at_the_context_limit_verifies_eagerly(tiny_models):
    """A request whose k drafts would run past its page-table row (the model's context limit,
    here 30 tokens) cannot pad to k: its last steps run unpadded, and its tokens are greedy's."""
    from minisgl.core import SamplingParams

    path = tiny_models["llama3"]
    prompt = [[5, 6, 7, 8] * 4]
    params = SamplingParams(max_tokens=15)
    want = [o["token_ids"] for o in _llm(path, 1, max_seq_len=30).generate(prompt, params)]
    llm = _llm(  # the model as its own draft: a draft at every step, up to the last
        path,
        1,  # pages of one token: the row is exactly the context, 30 positions
        max_seq_len=30,
        cuda_graph_max_bs=8,
        speculative="draft",
        draft_model=str(path),
        speculative_k=4,
        speculative_min_tokens=0.0,
    )
    engine = llm.scheduler.engine
    assert engine.page_table.shape[1] == 30
    padded, verified = [], []
    pad, verify = engine.verify_runner.pad, engine.verify_logits
    engine.verify_runner.pad = lambda batch: padded.append(batch.size) or pad(batch)
    engine.verify_logits = lambda batch: verified.append(batch.size) or verify(batch)
    assert [o["token_ids"] for o in llm.generate(prompt, params)] == want
    assert len(padded) < len(verified)  # the last steps, near the limit, ran unpadded
    assert_pages_all_back(llm.scheduler)
