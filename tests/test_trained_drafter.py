"""The shipped, trained DSpine drafter for SmolLM2-135M-Instruct (CPU, fp32).

It was trained on an H200 with `dspine-train` (docs/TRAINING.md, "The shipped drafter"); here it
must fit its size budget, load as the default draft, be accepted often enough that multi-token
accepts, bonus tokens after partial accepts and rollbacks all happen, and leave greedy output
exactly the target's on 20 real prompts (10 HumanEval, 10 MT-Bench), 128 new tokens, batched
(and on every fourth prompt at batch 1), against the plain-decoding reference the random-draft
tests share (conftest.py).
"""
import json

import pytest

from dspine_engine import Engine, SamplingParams
from dspine_engine.models.drafters import DEFAULT_DRAFTER


def test_shipped_drafter_fits_its_budget():
    weights = sorted(DEFAULT_DRAFTER.glob("*.safetensors"))
    assert weights, f"no drafter shipped in {DEFAULT_DRAFTER}"
    assert sum(p.stat().st_size for p in weights) <= 40_000_000
    assert all(p.stat().st_size <= 15 * 2**20 for p in weights)
    cfg = json.loads((DEFAULT_DRAFTER / "config.json").read_text())
    assert cfg["architectures"] == ["DSpineDraftModel"]
    assert cfg["injection"]["enabled"] and cfg["transition"]["enabled"]


def test_greedy_lossless_shipped_drafter(smollm2_dir, lossless_prompts, greedy_reference):
    prompts, reference = lossless_prompts, greedy_reference
    params = SamplingParams(max_tokens=len(reference[0]), ignore_eos=True)  # all of it
    eng = Engine(smollm2_dir, draft="default", progress=False, max_num_seqs=32)
    batched = eng.generate(prompts, params)
    assert [r.token_ids for r in batched] == reference
    stats = eng.stats
    assert stats.tau > 1.2, f"the trained drafter is barely accepted (tau {stats.tau:.2f})"
    assert stats.acceptance_by_position()[1] > 0, "multi-token accepts must happen"
    # Batch 1 on every fourth prompt (3 HumanEval, 2 MT-Bench): the random-draft tests cover
    # batch 1 too, and the 5-layer drafter made this test the suite's longest.
    one_by_one = [eng.generate(p, params)[0].token_ids for p in prompts[::4]]
    assert one_by_one == reference[::4]
    for kv in (eng.target_kv, eng.draft_kv):
        assert kv.pool.available == kv.pool.num_pages
