"""Hybrid targets (Qwen3.5 / Qwen3-Next, Gated DeltaNet + gated attention) against transformers
on tiny randomly initialised models written with save_pretrained (fp32, CPU).

Tolerance: prefill logits and the hidden states of every layer agree to max |diff| <= 1e-4 *
max |ref| (measured ~5e-7: summation order in the chunked delta rule, GEMMs and attention), and
64 greedy tokens equal transformers.generate's token for token.
"""
import pytest
import torch

from dspine_engine.models.target import TargetModel
from hybrid_runs import ModelRun, greedy
from tiny_models import write_tiny_hybrid

pytest.importorskip("transformers.models.qwen3_5")

LINEAR, FULL = "linear_attention", "full_attention"
CASES = {
    # Qwen3.5 default pattern (3 linear : 1 full), GQA 4/2, partial RoPE 1/4, 2 v-heads per k-head.
    "qwen3_5-interval4": ("qwen3_5", dict()),
    # Attention first, uneven pattern, MQA, half-rotary, no head grouping, conv kernel 3, tied.
    "qwen3_5-mixed": ("qwen3_5", dict(
        num_hidden_layers=5, layer_types=[FULL, LINEAR, FULL, LINEAR, LINEAR],
        num_key_value_heads=1, linear_num_key_heads=2, linear_num_value_heads=2,
        linear_conv_kernel_dim=3, rope_parameters={"rope_type": "default", "rope_theta": 1e6,
                                                   "partial_rotary_factor": 0.5},
        tie_word_embeddings=True)),
    # Qwen3-Next's fused per-group projections, 3 v-heads per k-head, full rotary, odd dims.
    "qwen3_next-ratio3": ("qwen3_next", dict(
        layer_types=[LINEAR, FULL, LINEAR, FULL], head_dim=16, linear_num_key_heads=2,
        linear_num_value_heads=6, linear_key_head_dim=24, linear_value_head_dim=8,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0,
                         "partial_rotary_factor": 1.0})),
    # The text model inside a Qwen3.5 vision-language checkpoint (the shape of Qwen3.8-27B).
    "qwen3_5_vl-text": ("qwen3_5_vl", dict(num_hidden_layers=2, layer_types=[LINEAR, FULL])),
}


def _close(ours, ref, rel=1e-4):
    assert torch.isfinite(ours).all()
    err = (ours.float() - ref.float()).abs().max().item()
    assert err <= rel * ref.abs().max().item(), f"max |diff| {err}"


@pytest.fixture(scope="module", params=sorted(CASES))
def hybrid_pair(request, tmp_path_factory, smollm2_dir):
    from transformers import AutoModelForCausalLM, AutoModelForImageTextToText

    flavour, overrides = CASES[request.param]
    path = write_tiny_hybrid(tmp_path_factory.mktemp(request.param), flavour, smollm2_dir,
                             seed=5, **overrides)
    auto = AutoModelForImageTextToText if flavour == "qwen3_5_vl" else AutoModelForCausalLM
    hf = auto.from_pretrained(path, dtype=torch.float32).eval()
    return TargetModel.load(path, progress=False), hf


def _prompts(n_tokens=(37, 90)):
    gen = torch.Generator().manual_seed(0)
    return [torch.randint(3, 49152, (n,), generator=gen).tolist() for n in n_tokens]


def test_prefill_logits_and_hidden_states_match(hybrid_pair):
    ours, hf = hybrid_pair
    layers = tuple(range(ours.config.num_layers))
    prompts = _prompts()
    run = ModelRun(ours, len(prompts), 128)
    logits, taps, cu = run.forward([0, 1], prompts, tap_layers=layers)
    h = ours.config.hidden_size
    for i, ids in enumerate(prompts):
        with torch.no_grad():
            ref = hf(torch.tensor([ids]), output_hidden_states=True)
        rows = slice(cu[i], cu[i + 1])
        _close(logits[rows], ref.logits[0])
        for layer in layers[:-1]:  # HF's last entry is after the final norm
            _close(taps[rows, layer * h:(layer + 1) * h], ref.hidden_states[layer + 1][0])


def test_64_greedy_tokens_equal_transformers_generate(hybrid_pair):
    ours, hf = hybrid_pair
    prompts = _prompts((21, 50))
    got = greedy(ours, prompts, 64)
    for ids, tokens in zip(prompts, got):
        with torch.no_grad():
            ref = hf.generate(torch.tensor([ids]), max_new_tokens=64, do_sample=False,
                              eos_token_id=None, pad_token_id=0)
        assert tokens == ref[0, len(ids):].tolist()


def test_rollback_state_after_replay_equals_plain_decode(hybrid_pair):
    """A verify block from the round's checkpoint, then commit of m = accepted drafts + anchor
    (random in 1..B), leaves the state a plain decode of those m tokens leaves. Across the model
    the verify's B-row GEMMs sum in another order than the decode's 1-row GEMMs, so equality is
    to fp32 rounding here (the ops themselves are bitwise: test_gated_delta_cpu.py)."""
    ours, _ = hybrid_pair
    blk, prompts = 8, _prompts((19, 33, 26))
    seqs = [0, 1, 2]
    spec = ModelRun(ours, 3, 64, ring_len=blk)
    plain = ModelRun(ours, 3, 64)
    spec.forward(seqs, prompts)
    plain.forward(seqs, prompts)
    gen = torch.Generator().manual_seed(1)
    for _ in range(3):  # rounds
        blocks = torch.randint(3, 49152, (3, blk), generator=gen).tolist()
        accepted = (torch.randint(0, blk, (3,), generator=gen) + 1).tolist()
        spec.forward(seqs, blocks, checkpoint=True)
        spec.commit(seqs, accepted)
        for t in range(blk):
            live = [b for b in seqs if t < accepted[b]]
            if live:
                plain.forward(live, [[blocks[b][t]] for b in live])
        assert spec.lens == plain.lens
        k = ours.config.conv_kernel
        _close(spec.state.conv[:, :, :k - 1], plain.state.conv, rel=1e-5)
        _close(spec.state.ssm, plain.state.ssm, rel=1e-5)
    # And the next step's logits agree: nothing of the rejected drafts leaked.
    nxt = [[5], [6], [7]]
    a, _, _ = spec.forward(seqs, nxt)
    b, _, _ = plain.forward(seqs, nxt)
    _close(a, b, rel=1e-5)
