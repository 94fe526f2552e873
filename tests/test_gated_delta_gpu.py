"""CUDA Gated DeltaNet kernels against the PyTorch references (run on CPU copies of the same
inputs), at model-like sizes, plus the bitwise ReplaySSM property on the GPU.
Run: python -m pytest -q -m gpu tests/test_gated_delta_gpu.py
"""
import pytest
import torch

from dspine_engine import ops
from kernel_cases import GDN_INPUTS, conv_case, decode_one_by_one, gdn_args, gdn_case, rel_err

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]

DEV = "cuda"
EMPTY = torch.empty(0)
TOL = {torch.float32: 1e-4, torch.bfloat16: 2e-2, torch.float16: 1e-2}
FLOATS = [torch.float32, torch.bfloat16, torch.float16]

# (sequence lengths, k heads, v heads, k dim, v dim)
SHAPES = [
    ([1, 1, 1, 1], 16, 48, 128, 128),       # Qwen3.8-27B decode
    ([16, 16, 16], 16, 48, 128, 128),       # its verify blocks
    ([16, 9, 1], 2, 6, 24, 40),             # odd dims (a partial column tile, masked rows)
    ([3, 16], 1, 2, 256, 64),               # the largest k dim
    ([1000, 77, 31], 4, 8, 128, 128),       # prefill: many chunks and a tail
    ([65, 33], 2, 2, 256, 96),              # prefill at k dim 256 (the largest shared memory)
]


def _cpu(case):
    return {k: (v.cpu() if torch.is_tensor(v) else v) for k, v in case.items()}


def _run(fn, case, state, ring=None, states_out=EMPTY):
    args = gdn_args(case, *GDN_INPUTS)
    meta = (case["state_slots"], case["cu_q"], case["max_q_len"])
    if fn in (ops.gated_delta_chunk, ops.gated_delta_chunk_ref):
        return fn(*args, state, *meta)
    return fn(*args, state, *meta, *(ring or (EMPTY, EMPTY, EMPTY)), states_out)


def _check_state(got, ref, slots, tol):
    used = slots[slots >= 0].long().cpu()
    assert rel_err(got.cpu()[used], ref[used]) < tol
    other = torch.ones(got.shape[0], dtype=torch.bool)
    other[used] = False
    assert torch.equal(got.cpu()[other], ref[other])


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("shape", range(len(SHAPES)))
def test_recurrent_and_chunk_match_the_reference(shape, dtype):
    lens, hk, hv, dk, dv = SHAPES[shape]
    case = gdn_case(lens, hk, hv, dk, dv, 6, dtype, DEV, seed=50 + shape)
    ref_case = _cpu(case)
    fn = ops.gated_delta_chunk if max(lens) > 16 else ops.gated_delta_recurrent
    ref_fn = ops.gated_delta_chunk_ref if fn is ops.gated_delta_chunk else ops.gated_delta_recurrent_ref
    st = case["state"].clone()
    ref_st = ref_case["state"].clone()
    out = _run(fn, case, st)
    ref = _run(ref_fn, ref_case, ref_st)
    assert out.dtype == dtype and rel_err(out.cpu(), ref) < TOL[dtype]
    assert (out[int(case["cu_q"][-2]):] == 0).all(), "padding rows must be zero"
    _check_state(st, ref_st, case["state_slots"], TOL[dtype])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_verify_block_fills_the_ring_and_keeps_the_checkpoint(dtype):
    lens, blk = [16, 7, 16], 16
    case = gdn_case(lens, 16, 48, 128, 128, 4, dtype, DEV, seed=60, ring_len=blk)
    ref_case = _cpu(case)
    ring = (case["ring_k"], case["ring_u"], case["ring_g"])
    ref_ring = (ref_case["ring_k"], ref_case["ring_u"], ref_case["ring_g"])
    st = case["state"].clone()
    out = _run(ops.gated_delta_recurrent, case, st, ring)
    ref = _run(ops.gated_delta_recurrent_ref, ref_case, ref_case["state"].clone(), ref_ring)
    assert rel_err(out.cpu(), ref) < TOL[dtype]
    assert torch.equal(st, case["state"])
    for b, n in enumerate(lens):
        s = int(case["state_slots"][b])
        if s >= 0:
            for got, want in zip(ring, ref_ring):
                assert rel_err(got[s, :n].cpu(), want[s, :n]) < TOL[dtype]
                assert torch.isnan(got[s, n:]).all()


def test_stored_states_match_the_reference():
    case = gdn_case([16, 5], 2, 4, 64, 64, 3, torch.float32, DEV, seed=61)
    n = 21
    got = torch.full((n, 4, 64, 64), float("nan"), device=DEV)
    want = torch.zeros(n, 4, 64, 64)
    _run(ops.gated_delta_recurrent, case, case["state"].clone(), states_out=got)
    ref_case = _cpu(case)
    _run(ops.gated_delta_recurrent_ref, ref_case, ref_case["state"].clone(), states_out=want)
    assert rel_err(got[:16].cpu(), want[:16]) < 1e-4


@pytest.mark.parametrize("dk", [24, 128, 256])
def test_replay_equals_plain_decode_bitwise(dk):
    blk, lens = 16, [16, 16, 16]
    case = gdn_case(lens, 4, 8, dk, 72, 4, torch.float32, DEV, seed=62, ring_len=blk)
    case["state_slots"] = torch.tensor([3, 0, 2], dtype=torch.int32, device=DEV)
    accepted = torch.tensor([1, 9, 16], dtype=torch.int32, device=DEV)
    ring = (case["ring_k"], case["ring_u"], case["ring_g"])
    verified = case["state"].clone()
    _run(ops.gated_delta_recurrent, case, verified, ring)
    ops.gated_delta_replay(verified, *ring, case["state_slots"], accepted)
    decoded = case["state"].clone()
    decode_one_by_one(case, decoded, accepted, blk,
                      lambda one, st: _run(ops.gated_delta_recurrent, one, st))
    assert torch.equal(verified, decoded)


def test_replay_of_stacked_layers_matches_reference():
    gen = torch.Generator().manual_seed(63)
    lead, slots, r, hk, hv, dk, dv = 3, 5, 16, 2, 6, 128, 40
    state = torch.randn(lead, slots, hv, dk, dv, generator=gen)
    rk = torch.randn(lead, slots, r, hk, dk, generator=gen)
    ru = torch.randn(lead, slots, r, hv, dv, generator=gen)
    rg = -torch.rand(lead, slots, r, hv, generator=gen)
    sl = torch.tensor([4, -1, 1], dtype=torch.int32)
    m = torch.tensor([16, 3, 7], dtype=torch.int32)
    want = state.clone()
    ops.gated_delta_replay_ref(want, rk, ru, rg, sl, m)
    got = state.to(DEV)
    ops.gated_delta_replay(got, rk.to(DEV), ru.to(DEV), rg.to(DEV), sl.to(DEV), m.to(DEV))
    assert rel_err(got.cpu(), want) < 1e-5
    assert torch.equal(got.cpu()[:, [0, 2, 3]], state[:, [0, 2, 3]])


@pytest.mark.parametrize("checkpoint", [False, True])
@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("lens,channels,kernel", [([1, 1, 1], 10240, 4), ([16, 16, 3], 10240, 4),
                                                  ([700, 5], 130, 3), ([2], 9, 2)])
def test_causal_conv1d_matches_reference(lens, channels, kernel, dtype, checkpoint):
    width = kernel - 1 + (max(lens) if checkpoint else 0)
    x, w, state, slots, cu, mq = conv_case(lens, channels, kernel, width, 4, dtype, DEV, seed=64)
    got_state = state.clone()
    ref_state = state.cpu()
    out = ops.causal_conv1d(x, w, got_state, slots, cu, mq, checkpoint)
    ref = ops.causal_conv1d_ref(x.cpu(), w.cpu(), ref_state, slots.cpu(), cu.cpu(), mq, checkpoint)
    assert rel_err(out.cpu(), ref) < TOL[dtype]
    assert torch.equal(got_state.cpu(), ref_state)


def test_conv_state_commit_matches_reference():
    gen = torch.Generator().manual_seed(65)
    state = torch.randn(3, 4, 3 + 16, 10240, generator=gen).to(torch.bfloat16)
    slots = torch.tensor([3, 0, -1], dtype=torch.int32)
    m = torch.tensor([16, 1, 5], dtype=torch.int32)
    want = state.clone()
    ops.conv_state_commit_ref(want, slots, m, 4)
    got = state.to(DEV)
    ops.conv_state_commit(got, slots.to(DEV), m.to(DEV), 4)
    assert torch.equal(got.cpu(), want)


def test_hybrid_target_on_the_gpu_matches_the_cpu(tmp_path, smollm2_dir):
    """A tiny hybrid target in fp32: prefill, a verify block + commit and a decode step agree
    between the CUDA and the CPU kernels."""
    from dspine_engine.models.target import TargetModel
    from hybrid_runs import ModelRun
    from tiny_models import write_tiny_hybrid

    path = write_tiny_hybrid(tmp_path / "m", "qwen3_5", smollm2_dir, seed=2)
    runs = []
    for device in ("cpu", DEV):
        model = TargetModel.load(path, device=device, progress=False)
        runs.append(ModelRun(model, 2, 256, ring_len=8))
    gen = torch.Generator().manual_seed(3)
    prompts = [torch.randint(3, 49152, (n,), generator=gen).tolist() for n in (150, 41)]
    block = torch.randint(3, 49152, (2, 8), generator=gen).tolist()
    outs = []
    for run in runs:
        a, _, _ = run.forward([0, 1], prompts)
        b, _, _ = run.forward([0, 1], block, checkpoint=True)
        run.commit([0, 1], [3, 8])
        c, _, _ = run.forward([0, 1], [[11], [12]])
        outs.append((a, b, c, run.state.ssm))
    for cpu, gpu in zip(*outs):
        assert rel_err(gpu.cpu(), cpu) < 1e-4
