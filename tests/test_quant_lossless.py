"""Greedy speculative decoding on the quantised CPU path is token-identical to autoregressive.

The quantised kernels compute each row with a reduction order that does not depend on how many
rows share the call (tests/test_quant_cpu.py), so a 16-token verify block and a one-token decode
step give a position the same logits. Checked end to end here with the shipped drafter on real
prompts (HumanEval and MT-Bench), at batch 1 and batched, on the path's default fp16 KV cache
and on an fp32 one; and with an fp16 cache under the fp32 (dequantised) default model.
"""
import pytest
import torch

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
    for kv in (smollm2_quant_engine.target_kv, eng.target_kv, eng.draft_kv):
        assert all(t.dtype == torch.float16 for t in kv.k + kv.v), "auto: fp16 on this path"
    batched = eng.generate(prompts, params)
    assert [r.token_ids for r in batched] == reference
    assert eng.stats.tau > 1.2, f"the drafter is barely accepted (tau {eng.stats.tau:.2f})"
    assert eng.stats.acceptance_by_position()[1] > 0, "multi-token accepts must happen"
    one_by_one = [eng.generate(p, params)[0].token_ids for p in prompts[2:4]]
    assert one_by_one == reference[2:4]
    for kv in (eng.target_kv, eng.draft_kv):
        assert kv.pool.available == kv.pool.num_pages


def assert_greedy_lossless(make_engine, prompts, params):
    """An engine with the shipped drafter (verifying 3 drafts a round, fixed) decodes what the
    same settings without a draft decode, batched and at batch 1."""
    reference = [r.token_ids for r in make_engine(draft=None).generate(prompts, params)]
    eng = make_engine(draft="default", spec_policy="fixed", num_speculative_tokens=3)
    assert [r.token_ids for r in eng.generate(prompts, params)] == reference
    assert [eng.generate(p, params)[0].token_ids for p in prompts[:2]] == reference[:2]
    assert eng.stats.acceptance_by_position()[1] > 0, "multi-token accepts must happen"
    return eng


def test_greedy_lossless_quantised_with_an_fp32_cache(quant_prompts, quant_params):
    eng = assert_greedy_lossless(
        lambda **kw: Engine(None, dtype="gguf", kv_cache_dtype="float32", progress=False,
                            max_num_seqs=4, **kw), quant_prompts, quant_params)
    assert eng.kv_dtype == torch.float32 and eng.target_kv.k[0].dtype == torch.float32


def test_greedy_lossless_fp32_model_with_an_fp16_cache(smollm2_dir, quant_prompts):
    """The op-by-op target loop and the fp32 draft (no one-op layers) on the CPU's mix."""
    params = SamplingParams(max_tokens=24, ignore_eos=True)
    eng = assert_greedy_lossless(
        lambda **kw: Engine(smollm2_dir, kv_cache_dtype="float16", progress=False,
                            max_num_seqs=4, **kw), quant_prompts[:3], params)
    assert not eng.quantized and eng.dtype == torch.float32
    assert eng.target_kv.k[0].dtype == eng.draft_kv.k[0].dtype == torch.float16
