"""CPU Gated DeltaNet kernels (conv1d, gated delta rule, ReplaySSM replay) against the PyTorch
references on fresh random inputs, and the rollback property: a verify block + replay of an
accepted prefix leaves exactly the state a plain decode of those tokens leaves (fp32, bitwise).
"""
import pytest
import torch

from dspine_engine import ops
from kernel_cases import (GDN_INPUTS, conv_case, cu_seqlens, decode_one_by_one, gdn_args, gdn_case,
                          rel_err)

DEV = "cpu"
EMPTY = torch.empty(0)

# (sequence lengths, k heads, v heads, k dim, v dim)
GDN_SHAPES = [
    ([1, 1, 1], 2, 4, 32, 32),          # decode, GQA 2
    ([16, 16, 16], 1, 3, 24, 40),       # verify blocks, GQA 3, odd dims
    ([5, 1, 9], 2, 2, 16, 8),           # varlen, no grouping
    ([130, 64, 7], 2, 6, 32, 16),       # prefill: several chunks, a chunk boundary, a short tail
]


def _recurrent(case, state, fn=ops.gated_delta_recurrent, ring=(EMPTY, EMPTY, EMPTY),
               states_out=EMPTY):
    return fn(*gdn_args(case, *GDN_INPUTS), state, case["state_slots"], case["cu_q"],
              case["max_q_len"], *ring, states_out)


def _chunk(case, state, fn=ops.gated_delta_chunk):
    return fn(*gdn_args(case, *GDN_INPUTS), state, case["state_slots"], case["cu_q"],
              case["max_q_len"])


def _assert_state(got, ref, slots, tol):
    """Slots of real sequences match the reference; every other slot is bitwise untouched."""
    used = slots[slots >= 0].long()
    assert rel_err(got[used], ref[used]) < tol
    other = torch.ones(got.shape[0], dtype=torch.bool)
    other[used] = False
    assert torch.equal(got[other], ref[other])


@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-5), (torch.bfloat16, 2e-2)])
@pytest.mark.parametrize("shape", range(len(GDN_SHAPES) - 1))  # the prefill shape: chunk test
def test_gated_delta_recurrent_in_place(shape, dtype, tol):
    lens, hk, hv, dk, dv = GDN_SHAPES[shape]
    case = gdn_case(lens, hk, hv, dk, dv, 5, dtype, DEV, seed=10 + shape)
    st, st_ref = case["state"].clone(), case["state"].clone()
    out = _recurrent(case, st)
    ref = _recurrent(case, st_ref, ops.gated_delta_recurrent_ref)
    assert out.dtype == dtype and rel_err(out, ref) < tol
    assert (out[int(case["cu_q"][-2]):] == 0).all(), "padding rows must be zero"
    _assert_state(st, st_ref, case["state_slots"], tol)


@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-5), (torch.bfloat16, 2e-2)])
def test_gated_delta_recurrent_ring_keeps_the_checkpoint(dtype, tol):
    lens, hk, hv, dk, dv = [16, 11, 16], 2, 4, 32, 24
    case = gdn_case(lens, hk, hv, dk, dv, 4, dtype, DEV, seed=3, ring_len=16)
    ring = (case["ring_k"], case["ring_u"], case["ring_g"])
    ring_ref = tuple(r.clone() for r in ring)
    st = case["state"].clone()
    out = _recurrent(case, st, ring=ring)
    ref = _recurrent(case, st.clone(), ops.gated_delta_recurrent_ref, ring=ring_ref)
    assert rel_err(out, ref) < tol
    assert torch.equal(st, case["state"]), "a verify block must leave the checkpoint"
    for b, n in enumerate(lens):
        s = int(case["state_slots"][b])
        if s < 0:
            continue
        for got, want in zip(ring, ring_ref):
            assert rel_err(got[s, :n], want[s, :n]) < tol
            assert torch.isnan(got[s, n:]).all(), "ring rows past the block must not be written"


def test_gated_delta_recurrent_stores_every_state():
    lens = [7, 16]
    case = gdn_case(lens, 1, 2, 16, 16, 3, torch.float32, DEV, seed=4)
    n = sum(lens)
    got = torch.full((n, 2, 16, 16), float("nan"))
    want = torch.zeros_like(got)
    st = case["state"].clone()
    _recurrent(case, st, states_out=got)
    _recurrent(case, case["state"].clone(), ops.gated_delta_recurrent_ref, states_out=want)
    assert rel_err(got[:lens[0]], want[:lens[0]]) < 1e-5
    last = int(case["cu_q"][1]) - 1
    slot = int(case["state_slots"][0])
    assert torch.equal(got[last], st[slot]), "the last stored state is the final state"


@pytest.mark.parametrize("dtype,tol", [(torch.float32, 2e-5), (torch.bfloat16, 2e-2)])
@pytest.mark.parametrize("shape", range(len(GDN_SHAPES)))
def test_gated_delta_chunk(shape, dtype, tol):
    lens, hk, hv, dk, dv = GDN_SHAPES[shape]
    case = gdn_case(lens, hk, hv, dk, dv, 5, dtype, DEV, seed=20 + shape)
    st, st_ref, st_rec = (case["state"].clone() for _ in range(3))
    out = _chunk(case, st)
    ref = _chunk(case, st_ref, ops.gated_delta_chunk_ref)
    assert rel_err(out, ref) < tol
    _assert_state(st, st_ref, case["state_slots"], tol)
    # The chunked algebra computes the same thing as the token-by-token definition.
    rec = _recurrent(case, st_rec, ops.gated_delta_recurrent_ref)
    assert rel_err(out, rec) < tol
    _assert_state(st, st_rec, case["state_slots"], tol)


@pytest.mark.parametrize("seed", range(4))
def test_replay_equals_plain_decode_exactly(seed):
    """ReplaySSM rollback: verify a block of B tokens from the checkpoint, accept a random
    prefix (0..B-1 drafts + the anchor), replay it; the state is bitwise the state a plain
    one-token-at-a-time decode of the same tokens leaves."""
    blk, lens = 16, [16, 16, 16, 16]
    case = gdn_case(lens, 2, 6, 32, 16, 6, torch.float32, DEV, seed=30 + seed, ring_len=blk)
    case["state_slots"] = torch.tensor([4, 1, 5, 2], dtype=torch.int32)
    gen = torch.Generator().manual_seed(seed)
    accepted = torch.randint(0, blk, (len(lens),), generator=gen, dtype=torch.int32) + 1
    accepted[0] = 1  # only the anchor
    ring = (case["ring_k"], case["ring_u"], case["ring_g"])
    verified = case["state"].clone()
    _recurrent(case, verified, ring=ring)
    ops.gated_delta_replay(verified, *ring, case["state_slots"], accepted)

    decoded = case["state"].clone()
    decode_one_by_one(case, decoded, accepted, blk, _recurrent)
    assert torch.equal(verified, decoded)


def test_replay_of_stacked_layers_matches_reference():
    lead, slots, r, hk, hv, dk, dv = 3, 4, 8, 1, 2, 8, 16
    gen = torch.Generator().manual_seed(5)
    state = torch.randn(lead, slots, hv, dk, dv, generator=gen)
    rk = torch.randn(lead, slots, r, hk, dk, generator=gen)
    ru = torch.randn(lead, slots, r, hv, dv, generator=gen)
    rg = -torch.rand(lead, slots, r, hv, generator=gen)
    sl = torch.tensor([2, -1, 0], dtype=torch.int32)
    m = torch.tensor([8, 3, 0], dtype=torch.int32)
    got, want = state.clone(), state.clone()
    ops.gated_delta_replay(got, rk, ru, rg, sl, m)
    ops.gated_delta_replay_ref(want, rk, ru, rg, sl, m)
    assert rel_err(got, want) < 1e-6
    for untouched in (0, 1, 3):  # slot 0 replays nothing, slots 1 and 3 are not named
        assert torch.equal(got[:, untouched], state[:, untouched])


CONV_SHAPES = [
    # (lens, channels, kernel, width)
    ([1, 1, 1], 40, 4, 3),        # decode
    ([16, 16, 5], 70, 4, 19),     # verify blocks (window + ring rows)
    ([33, 2, 1], 130, 3, 2),      # prefill, odd channels, short sequences
    ([9], 8, 2, 1),               # kernel 2
]


@pytest.mark.parametrize("checkpoint", [False, True])
@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-6), (torch.bfloat16, 1e-2)])
@pytest.mark.parametrize("shape", range(len(CONV_SHAPES)))
def test_causal_conv1d(shape, dtype, tol, checkpoint):
    lens, channels, kernel, width = CONV_SHAPES[shape]
    if checkpoint and max(lens) > width - kernel + 1:
        width = max(lens) + kernel - 1
    x, w, state, slots, cu, mq = conv_case(lens, channels, kernel, width, 5, dtype, DEV,
                                           seed=40 + shape)
    got_state, ref_state = state.clone(), state.clone()
    out = ops.causal_conv1d(x, w, got_state, slots, cu, mq, checkpoint)
    ref = ops.causal_conv1d_ref(x, w, ref_state, slots, cu, mq, checkpoint)
    assert out.dtype == dtype and rel_err(out, ref) < tol
    assert torch.equal(got_state, ref_state)  # the state only ever holds copied inputs
    if checkpoint:
        used = slots[slots >= 0].long()
        assert torch.equal(got_state[used, :kernel - 1], state[used, :kernel - 1])


def test_conv_state_commit_matches_reference():
    gen = torch.Generator().manual_seed(6)
    state = torch.randn(2, 4, 3 + 16, 12, generator=gen)  # [layers, slots, K-1+B, C]
    slots = torch.tensor([3, 0, -1], dtype=torch.int32)
    m = torch.tensor([16, 1, 5], dtype=torch.int32)
    got, want = state.clone(), state.clone()
    ops.conv_state_commit(got, slots, m, 4)
    ops.conv_state_commit_ref(want, slots, m, 4)
    assert torch.equal(got, want)
    assert torch.equal(got[:, 3, :3], state[:, 3, 16:19])


def test_verify_then_commit_equals_decoding_the_accepted_tokens():
    """The conv side of the rollback: window after (verify block, commit m) == window after
    feeding the m tokens through plain decode."""
    k, blk, c = 4, 16, 24
    x, w, state, slots, cu, _ = conv_case([blk, blk], c, k, k - 1 + blk, 3, torch.float32, DEV,
                                          seed=7)
    slots = torch.tensor([2, 0], dtype=torch.int32)
    m = torch.tensor([5, 16], dtype=torch.int32)
    verified = state.clone()
    ops.causal_conv1d(x, w, verified, slots, cu, blk, True)
    ops.conv_state_commit(verified, slots, m, k)
    decoded = state.clone()
    for b in range(2):
        rows = x[b * blk:b * blk + int(m[b])]
        ops.causal_conv1d(rows, w, decoded, slots[b:b + 1], cu_seqlens([rows.shape[0]]),
                          rows.shape[0], False)
    used = slots.long()
    assert torch.equal(verified[used, :k - 1], decoded[used, :k - 1])


def test_bad_inputs_are_refused():
    case = gdn_case([4, 4], 1, 2, 8, 8, 2, torch.float32, DEV, seed=8)
    args = dict(case)
    bad_slot = case["state_slots"].clone()
    bad_slot[0] = 7
    with pytest.raises(RuntimeError, match="outside the state"):
        _recurrent({**args, "state_slots": bad_slot}, case["state"].clone())
    with pytest.raises(RuntimeError, match="fp32"):
        _recurrent(args, case["state"].double())
    with pytest.raises(RuntimeError, match="multiple of key heads"):
        _chunk({**args, "q": torch.randn(8, 3, 8), "k": torch.randn(8, 3, 8)},
               case["state"].clone())
    with pytest.raises(RuntimeError, match="max_q_len"):
        _chunk({**args, "max_q_len": 3}, case["state"].clone())
    ring = tuple(torch.zeros(2, 2, *s) for s in ((1, 8), (2, 8), (2,)))
    with pytest.raises(RuntimeError, match="ring length"):
        _recurrent(args, case["state"].clone(), ring=ring)
    x, w, st, sl, cu, mq = conv_case([3], 8, 4, 3, 1, torch.float32, DEV, seed=9)
    with pytest.raises(RuntimeError, match="rows after the window"):
        ops.causal_conv1d(x, w, st, sl, cu, mq, True)
    with pytest.raises(RuntimeError, match="kernel size"):
        ops.causal_conv1d(x, w[:, :1].contiguous(), st, sl, cu, mq, False)
    with pytest.raises(RuntimeError, match="num_accepted"):
        ops.conv_state_commit(st, sl, torch.tensor([1], dtype=torch.int32), 4)


def test_schemas_and_fake_kernels_pass_opcheck():
    """Mutation annotations, fake (meta) kernels and torch.compile tracing of every op."""
    case = gdn_case([3, 2], 1, 2, 8, 8, 3, torch.float32, DEV, seed=11, ring_len=4)
    meta = (case["state_slots"], case["cu_q"], case["max_q_len"])
    inputs = tuple(t.contiguous() if t.dim() > 1 else t for t in gdn_args(case, *GDN_INPUTS))
    ring = (case["ring_k"].zero_(), case["ring_u"].zero_(), case["ring_g"].zero_())
    m = torch.tensor([2, 1], dtype=torch.int32)
    x, w, cs, sl, cu, mq = conv_case([3, 2], 8, 4, 3 + 4, 3, torch.float32, DEV, seed=12)
    calls = [
        (torch.ops.dspine.gated_delta_recurrent, (*inputs, case["state"].clone(), *meta, *ring,
                                                  EMPTY)),
        (torch.ops.dspine.gated_delta_chunk, (*inputs, case["state"].clone(), *meta)),
        (torch.ops.dspine.gated_delta_replay, (case["state"].clone(), *ring, meta[0], m)),
        (torch.ops.dspine.causal_conv1d, (x.contiguous(), w, cs, sl, cu, mq, True)),
        (torch.ops.dspine.conv_state_commit, (cs, sl, m, 4)),
    ]
    for op, args in calls:
        torch.library.opcheck(op, args, test_utils=("test_schema", "test_faketensor"))
