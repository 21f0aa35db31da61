def _decode(ids):
    assert isinstance(ids, list), f"decode should get a list of ids, got {type(ids).__name__}"
    return "".join(chr(96 + i) if i else "<eos>" for i in ids)


def _check(solution, args, text, what):
    inp, out = list(args[0]), list(args[1])
    got = solution.make_result(*args)
    want = {"text": text, "token_ids": out, "prompt_token_ids": inp}
    assert got == want, f"{what}: make_result{args[:4]} returned {got}, expected {want}"


def test_example(solution):
    _check(solution, ([5, 6], [1, 2, 0], False, {0}, _decode), "ab", "ended at EOS")


def test_several_eos_ids(solution):
    _check(solution, ([5], [1, 2, 7], False, {0, 7, 9}, _decode), "ab", "EOS 7 of {0, 7, 9}")


def test_ignore_eos_keeps_it(solution):
    _check(solution, ([5], [0, 2, 0], True, {0}, _decode), "<eos>b<eos>", "ignore_eos")


def test_only_the_last_is_dropped(solution):
    _check(
        solution,
        ([5], [0, 2, 0], False, {0}, _decode),
        "<eos>b",
        "an EOS before the last stays in the text",
    )


def test_ended_by_length(solution):
    _check(solution, ([5], [1, 2, 3], False, {0}, _decode), "abc", "no EOS: nothing dropped")


def test_empty_output(solution):
    _check(solution, ([5], [], False, {0}, _decode), "", "no tokens generated")


def test_no_tokenizer(solution):
    _check(solution, ([5], [1, 0], False, {0}, None), None, "decode=None gives text None")


def test_copies(solution):
    inp, out = [5, 6], [1, 0]
    got = solution.make_result(inp, out, False, {0}, _decode)
    got["token_ids"].append(99)
    got["prompt_token_ids"].append(99)
    assert inp == [5, 6] and out == [1, 0], "the result's lists must be copies, not the inputs"
