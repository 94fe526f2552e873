"""The engine on a GPU (bf16): CUDA-graph replay equals the eager forwards, a round's drafts
survive the verify replay, and greedy speculative decoding equals greedy autoregressive
decoding on real prompts.

What holds in bf16 (docs/DECISIONS.md): speculative and autoregressive decoding run the target
on different shapes (a 16-token verify vs 1-token decode), so their logits differ by bf16
rounding; the two greedy outputs are equal unless the target's top two logits at some step are
closer than that rounding. Since the decode-attention key split (38f289f) a decode row and a
verify row also sum their keys in different orders, so the default engine's test allows a
difference only at a near-tie (engine_rounds.assert_greedy_lossless); with the row-exact
attention knobs the outputs must be equal token for token. A kernel or bookkeeping bug breaks
either within a few tokens.
"""
import os

import pytest
import torch

from dspine_engine import Engine, SamplingParams
from dspine_engine.datasets import humaneval_prompts, mtbench_prompts
from engine_rounds import (GPU_KV_TOKENS, assert_greedy_lossless, pools_whole, prepared,
                           running_after_rounds)
from random_drafts import write_random_draft

pytestmark = pytest.mark.gpu

NEW_TOKENS = 128


@pytest.fixture(scope="module")
def real_prompts():
    return humaneval_prompts()[:10] + mtbench_prompts()[:10]


@pytest.fixture(scope="module")
def draft_dir(tmp_path_factory):
    return write_random_draft(tmp_path_factory.mktemp("gpu_draft") / "dspine")


@pytest.fixture(scope="module")
def spec_engine(smollm2_dir, draft_dir):
    return Engine(smollm2_dir, draft=draft_dir, device="cuda", max_num_seqs=32, progress=False,
                  kv_cache_tokens=GPU_KV_TOKENS)


@pytest.fixture(scope="module")
def one_split_engine(smollm2_dir, draft_dir):
    """Graphs captured with one key split: the split heuristic sizes splits from the block
    table's width, which graphs set to the longest context and eager runs to the batch's, so
    only with a fixed split count are graph and eager runs the same arithmetic (the split path
    itself is tested against the reference in test_kernels_gpu.py)."""
    old = os.environ.get("DSPINE_ATTN_SPLITS")
    os.environ["DSPINE_ATTN_SPLITS"] = "1"
    try:
        return Engine(smollm2_dir, draft=draft_dir, device="cuda", max_num_seqs=32,
                      progress=False, kv_cache_tokens=GPU_KV_TOKENS)
    finally:
        if old is None:
            del os.environ["DSPINE_ATTN_SPLITS"]
        else:
            os.environ["DSPINE_ATTN_SPLITS"] = old


@pytest.fixture(scope="module")
def ar_engine(smollm2_dir):
    """Autoregressive, graphs up to batch 512 (the training-data generator's shape)."""
    old = os.environ.get("DSPINE_ATTN_SPLITS")
    os.environ["DSPINE_ATTN_SPLITS"] = "1"
    try:
        return Engine(smollm2_dir, device="cuda", max_num_seqs=512, progress=False,
                      kv_cache_tokens=2 * GPU_KV_TOKENS)
    finally:
        if old is None:
            del os.environ["DSPINE_ATTN_SPLITS"]
        else:
            os.environ["DSPINE_ATTN_SPLITS"] = old


def _draft_outputs(runner, b):
    inp = runner.inputs
    return [t[:b].clone() for t in (inp.drafts, inp.cand_ids, inp.cand_probs)]


@pytest.mark.parametrize("batch", [1, 3, 8, 17, 32])
def test_graph_replay_matches_eager(one_split_engine, real_prompts, batch, monkeypatch):
    """From the same prepared tensors (padded to the next graph size), the captured draft and
    verify forwards give what the eager forwards give."""
    monkeypatch.setenv("DSPINE_ATTN_SPLITS", "1")
    eng, runner = one_split_engine, one_split_engine.runner
    assert runner.graphs is not None and runner.graphs.fits(batch)
    with running_after_rounds(eng, (real_prompts * 2)[:batch], rounds=2) as seqs:
        assert len(seqs) == batch
        seats = prepared(eng, seqs)
        # The draft reads the previous round's taps, which the verify then replaces with this
        # round's: the eager pass must start from the taps the graph pass started from.
        taps_before = runner._taps.clone()
        graphs = runner.graphs
        runner.propose()
        got = _draft_outputs(runner, batch)
        logits_g = runner.verify().clone()
        taps_g = runner._taps[seats].clone()
        runner.graphs = None  # the eager bodies, on the very same staged inputs
        try:
            runner._taps.copy_(taps_before)
            runner.propose()
            want = _draft_outputs(runner, batch)
            runner.inputs.drafts[:batch].copy_(got[0])  # verify the same drafts
            logits_e = runner.verify()
            taps_e = runner._taps[seats]
        finally:
            runner.graphs = graphs
        assert torch.isfinite(logits_g).all() and torch.isfinite(got[2]).all()
        # The same draft tokens (bf16 GEMMs of a padded batch may flip a near-tie rarely).
        agree = (got[0] == want[0]).float().mean().item()
        assert agree >= 0.97, f"graph and eager drafts agree on only {agree:.1%}"
        same = got[1] == want[1]
        torch.testing.assert_close(got[2][same], want[2][same], atol=2e-2, rtol=0)
        torch.testing.assert_close(logits_g.float(), logits_e.float(), atol=0.15, rtol=0.02)
        torch.testing.assert_close(taps_g.float(), taps_e.float(), atol=0.15, rtol=0.02)
    assert pools_whole(eng)


@pytest.mark.parametrize("batch", [300, 512])
def test_autoregressive_graphs_up_to_512(ar_engine, real_prompts, batch, monkeypatch):
    """The autoregressive path captures graphs up to batch 512; a replay equals the eager
    forward on the same staged inputs, and greedy tokens agree."""
    monkeypatch.setenv("DSPINE_ATTN_SPLITS", "1")
    eng, runner = ar_engine, ar_engine.runner
    assert runner.graphs is not None and runner.graphs.sizes[-1] == 512
    with running_after_rounds(eng, (real_prompts * 26)[:batch], rounds=3) as seqs:
        assert len(seqs) == batch
        prepared(eng, seqs)
        graphs = runner.graphs
        logits_g = runner.verify().clone()
        runner.graphs = None
        try:
            logits_e = runner.verify()
        finally:
            runner.graphs = graphs
        assert torch.isfinite(logits_g).all()
        torch.testing.assert_close(logits_g.float(), logits_e.float(), atol=0.15, rtol=0.02)
        agree = (logits_g.argmax(-1) == logits_e.argmax(-1)).float().mean().item()
        assert agree >= 0.97
    assert pools_whole(eng)


def test_autoregressive_batch_512_completes(ar_engine, real_prompts):
    """512 requests, token ids only (the data generator): all complete, pools come back."""
    assert not ar_engine.has_unfinished(), "an earlier test left requests in the engine"
    params = SamplingParams(max_tokens=32, ignore_eos=True, detokenize=False)
    res = ar_engine.generate((real_prompts * 26)[:512], params)
    assert all(r.finish_reason == "length" and len(r.token_ids) == 32 for r in res)
    assert pools_whole(ar_engine)


@pytest.mark.parametrize("batch", [1, 8, 32])
def test_drafts_survive_the_verify_replay(spec_engine, real_prompts, batch):
    """A round reads its drafts (and candidates) after the verify replay; all graphs share one
    memory pool, so the draft outputs must not live where the verify graph writes."""
    eng, runner = spec_engine, spec_engine.runner
    with running_after_rounds(eng, (real_prompts * 2)[:batch], rounds=1) as seqs:
        prepared(eng, seqs)
        runner.propose()
        kept = _draft_outputs(runner, batch)
        runner.verify()
        for now, before in zip(_draft_outputs(runner, batch), kept):
            assert torch.equal(now, before)


def test_greedy_lossless_on_gpu(spec_engine, smollm2_dir, real_prompts):
    """The default engine's attention is row-exact (attention="exact"): a verify row is
    bitwise the decoded row (benchmarks/gpu_row_exactness.py, H200; cuBLAS's GEMMs are
    row-exact at these shapes already), so greedy speculative output equals autoregressive
    output token for token, batched and alone, no tie allowed."""
    params = SamplingParams(max_tokens=NEW_TOKENS, ignore_eos=True)
    assert spec_engine.target.exact_attention
    assert_greedy_lossless(
        spec_engine, lambda: Engine(smollm2_dir, device="cuda", max_num_seqs=32, progress=False,
                                    kv_cache_tokens=GPU_KV_TOKENS),
        real_prompts, params, one_by_one=8)
    assert pools_whole(spec_engine)


# attention="fast", with the knobs that make it row-exact again, or none (ties allowed then).
FAST_ATTENTION_KNOBS = {"fast": {},
                        "fast_row_tiles_one_split": {"DSPINE_ATTN_KEY_SPLIT": "0",
                                                     "DSPINE_ATTN_SPLITS": "1"},
                        "fast_env_exact": {"DSPINE_ATTN_EXACT": "1"},
                        "fast_env_exact_key_split": {"DSPINE_ATTN_EXACT": "2"}}


@pytest.mark.parametrize("knobs", FAST_ATTENTION_KNOBS.values(), ids=FAST_ATTENTION_KNOBS.keys())
def test_greedy_lossless_with_fast_attention(smollm2_dir, draft_dir, real_prompts, knobs,
                                             monkeypatch):
    """attention="fast" splits keys by shape, so a verify row and the decoded row may differ in
    their last bits: outputs may part only at near-ties (what holds in bf16, DECISIONS.md). Two
    ways back to token-identical outputs: the diagnostic knobs (decode on the row tiles, one key
    split) and DSPINE_ATTN_EXACT=1 or 2 (the exact mode, either form, for every call of the
    process)."""
    for name, value in knobs.items():
        monkeypatch.setenv(name, value)
    params = SamplingParams(max_tokens=NEW_TOKENS, ignore_eos=True)
    engine = Engine(smollm2_dir, draft=draft_dir, device="cuda", max_num_seqs=32, progress=False,
                    kv_cache_tokens=GPU_KV_TOKENS, attention="fast")
    assert not engine.target.exact_attention
    assert_greedy_lossless(
        engine, lambda: Engine(smollm2_dir, device="cuda", max_num_seqs=32, progress=False,
                               kv_cache_tokens=GPU_KV_TOKENS, attention="fast"),
        real_prompts, params, one_by_one=8, near_tie_model=None if knobs else smollm2_dir)
    assert pools_whole(engine)


def test_padding_round_at_an_uncaptured_width_runs_eagerly(smollm2_dir, draft_dir):
    """A fixed-policy engine captures the full-block verify only; a padding round at another
    width (benchmarks/round_profile.py times every width) runs eagerly instead of failing on
    the missing graph, and the full block still replays its graph."""
    eng = Engine(smollm2_dir, draft=draft_dir, device="cuda", max_num_seqs=4, progress=False,
                 kv_cache_tokens=GPU_KV_TOKENS, spec_policy="fixed")
    runner = eng.runner
    assert runner.graphs.has("verify") and not runner.graphs.has("verify2")
    for width, graphed in ((1, False), (2, False), (runner.block, True)):
        runner.padding_round(1, width)
        torch.cuda.synchronize()
        assert runner._use_graph is graphed, width


def test_overlapped_rounds_change_no_output_on_gpu(smollm2_dir, real_prompts):
    """Overlapped rounds (the default on CUDA: a round launched before the host reads the last
    one back, the seats' state kept on the device) against rounds in step, with the shipped
    drafter (multi-token accepts), answers of different lengths and stop tokens, so requests
    end mid-batch and their extra round is dropped: the same tokens and finish reasons (the
    exact attention: a row's arithmetic does not depend on the batch around it) and every
    page back."""
    prompts = real_prompts[::2]
    plain = Engine(smollm2_dir, draft="default", device="cuda", max_num_seqs=8, progress=False,
                   kv_cache_tokens=GPU_KV_TOKENS, overlap="off")
    free = plain.generate(prompts, SamplingParams(max_tokens=NEW_TOKENS, ignore_eos=True))
    params = [SamplingParams(max_tokens=40 + 9 * i, ignore_eos=True,
                             stop_token_ids=[r.token_ids[30]] if i % 3 == 1 else [])
              for i, r in enumerate(free)]
    expected = [(r.token_ids, r.finish_reason) for r in plain.generate(prompts, params)]
    del plain
    eng = Engine(smollm2_dir, draft="default", device="cuda", max_num_seqs=8, progress=False,
                 kv_cache_tokens=GPU_KV_TOKENS)
    assert eng.overlap
    got = [(r.token_ids, r.finish_reason) for r in eng.generate(prompts, params)]
    assert got == expected
    assert sum(reason == "stop" for _, reason in got) >= 2
    assert eng.stats.tau > 1.5
    assert pools_whole(eng) and not eng.has_unfinished()
