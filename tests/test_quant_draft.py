"""The draft beside a quantised CPU target holds its projections, and its heads' lm_head, in Q4_1
blocks and runs them on the quantised kernels (Engine.draft_weight_format): each block is its
fp32 weight within half a quantisation step, and the draft's states stay those of the
fp32-bound draft up to rounding. Output is the target's either way
(tests/test_quant_lossless.py, with the shipped drafter)."""
import pytest
import torch

from dspine_engine import Engine
from dspine_engine.models.dspine import DSpineDraft
from dspine_engine.models.quant_dense import QuantWeight, table_times
from engine_rounds import prepared, running_after_rounds
from random_drafts import write_random_draft


def _projections(bound):
    tables = [bound.fc, bound.transition.hidden_proj]
    for layer in bound.layers:
        tables += [layer.q, layer.kv, layer.o, layer.gate_up, layer.down]
        inj = layer.injection
        tables += [inj.predictor_gate_h, inj.gate_f_inject]
    return tables


def _draft_states(eng, draft):
    runner = eng.runner
    meta, taps, positions, slots = runner._pending_context(runner._n, runner._width)
    return draft(runner.inputs.dev["anchors"][:runner._n].long(), taps, positions, slots,
                 meta, runner.draft_kv.k, runner.draft_kv.v)


def _within_half_a_q4_1_step(table: QuantWeight, weight: torch.Tensor) -> bool:
    blocks = weight.reshape(weight.shape[0], -1, 32)
    low, high = blocks.amin(-1, keepdim=True), blocks.amax(-1, keepdim=True)
    step = (high - low) / 15
    error = (table.dequantize() - weight).view_as(blocks).abs()
    # half a step, plus 15 times the fp16 rounding of the step and the rounding of the minimum
    # (2^-11 relative each)
    bound = step * (0.5 + 15 * 2.0 ** -11) + low.abs() * 2.0 ** -11 + 1e-12
    return bool((error <= bound).all())


def test_the_draft_runs_on_q4_1_blocks_beside_a_quantised_target(tmp_path):
    path = write_random_draft(tmp_path / "draft")
    eng = Engine(None, draft=path, device="cpu", dtype="gguf", progress=False, max_num_seqs=2)
    assert eng.quantized and eng.draft_weight_format == "q4_1"
    bound = eng.draft.bound
    # The engine's draft dropped its fp32 projections after binding: compare with a fresh load.
    fp32 = DSpineDraft.load(path, progress=False)
    assert all(isinstance(t, QuantWeight) and t.format == "q4_1" for t in _projections(bound))
    assert _within_half_a_q4_1_step(bound.layers[0].q,
                                    fp32.layers[0].self_attn.q_proj.weight.detach())
    # The heads read a Q4_1 copy of the target's Q8_0 table (the target keeps its own).
    head, table = bound.lm_head_dense, eng.target.lm_head
    assert head.format == "q4_1" and table.format == "q8_0" and head is not table
    assert _within_half_a_q4_1_step(head, table.dequantize())
    # P and Q in bf16 (half their fp32 bytes), the bf16 rounding of the fp32 products.
    pred = table_times(table, fp32.transition.pred.weight.detach().T)
    assert bound.transition.pred.dtype == torch.bfloat16 == bound.transition.succ.dtype
    assert torch.equal(bound.transition.pred, pred.bfloat16())

    with running_after_rounds(eng, ["def add(a, b):", "Say hello."], rounds=2) as seqs:
        prepared(eng, seqs)
        quantised = _draft_states(eng, eng.draft)
        fp32.bind(eng.target.embed, eng.target.lm_head, eng.target.config,
                  eng.target.lm_head_dense, max_positions=eng.config.max_position)
        exact = _draft_states(eng, fp32)
    assert torch.isfinite(quantised).all()
    cos = torch.nn.functional.cosine_similarity(quantised.flatten(1), exact.flatten(1), dim=-1)
    # Q4_1 rounds 8x coarser than Q8_0 (0.999 there): measured 0.989-0.991 for this draft
    assert float(cos.min()) > 0.98, cos


def test_an_engines_draft_keeps_only_what_inference_reads(tmp_path):
    """After binding, the engine's draft frees its module's projections (bind laid them out
    again: fused, quantised here), keeps the norms, and refuses a second bind; its states are
    those it had before dropping them."""
    path = write_random_draft(tmp_path / "draft")
    eng = Engine(None, draft=path, device="cpu", dtype="gguf", progress=False, max_num_seqs=2)
    draft = eng.draft
    linears = [m for m in draft.modules() if isinstance(m, torch.nn.Linear)]
    assert linears and all(m.weight.numel() == 0 for m in linears)
    assert draft.norm.weight.numel() == draft.config.hidden_size
    with running_after_rounds(eng, ["def add(a, b):", "Say hello."], rounds=2) as seqs:
        prepared(eng, seqs)
        after = _draft_states(eng, draft)
        kept = DSpineDraft.load(path, progress=False)
        kept.bind(eng.target.embed, eng.target.lm_head, eng.target.config,
                  eng.target.lm_head_dense, max_positions=eng.config.max_position,
                  weight_format=eng.draft_weight_format)
        before = _draft_states(eng, kept)
    assert torch.equal(after, before)
    with pytest.raises(RuntimeError, match="dropped after its first bind"):
        draft.bind(eng.target.embed, eng.target.lm_head, eng.target.config,
                   eng.target.lm_head_dense)
