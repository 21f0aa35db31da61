import copy
import random


def _model(reqs, table):
    out = {"input_ids": [], "positions": [], "table_rows": [], "out_loc": [], "logits_rows": []}
    for r in reqs:
        tokens = r["input_ids"] + r["output_ids"]
        for pos in range(r["cached_len"], r["device_len"]):
            out["input_ids"].append(tokens[pos])
            out["positions"].append(pos)
            out["table_rows"].append(r["table_idx"])
            out["out_loc"].append(table[r["table_idx"]][pos])
        out["logits_rows"].append(len(out["input_ids"]) - 1)
    return out


def _req(inp, out, cached, device, row):
    return {
        "input_ids": inp,
        "output_ids": out,
        "cached_len": cached,
        "device_len": device,
        "table_idx": row,
    }


def _check(solution, reqs, table, what):
    before = copy.deepcopy((reqs, table))
    got = solution.prepare_batch(reqs, table)
    want = _model(reqs, table)
    got = {k: list(v) for k, v in dict(got).items()}
    assert got == want, f"{what}: reqs={reqs}\n got  {got}\n want {want}"
    assert (reqs, table) == before, f"{what}: the inputs were changed"


TABLE = [[10, 11, 12, 13, 14, 15], [20, 21, 22, 23, 24, 25], [30, 31, 32, 33, 34, 35]]


def test_example(solution):
    reqs = [_req([7, 8, 9], [], 0, 3, 1), _req([4], [5, 6], 2, 3, 0)]
    _check(solution, reqs, TABLE, "README example")


def test_decode_only(solution):
    reqs = [_req([1, 2], [3], 2, 3, 2), _req([4], [5, 6, 7], 3, 4, 0), _req([8], [9], 1, 2, 1)]
    _check(solution, reqs, TABLE, "three decoding requests, one token each")


def test_chunk_of_a_prompt(solution):
    reqs = [_req([1, 2, 3, 4, 5, 6], [], 2, 5, 0)]
    _check(solution, reqs, TABLE, "positions 2..4 of a six-token prompt")


def test_span_prompt_and_output(solution):
    reqs = [_req([1, 2], [3, 4], 1, 4, 2)]
    _check(solution, reqs, TABLE, "a run over the prompt's end and the output")


def test_empty_batch(solution):
    _check(solution, [], TABLE, "no requests")


def test_random(solution):
    rng = random.Random(61)
    for case in range(50):
        rows = list(range(6))
        rng.shuffle(rows)
        table = [[rng.randrange(1000) for _ in range(16)] for _ in range(6)]
        reqs = []
        for row in rows[: rng.randint(1, 5)]:
            inp = [rng.randrange(100) for _ in range(rng.randint(1, 8))]
            out = [rng.randrange(100) for _ in range(rng.randint(0, 8))]
            device = rng.randint(1, len(inp) + len(out))
            reqs.append(_req(inp, out, rng.randint(0, device - 1), device, row))
        _check(solution, reqs, table, f"random case {case}")
