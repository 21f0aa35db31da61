"""Chapter 21's benchmark scripts: ``benchmark/moe_baseline.py`` (the tuned fused MoE of vLLM and
SGLang, rebuilt as a baseline) against the reference MoE in Triton's interpreter on small shapes
with edge cases, its config choice, and ``benchmark/bench_moe.py --quick`` run end to end: every
line runs and agrees with the reference.

The scripts live in ``benchmark/``, which no chapter's tree holds: there these tests skip."""

from __future__ import annotations

import importlib
import importlib.util
import os
import re
import subprocess
import sys
from typing import Any, Dict

import pytest
import torch
from helpers import ROOT, benchmark_module

BENCHMARK = ROOT / "benchmark"
HAS_TRITON = importlib.util.find_spec("triton") is not None
INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"  # conftest sets it on a machine w/o GPU
interpreted = pytest.mark.skipif(
    not (HAS_TRITON and INTERPRETED), reason="runs on the CPU: needs Triton's interpreter"
)
pytestmark = pytest.mark.skipif(
    not (BENCHMARK / "bench_moe.py").exists(), reason="benchmark/ is not part of a chapter's tree"
)


def _config(block_m: int, block_n: int, block_k: int, group_m: int) -> Dict[int, dict]:
    """One config for every batch size."""
    return {
        1: dict(
            BLOCK_SIZE_M=block_m,
            BLOCK_SIZE_N=block_n,
            BLOCK_SIZE_K=block_k,
            GROUP_SIZE_M=group_m,
            num_warps=4,
            num_stages=2,
        )
    }


# ---- the published configs and the choice among them ----------------------------------------


def test_configs_are_the_published_h200_file_keyed_by_batch_size() -> None:
    import json

    moe_baseline = benchmark_module("moe_baseline")
    source = json.loads(moe_baseline.CONFIG_FILE.read_text())["source"]
    assert "E=128,N=768,device_name=NVIDIA_H200" in source["path"]
    assert re.fullmatch(r"[0-9a-f]{40}", source["commit"])
    configs = moe_baseline.load_configs()
    assert min(configs) == 1 and max(configs) == 4096
    for config in configs.values():
        for tile in ("BLOCK_SIZE_M", "BLOCK_SIZE_N", "BLOCK_SIZE_K"):  # powers of two
            assert config[tile] >= 16 and config[tile] & (config[tile] - 1) == 0


@pytest.mark.parametrize(
    "tokens,key",
    [(1, 1), (3, 2), (5, 4), (20, 16), (21, 24), (700, 512), (800, 1024), (16384, 4096)],
)
def test_a_batch_takes_the_config_of_the_nearest_batch_size(tokens: int, key: int) -> None:
    moe_baseline = benchmark_module("moe_baseline")
    configs = moe_baseline.load_configs()
    assert moe_baseline.nearest_config(configs, tokens) is configs[key]  # ties: the smaller


# ---- the baseline against the reference, in the interpreter ---------------------------------


CASES = {
    # name: (tokens, experts, topk, hidden, inter, tile config or None for the published ones)
    "one token": (1, 8, 2, 64, 32, None),
    "published configs, T=33": (33, 8, 2, 64, 32, None),
    "experts with no token": (3, 16, 2, 64, 32, None),
    "T not a multiple of the block, short last group": (37, 8, 2, 64, 32, _config(16, 32, 32, 4)),
    "K and N not multiples of the tile": (9, 4, 2, 80, 24, _config(16, 32, 32, 2)),
}


def _layer(
    tokens: int, experts: int, hidden: int, inter: int, seed: int
) -> tuple[torch.Tensor, ...]:
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(tokens, hidden, generator=gen)
    w1 = torch.randn(experts, 2 * inter, hidden, generator=gen) / hidden**0.5
    w2 = torch.randn(experts, hidden, inter, generator=gen) / inter**0.5
    gating = torch.randn(tokens, experts, generator=gen)
    return x, w1, w2, gating


def _relative_error(out: torch.Tensor, ref: torch.Tensor) -> float:
    return ((out - ref).abs().max() / ref.abs().max()).item()


@interpreted
@pytest.mark.parametrize("name", list(CASES))
@pytest.mark.parametrize("renormalize", [True, False])
def test_tuned_baseline_matches_the_reference(name: str, renormalize: bool) -> None:
    from minisgl.moe.base import select_experts
    from minisgl.moe.torch_backend import TorchMoeBackend

    tokens, experts, topk, hidden, inter, configs = CASES[name]
    x, w1, w2, gating = _layer(tokens, experts, hidden, inter, seed=len(name))
    if name == "experts with no token":
        gating[:, experts // 2 :] -= 20.0  # the upper half is never chosen
        assert select_experts(gating, topk, renormalize)[1].max() < experts // 2
    baseline = benchmark_module("moe_baseline").TunedBaselineMoe(configs)
    out = baseline.forward(x, w1, w2, gating, topk, renormalize)
    ref = TorchMoeBackend().forward(x, w1, w2, gating, topk, renormalize)
    assert out.shape == ref.shape
    assert _relative_error(out, ref) < 1e-5


@interpreted
def test_tuned_baseline_all_tokens_to_the_same_experts() -> None:
    """Every token picks experts 2 and 5: their runs span several tiles, six experts get none."""
    from minisgl.moe.torch_backend import TorchMoeBackend

    x, w1, w2, gating = _layer(40, 8, 64, 32, seed=3)
    gating[:, [2, 5]] += 30.0
    out = (
        benchmark_module("moe_baseline")
        .TunedBaselineMoe(_config(16, 32, 64, 2))
        .forward(x, w1, w2, gating, 2, True)
    )
    ref = TorchMoeBackend().forward(x, w1, w2, gating, 2, True)
    assert _relative_error(out, ref) < 1e-5


@interpreted
def test_tuned_baseline_near_the_worst_case_of_tiles() -> None:
    """Each of 8 experts gets 17 pairs, so each takes two tiles of 16 with one pair in the
    second: about as many tiles as the grid covers for the worst case."""
    from minisgl.moe.torch_backend import TorchMoeBackend

    x, w1, w2, gating = _layer(68, 8, 64, 32, seed=4)
    pair = torch.arange(68) % 4
    gating[torch.arange(68), 2 * pair] += 20.0  # token t: experts 2(t % 4) and 2(t % 4) + 1
    gating[torch.arange(68), 2 * pair + 1] += 19.0
    out = (
        benchmark_module("moe_baseline")
        .TunedBaselineMoe(_config(16, 32, 32, 3))
        .forward(x, w1, w2, gating, 2, True)
    )
    ref = TorchMoeBackend().forward(x, w1, w2, gating, 2, True)
    assert _relative_error(out, ref) < 1e-5


@interpreted
@pytest.mark.parametrize("group_m", [1, 2, 3, 4, 16])
def test_grouped_gemm_computes_every_tile_of_a_short_last_group(group_m: int) -> None:
    """The kernel alone on tiles that fill its grid exactly (chapter 20's alignment, no spare
    tiles): 7 tile rows x 3 column blocks, so for most GROUP_M the last group is short and holds
    real tiles. Each pair p must get a[p // k] @ b[expert of p].T, once."""
    from minisgl.moe.fused import moe_align_block_size

    gen = torch.Generator().manual_seed(group_m)
    topk, experts, block_m = 2, 4, 16
    topk_ids = torch.tensor([[t % experts, (t + 1) % experts] for t in range(44)])  # 22 each
    sorted_ids, expert_ids = moe_align_block_size(topk_ids, block_m, experts)
    assert expert_ids.numel() == 8  # two tiles per expert, the second holding 6 pairs
    sorted_ids, expert_ids = sorted_ids[: 7 * block_m], expert_ids[:7]  # leave out the last
    num_padded = torch.tensor([7 * block_m], dtype=torch.int32)
    a = torch.randn(44, 40, generator=gen)
    b = torch.randn(experts, 48, 40, generator=gen)  # N = 48: three blocks of 16
    c = torch.full((88, 48), float("nan"))
    weights = torch.ones(88)
    grouped_gemm = benchmark_module("moe_baseline").grouped_gemm
    grouped_gemm(
        a,
        b,
        c,
        weights,
        sorted_ids,
        expert_ids,
        num_padded,
        topk,
        False,
        _config(block_m, 16, 16, group_m)[1],
    )
    computed = sorted_ids[sorted_ids < 88].long()  # the pairs of the 7 tiles given
    flat_ids = topk_ids.flatten()
    expected = torch.einsum("pk,pnk->pn", a[computed // topk], b[flat_ids[computed]])
    torch.testing.assert_close(c[computed], expected, rtol=1e-5, atol=1e-5)
    untouched = torch.ones(88, dtype=torch.bool)
    untouched[computed] = False
    assert c[untouched].isnan().all()  # the pairs of the tile left out: never written


# ---- the benchmark end to end -----------------------------------------------------------------


@interpreted
def test_bench_moe_quick_runs_every_line_and_each_agrees() -> None:
    env = dict(os.environ, PYTHONPATH=str(ROOT / "python"), TRITON_INTERPRET="1")
    result = subprocess.run(
        [sys.executable, str(BENCHMARK / "bench_moe.py"), "--quick"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    for line in ("ch20 fused", "tuned baseline", "ch21 fast"):
        assert re.search(rf"^  {line} +agrees: T=1 .*T=5 .*T=33 ", result.stdout, re.M), (
            result.stdout
        )
    assert "not available" not in result.stdout


# ---- beside upstream's kernel: bench_moe_upstream.py ---------------------------------------
# It loads upstream's files from a clone at run time; a test that runs them needs a clone:
# git clone https://github.com/sgl-project/mini-sglang && git -C mini-sglang checkout 20fcd7f
UPSTREAM = os.environ.get("MINISGL_UPSTREAM")


def _bench_upstream(folder: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(ROOT / "python"), TRITON_INTERPRET="1")
    return subprocess.run(
        [sys.executable, str(BENCHMARK / "bench_moe_upstream.py"), "--upstream", folder, "--quick"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


@interpreted
def test_bench_moe_upstream_refuses_a_folder_that_is_not_upstream(tmp_path) -> None:
    result = _bench_upstream(str(tmp_path))
    assert result.returncode != 0
    assert "--upstream takes a clone of https://github.com/sgl-project/mini-sglang" in (
        result.stderr
    )


def test_bench_moe_upstream_takes_only_the_functions_it_names(tmp_path) -> None:
    bench = benchmark_module("bench_moe_upstream")
    source = tmp_path / "fused.py"
    source.write_text("import not_installed\n\ndef f(a):\n    return a + 1\n\ndef g():\n    pass\n")
    assert bench.functions_of(source, ("f",), {})["f"](1) == 2  # the import never runs
    with pytest.raises(SystemExit, match="has no h"):
        bench.functions_of(source, ("f", "h"), {})


@interpreted
@pytest.mark.skipif(not UPSTREAM, reason="set MINISGL_UPSTREAM to a clone of upstream at 20fcd7f")
def test_bench_moe_upstream_quick_runs_every_line_and_each_agrees() -> None:
    result = _bench_upstream(UPSTREAM)
    assert result.returncode == 0, result.stdout + result.stderr
    for line in ("ch21", "upstream", "upstream, vLLM's H200 configs", "ch21 vs upstream"):
        assert re.search(rf"^  {line} +agrees: T=1 .*T=5 .*T=33 ", result.stdout, re.M), (
            result.stdout
        )
    # on a CPU there is no sgl_kernel nor FlashInfer: the table says what stands in
    assert re.search(r"^routing +\|.*\| STAND-IN \(no sgl_kernel\)", result.stdout, re.M)
    assert re.search(r"^activation +\|.*\| STAND-IN \(no FlashInfer\)", result.stdout, re.M)


# ---- the tuner --------------------------------------------------------------------------------


@interpreted
def test_tune_moe_quick_writes_configs_and_keeps_other_token_counts(tmp_path) -> None:
    """``tune_moe.py --quick`` in the interpreter: one entry per token count on the path
    moe/configs.py gives it, each a candidate of the search; a second run over one count keeps
    the other counts' entries and adds its command to the first's."""
    import json

    from minisgl.moe.configs import DECODE_MAX_TOKENS

    def tune(*extra: str) -> Dict[str, Any]:
        r = subprocess.run(
            [
                sys.executable,
                str(BENCHMARK / "tune_moe.py"),
                "--quick",
                "--out",
                str(tmp_path),
                *extra,
            ],
            capture_output=True,
            text=True,
            timeout=120,
            env=dict(os.environ, PYTHONPATH=str(ROOT / "python")),
        )
        assert r.returncode == 0, r.stderr
        (path,) = tmp_path.glob("*.json")
        assert path.name == "E=8,N=16,dtype=fp32,device=CPU_interpreter.json"
        return json.loads(path.read_text())

    first = tune()
    assert list(first["configs"]) == ["1", "5", "33"]  # the quick run's counts, in order
    for tokens, config in first["configs"].items():
        want = "decode" if int(tokens) <= DECODE_MAX_TOKENS else "aligned"
        assert config["path"] == want, tokens
        assert config["gate_up"]["BLOCK_N"] == 16 and config["down"]["BLOCK_K"] in (16, 32)
    assert first["configs"]["33"]["BLOCK_M"] in (16, 64)
    first["configs"]["33"]["marker"] = "kept"  # a second run must not tune 33 again
    (path,) = tmp_path.glob("*.json")
    path.write_text(json.dumps(first))
    second = tune("--tokens", "1")
    assert second["configs"]["33"]["marker"] == "kept"
    assert len(second["commands"]) == 2 and second["commands"][1].endswith("--tokens 1")


@interpreted
def test_profile_moe_padding_counts_chapter_20s_slots() -> None:
    """profile_moe.py's padding line: the slots chapter 20's alignment makes for the same
    routing and tile height, and no line for a decode batch."""
    from minisgl.moe.base import select_experts
    from minisgl.moe.configs import default_config
    from minisgl.moe.fused import moe_align_block_size

    padding = benchmark_module("profile_moe").padding
    torch.manual_seed(0)
    logits = torch.randn(600, 128)
    block_m = default_config(600, 8, 128)["BLOCK_M"]
    ids = select_experts(logits, 8, True)[1]
    slots = moe_align_block_size(ids, block_m, 128)[0].numel()
    share = f"{100 * (1 - ids.numel() / slots):.1f}% padding"
    assert (
        padding(logits, 8, 768, torch.bfloat16)
        == f"BLOCK_M {block_m}: {slots} slots for {ids.numel()} pairs, {share}"
    )
    assert padding(logits[:16], 8, 768, torch.bfloat16) == "decode path"


def test_profile_moe_counts_the_rows_split_tails_compute() -> None:
    """Tiles of 64 slots holding 5, 20, 40 and 64 pairs: halves compute 32, 32, 64 and 64
    rows; quarters 16, 32, 64 and 64."""
    computed_rows = benchmark_module("profile_moe").computed_rows
    num_pairs = 1000
    tiles = torch.full((4, 64), num_pairs)
    for tile, pairs in enumerate((5, 20, 40, 64)):
        tiles[tile, :pairs] = torch.arange(pairs)
    assert computed_rows(tiles, num_pairs, 2) == 192
    assert computed_rows(tiles, num_pairs, 4) == 176


# ---- the small kernels' launch sizes ----------------------------------------------------------


@interpreted
def test_sweep_moe_launches_quick_every_candidate_agrees() -> None:
    """``sweep_moe_launches.py --quick`` in the interpreter: every launch size of the routing,
    the plan (over one and two chunks, two programs of tiles), the scatter and the k-sum gives
    the bits of the current choice, which is among the candidates."""
    env = dict(os.environ, PYTHONPATH=str(ROOT / "python"), TRITON_INTERPRET="1")
    result = subprocess.run(
        [sys.executable, str(BENCHMARK / "sweep_moe_launches.py"), "--quick"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    for name, count in (("routing", 4), ("plan", 27), ("scatter", 4), ("k-sum", 32)):
        assert f"  {name}: {count} candidates, all agree" in result.stdout, result.stdout
    sweep = benchmark_module("sweep_moe_launches")
    for module, candidates in sweep.SPACES.values():
        assert sweep.current(module, candidates) in candidates


def test_sweep_moe_launches_reports_a_candidate_that_disagrees(capsys) -> None:
    """A call whose output depends on the swept constant: the sweep says which candidates
    disagree and returns False, and the module's constant is put back."""
    sweep = benchmark_module("sweep_moe_launches")
    from minisgl.kernel import moe_routing

    before = moe_routing.SCATTER_WARPS
    assert not sweep.sweep(
        "scatter", lambda: (torch.tensor([moe_routing.SCATTER_WARPS]),), iters=1, timed=False
    )
    out = capsys.readouterr().out
    assert out.count("DISAGREES") == 3 and "NOT all agree" in out
    assert moe_routing.SCATTER_WARPS == before


@pytest.mark.skipif(not torch.cuda.is_available() or not HAS_TRITON, reason="needs CUDA")
def test_sweep_moe_launches_times_each_sweep_on_a_gpu() -> None:
    env = dict(os.environ, PYTHONPATH=str(ROOT / "python"))
    result = subprocess.run(
        [
            sys.executable,
            str(BENCHMARK / "sweep_moe_launches.py"),
            "--tokens",
            "300",
            "--iters",
            "2",
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    for name in ("routing", "plan", "scatter", "k-sum"):
        assert re.search(rf"^  {name} *\* +\d+\. +[\d.]+ us", result.stdout, re.M), result.stdout
