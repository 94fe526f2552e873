"""Greedy speculative decoding on the quantised CPU path is token-identical to autoregressive.

The quantised kernels compute each row with a reduction order that does not depend on how many
rows share the call (tests/test_quant_cpu.py), so a 16-token verify block and a one-token decode
step give a position the same logits. Checked end to end here with the shipped drafter on real
prompts (HumanEval and MT-Bench), at batch 1 and batched.
"""
import pytest

from dspine_engine import Engine, SamplingParams
from dspine_engine.datasets import humaneval_prompts, mtbench_prompts

NEW_TOKENS = 48


@pytest.fixture(scope="module")
def prompts():
    return humaneval_prompts()[:3] + mtbench_prompts()[:3]


def test_greedy_lossless_quantised(smollm2_quant_engine, prompts):
    params = SamplingParams(max_tokens=NEW_TOKENS, ignore_eos=True)
    reference = [r.token_ids for r in smollm2_quant_engine.generate(prompts, params)]
    eng = Engine(None, draft="default", device="cpu", dtype="gguf", progress=False,
                 max_num_seqs=6)
    assert eng.quantized
    batched = eng.generate(prompts, params)
    assert [r.token_ids for r in batched] == reference
    assert eng.stats.tau > 1.2, f"the drafter is barely accepted (tau {eng.stats.tau:.2f})"
    assert eng.stats.acceptance_by_position()[1] > 0, "multi-token accepts must happen"
    one_by_one = [eng.generate(p, params)[0].token_ids for p in prompts[2:4]]
    assert one_by_one == reference[2:4]
    for kv in (eng.target_kv, eng.draft_kv):
        assert kv.pool.available == kv.pool.num_pages
