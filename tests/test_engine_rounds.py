"""The harness of the GPU tests (engine_rounds.py) on the CPU, so CI guards what they assume:
many prompts take several prefill steps (each within max_prefill_tokens) and are all running
afterwards; leaving the harness, also by a failure, aborts every request it queued and every
page comes back; a staged round can be run twice and gives the same result when the draft
starts from the same taps (what the GPU test's graph-vs-eager comparison relies on)."""
import numpy as np
import pytest
import torch

from dspine_engine import Engine, SamplingParams
from engine_rounds import pools_whole, prepared, running_after_rounds
from random_drafts import write_tiny_random_draft

PROMPTS = [f"request {i}: " + "word " * (i % 7) for i in range(12)]
BUDGET = 96  # prompt tokens per prefill step: two or three prompts


def _prefill_batches(lens: list[int], budget: int) -> list[int]:
    """How many prompts each prefill step admits (FIFO; a step takes prompts while they fit
    the budget, and always at least one)."""
    sizes, tokens = [], None
    for n in lens:
        if tokens is None or tokens + n > budget:
            sizes.append(0)
            tokens = 0
        sizes[-1] += 1
        tokens += n
    return sizes


@pytest.fixture(scope="module")
def engine(tiny_llama):
    return Engine(tiny_llama, progress=False, max_num_seqs=24, max_prefill_tokens=BUDGET,
                  kv_cache_tokens=16 * 100)


def test_prompts_over_several_prefill_steps_all_run(engine):
    lens = [len(engine.encode_prompt(p)) for p in PROMPTS]
    batches = _prefill_batches(lens, BUDGET)
    assert len(batches) > 3  # the case the GPU tests met: one step does not prefill them all
    ids = [engine.add_request(p, SamplingParams(max_tokens=8)) for p in PROMPTS]
    running = []
    for _ in batches:
        engine.step()
        running.append(len(engine.scheduler.running))
    assert running == np.cumsum(batches).tolist()
    for rid in ids:
        engine.abort(rid)
    engine.step()
    assert pools_whole(engine) and not engine.has_unfinished()
    with running_after_rounds(engine, PROMPTS, rounds=2, max_tokens=8) as seqs:
        assert len(seqs) == len(PROMPTS)
        engine.cache.check_invariants(seqs)
        assert all(len(s.output_ids) == 3 for s in seqs)  # the prefill's token + two rounds
    assert pools_whole(engine) and not engine.has_unfinished()


def test_leaving_the_harness_by_a_failure_aborts_everything(engine):
    """A failing body, or requests that cannot all be admitted (each reserves more than a
    quarter of the pool): the engine is left idle with every page back."""
    with pytest.raises(RuntimeError, match="body failed"):
        with running_after_rounds(engine, PROMPTS, rounds=1, max_tokens=8):
            raise RuntimeError("body failed")
    assert pools_whole(engine) and not engine.has_unfinished()
    with pytest.raises(AssertionError, match="requests still wait"):
        with running_after_rounds(engine, PROMPTS[:8], rounds=1, max_tokens=300):
            pass
    assert pools_whole(engine) and not engine.has_unfinished()


def test_a_staged_round_runs_twice_the_same(tiny_llama, tmp_path):
    draft = write_tiny_random_draft(tmp_path / "draft", seed=4)
    eng = Engine(tiny_llama, draft=draft, progress=False, max_num_seqs=4, page_size=4)
    runner = eng.runner
    with running_after_rounds(eng, PROMPTS[:3], rounds=2, max_tokens=40) as seqs:
        seats = prepared(eng, seqs)
        taps_before = runner._taps.clone()
        runs = []
        for _ in range(2):
            runner._taps.copy_(taps_before)  # the verify replaces them with this round's
            runner.propose()
            inp = runner.inputs
            drafts = [t[:3].clone() for t in (inp.drafts, inp.cand_ids, inp.cand_probs)]
            runs.append(drafts + [runner.verify().clone(), runner._taps[seats].clone()])
        assert not torch.equal(runner._taps, taps_before)
        for first, second in zip(*runs):
            assert torch.equal(first, second)
    assert pools_whole(eng)


@pytest.mark.parametrize("tokens", [2, 5])
def test_a_shorter_verify_drafts_the_whole_blocks_first_drafts(tiny_llama, tmp_path, tokens):
    """With whole draft blocks (draft_block="full"), a round verifying ``tokens`` positions
    runs the draft's heads and walk over its tokens - 1 drafts only (runner.propose): they are
    the first drafts of the whole block's walk, candidates and probabilities included. (The
    CPU's default drafts from the verified positions alone, which changes the proposals:
    tests/test_draft_block.py.)"""
    draft = write_tiny_random_draft(tmp_path / "draft", seed=5)
    eng = Engine(tiny_llama, draft=draft, progress=False, max_num_seqs=4, page_size=4,
                 draft_block="full")
    runner, outputs = eng.runner, lambda: (runner.inputs.drafts, runner.inputs.cand_ids,
                                           runner.inputs.cand_probs)
    with running_after_rounds(eng, PROMPTS[:3], rounds=2, max_tokens=40) as seqs:
        seats = prepared(eng, seqs)
        taps_before = runner._taps.clone()
        runner.propose()
        whole = [t[:3, :tokens - 1].clone() for t in outputs()]
        for t in outputs():
            t.fill_(-7)  # poisoned: the short round must write every draft it verifies
        runner._taps.copy_(taps_before)
        runner.prepare_round(seqs, seats, tokens)
        runner.propose()
        for first, short in zip(whole, outputs()):
            assert torch.equal(first, short[:3, :tokens - 1])
    assert pools_whole(eng)


def test_admission_batch_waits_for_free_seats_and_changes_no_output(tiny_llama):
    """admission_batch=2: a running batch takes new requests only once two seats are free (one
    prefill step for both), and every request's tokens are those of admission at once."""
    lengths = [2, 4, 9, 9, 3, 3]

    def run(admission_batch):
        eng = Engine(tiny_llama, progress=False, max_num_seqs=4, admission_batch=admission_batch)
        ids = [eng.add_request(f"prompt {i}", SamplingParams(max_tokens=n, ignore_eos=True,
                                                             temperature=1.0, seed=i))
               for i, n in enumerate(lengths)]
        tokens, running = {rid: [] for rid in ids}, []
        while eng.has_unfinished():
            for out in eng.step():
                tokens[out.request_id] += out.new_token_ids
            running.append(len(eng.scheduler.running))
        return [tokens[rid] for rid in ids], running

    at_once, running_1 = run(1)
    batched, running_2 = run(2)
    assert batched == at_once and [len(t) for t in batched] == lengths
    # Running after each step. Request 0 ends in the first decode step (its second token): at
    # once, the next step refills its seat; batched, the seat stays empty until request 1 ends
    # too, then both waiting requests join in one prefill step.
    assert running_1[:3] == [4, 3, 4]
    assert running_2[:5] == [4, 3, 3, 2, 4]
