"""Helpers of the tests that stage an engine round by hand or compare an engine with plain
decoding (test_engine_gpu.py, test_spec_policy_gpu.py, and
test_engine_rounds.py, which checks the same harness on the CPU in CI)."""
from __future__ import annotations

import contextlib
import warnings

from dspine_engine import SamplingParams

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
    candidate tokens tie within bf16 rounding, i.e. at its first differing position both are
    within NEAR_TIE_LOGITS of the best fp32 logit of the target (transformers, an implementation
    independent of ours). A verifier that accepted a wrong token fails it: the draft's token is
    then far below the best."""
    ar = ar_engine_factory()
    reference = [r.token_ids for r in ar.generate(prompts, params)]
    del ar
    batched = [r.token_ids for r in engine.generate(prompts, params)]
    alone = [engine.generate(p, params)[0].token_ids for p in prompts[:one_by_one]]
    for name, got, ref in (("batched", batched, reference), ("alone", alone, reference[:one_by_one])):
        if near_tie_model is None or got == ref:
            assert got == ref, name
            continue
        gaps = divergence_gaps(engine, near_tie_model, prompts, got, ref)
        report = f"{name}: {len(gaps)} of {len(ref)} prompts differ; (prompt, position, gaps) = {gaps}"
        warnings.warn(report)  # the measured margins, in the summary also when the test passes
        assert all(max(g) <= NEAR_TIE_LOGITS for _, _, g in gaps), report
    return reference


# Two fp32 logits this close are a tie for a bf16 forward: the default model's bf16 logits
# differ from fp32 by ~0.1-0.3 (30 layers of bf16 rounding), so a 16-token verify and a
# one-token decode can order them either way. A wrong accepted token is typically several
# logits below the best.
NEAR_TIE_LOGITS = 0.5


def first_difference(a: list[int], b: list[int]) -> int | None:
    """The first position where two token lists differ (the shorter one's end counts), or None."""
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def divergence_gaps(engine, model_dir, prompts, got, ref):
    """For each output that differs from its reference: (prompt index, first differing position,
    (best - logit of the reference's token, best - logit of the other token)) under the target's
    fp32 logits after the prompt and the common prefix."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32).eval()
    gaps = []
    for i, (g, r) in enumerate(zip(got, ref)):
        pos = first_difference(g, r)
        if pos is None or pos >= min(len(g), len(r)):
            if pos is not None:
                gaps.append((i, pos, (float("inf"), float("inf"))))  # a length difference: no tie
            continue
        ids = engine.encode_prompt(prompts[i]) + r[:pos]
        with torch.no_grad():
            logits = model(torch.tensor([ids])).logits[0, -1]
        best = logits.max().item()
        gaps.append((i, pos, (round(best - logits[r[pos]].item(), 4), round(best - logits[g[pos]].item(), 4))))
    return gaps
