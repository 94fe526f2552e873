"""Greedy lossless with a *trained* DSpine draft (CPU, fp32).

The draft is trained here by `dspine-train` itself: self-generated data from SmolLM2-135M-Instruct
(Magpie-style, no external data), a short fit on the CPU. It is small and briefly trained, but its
drafts are accepted often enough that multi-token accepts, bonus tokens after partial accepts and
rollbacks all happen; the test checks they do. Then greedy speculative output must equal greedy
autoregressive output on 20 real prompts (10 HumanEval, 10 MT-Bench), 128 new tokens, at batch 1
and batched.
"""
import pytest

from dspine_engine import Engine, SamplingParams
from dspine_engine.cli.train import main as train_main
from dspine_engine.datasets import humaneval_prompts, mtbench_prompts

NEW_TOKENS = 128


@pytest.fixture(scope="module")
def trained_draft(tmp_path_factory, smollm2_dir):
    tmp = tmp_path_factory.mktemp("trained")
    data = tmp / "data.jsonl"
    assert train_main(["data", "--target", str(smollm2_dir), "--out", str(data), "--num", "24",
                       "--max-new-tokens", "160", "--max-num-seqs", "24", "--quiet"]) == 0
    out = tmp / "draft"
    assert train_main(["fit", "--target", str(smollm2_dir), "--data", str(data), "--out",
                       str(out), "--init", "--layers", "1", "--intermediate", "512", "--rank",
                       "32", "--steps", "40", "--batch-size", "4", "--blocks-per-seq", "6",
                       "--lr", "3e-3", "--quiet", "--seed", "1"]) == 0
    return out


@pytest.fixture(scope="module")
def prompts():
    return humaneval_prompts()[10:20] + mtbench_prompts()[10:20]


def test_greedy_lossless_trained_draft(trained_draft, smollm2_dir, smollm2_engine, prompts):
    params = SamplingParams(max_tokens=NEW_TOKENS, ignore_eos=True)
    reference = [r.token_ids for r in smollm2_engine.generate(prompts, params)]
    eng = Engine(smollm2_dir, draft=trained_draft, progress=False, max_num_seqs=32)
    batched = eng.generate(prompts, params)
    assert [r.token_ids for r in batched] == reference
    stats = eng.stats
    assert stats.accepted_drafts > 0 and stats.acceptance_by_position()[1] > 0, \
        "the trained draft must be accepted, multi-token accepts included"
    one_by_one = [eng.generate(p, params)[0].token_ids for p in prompts]
    assert one_by_one == reference
    for kv in (eng.target_kv, eng.draft_kv):
        assert kv.pool.available == kv.pool.num_pages
