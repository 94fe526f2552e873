"""Draft forwards over the verified drafts only (EngineConfig.draft_block): on the CPU a round
verifying w tokens drafts from a w-token block and from the pending context rows alone.

The block's attention is bidirectional, so a shorter block changes the proposals a little; the
output must stay the target's (greedy: token-identical to autoregressive decoding, batch 1 and
batched, with the shipped drafter on real prompts). The context rows left out are padding: the
draft's states do not change when they are dropped.
"""
import pytest
import torch

from dspine_engine import Engine
from dspine_engine.engine.config import EngineConfig
from engine_rounds import prepared, running_after_rounds
from test_spec_policy_lossless import write_linear_profile


def _engine(draft_block: str, **kw) -> Engine:
    return Engine(None, draft="default", device="cpu", dtype="gguf", progress=False,
                  draft_block=draft_block, **kw)


def _block_lengths(eng) -> list[int]:
    """Records the block length of every draft forward of ``eng`` from now on."""
    seen, inner = [], eng.draft.forward

    def recording(anchors, ctx_taps, ctx_positions, ctx_slots, meta, *rest):
        seen.append(meta.max_q_len)
        return inner(anchors, ctx_taps, ctx_positions, ctx_slots, meta, *rest)

    eng.draft.forward = recording
    return seen


@pytest.mark.parametrize("draft_block,blocks", [("verified", {4}), ("full", {16})])
def test_greedy_lossless_with_either_draft_block(draft_block, blocks, quant_prompts,
                                                 quant_params, quant_reference):
    eng = _engine(draft_block, spec_policy="fixed", num_speculative_tokens=3, max_num_seqs=4)
    lengths = _block_lengths(eng)
    assert [r.token_ids for r in eng.generate(quant_prompts, quant_params)] == quant_reference
    one_by_one = [eng.generate(p, quant_params)[0].token_ids for p in quant_prompts[1:3]]
    assert one_by_one == quant_reference[1:3]
    assert set(lengths) == blocks
    assert eng.stats.tau > 1.2, f"the drafter is barely accepted (tau {eng.stats.tau:.2f})"


def test_auto_policy_lossless_with_verified_blocks(quant_prompts, quant_params,
                                                   quant_reference, tmp_path):
    """Under the auto policy (a profile that mixes plain rounds and 2- and 4-token blocks in
    one batch) each drafted round drafts from a block of its own width."""
    profile = write_linear_profile(tmp_path / "p.json", 0.2)
    eng = _engine("auto", spec_policy="auto", max_num_seqs=4, spec_cost_profile=str(profile))
    assert eng.runner.verified_draft_blocks
    lengths = _block_lengths(eng)
    assert [r.token_ids for r in eng.generate(quant_prompts, quant_params)] == quant_reference
    drafted = {k + 1 for k in eng.stats.verify_lengths if k > 0}
    assert len(drafted) >= 2 and set(lengths) == drafted, (lengths, eng.stats.verify_lengths)


def test_dropped_context_rows_leave_the_draft_states_unchanged():
    """The pending context rows alone give the draft the states a whole block of context rows
    (the rest padding, slot -1) gives it: bitwise, on the quantised kernels (rows independent)."""
    eng = _engine("verified", max_num_seqs=2)
    runner = eng.runner
    with running_after_rounds(eng, ["def add(a, b):", "Say hello."], rounds=2) as seqs:
        prepared(eng, seqs)
        rows = runner._pending_rows()
        assert 1 <= rows < runner.block
        states = []
        for r in (rows, None):
            meta, taps, positions, slots = runner._pending_context(runner._n, runner._width,
                                                                   tokens=4, rows=r)
            states.append(eng.draft(runner.inputs.dev["anchors"][:runner._n].long(), taps,
                                    positions, slots, meta, runner.draft_kv.k,
                                    runner.draft_kv.v))
    assert states[0].shape == (2, 3, eng.draft.config.hidden_size)
    assert torch.equal(states[0], states[1])


def test_draft_block_setting():
    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    assert EngineConfig().draft_block == "auto"
    assert EngineConfig().verified_draft_blocks(cpu, graphs=False)
    assert not EngineConfig().verified_draft_blocks(cuda, graphs=True)
    full = EngineConfig.from_kwargs(None, draft_block="full")
    assert not full.verified_draft_blocks(cpu, graphs=False)
    verified = EngineConfig.from_kwargs(None, draft_block="verified")
    assert verified.verified_draft_blocks(cuda, graphs=False)
    with pytest.raises(ValueError, match="cuda_graphs=False"):
        verified.verified_draft_blocks(cuda, graphs=True)
    with pytest.raises(ValueError, match="draft_block must be one of"):
        EngineConfig.from_kwargs(None, draft_block="short")
