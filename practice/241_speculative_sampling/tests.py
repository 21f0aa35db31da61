"""Exercise 241's tests: each takes the learner's module and checks its behaviour."""

from __future__ import annotations

import copy
import importlib
import importlib.util
import math
import random

# The engine's verify.py and torch, where they are installed: loaded here, outside any one
# test's time limit, through importlib (an import statement of a package outside the standard
# library is refused in a browser exercise), and from its file alone, so that nothing else of
# the engine is imported; the browser has neither and skips that test
try:
    torch = importlib.import_module("torch")
    _package = importlib.util.find_spec("minisgl")
    _spec = importlib.util.spec_from_file_location(
        "exercise_241_engine_verify",
        f"{_package.submodule_search_locations[0]}/speculative/verify.py",
    )
    engine = importlib.util.module_from_spec(_spec)
    _spec.loader.exec_module(engine)
except (ImportError, AttributeError, FileNotFoundError):
    torch = engine = None

CLOSE = 1e-9  # how near draw's weights must sum to 1, and sit to the weights worked out here
RUNS = 20_000  # each statistical check's runs
SIGMAS = 5  # how far a frequency may stray from its probability, in standard deviations


class Draw:
    """The `draw` the tests hand in: it checks that it gets a distribution over V tokens,
    records it, and picks a token, by `pick` or from a random.Random."""

    def __init__(self, size: int, pick: int | None = None, rng: random.Random | None = None):
        self.size, self.pick, self.rng = size, pick, rng
        self.calls: list[list[float]] = []

    def __call__(self, probs: list[float]) -> int:
        probs = list(probs)
        assert len(probs) == self.size, (
            f"draw got {len(probs)} weights, not one for each of the {self.size} tokens"
        )
        assert all(w >= 0 for w in probs), f"draw got negative weights: {probs}"
        assert abs(sum(probs) - 1) < CLOSE, (
            f"draw takes a distribution, but these weights sum to {sum(probs)}: {probs}"
        )
        self.calls.append(probs)
        if self.rng is not None:
            return self.rng.choices(range(self.size), probs)[0]
        return self.pick if self.pick is not None else max(range(self.size), key=probs.__getitem__)


def sampled(solution, drafts, p, q, uniforms, draw: Draw) -> list[int]:
    run = solution.accept_sampled(
        list(drafts), copy.deepcopy(p), copy.deepcopy(q), list(uniforms), draw
    )
    run = list(run)
    assert all(isinstance(t, int) for t in run), f"the run must be ints: {run}"
    return run


def check_run(
    solution,
    drafts,
    p,
    q,
    uniforms,
    pick: int,
    want_run: list[int],
    want_weights: list[float],
    what: str,
) -> None:
    draw = Draw(len(p[0]), pick)
    run = sampled(solution, drafts, p, q, uniforms, draw)
    call = f"accept_sampled({drafts}, p, {'None' if q is None else 'q'}, {uniforms}, draw)"
    assert len(draw.calls) == 1, f"{what}: {call} called draw {len(draw.calls)} times, not once"
    got = draw.calls[0]
    near = all(abs(a - b) < CLOSE for a, b in zip(got, want_weights))
    assert near, f"{what}: {call} should draw from {rounded(want_weights)}, not {rounded(got)}"
    assert run == want_run, f"{what}: {call} is {want_run} (draw picks {pick}), not {run}"


def rounded(weights: list[float]) -> list[float]:
    return [round(w, 4) for w in weights]


P3 = [[0.5, 0.3, 0.2], [0.1, 0.2, 0.7], [0.6, 0.3, 0.1]]
Q3 = [[0.8, 0.1, 0.1], [0.2, 0.2, 0.6]]


def test_the_statements_example(solution):
    check_run(solution, [0, 2], P3, Q3, [0.7, 0.1], 1, [1], [0.0, 2 / 3, 1 / 3], "x_0 refused")
    check_run(solution, [0, 2], P3, Q3, [0.6, 0.99], 0, [0, 2, 0], P3[2], "both kept")
    check_run(
        solution,
        [2],
        P3[1:],
        None,
        [0.75],
        1,
        [1],
        [1 / 3, 2 / 3, 0.0],
        "a deterministic draft refused",
    )
    run = list(solution.accept_greedy([4, 7, 1], [4, 7, 9, 3]))
    assert run == [4, 7, 9], f"accept_greedy([4, 7, 1], [4, 7, 9, 3]) is [4, 7, 9], not {run}"


def test_greedy_runs_of_every_length(solution):
    target = [5, 0, 3, 3, 8]
    for kept in range(5):
        drafts = target[:kept] + [9] * (4 - kept)  # 9 is never the target's argmax here
        run = list(solution.accept_greedy(list(drafts), list(target)))
        want = target[: kept + 1]
        assert run == want, f"accept_greedy({drafts}, {target}) is {want}, not {run}"
    run = list(solution.accept_greedy([], [6]))
    assert run == [6], f"no drafts: accept_greedy([], [6]) is the target's token, [6], not {run}"
    drafts = [5, 1, 3, 3]  # the third and fourth match, but after a mismatch they do not count
    run = list(solution.accept_greedy(drafts, target))
    assert run == [5, 0], f"accept_greedy({drafts}, {target}) is [5, 0], not {run}"


def test_refused_in_the_middle(solution):
    p = [
        [0.25, 0.25, 0.5, 0.0],
        [0.0, 0.5, 0.25, 0.25],
        [0.5, 0.5, 0.0, 0.0],
        [0.25, 0.25, 0.25, 0.25],
    ]
    q = [[0.25, 0.25, 0.25, 0.25], [0.0, 0.0, 0.0, 1.0], [0.0, 1.0, 0.0, 0.0]]
    # x_0 = 2 always kept (0.5 / 0.25 > 1); x_1 = 3 kept with probability 0.25: 0.5 refuses it,
    # and the leftover max(p_1 - q_1, 0) is [0, 0.5, 0.25, 0] over 0.75; x_2 is not looked at,
    # though its uniform 0.0 would keep it
    check_run(
        solution,
        [2, 3, 1],
        p,
        q,
        [0.999, 0.5, 0.0],
        1,
        [2, 1],
        [0.0, 2 / 3, 1 / 3, 0.0],
        "x_1 refused",
    )
    check_run(
        solution, [2, 3, 1], p, q, [0.999, 0.2, 0.0], 3, [2, 3, 1, 3], p[3], "every draft kept"
    )
    check_run(
        solution,
        [2, 3, 1],
        p,
        q,
        [0.999, 0.2, 0.5],
        0,
        [2, 3, 0],
        [1.0, 0.0, 0.0, 0.0],
        "x_2 refused",
    )


def test_refused_at_the_first(solution):
    p = [[0.4, 0.1, 0.5], [0.2, 0.2, 0.6]]
    q = [[0.1, 0.8, 0.1]]
    # x_0 = 1 kept with probability 0.1 / 0.8 = 0.125; leftover [0.3, 0, 0.4] over 0.7
    check_run(solution, [1], p, q, [0.5], 2, [2], [3 / 7, 0.0, 4 / 7], "x_0 refused")
    check_run(solution, [1], p, q, [0.1], 2, [1, 2], p[1], "x_0 kept")


def test_no_drafts(solution):
    p = [[0.1, 0.6, 0.3]]
    for q in (None, []):
        check_run(solution, [], p, q, [], 2, [2], p[0], f"k = 0, draft_probs {q}")


def test_p_equal_to_q_keeps_every_draft(solution):
    rng = random.Random(241)
    for _ in range(20):
        k, size = rng.randint(1, 5), rng.randint(2, 6)
        p = [distribution(rng, size) for _ in range(k + 1)]
        drafts = [rng.randrange(size) for _ in range(k)]
        q = [list(row) for row in p[:k]]
        for row, token in zip(q, drafts):  # a draft's own token always has some probability
            if row[token] == 0:
                row[token] = 0.5
                row[:] = [w / sum(row) for w in row]
        p[:k] = copy.deepcopy(q)
        uniforms = [1 - 2**-40] * k  # as near 1 as a uniform gets: p / q = 1 still keeps
        check_run(solution, drafts, p, q, uniforms, 0, drafts + [0], p[k], "p equal to q")


def test_a_token_of_probability_0_is_never_kept(solution):
    p = [[0.5, 0.5, 0.0], [0.0, 0.0, 1.0]]
    check_run(
        solution,
        [2],
        p,
        [[0.2, 0.2, 0.6]],
        [0.0],
        0,
        [0],
        [0.5, 0.5, 0.0],
        "p_0(2) = 0 at a uniform of 0.0",
    )
    check_run(
        solution,
        [2],
        p,
        None,
        [0.0],
        1,
        [1],
        [0.5, 0.5, 0.0],
        "p_0(2) = 0 at a uniform of 0.0, a deterministic draft",
    )


def test_deterministic_drafts(solution):
    p = [[0.1, 0.2, 0.3, 0.4], [0.25, 0.5, 0.125, 0.125], [0.0, 0.0, 1.0, 0.0]]
    # x_i kept when the uniform is less than p_i(x_i); the leftover is p_i without x_i
    check_run(
        solution, [3, 1], p, None, [0.3, 0.6], 0, [3, 0], [0.5, 0.0, 0.25, 0.25], "x_1 refused"
    )
    check_run(
        solution, [3, 1], p, None, [0.45, 0.0], 2, [2], [1 / 6, 1 / 3, 1 / 2, 0.0], "x_0 refused"
    )
    check_run(solution, [3, 1], p, None, [0.39, 0.49], 2, [3, 1, 2], p[2], "both kept")
    check_run(
        solution,
        [2],
        [[0.0, 0.0, 1.0], [0.5, 0.0, 0.5]],
        None,
        [1 - 2**-40],
        0,
        [2, 0],
        [0.5, 0.0, 0.5],
        "p_0(x_0) = 1 keeps it",
    )


def test_inputs_unchanged(solution):
    drafts, q, uniforms = [0, 2], copy.deepcopy(Q3), [0.7, 0.1]
    p = copy.deepcopy(P3)
    solution.accept_sampled(drafts, p, q, uniforms, Draw(3, 1))
    assert (drafts, p, q, uniforms) == ([0, 2], P3, Q3, [0.7, 0.1]), (
        "accept_sampled changed its inputs"
    )
    p = copy.deepcopy(P3[1:])
    solution.accept_sampled([2], p, None, [0.75], Draw(3, 1))
    assert p == P3[1:], f"accept_sampled changed target_probs: {p}"
    drafts, target = [4, 7, 1], [4, 7, 9, 3]
    run = solution.accept_greedy(drafts, target)
    assert (drafts, target) == ([4, 7, 1], [4, 7, 9, 3]), "accept_greedy changed its inputs"
    assert run is not target, "accept_greedy must return a new list, not target_ids"


def distribution(rng: random.Random, size: int) -> list[float]:
    weights = [rng.random() for _ in range(size)]
    return [w / sum(weights) for w in weights]


def frequencies_match(counts: list[int], probs: list[float], what: str) -> None:
    n = sum(counts)
    assert n > 100, f"{what}: only {n} of the {RUNS} runs got there"
    for token, (count, prob) in enumerate(zip(counts, probs)):
        bound = SIGMAS * math.sqrt(prob * (1 - prob) / n) + 1e-3
        assert abs(count / n - prob) <= bound, (
            f"{what}: token {token} came out {count / n:.4f} of {n} times, but has "
            f"probability {prob:.4f} (off by more than {bound:.4f})"
        )


def emitted(solution, p, q_rows, rng: random.Random) -> list[list[int]]:
    """The first three tokens' counts over RUNS runs: the first of every run, the second of
    the runs that kept x_0, the third of those that kept both; drafts drawn from q_rows (a
    deterministic draft: its one token)."""
    size = len(p[0])
    counts = [[0] * size for _ in range(3)]
    deterministic = all(max(row) == 1.0 for row in q_rows)
    for _ in range(RUNS):
        drafts = [rng.choices(range(size), row)[0] for row in q_rows]
        q = None if deterministic else q_rows
        uniforms = [rng.random() for _ in drafts]
        # no copies of p and q, as in sampled: they cost more than the rule (inputs_unchanged
        # checks that the rule leaves them)
        run = list(solution.accept_sampled(drafts, p, q, uniforms, Draw(size, rng=rng)))
        assert 1 <= len(run) <= len(drafts) + 1, f"a run of {len(run)} tokens from 2 drafts"
        for position, token in enumerate(run):
            counts[position][token] += 1
    return counts


def test_tokens_come_out_distributed_as_p(solution):
    rng = random.Random(2410)
    p = [[0.1, 0.2, 0.3, 0.4], [0.05, 0.45, 0.1, 0.4], [0.4, 0.3, 0.2, 0.1]]
    q = [[0.4, 0.3, 0.2, 0.1], [0.25, 0.25, 0.25, 0.25]]
    counts = emitted(solution, p, q, rng)
    for position, what in enumerate(
        ("the first token", "the second token, x_0 kept", "the bonus token, both kept")
    ):
        frequencies_match(counts[position], p[position], f"drafts from q: {what}")


def test_deterministic_drafts_come_out_distributed_as_p(solution):
    rng = random.Random(2411)
    p = [[0.3, 0.1, 0.2, 0.4], [0.2, 0.2, 0.5, 0.1], [0.1, 0.6, 0.1, 0.2]]
    q = [[0.0, 0.0, 0.0, 1.0], [0.0, 1.0, 0.0, 0.0]]  # drafts 3 then 1, draft_probs None
    counts = emitted(solution, p, q, rng)
    for position, what in enumerate(
        ("the first token", "the second token, x_0 kept", "the bonus token, both kept")
    ):
        frequencies_match(counts[position], p[position], f"deterministic drafts: {what}")


class _EngineTorch:
    """torch, as the engine's verify.py sees it in the next test: its uniforms are the test's
    and its draw is the test's `Draw`; everything else is torch's own."""

    def __init__(self, uniforms: list[float], draw: Draw):
        self.uniforms, self.draw = iter(uniforms), draw

    def __getattr__(self, name: str):
        return getattr(torch, name)

    def rand(self, *args, **kwargs):
        return torch.tensor(next(self.uniforms), dtype=torch.float64)

    def multinomial(self, probs, count, **kwargs):
        return torch.tensor([self.draw(probs.tolist())])


def test_agrees_with_the_engine_where_installed(solution):
    """Where torch and the engine are installed, the runs and the weights drawn from must be
    those of the engine's accept_sampled and accept_greedy. The browser has neither: there only
    the first line's run is checked, so that an unwritten solution fails here as it does
    locally."""
    run = list(solution.accept_greedy([], [3]))
    assert run == [3], f"accept_greedy([], [3]) is [3], not {run}"
    if engine is None:
        return
    rng = random.Random(24)
    for case in range(200):
        size, k = rng.randint(2, 6), rng.randint(0, 4)
        p = [distribution(rng, size) for _ in range(k + 1)]
        for row in p:  # some tokens of probability 0, as after top-k or top-p
            row[rng.randrange(size)] = 0.0
            row[:] = [w / sum(row) for w in row]
        q = None if case % 2 else [distribution(rng, size) for _ in range(k)]
        drafts = [
            rng.randrange(size) if q is None else rng.choices(range(size), q[i])[0]
            for i in range(k)
        ]
        uniforms = [rng.random() for _ in range(k)]
        pick = rng.randrange(size)
        ours, theirs = Draw(size, pick), Draw(size, pick)
        run = sampled(solution, drafts, p, q, uniforms, ours)
        real = engine.torch
        engine.torch = _EngineTorch(uniforms, theirs)
        try:
            want = engine.accept_sampled(
                drafts,
                torch.tensor(p, dtype=torch.float64),
                None,
                None if q is None else torch.tensor(q, dtype=torch.float64),
            )
        finally:
            engine.torch = real
        assert run == want, f"case {case}: the engine's run is {want}, not {run}"
        near = all(abs(a - b) < CLOSE for a, b in zip(ours.calls[0], theirs.calls[0]))
        assert near, (
            f"case {case}: the engine draws from {rounded(theirs.calls[0])}, "
            f"not {rounded(ours.calls[0])}"
        )
        target = [rng.randrange(size) for _ in range(k + 1)]
        greedy = [t if rng.random() < 0.7 else rng.randrange(size) for t in target[:k]]
        want = engine.accept_greedy(greedy, target)
        run = list(solution.accept_greedy(list(greedy), list(target)))
        assert run == want, f"case {case}: accept_greedy({greedy}, {target}) is {want}, not {run}"
