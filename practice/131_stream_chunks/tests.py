import random


def _r(text, n=1, reason=None):
    return {"text": text, "num_tokens": n, "finished": reason is not None, "finish_reason": reason}


def _model(replies, chat, usage, prompt):
    out = [{"delta": {"role": "assistant", "content": ""}, "finish_reason": None}] if chat else []
    used = 0
    for r in replies:
        used += r["num_tokens"]
        if r["text"] == "" and not r["finished"]:
            continue
        if chat:
            delta = {"content": r["text"]} if r["text"] != "" else {}
            out.append({"delta": delta, "finish_reason": r["finish_reason"]})
        else:
            out.append({"text": r["text"], "finish_reason": r["finish_reason"]})
        if r["finished"]:
            break
    if usage:
        out.append(
            {
                "usage": {
                    "prompt_tokens": prompt,
                    "completion_tokens": used,
                    "total_tokens": prompt + used,
                }
            }
        )
    out.append("[DONE]")
    return out


def _check(solution, replies, chat, usage, prompt, what):
    got = solution.stream_chunks([dict(r) for r in replies], chat, usage, prompt)
    want = _model(replies, chat, usage, prompt)
    assert list(got) == want, f"{what} (chat={chat}, usage={usage}):\n got  {got}\n want {want}"


def test_readme_example(solution):
    _check(solution, [_r("He"), _r(""), _r("llo", 1, "length")], False, False, 5, "README example")


def test_chat(solution):
    _check(solution, [_r("Hi"), _r(" there", 2), _r("!", 1, "stop")], True, False, 3, "chat")


def test_usage_counts_empty_replies(solution):
    replies = [_r("a", 1), _r("", 3), _r("b", 2, "stop")]
    _check(solution, replies, False, True, 7, "completion with usage")
    _check(solution, replies, True, True, 7, "chat with usage")


def test_empty_finished_reply(solution):
    replies = [_r("done", 2), _r("", 1, "stop")]
    _check(solution, replies, True, True, 1, "an empty last reply still carries the reason")
    _check(solution, replies, False, False, 1, "the same for a completion")


def test_after_finished_ignored(solution):
    replies = [_r("x", 1, "length"), _r("y", 1)]
    _check(solution, replies, False, True, 2, "a reply after the finished one")


def test_random(solution):
    rng = random.Random(131)
    for case in range(100):
        replies = [
            _r(rng.choice(["", "", "a", "bc", " "]), rng.randint(0, 3))
            for _ in range(rng.randint(0, 6))
        ]
        replies.append(_r(rng.choice(["", "z"]), rng.randint(0, 2), rng.choice(["stop", "length"])))
        _check(
            solution,
            replies,
            rng.random() < 0.5,
            rng.random() < 0.5,
            rng.randint(1, 50),
            f"random case {case}",
        )
