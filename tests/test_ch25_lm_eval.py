"""Chapter 25 as lm-evaluation-harness uses it: two small tasks of the book's own (local files
under tests/data/lm_eval: ten multiple-choice questions, ten sums to generate), evaluated once by
``local-completions`` against the real server on SmolLM2-135M-Instruct and once by ``hf``, the
harness's own transformers model, on the same weights in float32. The scores must be the same,
each loglikelihood the same to float32's rounding, each generated string the same.

``local-completions`` runs with the harness's defaults: token-id prompts (``tokenized_requests``),
a loglikelihood as one completion with ``echo``, ``logprobs: 1`` and ``max_tokens: 1``, whose
prompt tokens after the context it sums. The module records the requests it sends, so that a
change of those defaults in a later harness shows here rather than as a score that drifts."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Callable, Iterator

import pytest

for _package in ("zmq", "msgpack", "fastapi", "uvicorn", "openai", "httpx"):
    pytest.importorskip(_package)
# lm-evaluation-harness and what its API models import (pip install -e '.[tools]')
for _package in ("lm_eval", "aiohttp", "tenacity", "requests"):
    pytest.importorskip(_package, reason=f"{_package} is missing: pip install -e '.[tools]'")

import requests  # noqa: E402
from lm_eval import simple_evaluate  # noqa: E402
from lm_eval.tasks import TaskManager  # noqa: E402
from test_ch13_server import Server  # noqa: E402 (the real process, as ch13 runs it)

DATA = Path(__file__).resolve().parent / "data" / "lm_eval"
MULTIPLE_CHOICE, GENERATE = "minisgl_facts", "minisgl_arithmetic"
TASKS = [MULTIPLE_CHOICE, GENERATE]
SCORES = {MULTIPLE_CHOICE: ["acc,none", "acc_norm,none"], GENERATE: ["exact_match,strip"]}
NAME = "smollm2"  # the served model's name, which lm-eval sends in every request
BATCH = 4
# Measured: the server's and transformers' float32 loglikelihoods of a choice (a sum over its
# one to three tokens) differ by at most 2.8e-5, the same every run: the same weights, added in
# another order (another attention, four prompts in one ragged prefill against transformers'
# padded batch). Seven times that is still far below what a fault moves: a log-probability read
# one position off, or a token's entry dropped, changes a loglikelihood by whole units.
TOLERANCE = 2e-4


@pytest.fixture(scope="module")
def task_manager() -> TaskManager:
    """The two tasks alone: without the harness's thousands of built-in ones to index (5 s)."""
    return TaskManager(include_path=str(DATA), include_defaults=False)


@pytest.fixture(scope="module")
def server(real_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """Started without waiting: it loads while transformers evaluates (``hf``)."""
    log = tmp_path_factory.mktemp("lm_eval") / "server.log"
    srv = Server(real_model, log, "--dtype", "float32", "--served-model-name", NAME, wait=False)
    yield srv
    assert srv.stop() == 0
    assert "Traceback" not in srv.log.read_text(), srv.log.read_text()


def _evaluate(task_manager: TaskManager, model: str, model_args: dict[str, Any]) -> dict:
    """``simple_evaluate`` on the two tasks, every sample kept. datasets reads a task's
    ``data_files`` from the working directory, so the evaluation runs from the tasks' folder."""
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(DATA)
        results = simple_evaluate(
            model=model,
            model_args=model_args,
            tasks=TASKS,
            batch_size=BATCH,
            task_manager=task_manager,
            log_samples=True,
            bootstrap_iters=0,  # no standard errors: they are not compared
        )
    assert results is not None
    return results


@pytest.fixture(scope="module")
def hf(real_model: Path, server: Server, task_manager: TaskManager) -> dict:
    """transformers through the harness, in float32 on the CPU: the reference. It asks for the
    server only to start it first."""
    args = {"pretrained": str(real_model), "dtype": "float32", "device": "cpu"}
    return _evaluate(task_manager, "hf", args)


class Recorder:
    """``requests.post`` that keeps each JSON body: lm-eval's API models send their requests
    with it (one batch of ``BATCH`` prompts a request, none concurrent by default)."""

    def __init__(self, post: Callable[..., requests.Response]) -> None:
        self.post = post
        self.bodies: list[dict[str, Any]] = []

    def __call__(self, url: str, *args: Any, json: Any = None, **kwargs: Any) -> Any:
        self.bodies.append(json)
        return self.post(url, *args, json=json, **kwargs)


@pytest.fixture(scope="module")
def api(
    real_model: Path, server: Server, task_manager: TaskManager
) -> tuple[dict, list[dict[str, Any]]]:
    """The server through ``local-completions`` with the harness's defaults, and the requests
    it sent. The tokenizer is the model folder's, as ``hf`` uses it: the default backend
    (``auto``) asks the server for ``/tokenizer_info``, gets a 404 and tokenizes on the client."""
    server.wait_healthy()
    args = {"model": NAME, "base_url": server.url + "/v1/completions", "tokenizer": str(real_model)}
    recorder = Recorder(requests.post)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(requests, "post", recorder)
        results = _evaluate(task_manager, "local-completions", args)
    return results, recorder.bodies


def _samples(results: dict, task: str) -> list[dict]:
    return sorted(results["samples"][task], key=lambda s: s["doc_id"])


def test_transformers_scores_lie_strictly_between_zero_and_one(hf):
    """Ten samples a task, and scores the model neither always wins nor always loses: equal
    scores below then say something."""
    for task, metrics in SCORES.items():
        assert len(hf["samples"][task]) == 10
        for metric in metrics:
            assert 0 < hf["results"][task][metric] < 1, (task, metric, hf["results"][task])


def test_lm_eval_sends_its_default_loglikelihood_and_generation_requests(api, hf, real_model):
    """Each loglikelihood request: a batch of token-id prompts, each a context and a choice as
    the model's tokenizer writes them, with ``echo``, ``logprobs: 1``, ``max_tokens: 1``, greedy.
    Each generation: token-id prompts, greedy, the task's stop and length."""
    _, bodies = api
    scoring = [b for b in bodies if b.get("echo")]
    generating = [b for b in bodies if not b.get("echo")]
    assert len(scoring) == 10 and len(generating) == 3, json.dumps(bodies[0])  # 40 and 10 prompts
    print("lm-eval's first loglikelihood request:", json.dumps(scoring[0]))
    # every context + choice of the task, as text: what the prompts must decode to
    texts = {ctx + choice for s in hf["samples"][MULTIPLE_CHOICE] for ctx, choice in s["arguments"]}
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(real_model))
    for body in scoring:
        assert {k: v for k, v in body.items() if k != "prompt"} == {
            "model": NAME,
            "temperature": 0,
            "max_tokens": 1,
            "logprobs": 1,
            "seed": 1234,
            "echo": True,
        }, json.dumps(body)
        assert 1 <= len(body["prompt"]) <= BATCH
        for prompt in body["prompt"]:
            assert all(isinstance(t, int) for t in prompt)
            assert tokenizer.decode(prompt) in texts
    for body in generating:
        assert all(isinstance(t, int) for prompt in body["prompt"] for t in prompt)
        assert body["max_tokens"] == 6 and body["temperature"] == 0
        assert body["stop"] == ["\n", tokenizer.eos_token] and "echo" not in body


def test_the_scores_are_exactly_transformers(hf, api):
    results, _ = api
    for task, metrics in SCORES.items():
        for metric in metrics:
            ours, theirs = results["results"][task][metric], hf["results"][task][metric]
            print(f"{task} {metric}: hf {theirs}, local-completions {ours}")
            assert ours == theirs, (task, metric)


def test_each_loglikelihood_is_transformers_to_float32s_rounding(hf, api):
    """Every choice of every question: the loglikelihood within ``TOLERANCE``, and whether the
    choice is the greedy continuation exactly."""
    results, _ = api
    ours, theirs = _samples(results, MULTIPLE_CHOICE), _samples(hf, MULTIPLE_CHOICE)
    assert [s["doc_id"] for s in ours] == [s["doc_id"] for s in theirs]
    worst = 0.0
    for mine, ref in zip(ours, theirs):
        assert mine["arguments"] == ref["arguments"]
        # resps: one list a choice, holding (loglikelihood, is_greedy); filtered_resps: the same
        # pairs, one a choice, after the task's filter (none for multiple choice)
        for key, unwrap in (("resps", lambda r: r[0]), ("filtered_resps", lambda r: r)):
            assert len(mine[key]) == len(ref[key]) == 4
            for a, b in zip(mine[key], ref[key]):
                (ll, greedy), (ref_ll, ref_greedy) = unwrap(a), unwrap(b)
                assert abs(ll - ref_ll) <= TOLERANCE, (mine["doc"], ll, ref_ll)
                assert greedy == ref_greedy, mine["doc"]
                worst = max(worst, abs(ll - ref_ll))
    print(f"largest loglikelihood difference: {worst:.3g} (tolerance {TOLERANCE:g})")


def test_each_generated_answer_is_transformers_string_for_string(hf, api):
    results, _ = api
    ours, theirs = _samples(results, GENERATE), _samples(hf, GENERATE)
    assert [s["doc_id"] for s in ours] == [s["doc_id"] for s in theirs]
    for mine, ref in zip(ours, theirs):
        assert mine["resps"] == ref["resps"], mine["doc"]
        assert mine["filtered_resps"] == ref["filtered_resps"], mine["doc"]
