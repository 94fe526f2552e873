"""Dynamic verification on a GPU (bf16, CUDA graphs): the verify graphs of every bucket replay
what the eager forward computes, the cost profile is measured through the graphs and cached,
and greedy output under the auto policy equals greedy autoregressive output (the bf16 caveat
of test_engine_gpu.py applies: equality holds on these prompts; a bookkeeping bug breaks it
within a few tokens)."""
import json

import pytest
import torch

from dspine_engine import Engine, SamplingParams
from dspine_engine.datasets import humaneval_prompts, mtbench_prompts
from engine_rounds import GPU_KV_TOKENS, assert_greedy_lossless, pools_whole, running_after_rounds
from test_spec_policy_lossless import write_linear_profile

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def real_prompts():
    return humaneval_prompts()[:8] + mtbench_prompts()[:8]


@pytest.fixture(scope="module")
def auto_engine(smollm2_dir, tmp_path_factory):
    profile = write_linear_profile(tmp_path_factory.mktemp("profile") / "p.json", 0.12)
    return Engine(smollm2_dir, draft="default", device="cuda", max_num_seqs=16, progress=False,
                  kv_cache_tokens=GPU_KV_TOKENS, spec_policy="auto", spec_cost_profile=str(profile))


@pytest.mark.parametrize("tokens", [1, 2, 4, 8, 16])
def test_verify_graph_of_each_width_matches_eager(auto_engine, real_prompts, tokens,
                                                  monkeypatch):
    eng, runner = auto_engine, auto_engine.runner
    assert runner.graphs is not None
    with running_after_rounds(eng, real_prompts[:5], rounds=2) as seqs:
        seats = eng.scheduler.prepare_round(seqs)
        runner.prepare_round(seqs, seats, tokens)
        runner.propose()
        graph = runner.verify().float().clone()
        monkeypatch.setattr(runner, "graphs", None)
        eager = runner.verify().float()
    assert graph.shape == eager.shape == (5, tokens, eng.target.config.vocab_size)
    agree = (graph.argmax(-1) == eager.argmax(-1)).float().mean().item()
    assert agree > 0.97


def test_greedy_lossless_with_dynamic_verification_on_gpu(auto_engine, smollm2_dir,
                                                           real_prompts):
    params = SamplingParams(max_tokens=96, ignore_eos=True)
    assert_greedy_lossless(
        auto_engine, lambda: Engine(smollm2_dir, device="cuda", max_num_seqs=16, progress=False,
                                     kv_cache_tokens=GPU_KV_TOKENS),
        real_prompts, params, one_by_one=4)  # row-exact attention: no tie allowed
    lengths = auto_engine.stats.verify_lengths
    assert lengths.get(0, 0) > 0 and len([k for k in lengths if k > 0]) >= 2, lengths
    assert pools_whole(auto_engine)


def test_cost_profile_is_measured_through_the_graphs(smollm2_dir, tmp_path, monkeypatch):
    prompts = real_prompts_small()  # read from the real cache before it is moved
    monkeypatch.setenv("DSPINE_CACHE", str(tmp_path / "cache"))
    eng = Engine(smollm2_dir, draft="default", device="cuda", max_num_seqs=8, progress=False,
                 kv_cache_tokens=GPU_KV_TOKENS, spec_policy="auto")
    (path,) = (tmp_path / "cache" / "verify_cost").glob("*.json")
    saved = json.loads(path.read_text())
    assert saved["padded_sizes"] == eng.runner.graphs.sizes == [1, 2, 4, 8]
    costs = {int(w): {int(b): s for b, s in row.items()} for w, row in saved["seconds"].items()}
    assert sorted(costs) == [1, 2, 4, 8, 16]
    assert all(sorted(row) == [1, 2, 4, 8] and min(row.values()) > 0 for row in costs.values())
    print("verify cost (ms) by width, batch:",
          {w: {b: round(1e3 * s, 3) for b, s in row.items()} for w, row in costs.items()})
    out = eng.generate(prompts, SamplingParams(max_tokens=32, ignore_eos=True))
    assert all(len(r.token_ids) == 32 for r in out)
    torch.cuda.synchronize()


def real_prompts_small():
    return humaneval_prompts()[:2] + mtbench_prompts()[:2]
