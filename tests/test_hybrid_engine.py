"""Hybrid targets through the engine (CPU, fp32): autoregressive decoding equals transformers,
greedy speculative decoding equals autoregressive decoding with random DSpine and DFlash drafts
(batch 1, batched, requests of mixed lengths joining and leaving), the ReplaySSM rollback leaves
the state of the committed tokens for every accept length, the recurrent-state slots come back,
bad requests are refused, and the trainer's capture reads the hybrid target's taps.
"""
import numpy as np
import pytest
import torch

from dspine_engine import Engine, SamplingParams
from dspine_engine.engine.kv_cache import KVCacheFullError
from dspine_engine.engine.recurrent_cache import RecurrentCache
from engine_rounds import GPU_KV_TOKENS
from hybrid_runs import ModelRun
from random_drafts import write_tiny_random_draft
from tiny_models import write_tiny_hybrid

pytest.importorskip("transformers.models.qwen3_5")

PROMPTS = [
    "Write a Python function that checks whether a number is prime.",
    "What are the three primary colors?",
    "Explain why the sky is blue.",
    "Translate 'good morning' into French, Spanish and German, then explain the grammar.",
]
MAX_TOKENS = (32, 12, 24, 18)


@pytest.fixture(scope="module")
def tiny_hybrid(tmp_path_factory, smollm2_dir):
    return write_tiny_hybrid(tmp_path_factory.mktemp("tiny_hybrid"), "qwen3_5", smollm2_dir,
                             seed=7)


@pytest.fixture(scope="module")
def ar_engine(tiny_hybrid):
    return Engine(tiny_hybrid, progress=False, max_num_seqs=8)


@pytest.fixture(scope="module")
def ar_reference(ar_engine):
    params = [SamplingParams(max_tokens=n, ignore_eos=True) for n in MAX_TOKENS]
    return [r.token_ids for r in ar_engine.generate(PROMPTS, params)], params


def _spec_engine(path, tmp_path, kind="dspine", seed=3, **kw):
    extra = {} if kind == "dspine" else dict(injection=False, transition=False)
    draft = write_tiny_random_draft(tmp_path / kind, seed=seed, **extra)
    return Engine(path, draft=draft, progress=False, **kw)


def _all_back(eng):
    assert eng.recurrent.available == eng.recurrent.num_slots
    assert eng.target_kv.pool.available == eng.target_kv.pool.num_pages


def test_autoregressive_engine_equals_transformers_generate(tiny_hybrid, ar_engine):
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(tiny_hybrid, dtype=torch.float32).eval()
    ids = [ar_engine.encode_prompt(p) for p in PROMPTS[:2]]
    ours = ar_engine.generate(ids, SamplingParams(max_tokens=40, ignore_eos=True))
    for prompt, res in zip(ids, ours):
        with torch.no_grad():
            ref = hf.generate(torch.tensor([prompt]), max_new_tokens=40, do_sample=False,
                              eos_token_id=None, pad_token_id=0)
        assert res.token_ids == ref[0, len(prompt):].tolist()
    _all_back(ar_engine)


@pytest.mark.parametrize("kind", ["dspine", "dflash"])
def test_greedy_speculative_equals_autoregressive(kind, tmp_path, tiny_hybrid, ar_reference):
    reference, params = ar_reference
    eng = _spec_engine(tiny_hybrid, tmp_path, kind, max_num_seqs=8)
    assert eng.block > 1 and eng.recurrent.speculative
    batched = eng.generate(PROMPTS, params)
    assert [r.token_ids for r in batched] == reference
    assert all(r.stats.drafted_rounds > 0 for r in batched)
    one_by_one = [eng.generate(p, q)[0].token_ids for p, q in zip(PROMPTS[:2], params[:2])]
    assert one_by_one == reference[:2]
    _all_back(eng)


def _oracle_drafts(engine, reference: dict) -> list[int]:
    """Makes the draft propose the target's own greedy continuation, right for the first
    `right` tokens and wrong after them, with `right` cycling through 0..B-1 in a scrambled
    order, so the rollback replays prefixes of every length (a random draft is almost never
    accepted). Returns the lengths proposed."""
    runner, blk = engine.runner, engine.block
    vocab = engine.target.config.vocab_size
    real_propose, lengths = runner.propose, []

    def propose():
        real_propose()  # the draft's context bookkeeping (and graph replay) stays the real one
        by_seat = {s.seat: s for s in engine.scheduler.running}
        for i, seat in enumerate(runner.inputs.host["seats"][:runner._b]):
            s = by_seat[int(seat)]
            ref, done = reference[s.request_id], len(s.output_ids)
            right = (7 * len(lengths)) % blk  # 7 is prime to B = 16: every length
            row = (ref[done:done + blk - 1] + [0] * blk)[:blk - 1]
            for j in range(right, blk - 1):
                row[j] = (row[j] + 1 + j) % vocab
            runner.inputs.drafts[i] = torch.tensor(row, device=engine.device)
            lengths.append(right)

    runner.propose = propose
    return lengths


def _committed_state(engine, seq):
    """The recurrent state a plain (non-speculative) prefill of the sequence's committed tokens
    leaves: every position before the anchor."""
    tokens = (seq.prompt_ids + seq.output_ids)[:-1]
    run = ModelRun(engine.target, 1, len(tokens) + 1)
    run.forward([0], [tokens])
    return run.state


def _close(ours, ref, rel=1e-4):
    err = (ours - ref).abs().max().item()
    assert err <= rel * ref.abs().max().item(), f"max |diff| {err}"


ORACLE_TOKENS = 40  # 4 x 40 tokens: enough rounds for the 16 accept lengths


def _check_rollback_through_the_engine(eng, ar, rel):
    """Oracle drafts on ``eng``; after every step each running sequence's state equals that
    of a plain prefill of its committed tokens, and the outputs equal ``ar``'s."""
    params = SamplingParams(max_tokens=ORACLE_TOKENS, ignore_eos=True)
    reference = [r.token_ids for r in ar.generate(PROMPTS, params)]
    rids = [f"r{i}" for i in range(len(PROMPTS))]
    proposed = _oracle_drafts(eng, dict(zip(rids, reference)))
    for rid, prompt in zip(rids, PROMPTS):
        eng.add_request(prompt, params, request_id=rid)
    tokens = {rid: [] for rid in rids}
    state, kernel = eng.recurrent.state, eng.target.config.conv_kernel
    while eng.has_unfinished():
        for out in eng.step():
            tokens[out.request_id].extend(out.new_token_ids)
        for s in eng.scheduler.running:
            want, slot = _committed_state(eng, s), eng.recurrent.slot(s.seat)
            _close(state.ssm[:, slot], want.ssm[:, 0], rel)
            _close(state.conv[:, slot, :kernel - 1], want.conv[:, 0], rel)
    assert [tokens[r] for r in rids] == reference
    assert set(proposed) == set(range(eng.block)), "every accept length must occur"
    assert eng.stats.accepted_drafts > 2 * eng.stats.rounds


def test_rollback_of_every_accept_length_leaves_the_committed_state(tmp_path, tiny_hybrid,
                                                                    ar_engine):
    """Through the engine's path (verify from the checkpoint, block verify, the cache manager's
    commit): after every round each sequence's state equals that of a plain prefill of its
    committed tokens (to fp32 rounding: chunked vs token-by-token sums), and the outputs stay
    exact."""
    eng = _spec_engine(tiny_hybrid, tmp_path, seed=5, max_num_seqs=8)
    _check_rollback_through_the_engine(eng, ar_engine, rel=1e-4)


def test_requests_join_and_leave_between_rounds(tmp_path, tiny_hybrid, ar_reference):
    """Step API with two seats for four requests: each joins the running ones mid-generation
    as a slot frees up, they finish at different times; every output is exact."""
    reference, params = ar_reference
    eng = _spec_engine(tiny_hybrid, tmp_path, seed=4, max_num_seqs=2)
    assert eng.recurrent.num_slots == 2
    rids, tokens = {}, {}
    pending = list(range(len(PROMPTS)))
    while pending or eng.has_unfinished():
        if pending:  # one more request joins before every step; extras wait for a slot
            i = pending.pop(0)
            rids[eng.add_request(PROMPTS[i], params[i])] = i
        for out in eng.step():
            tokens.setdefault(out.request_id, []).extend(out.new_token_ids)
        assert eng.recurrent.available + len(eng.scheduler.running) == 2
        eng.cache.check_invariants(eng.scheduler.running)  # every running seat has its slot
    assert [tokens[r] for r in sorted(rids, key=rids.get)] == reference
    _all_back(eng)


def test_admission_waits_for_a_free_state_slot(tiny_hybrid, ar_engine):
    """Fewer state slots than seats (a GPU whose memory holds fewer states): the cache manager
    admits no more sequences than slots, and a released slot is zeroed for the next one."""
    from dspine_engine.engine.sequence import Sequence

    cache = ar_engine.cache
    small = RecurrentCache(ar_engine.target, 1, cache.max_seats, block=1)
    real, cache.recurrent = cache.recurrent, small
    try:
        seqs = [Sequence(f"s{i}", "", [5, 6, 7], SamplingParams(max_tokens=4), None, set())
                for i in range(2)]
        assert cache.admit(seqs[0])
        assert not cache.admit(seqs[1]), "no slot left: the request must wait"
        small.state.ssm.fill_(1.0)
        cache.release(seqs[0])
        assert cache.admit(seqs[1]) and small.slot(seqs[1].seat) == 0
        assert not small.state.ssm.any(), "a slot is zeroed when it is handed out"
        cache.release(seqs[1])
    finally:
        cache.recurrent = real
    with pytest.raises(ValueError, match="at least one slot"):
        RecurrentCache(ar_engine.target, 0, cache.max_seats, block=1)


def test_aborted_request_returns_its_slot(tiny_hybrid):
    eng = Engine(tiny_hybrid, progress=False, max_num_seqs=1)
    rid = eng.add_request(PROMPTS[0], SamplingParams(max_tokens=30))
    eng.step()
    assert eng.recurrent.available == 0
    eng.abort(rid)
    assert eng.recurrent.available == 1
    out = eng.generate(PROMPTS[1], SamplingParams(max_tokens=5, ignore_eos=True))[0]
    assert len(out.token_ids) == 5


def test_a_request_that_can_never_fit_is_refused_and_loses_nothing(tmp_path, tiny_hybrid,
                                                                   ar_reference):
    """The K/V of a hybrid target's attention layers is admitted like any target's: a request
    beyond the pool is refused at once with the numbers, and the others run exactly."""
    reference, params = ar_reference
    eng = _spec_engine(tiny_hybrid, tmp_path, seed=3, max_num_seqs=4, kv_cache_tokens=256)
    assert len(eng.target_kv.k) == eng.target.config.num_kv_layers  # attention layers only
    rid = eng.add_request(PROMPTS[1], params[1])
    with pytest.raises(KVCacheFullError, match="target KV pages"):
        eng.add_request(PROMPTS[0], SamplingParams(max_tokens=400))
    tokens = []
    while eng.has_unfinished():
        tokens += [t for o in eng.step() if o.request_id == rid for t in o.new_token_ids]
    assert tokens == reference[1]
    _all_back(eng)


def test_trainer_capture_reads_the_hybrid_targets_taps(tiny_hybrid):
    from dspine_engine.models.target import TargetModel
    from dspine_engine.train.capture import TargetCapture

    target = TargetModel.load(tiny_hybrid, progress=False)
    taps = (0, 2)
    gen = torch.Generator().manual_seed(2)
    seqs = [torch.randint(3, 49152, (n,), generator=gen) for n in (30, 12)]
    padded = torch.zeros(2, 30, dtype=torch.long)
    for i, s in enumerate(seqs):
        padded[i, :len(s)] = s
    got = TargetCapture(target, list(taps), max_tokens=64)(padded, [30, 12])
    run = ModelRun(target, 2, 64)
    _, want, cu = run.forward([0, 1], [s.tolist() for s in seqs], tap_layers=taps)
    assert torch.allclose(got[0, :30], want[cu[0]:cu[1]], atol=1e-5)
    assert torch.allclose(got[1, :12], want[cu[1]:cu[2]], atol=1e-5)
    assert (got[1, 12:] == 0).all()
    assert np.isfinite(got.numpy()).all()


# ------------------------------------------------------------------------------------- GPU
# fp32 on CUDA: the verify (B-row GEMMs) and a decode (1-row GEMMs) round differently, but on
# this tiny model the greedy outputs agree; a bookkeeping or rollback bug breaks them within a
# few tokens.

@pytest.fixture(scope="module")
def gpu_ar_engine(tiny_hybrid):
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    return Engine(tiny_hybrid, device="cuda", dtype="float32", progress=False, max_num_seqs=8,
                  kv_cache_tokens=GPU_KV_TOKENS)


@pytest.mark.gpu
@pytest.mark.parametrize("graphs", [True, False])
def test_gpu_greedy_speculative_equals_autoregressive(graphs, tmp_path, tiny_hybrid,
                                                      gpu_ar_engine):
    params = [SamplingParams(max_tokens=n, ignore_eos=True) for n in MAX_TOKENS]
    reference = [r.token_ids for r in gpu_ar_engine.generate(PROMPTS, params)]
    eng = _spec_engine(tiny_hybrid, tmp_path, device="cuda", dtype="float32", max_num_seqs=8,
                       cuda_graphs=graphs, kv_cache_tokens=GPU_KV_TOKENS)
    assert (eng.runner.graphs is not None) == graphs
    assert [r.token_ids for r in eng.generate(PROMPTS, params)] == reference
    assert eng.generate(PROMPTS[2], params[2])[0].token_ids == reference[2]
    _all_back(eng)


@pytest.mark.gpu
def test_gpu_rollback_of_every_accept_length_leaves_the_committed_state(tmp_path, tiny_hybrid,
                                                                        gpu_ar_engine):
    """As the CPU test, with the engine's CUDA graphs replaying the draft and the verify."""
    eng = _spec_engine(tiny_hybrid, tmp_path, seed=5, device="cuda", dtype="float32",
                       max_num_seqs=8, kv_cache_tokens=GPU_KV_TOKENS)
    assert eng.runner.graphs is not None
    _check_rollback_through_the_engine(eng, gpu_ar_engine, rel=1e-3)
