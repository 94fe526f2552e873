"""Helpers of the tests that stage an engine round by hand or compare an engine with plain
decoding (test_engine_gpu.py, test_spec_policy_gpu.py, and
test_engine_rounds.py, which checks the same harness on the CPU in CI)."""
from __future__ import annotations

import contextlib
import warnings

from dspine_engine import SamplingParams
from dspine_engine.lossless import all_near_ties, tie_gaps

# GPU tests run side by side (pytest -n) and beside other GPU jobs (the data generators): an
# engine left to size its KV pool from the free memory (half of it) starves the next one, so
# each GPU test engine is given its pool (3 GiB of the default model's KV).
GPU_KV_TOKENS = 1 << 17


@contextlib.contextmanager
def running_after_rounds(engine, prompts, rounds: int, max_tokens: int = 96):
    """Queues the prompts, steps until every one is prefilled (a prefill step takes at most
    max_prefill_tokens prompt tokens, so many prompts need several steps), runs ``rounds``
    rounds and yields the running sequences. On exit every request it queued is aborted, also
    when the body failed, so a shared engine is idle again for the next test."""
    params = SamplingParams(max_tokens=max_tokens, ignore_eos=True)
    ids = [engine.add_request(p, params) for p in prompts]
    try:
        for _ in range(len(ids)):  # each prefill step admits at least one request
            if not engine.scheduler.waiting:
                break
            engine.step()
        assert not engine.scheduler.waiting, "requests still wait for admission"
        for _ in range(rounds):
            engine.step()
        engine._driver.settle()  # overlapped rounds: the host's state is the device's again
        yield list(engine.scheduler.running)
    finally:
        for rid in ids:
            engine.abort(rid)
        engine.step()  # hands out the aborted requests' final outputs


def prepared(engine, seqs):
    """Stages one round (pages from the scheduler, inputs into the runner's buffers); returns
    the seats."""
    seats = engine.scheduler.prepare_round(seqs)
    engine.runner.prepare_round(seqs, seats)
    return seats


def pools_whole(engine) -> bool:
    """Every page of every KV pool is free and unpromised (nothing leaked)."""
    return all(c.pool.available == c.pool.free_pages == c.pool.num_pages
               for c in engine.cache.caches)


def assert_greedy_lossless(engine, ar_engine_factory, prompts, params, one_by_one: int,
                           near_tie_model=None):
    """``engine``'s greedy outputs equal a plain engine's (made by ``ar_engine_factory`` and
    freed before ``engine`` runs), batched and for the first ``one_by_one`` prompts alone; every
    page comes back.

    ``near_tie_model`` (GPU runs: the target's directory) states what holds in bf16 (DECISIONS,
    "What lossless means on a GPU"): an output may leave the reference only where the two
    candidate tokens tie within bf16 rounding (dspine_engine.lossless: both within
    NEAR_TIE_LOGITS of the target's best fp32 logit). A verifier that accepted a wrong token
    fails it: the draft's token is then far below the best."""
    ar = ar_engine_factory()
    reference = [r.token_ids for r in ar.generate(prompts, params)]
    del ar
    batched = [r.token_ids for r in engine.generate(prompts, params)]
    alone = [engine.generate(p, params)[0].token_ids for p in prompts[:one_by_one]]
    for name, got, ref in (("batched", batched, reference), ("alone", alone, reference[:one_by_one])):
        if near_tie_model is None or got == ref:
            assert got == ref, name
            continue
        prompt_ids = [engine.encode_prompt(p) for p in prompts[:len(ref)]]
        gaps = tie_gaps(near_tie_model, prompt_ids, ref, got)
        report = f"{name}: {len(gaps)} of {len(ref)} outputs differ; first differences {gaps}"
        warnings.warn(report)  # the measured margins, in the summary also when the test passes
        assert all_near_ties(gaps), report
    return reference
