"""Lossless speculative decoding on the CPU in fp32.

Greedy: speculative output equals autoregressive output token for token, on 20 real prompts
(10 HumanEval, 10 MT-Bench), 48 new tokens each, batched and (every fourth prompt) at batch 1,
with randomly initialised DSpine/DFlash drafts (with and without a sliding window shorter than
the context).
The same check with the trained drafter lives in test_trained_drafter.py.
"""
import json

import pytest

from dspine_engine import Engine, SamplingParams
from dspine_engine.models.config import ModelConfigError
from random_drafts import write_random_draft

# A random draft is accepted almost never, so every token costs a 16-token fp32 verify and a
# 15-row draft lm_head: 48 tokens keep every rejection path busy at a fraction of the trained
# drafter's cost (test_trained_drafter.py runs 128-token answers with real multi-token accepts).
NEW_TOKENS = 48


# The DFlash + sliding-window variant runs batched only: its batch-1 path is the same code, and
# each batch-1 pass over 20 prompts costs minutes of CPU (16-token fp32 verifies).
@pytest.mark.parametrize("variant,kw,batch1", [
    ("dspine", {}, True),
    ("dflash-window", dict(injection=False, transition=False, sliding_window=48), False),
])
def test_greedy_lossless_random_draft(variant, kw, batch1, tmp_path, smollm2_dir,
                                      lossless_prompts, greedy_reference):
    draft = write_random_draft(tmp_path / variant, **kw)
    eng = Engine(smollm2_dir, draft=draft, progress=False, max_num_seqs=32)
    params = SamplingParams(max_tokens=NEW_TOKENS, ignore_eos=True)
    reference = [r[:NEW_TOKENS] for r in greedy_reference]
    batched = eng.generate(lossless_prompts, params)
    assert [r.token_ids for r in batched] == reference
    if batch1:  # every fourth prompt (3 HumanEval, 2 MT-Bench): batch 1 is the costly pass
        one_by_one = [eng.generate(p, params)[0].token_ids for p in lossless_prompts[::4]]
        assert one_by_one == reference[::4]
    assert all(r.stats.rounds > 0 for r in batched)
    # Every page (and reservation) of both pools came back.
    for kv in (eng.target_kv, eng.draft_kv):
        assert kv.pool.available == kv.pool.num_pages


def test_draft_must_fit_the_target(tmp_path, smollm2_dir):
    cases = {"vocab": dict(vocab_size=1000), "hidden": dict(hidden_size=512, num_heads=8,
                                                             num_kv_heads=2),
             "layers": dict(target_layer_ids=[3, 40])}
    for name, kw in cases.items():
        path = write_random_draft(tmp_path / name, **kw)
        with pytest.raises(ModelConfigError, match="does not fit"):
            Engine(smollm2_dir, draft=path, progress=False)


def test_dflash_checkpoint_loads(tmp_path, smollm2_dir, lossless_prompts, greedy_reference):
    """A checkpoint in DFlash's own format (DFlashDraftModel + dflash_config) is a drafter."""
    path = write_random_draft(tmp_path / "dflash", injection=False, transition=False,
                              mask_token_id=0)
    cfg = json.loads((path / "config.json").read_text())
    dflash = {k: v for k, v in cfg.items() if k not in ("block_size", "target_layer_ids",
                                                        "mask_token_id", "injection",
                                                        "transition", "model_type")}
    dflash.update(architectures=["DFlashDraftModel"], model_type="qwen3",
                  dflash_config={"block_size": 16, "mask_token_id": 0,
                                 "target_layer_ids": cfg["target_layer_ids"]},
                  layer_types=["full_attention"] * cfg["num_hidden_layers"])
    (path / "config.json").write_text(json.dumps(dflash))
    eng = Engine(smollm2_dir, draft=path, progress=False)
    assert eng.draft.config.architecture == "DFlashDraftModel"
    assert not eng.draft.config.injection and not eng.draft.config.transition
    out = eng.generate(lossless_prompts[:3], SamplingParams(max_tokens=NEW_TOKENS,
                                                            ignore_eos=True))
    assert [r.token_ids for r in out] == [r[:NEW_TOKENS] for r in greedy_reference[:3]]


def test_seeded_sampling_with_draft_is_reproducible(tmp_path, smollm2_dir, lossless_prompts):
    path = write_random_draft(tmp_path / "d")
    eng = Engine(smollm2_dir, draft=path, progress=False)
    p = SamplingParams(max_tokens=40, temperature=0.8, top_p=0.9, seed=11)
    a = eng.generate(lossless_prompts[:2], p)
    b = eng.generate(lossless_prompts[1], p)[0]
    assert a[1].token_ids == b.token_ids
    assert a[0].token_ids != a[1].token_ids
