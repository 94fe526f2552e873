"""Dynamic verification (spec_policy="auto") leaves greedy output token-identical to
autoregressive decoding: the default model (fp32, CPU) with the shipped drafter, real prompts of
mixed lengths, batched and at batch 1, under a cost profile that makes the policy mix plain
decoding, short and long verify blocks in the same run. And the verify-cost profile is measured
once, cached, and measured again on request (tiny target, fast)."""
import json
from collections import Counter

import pytest

from dspine_engine import Engine, SamplingParams
from dspine_engine.engine import engine as engine_module
from dspine_engine.engine.verify_cost import build_fingerprint
from dspine_engine.datasets import humaneval_prompts, mtbench_prompts
from random_drafts import write_tiny_random_draft

NEW_TOKENS = 48


def write_linear_profile(path, per_token: float, widths=(1, 2, 4, 8, 16)):
    """A cost profile where a round costs b * (1 + per_token * (w - 1)): each sequence's choice
    is then its own, so a batch splits between plain decoding and drafting."""
    seconds = {str(w): {"1": 1 + per_token * (w - 1), "64": 64 * (1 + per_token * (w - 1))}
               for w in widths}
    path.write_text(json.dumps({"seconds": seconds}))
    return path


@pytest.fixture(scope="module")
def prompts():
    return humaneval_prompts()[:3] + mtbench_prompts()[:3]


@pytest.mark.parametrize("overlap", ["off", "on"], ids=["in-step", "overlapped"])
def test_greedy_lossless_with_dynamic_verification(smollm2_dir, smollm2_engine, prompts,
                                                   tmp_path, overlap):
    """Overlapped, the plan of round k+1 is made before round k is read back, and a plain
    round's catch-up of the draft context goes by the host's bound on the pending rows."""
    params = SamplingParams(max_tokens=NEW_TOKENS, ignore_eos=True)
    reference = [r.token_ids for r in smollm2_engine.generate(prompts, params)]
    eng = Engine(smollm2_dir, draft="default", progress=False, max_num_seqs=8,
                 spec_policy="auto", overlap=overlap,
                 # 0.2 per verified token splits the shipped drafter's sequences between plain
                 # rounds and 2- and 4-token blocks (run 6: {1: 112, 3: 95, 0: 25}); a better
                 # drafter drafts more at the same price, so this moves with the weights.
                 spec_cost_profile=str(write_linear_profile(tmp_path / "p.json", 0.2)))
    batched = eng.generate(prompts, params)
    assert [r.token_ids for r in batched] == reference
    singles = [eng.generate(p, params)[0] for p in prompts[::3]]
    assert [r.token_ids for r in singles] == reference[::3]
    lengths = eng.stats.verify_lengths
    # Not vacuous: plain rounds, and at least two different drafted lengths, all from buckets.
    assert lengths.get(0, 0) > 0 and len([k for k in lengths if k > 0]) >= 2, lengths
    assert set(lengths) <= {0, 1, 3, 7, 15}
    assert all(sum(r.stats.verify_lengths.values()) == r.stats.rounds for r in batched)
    assert any(r.stats.path().startswith("mixed") for r in batched)
    # Each request's tally (its rounds by outcome) adds up to the engine's counts of the batch.
    runs = [r.stats for r in batched + singles]
    assert [sum(c) for c in zip(*(s.accepted_by_position for s in runs))] == \
        eng.stats.accepted_by_position
    assert [sum(c) for c in zip(*(s.verified_by_position for s in runs))] == \
        eng.stats.verified_by_position
    assert sum((Counter(s.verify_lengths) for s in runs), Counter()) == Counter(lengths)
    assert sum(s.accepted_drafts for s in runs) == eng.stats.accepted_drafts
    for kv in (eng.target_kv, eng.draft_kv):
        assert kv.pool.available == kv.pool.num_pages


def test_fixed_shorter_blocks_are_lossless(smollm2_dir, smollm2_engine, prompts):
    params = SamplingParams(max_tokens=24, ignore_eos=True)
    reference = [r.token_ids for r in smollm2_engine.generate(prompts[:3], params)]
    eng = Engine(smollm2_dir, draft="default", progress=False, max_num_seqs=4,
                 num_speculative_tokens=5)
    assert [r.token_ids for r in eng.generate(prompts[:3], params)] == reference
    assert set(eng.stats.verify_lengths) == {5}
    assert eng.stats.acceptance_by_position()[5:] == [0.0] * 10  # never verified


def test_cost_profile_is_measured_once_and_cached(tiny_llama, tiny_llama_engine, tmp_path,
                                                  monkeypatch):
    monkeypatch.setenv("DSPINE_CACHE", str(tmp_path / "cache"))
    draft = write_tiny_random_draft(tmp_path / "draft", seed=3)
    kw = dict(draft=draft, progress=False, max_num_seqs=4, spec_policy="auto")
    first = Engine(tiny_llama, **kw)
    files = list((tmp_path / "cache" / "verify_cost").glob("*.json"))
    assert len(files) == 1
    saved = json.loads(files[0].read_text())
    assert sorted(map(int, saved["seconds"])) == [1, 2, 4, 8, 16]
    assert all(sorted(map(int, row)) == [1, 4] for row in saved["seconds"].values())
    stamp = files[0].stat().st_mtime_ns
    Engine(tiny_llama, **kw)  # same shapes: read from the cache
    assert files[0].stat().st_mtime_ns == stamp
    Engine(tiny_llama, reprofile=True, **kw)
    assert files[0].stat().st_mtime_ns != stamp
    params = SamplingParams(max_tokens=20, ignore_eos=True)
    texts = ["Hello there", "def add(a, b):"]
    assert ([r.token_ids for r in first.generate(texts, params)]
            == [r.token_ids for r in tiny_llama_engine.generate(texts, params)])


def test_a_rebuilt_engine_measures_its_rounds_again(tiny_llama, tmp_path, monkeypatch):
    """The profile's key holds the code's fingerprint: after an upgrade or a rebuild the rounds
    are measured again (a faster draft forward must not be planned with its old cost); the old
    build's profile stays beside the new one."""
    monkeypatch.setenv("DSPINE_CACHE", str(tmp_path / "cache"))
    draft = write_tiny_random_draft(tmp_path / "draft", seed=3)
    kw = dict(draft=draft, progress=False, max_num_seqs=2, spec_policy="auto")

    def builds():
        return sorted(json.loads(f.read_text())["identity"]["build"]
                      for f in (tmp_path / "cache" / "verify_cost").glob("*.json"))

    Engine(tiny_llama, **kw)
    assert builds() == [build_fingerprint()]
    Engine(tiny_llama, **kw)  # the same build: the cached profile
    assert builds() == [build_fingerprint()]
    monkeypatch.setattr(engine_module, "build_fingerprint", lambda: "0-rebuilt")
    Engine(tiny_llama, **kw)
    assert builds() == sorted(["0-rebuilt", build_fingerprint()])


def test_a_bad_cost_profile_is_a_clear_error(tiny_llama, tmp_path):
    draft = write_tiny_random_draft(tmp_path / "draft", seed=3)
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"seconds": {"1": {"1": 1.0}}}))
    with pytest.raises(ValueError, match="no usable costs for 2 verified"):
        Engine(tiny_llama, draft=draft, progress=False, spec_policy="auto",
               spec_cost_profile=str(bad))
    with pytest.raises(ValueError, match="cannot read the cost profile"):
        Engine(tiny_llama, draft=draft, progress=False, spec_policy="auto",
               spec_cost_profile=str(tmp_path / "missing.json"))
