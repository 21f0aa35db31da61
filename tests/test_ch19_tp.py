"""Chapter 19: tensor parallelism. The shards the loader cuts; the parallel layers over two
gloo ranks against the whole computation; the offline LLM at tp_size=2 (two processes) giving
the same greedy tokens as one rank for every dense tiny family; the server at --tp-size 2."""

from __future__ import annotations

import os
import signal
import time
from typing import Any, Iterator

import pytest
import tiny_models
import torch
import torch.multiprocessing as tmp
from helpers import START_TIMEOUT, greedy

DENSE = [name for name in tiny_models.FAMILIES if "moe" not in name]  # MoE: chapter 20
PROMPTS = [[3, 1, 4, 1, 5, 9, 2, 6], [2, 7, 1, 8], list(range(30, 50)), [17]]
LENGTHS = [9, 3, 12, 6]  # requests leave at different steps: the batch shrinks on every rank
OPTIONS = dict(
    device="cpu", page_size=4, num_pages=128, max_running_req=4, max_extend_tokens=16
)  # the 20-token prompt runs in two chunks


@pytest.fixture
def two_ranks() -> Iterator[None]:
    """``get_tp_info`` says rank r of 2 inside the test (no process group: building and
    loading only read it); one rank again afterwards."""
    from minisgl.distributed import get_tp_info, set_tp_info

    assert get_tp_info().size == 1
    yield
    set_tp_info(0, 1)


def test_one_rank_needs_no_process_group():
    from minisgl.distributed import DistributedCommunicator, get_tp_info

    assert (get_tp_info().rank, get_tp_info().size, get_tp_info().is_primary()) == (0, 1, True)
    x = torch.arange(6.0).reshape(2, 3)
    comm = DistributedCommunicator()
    assert comm.all_reduce(x) is x and comm.all_gather(x) is x


def test_there_is_one_get_tp_info():
    import minisgl.distributed as distributed
    import minisgl.engine.engine as engine
    import minisgl.kvcache as kvcache
    import minisgl.layers.linear as linear
    import minisgl.utils.misc as misc

    assert not hasattr(misc, "get_tp_info")  # chapter 1's stand-in is gone
    for module in (engine, kvcache, linear):
        assert module.get_tp_info is distributed.get_tp_info, module.__name__


def test_config_refuses_a_rank_outside_the_group():
    pytest.importorskip("zmq")  # the server's packages: not on every GPU image
    from minisgl.engine.config import EngineConfig
    from minisgl.server.args import parse_args

    with pytest.raises(ValueError, match="tp_rank"):
        EngineConfig("/m", tp_size=2, tp_rank=2)
    args = parse_args(["--model", "/m", "--tp-size", "2"])
    assert args.tp_size == 2 and args.scheduler_config().tp_size == 2


def test_shard_cuts_each_tensor_as_its_layer_holds_it(two_ranks):
    from minisgl.distributed import set_tp_info
    from minisgl.models.weight import shard

    t = torch.arange(8 * 6.0).reshape(8, 6)
    rows = [
        "model.layers.0.self_attn.q_proj.weight",
        "model.layers.1.self_attn.v_proj.bias",
        "model.layers.0.mlp.up_proj.weight",
        "model.layers.0.mlp.experts.3.gate_proj.weight",
    ]
    cols = [
        "model.layers.0.self_attn.o_proj.weight",
        "model.layers.0.mlp.down_proj.weight",
        "model.layers.1.mlp.experts.7.down_proj.weight",
    ]
    whole = [
        "model.layers.0.input_layernorm.weight",
        "model.layers.0.mlp.gate.weight",
        "model.norm.weight",
    ]
    vocab = torch.arange(11 * 2.0).reshape(11, 2)  # 11 rows: 6 and 5, padded to 6
    for rank in range(2):
        set_tp_info(rank, 2)
        for name in rows:
            assert torch.equal(shard(name, t), t[4 * rank : 4 * rank + 4]), name
        for name in cols:
            assert torch.equal(shard(name, t), t[:, 3 * rank : 3 * rank + 3]), name
        for name in whole:
            assert shard(name, t) is t, name
        for name in ("model.embed_tokens.weight", "lm_head.weight"):
            part = shard(name, vocab)
            real = vocab[6 * rank : 6 * rank + 6]
            assert part.shape == (6, 2) and torch.equal(part[: len(real)], real)
            assert not part[len(real) :].any()  # the padding row is zero


def test_the_ranks_weights_put_together_are_the_whole_model(tiny_models, two_ranks):
    from minisgl.distributed import set_tp_info
    from minisgl.models import load_model

    path = tiny_models["qwen2"]  # q/k/v biases, tied embeddings
    whole = load_model(path).state_dict()
    parts = []
    for rank in range(2):
        set_tp_info(rank, 2)
        parts.append(load_model(path).state_dict())
    set_tp_info(0, 1)
    qkv = "model.layers.1.self_attn.qkv_proj.bias"  # [q 64 | k 32 | v 32] -> [32 | 16 | 16]
    split = [p[qkv].split([32, 16, 16]) for p in parts]
    assert torch.equal(torch.cat([torch.cat(s) for s in zip(*split)]), whole[qkv])
    gate_up = "model.layers.0.mlp.gate_up_proj.weight"  # [gate 128 | up 128] -> [64 | 64]
    halves = [p[gate_up].split(64) for p in parts]
    assert torch.equal(torch.cat([torch.cat(h) for h in zip(*halves)]), whole[gate_up])
    for name in ("model.layers.0.self_attn.o_proj.weight", "model.layers.1.mlp.down_proj.weight"):
        assert torch.equal(torch.cat([p[name] for p in parts], dim=1), whole[name])
    embed = torch.cat([p["model.embed_tokens.weight"] for p in parts])
    assert torch.equal(embed, whole["model.embed_tokens.weight"])
    assert all(p["lm_head.weight"] is p["model.embed_tokens.weight"] for p in parts)  # tied


def _layers_on_rank(rank: int, addr: str) -> None:
    """Rank ``rank`` of 2 (a spawned process): each parallel layer on its shard, against the
    whole computation on full weights drawn from the same seed."""
    import torch.nn.functional as F

    from minisgl.distributed import destroy_distributed, init_distributed, min_across_ranks
    from minisgl.layers.embedding import ParallelLMHead, VocabParallelEmbedding
    from minisgl.layers.linear import LinearColParallel, LinearRowParallel
    from minisgl.models.weight import shard

    init_distributed(rank, 2, addr, "cpu")
    torch.manual_seed(0)
    H, N, V = 8, 6, 11  # hidden, intermediate, an odd vocabulary
    x, ids = torch.randn(5, H), torch.tensor([0, 5, 6, 10, 3, 7])
    w_col, w_row, bias = torch.randn(N, H), torch.randn(H, N), torch.randn(H)
    table = torch.randn(V, H)
    col, row = LinearColParallel(H, N), LinearRowParallel(N, H, has_bias=True)
    col.weight = shard("m.layers.0.mlp.up_proj.weight", w_col)
    row.weight, row.bias = shard("m.layers.0.mlp.down_proj.weight", w_row), bias
    want = F.linear(F.linear(x, w_col), w_row, bias)
    torch.testing.assert_close(row.forward(col.forward(x)), want)  # the bias counted once
    embed, head = VocabParallelEmbedding(V, H), ParallelLMHead(V, H)
    embed.weight = shard("model.embed_tokens.weight", table)
    head.weight = shard("lm_head.weight", table)
    assert torch.equal(embed.forward(ids), F.embedding(ids, table))  # one rank's row, plus zeros
    torch.testing.assert_close(head.forward(x), F.linear(x, table))  # [5, 11]: padding cut
    assert min_across_ranks(10 - 3 * rank) == 7  # the KV pages every rank can hold
    destroy_distributed()


def test_parallel_layers_over_two_gloo_ranks_equal_the_whole(tmp_path):
    ranks = tmp.spawn(_layers_on_rank, args=(f"file://{tmp_path}/init",), nprocs=2, join=False)
    deadline = time.monotonic() + START_TIMEOUT  # a rank that hangs in a collective fails it
    try:
        while not ranks.join(timeout=max(0.0, deadline - time.monotonic())):  # raises on a failure
            assert time.monotonic() < deadline, f"the ranks still run after {START_TIMEOUT} s"
    finally:
        for proc in ranks.processes:
            if proc.is_alive():
                proc.kill()


def _generate(llm: Any) -> list[list[int]]:
    from minisgl.core import SamplingParams

    params = [SamplingParams(max_tokens=n, ignore_eos=True) for n in LENGTHS]
    return [r["token_ids"] for r in llm.generate(PROMPTS, params)]


@pytest.mark.parametrize("family", DENSE)
def test_tp2_greedy_tokens_equal_one_rank(tiny_models, family):
    from minisgl.llm import LLM

    one = LLM(str(tiny_models[family]), **OPTIONS)
    want, want_again = _generate(one), one.generate([PROMPTS[1]], greedy(5))
    one.shutdown()
    two = LLM(str(tiny_models[family]), tp_size=2, **OPTIONS)
    followers = list(two._workers.procs.values())
    try:
        assert _generate(two) == want
        assert two.generate([PROMPTS[1]], greedy(5)) == want_again  # the ranks stay in step
    finally:
        two.shutdown()
    assert [p.exitcode for p in followers] == [0]  # rank 1 ended by itself, cleanly


def test_a_model_that_does_not_split_fails_and_leaves_no_rank(tiny_models):
    import torch.distributed as dist

    from minisgl.llm import LLM

    with pytest.raises(ValueError, match="not evenly divisible by 3"):  # 4 query heads
        LLM(str(tiny_models["llama3"]), tp_size=3, **OPTIONS)
    assert not dist.is_initialized()
    one = LLM(str(tiny_models["llama3"]), **OPTIONS)  # this process can build a model again
    one.shutdown()


def test_server_at_tp2_answers_as_one_rank(tiny_models, tmp_path):
    from test_ch13_server import MODEL, Server

    from minisgl.core import SamplingParams
    from minisgl.llm import LLM

    model = tiny_models["qwen2bytes"]
    one = LLM(str(model), device="cpu", page_size=4, num_pages=256)
    prompts = ["Hello world", "Once upon a time"]
    refs = one.generate(prompts, SamplingParams(max_tokens=10, ignore_eos=True))
    one.shutdown()
    srv = Server(model, tmp_path / "server.log", "--tp-size", "2")
    try:
        client = srv.client()
        for prompt, ref in zip(prompts, refs):
            out = client.completions.create(
                model=MODEL,
                prompt=prompt,
                max_tokens=10,
                temperature=0,
                extra_body={"ignore_eos": True},
            )
            assert out.choices[0].text == ref["text"]
        stream = client.chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": "Hi"}],
            max_tokens=4,
            temperature=0,
            stream=True,
            extra_body={"ignore_eos": True},
        )
        reasons = [c.choices[0].finish_reason for c in stream if c.choices]
        assert reasons[-1] == "length"
        follower = srv.worker_pid("scheduler-1")
    finally:
        code = srv.stop()
    log = srv.log.read_text()
    assert code == 0 and "Traceback" not in log, log
    with pytest.raises(ProcessLookupError):
        os.kill(follower, 0)  # rank 1's process is gone too


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


@pytest.mark.parametrize("killed", ["scheduler", "scheduler-1"])
def test_a_killed_rank_stops_the_server_and_the_other_rank(tiny_models, tmp_path, killed):
    """Exercise 4: rank 0 or rank 1 killed with SIGKILL while the server is idle (rank 0
    waiting on its socket, rank 1 in the broadcast). Either way chapter 12's watcher names it,
    a request gets a 503 that names it, the watcher ends the other rank's process from outside
    (within the grace period, before the server stops its workers), and the server exits
    non-zero."""
    import httpx
    from test_ch13_server import KEY, MODEL, WAIT, Server

    model = tiny_models["qwen2bytes"]
    env = {"MINISGL_FAILURE_GRACE_S": "6"}
    srv = Server(model, tmp_path / "server.log", "--tp-size", "2", env=env)
    try:
        other = srv.worker_pid("scheduler-1" if killed == "scheduler" else "scheduler")
        os.kill(srv.worker_pid(killed), signal.SIGKILL)
        deadline = time.monotonic() + WAIT
        while True:  # until the server learns of it: then 503 for the grace period
            assert time.monotonic() < deadline and srv.proc.poll() is None
            reply = httpx.post(
                srv.url + "/v1/completions",
                json={"model": MODEL, "prompt": "Hi", "max_tokens": 1},
                headers={"Authorization": f"Bearer {KEY}"},
                timeout=WAIT,
            )
            if reply.status_code == 503:
                break
            time.sleep(0.1)
        assert killed in reply.json()["error"]["message"]
        ended_by = time.monotonic() + 3.0  # by the watcher, not the stop 6 s later
        while _alive(other):
            assert time.monotonic() < ended_by, "the other rank waited for the server's stop"
            time.sleep(0.05)
        assert srv.proc.wait(timeout=WAIT) != 0
        log = srv.log.read_text()
        assert f"the {killed} process was killed by SIGKILL" in log, log
    finally:
        srv.stop()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA (NCCL)")
def test_one_rank_through_nccl_gives_the_tokens_of_no_group(tiny_models, tmp_path):
    """On one GPU: the process group is NCCL's, its collectives run (a sum and a gather of one
    rank), and the engine built inside the group gives the tokens of one built without."""
    import torch.distributed as dist

    from minisgl.distributed import destroy_distributed, init_distributed, min_across_ranks
    from minisgl.llm import LLM

    options = dict(OPTIONS, device="cuda", dtype=torch.float32)
    alone = LLM(str(tiny_models["qwen3"]), **options)
    want = _generate(alone)
    alone.shutdown()
    init_distributed(0, 1, f"file://{tmp_path}/init", "cuda")
    try:
        assert dist.get_backend() == "nccl" and dist.get_world_size() == 1
        x = torch.arange(4.0, device="cuda")
        dist.all_reduce(x)  # through NCCL, though one rank's sum is itself
        parts = [torch.empty_like(x)]
        dist.all_gather(parts, x)
        assert torch.equal(parts[0], torch.arange(4.0, device="cuda"))
        assert min_across_ranks(7) == 7
        grouped = LLM(str(tiny_models["qwen3"]), **options)
        assert _generate(grouped) == want
        grouped.shutdown()
    finally:
        destroy_distributed()
    assert not dist.is_initialized()


@pytest.mark.parametrize(
    "rank,size,ok", [(0, 1, True), (1, 2, True), (2, 2, False), (-1, 2, False)]
)
def test_a_rank_lies_in_its_group(rank, size, ok):
    """Ranks count from 0 to size - 1: rank ``size`` names no process of the group."""
    from minisgl.distributed.info import DistributedInfo

    if ok:
        assert DistributedInfo(rank, size).rank == rank
    else:
        with pytest.raises(ValueError, match=f"rank {rank} is not in"):
            DistributedInfo(rank, size)
