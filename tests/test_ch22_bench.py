"""Chapter 22's benchmark checkpoint: ``benchmark/make_checkpoint.py`` writes a folder of a named
shape that ``LLM(path)``, the server and upstream's ``bench.py`` load like a downloaded model: its
weights are transformers' own, so the engine's greedy tokens equal transformers', and its
word-level tokenizer decodes every id the model can sample.

The script lives in ``benchmark/``, which no chapter's tree holds: there these tests skip."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from helpers import ROOT, START_TIMEOUT, benchmark_module

BENCHMARK = ROOT / "benchmark"
pytestmark = pytest.mark.skipif(
    not (BENCHMARK / "make_checkpoint.py").exists(),
    reason="benchmark/ is not part of a chapter's tree",
)


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    make = benchmark_module("make_checkpoint")
    return make.make_checkpoint("tiny", tmp_path_factory.mktemp("ckpt") / "tiny", "cpu")


def test_the_folder_holds_the_shape_and_a_tokenizer_of_its_whole_vocabulary(checkpoint):
    from ch15_measure import SHAPES
    from transformers import AutoTokenizer

    config = json.loads((checkpoint / "config.json").read_text())
    for key in ("hidden_size", "num_hidden_layers", "num_attention_heads", "head_dim"):
        assert config[key] == SHAPES["tiny"][key]
    tok = AutoTokenizer.from_pretrained(checkpoint)
    vocab = SHAPES["tiny"]["vocab_size"]
    assert len(tok) == vocab  # no added token: EOS lies inside the vocabulary
    ids = [0, 1, 17, vocab // 2, vocab - 1]
    assert tok.encode(tok.decode(ids), add_special_tokens=False) == ids
    assert tok.eos_token_id == vocab - 1  # the tiny shape's EOS (151,645) lies outside


def test_llm_on_the_checkpoint_gives_transformers_greedy_tokens(checkpoint):
    from transformers import AutoModelForCausalLM

    from minisgl.core import SamplingParams
    from minisgl.llm import LLM

    prompts = [[5, 9, 200, 31], [7] * 3, list(range(100, 111))]
    llm = LLM(str(checkpoint), device="cpu", num_pages=256, page_size=4)
    params = SamplingParams(temperature=0.0, ignore_eos=True, max_tokens=6)
    ours = [out["token_ids"] for out in llm.generate(prompts, params)]
    model = AutoModelForCausalLM.from_pretrained(checkpoint, dtype=torch.float32)
    for prompt, tokens in zip(prompts, ours):
        out = model.generate(
            torch.tensor([prompt]),
            do_sample=False,
            max_new_tokens=6,
            min_new_tokens=6,
            eos_token_id=None,
            pad_token_id=0,
        )
        assert tokens == out[0, len(prompt) :].tolist()


@pytest.mark.parametrize("client", ["openai", "raw"])
def test_online_py_launches_a_server_and_counts_every_token(checkpoint, client):
    """``benchmark/online.py --launch`` as chapter 22 runs it on a GPU, here on a CPU: each
    request's tokens come back (``ignore_eos``), by either client, and the server's own TTFT is
    read from its /metrics."""
    command = [
        sys.executable,
        str(BENCHMARK / "online.py"),
        "--launch",
        str(checkpoint),
        "--server-args",
        "--device cpu",
        "--num-prompts",
        "4",
        "--concurrency",
        "2",
        "--max-input",
        "16",
        "--max-output",
        "3",
        "--client",
        client,
        "--json",
    ]
    done = subprocess.run(
        command,
        capture_output=True,
        text=True,
        timeout=4 * START_TIMEOUT,
        env={**os.environ, "PYTHONPATH": str(ROOT / "python")},
    )
    assert done.returncode == 0, done.stderr
    summary = json.loads(done.stdout.strip().splitlines()[-1])
    assert (summary["requests"], summary["output_tokens"]) == (4, 12)
    assert 0 < summary["ttft"]["p50"] <= summary["e2e"]["p50"]
    assert 0 < summary["client_cpu_s"]
    assert "ms by the server's own clock (its /metrics)" in done.stdout


def test_busy_time_is_the_union_of_the_kernels_intervals():
    """offline.py --busy: overlapping, nested and unordered intervals count once; the gaps are
    the idle stretches between the union's pieces."""
    busy_and_gaps = benchmark_module("offline").busy_and_gaps
    assert busy_and_gaps([(0, 10)]) == (10, [])
    assert busy_and_gaps([(20, 30), (0, 10)]) == (20, [10])
    assert busy_and_gaps([(0, 10), (5, 15), (2, 4), (15, 16), (40, 50)]) == (26, [24])
    assert busy_and_gaps([(0, 100), (10, 20), (30, 40), (150, 160)]) == (110, [50])


def test_profile_kinds_name_chapter_22s_kernels():
    """profile_decode.py groups kernels by name: the fused q/k norm + rotary kernel counts as
    rotary (not norm), the fused MoE kernels as MoE (not activation or elementwise)."""
    kind_of = benchmark_module("profile_decode").kind_of
    expected = {
        "_qk_norm_rope_kernel": "rotary",
        "_add_rms_norm_kernel": "norm",
        "_decode_split_kernel": "attention",
        "_decode_combine_kernel": "attention",
        "_store_kv_kernel": "KV store",
        "_race_blocks_kernel": "sampling",
        "_gate_up_silu_kernel": "MoE",
        "_decode_gate_up_kernel": "MoE",
        "_down_kernel": "MoE",
        "_scatter_pairs_kernel": "MoE",
        "_route_and_count_kernel": "MoE",
        "nvjet_sm90_tst_64x24_64x16_4x2_h_bz_TNT": "GEMM",
        "void at::native::vectorized_elementwise_kernel<4>": "elementwise/copy",
        "some_unknown_kernel": "other",
    }
    assert {name: kind_of(name) for name in expected} == expected


def test_bench_settings_reads_each_setting_and_tables_runs_and_phases(capsys):
    """benchmark/bench_settings.py: a setting's NAME=VALUE words go to the environment and the
    rest to offline.py; it reads offline.py's timed line and --breakdown's ms a call, and
    tables each setting's runs, median, spread and ratio, and each phase's median."""
    bench, offline = benchmark_module("bench_settings"), benchmark_module("offline")
    off = bench.parse_setting("kernels off:MINISGL_DISABLE_FUSED_KERNELS=1 --page-size 16")
    assert (off.label, off.env, off.options) == (
        "kernels off",
        {"MINISGL_DISABLE_FUSED_KERNELS": "1"},
        ["--page-size", "16"],
    )
    on = bench.parse_setting("kernels on:")
    assert (on.env, on.options) == ({}, [])
    with pytest.raises(ValueError):
        bench.parse_setting("no label here")
    offline.report("minisgl", [offline.SamplingParams(max_tokens=1000)] * 3, 0.25)
    printed = capsys.readouterr().out
    # two rows as offline.py's breakdown prints them, and its line outside the phases
    printed += "  schedule             0.553    1023     0.541   6.1%\n"
    printed += "  forward decode       5.444    1023     5.322  60.1%\n"
    printed += "  (outside phases)     0.018                     1.1%\n"
    run = bench.parse_output(printed)
    assert run.tokens_per_s == 12000
    assert run.phases_ms == {"schedule": 0.541, "forward decode": 5.322}
    with pytest.raises(ValueError):
        bench.parse_output("no timed line")
    runs = {
        "kernels on": [
            bench.Run(v, {"schedule": m}) for v, m in ((100, 0.5), (120, 0.7), (90, 0.6))
        ],
        "kernels off": [
            bench.Run(v, {"schedule": m}) for v, m in ((130, 1.0), (117, 0.9), (150, 1.2))
        ],
    }
    text = bench.table(22, ["--shape", "tiny"], [on, off], runs)
    assert "| kernels on | 100; 120; 90 | 100 | 30.0% | 1.000 |" in text
    assert "| kernels off | 130; 117; 150 | 130 | 25.4% | 1.300 |" in text
    assert "| schedule | 0.600 (33%) | 1.000 (30%) |" in text
