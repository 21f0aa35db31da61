import math
import random


def _model(weights, kv, ins, outs, bw):
    steps = max(outs) - 1
    if steps == 0:
        return 0.0, 0.0
    context, made = 0, 0
    for step in range(1, steps + 1):
        for i, o in zip(ins, outs):
            if step <= o - 1:  # still decoding: reads its prompt and `step` generated tokens
                context += i + step
                made += 1
    floor = (weights + kv * context / steps) / bw
    return floor, made / (steps * floor)


def _check(solution, args, what):
    got = solution.decode_floor(*args)
    want = _model(*args)
    assert len(got) == 2 and all(
        math.isclose(g, w, rel_tol=1e-9, abs_tol=1e-15) for g, w in zip(got, want)
    ), f"{what}: decode_floor{args if len(args[2]) < 8 else '(...)'} gave {got}, expected {want}"


def test_example(solution):
    _check(solution, (1000, 10, [10], [3], 1000.0), "README example")


def test_several_requests(solution):
    _check(solution, (5000, 4, [10, 100, 1], [5, 2, 9], 1e4), "three requests")


def test_one_output_token(solution):
    _check(solution, (5000, 4, [10, 20], [1, 4], 1e4), "a request with no decode step")
    got = solution.decode_floor(5000, 4, [10, 20], [1, 1], 1e4)
    assert tuple(got) == (0.0, 0.0), f"no decode step at all: expected (0.0, 0.0), got {got}"


def test_random(solution):
    rng = random.Random(152)
    for case in range(40):
        n = rng.randint(1, 12)
        ins = [rng.randint(1, 300) for _ in range(n)]
        outs = [rng.randint(1, 60) for _ in range(n)]
        _check(
            solution,
            (
                rng.randint(10**6, 10**9),
                rng.randint(1000, 200000),
                ins,
                outs,
                rng.choice([1e12, 3.35e12, 4.8e12]),
            ),
            f"random case {case}",
        )


def test_nano_vllm_sized(solution):
    rng = random.Random(0)
    ins = [rng.randint(100, 1024) for _ in range(256)]
    outs = [rng.randint(100, 1024) for _ in range(256)]
    _check(solution, (1_192_000_000, 114_688, ins, outs, 4.8e12), "256 requests of 100..1024")
