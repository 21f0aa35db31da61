"""Chapter 23: structured output. A JSON schema, a regular expression and an EBNF grammar
compiled by xgrammar against a tiny model's tokenizer; the tokens each allows at a step; the
engine's outputs under them, greedy and seeded, beside a free row that keeps its tokens; the
same run with overlap scheduling; and the error a bad constraint gets."""

import json
import re
import tempfile
from typing import List

import jsonschema
import tiny_models
import torch

from minisgl.core import SamplingParams
from minisgl.llm import LLM
from minisgl.structured import Constraint

torch.set_num_threads(1)

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
CONSTRAINTS = [("json_schema", json.dumps(PERSON)), ("regex", DATE), ("ebnf", YES_NO)]
PROMPT = "the weather"


def allowed_at_each_step(llm: LLM, constraint: Constraint, token_ids: list) -> list:
    """How many of the vocabulary's tokens the grammar allows before each output token."""
    import xgrammar

    grammar = llm.scheduler.grammars.compiler.matcher(constraint)
    vocab = grammar.vocab_size
    counts = []
    for i, token in enumerate(token_ids):
        bitmask = xgrammar.allocate_token_bitmask(1, vocab)
        grammar.fill(bitmask, 0)
        bits = [(int(bitmask[0, t // 32]) >> (t % 32)) & 1 for t in range(vocab)]
        counts.append(sum(bits))
        grammar.catch_up(token_ids[: i + 1])
    return counts


def show_outputs(llm: LLM, prompt: str) -> None:
    """Each constraint, greedy and seeded: the text, its length and how it ended."""
    for kind, text in CONSTRAINTS:
        greedy = SamplingParams(max_tokens=80, **{kind: text})
        seeded = SamplingParams(max_tokens=80, temperature=1.0, seed=1, **{kind: text})
        outs = llm.generate([prompt, prompt], [greedy, seeded])
        print(f"\n{kind}:")
        for label, out in zip(("greedy", "seeded"), outs):
            ends = "EOS" if out["token_ids"][-1] in llm.scheduler.eos_token_ids else "length"
            print(f"  {label}: {out['text']!r} ({len(out['token_ids'])} tokens, ends at {ends})")
        if kind == "json_schema":
            for out in outs:
                jsonschema.validate(json.loads(out["text"]), PERSON)
            print("  both parse and validate against the schema")
        else:
            pattern = DATE if kind == "regex" else r"(yes|no) because [a-z]{1,6}"
            print("  both match:", all(re.fullmatch(pattern, o["text"]) for o in outs))


def show_steps(llm: LLM, prompt: str) -> None:
    """The JSON request's first tokens, each with how many tokens the grammar allowed."""
    params = SamplingParams(max_tokens=80, json_schema=CONSTRAINTS[0][1])
    token_ids = llm.generate([prompt], [params])[0]["token_ids"]
    counts = allowed_at_each_step(llm, Constraint(*CONSTRAINTS[0]), token_ids)
    vocab = llm.scheduler.engine.model_config.vocab_size
    print("\nthe JSON request, step by step: token, then how many tokens the grammar allowed")
    for token, count in list(zip(token_ids, counts))[:12]:
        print(f"  {llm.tokenizer.decode([token])!r:>10} {count:4d} of {vocab}")


def show_free_rows(llm: LLM) -> List[List[int]]:
    """Free rows beside a constrained one: their tokens, alone and in the mixed batch."""
    free = [SamplingParams(max_tokens=24), SamplingParams(max_tokens=24, temperature=0.9, seed=7)]
    alone = [o["token_ids"] for o in llm.generate(["a b c", "x y"], free)]
    mixed = llm.generate(
        ["a b c", "hello", "x y"], [free[0], SamplingParams(max_tokens=80, regex=DATE), free[1]]
    )
    print(
        "\nfree rows beside a constrained one keep their tokens:",
        [mixed[0]["token_ids"], mixed[2]["token_ids"]] == alone,
    )
    return alone


def show_overlap(path: str, prompt: str) -> None:
    params = [SamplingParams(max_tokens=80, **{k: t}) for k, t in CONSTRAINTS]
    runs = []
    for overlap in (False, True):
        run = LLM(path, device="cpu", page_size=4, num_pages=256, overlap_scheduling=overlap)
        runs.append([o["token_ids"] for o in run.generate([prompt] * 3, params)])
    print(
        "overlap scheduling, each mask from the in-flight tokens: same tokens",
        runs[0] == runs[1],
    )


def show_errors(llm: LLM, prompt: str, alone: List[List[int]]) -> None:
    """Bad constraints, each refused with xgrammar's message; the engine goes on."""
    bad = [dict(regex="(ab"), dict(json_schema='{"type": "nope"}'), dict(regex="[^\\s\\S]")]
    for constraint in bad:
        try:
            llm.generate([prompt], [SamplingParams(max_tokens=8, **constraint)])
        except ValueError as error:
            print(f"refused: {error}")
    again = llm.generate(["a b c"], [SamplingParams(max_tokens=24)])[0]["token_ids"]
    print("and the next request runs as before:", again == alone[0])


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        path = str(tiny_models.make_tiny_model("qwen3", f"{tmp}/qwen3"))
        llm = LLM(path, device="cpu", page_size=4, num_pages=256)
        vocab = llm.scheduler.engine.model_config.vocab_size
        print(f"tiny Qwen3: {vocab} tokens, a bitmask row of {-(-vocab // 32)} int32 words")
        show_outputs(llm, PROMPT)
        show_steps(llm, PROMPT)
        alone = show_free_rows(llm)
        show_overlap(path, PROMPT)
        show_errors(llm, PROMPT, alone)


if __name__ == "__main__":
    main()
