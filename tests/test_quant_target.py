"""Targets that run on their GGUF blocks (the default on the CPU): loading, choice, quality.

Quality tolerance: the quantised forward (int8 activations per block of 32 against the file's
Q4_1/Q8_0 weights) against the fp32 forward of the same dequantised weights; on SmolLM2 the
last-position logits must differ by at most 8% of the largest |logit|, and the top-1 token must
agree on every probe prompt.
"""
import gguf
import numpy as np
import pytest
import torch

from dspine_engine import Engine, SamplingParams
from dspine_engine.models import gguf as gg
from dspine_engine.models.gguf_header import read_gguf_header
from dspine_engine.models.gguf_target import load_gguf_target
from dspine_engine.models.quant_dense import QuantWeight
from test_gguf import write_tiny_gguf
from test_target_parity import PROMPTS, _last_logits


@pytest.fixture(scope="module")
def tiny_gguf(tmp_path_factory):
    path = tmp_path_factory.mktemp("quant") / "tiny.gguf"
    write_tiny_gguf(path)
    return path


def test_header_reader_agrees_with_gguf_reader(tiny_gguf):
    meta, tensors = read_gguf_header(tiny_gguf)
    reader = gguf.GGUFReader(tiny_gguf)
    full = gg.read_metadata(reader)
    for key, value in full.items():
        if not isinstance(value, list):
            assert meta[key] == pytest.approx(value) if isinstance(value, float) \
                else meta[key] == value
    assert set(tensors) == {t.name for t in reader.tensors}
    for t in reader.tensors:
        ours = tensors[t.name]
        assert (ours.data_offset, ours.n_bytes, ours.tensor_type) == \
            (t.data_offset, t.n_bytes, t.tensor_type)
        assert ours.shape.tolist() == t.shape.tolist()


@pytest.mark.parametrize("keep", [0.5, 0.999])
def test_header_reader_refuses_truncated_files(tiny_gguf, tmp_path, keep):
    data = tiny_gguf.read_bytes()
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(data[: int(len(data) * keep)])
    with pytest.raises(ValueError, match="truncated"):
        read_gguf_header(cut)
    (tmp_path / "junk.gguf").write_bytes(b"not a gguf file at all, really" * 4)
    with pytest.raises(ValueError, match="not a readable GGUF"):
        read_gguf_header(tmp_path / "junk.gguf")


def test_tiny_gguf_quantised_matches_fp32(tiny_gguf, tmp_path):
    """Mixed tensor types (Q8_0, Q4_1, and F16/BF16/F32/Q4_0 requantised to Q8_0) load, and the
    quantised engine follows the fp32 engine of the converted file."""
    quant = Engine(tiny_gguf, progress=False)
    fp32 = Engine(tiny_gguf, dtype="float32", progress=False)
    assert quant.quantized and not fp32.quantized
    layer = quant.target.layers[0]
    assert isinstance(layer.qkv, QuantWeight) and layer.qkv.format == "q8_0"  # mixed q|k|v
    assert layer.o.format == "q4_1" and quant.target.embed.format == "q8_0"
    ids = [5, 17, 33, 40, 41, 60, 7, 9]
    ours, ref = _last_logits(quant, ids), _last_logits(fp32, ids)
    assert torch.isfinite(ours).all()
    assert (ours - ref).abs().max() <= 0.1 * ref.abs().max()


def test_quantised_default_model_logits(smollm2_quant_engine, smollm2_engine):
    eng = smollm2_quant_engine
    assert eng.quantized and eng.target.quantized
    assert eng.target.layers[0].gate_up.format == "q4_1"
    assert eng.target.lm_head is eng.target.embed and eng.target.embed.format == "q8_0"
    for prompt in PROMPTS:
        ids = eng.tokenizer.encode_chat([{"role": "user", "content": prompt}])
        ours, ref = _last_logits(eng, ids), _last_logits(smollm2_engine, ids)
        assert torch.isfinite(ours).all()
        assert (ours - ref).abs().max() <= 0.08 * ref.abs().max()
        assert int(ours.argmax()) == int(ref.argmax())


def _without_one_op(target):
    """A context in which `target` runs its decoder loop op by op (ops.target_layers unused)."""
    import contextlib

    @contextlib.contextmanager
    def scope():
        saved, target.layer_tables = target.layer_tables, None
        try:
            yield
        finally:
            target.layer_tables = saved
    return scope()


def test_one_op_layers_are_the_loop_bitwise(smollm2_quant_engine, tiny_gguf):
    """The decoder layers of a quantised CPU target run as one op (ops.target_layers): a
    prompt's logits must be bitwise the op-by-op loop's, on the default model and on the tiny
    model of mixed formats (Q8_0 q|k|v beside Q4_1 layers)."""
    tiny = Engine(tiny_gguf, progress=False)
    for eng, ids in ((smollm2_quant_engine, smollm2_quant_engine.tokenizer.encode_chat(
            [{"role": "user", "content": PROMPTS[0]}])), (tiny, [5, 17, 33, 40, 41, 60, 7, 9])):
        assert eng.target.layer_tables is not None, "the quantised CPU target should use the op"
        one_op = _last_logits(eng, ids)
        with _without_one_op(eng.target):
            loop = _last_logits(eng, ids)
        assert torch.equal(one_op, loop)


def test_one_op_layers_feed_the_draft_the_loops_taps(quant_prompts):
    """Speculative decoding on the GGUF blocks with the one-op layers: the answers and the
    drafter's acceptance (which reads the target's tapped layers) are exactly those of the
    op-by-op loop, batched and alone."""
    eng = Engine(None, draft="default", dtype="gguf", spec_policy="fixed", progress=False,
                 max_num_seqs=4)
    params = SamplingParams(max_tokens=24, ignore_eos=True)
    runs = []
    for one_op in (True, False):
        eng.reset_stats()
        if one_op:
            outs = [r.token_ids for r in eng.generate(quant_prompts, params)]
        else:
            with _without_one_op(eng.target):
                outs = [r.token_ids for r in eng.generate(quant_prompts, params)]
        runs.append((outs, list(eng.stats.accepted_by_position)))
    assert runs[0] == runs[1]
    assert sum(runs[0][1]) > 0  # the drafter was used and accepted something


def test_weights_are_not_copied_to_fp32(smollm2_quant_engine):
    target = smollm2_quant_engine.target
    matrices = [w for layer in target.layers for w in (layer.qkv, layer.o, layer.gate_up,
                                                       layer.down)] + [target.embed]
    assert all(isinstance(w, QuantWeight) and w.data.dtype == torch.uint8 for w in matrices)
    total = sum(w.data.numel() for w in matrices)
    assert total < 100e6  # the GGUF file is 98.4 MB; fp32 would be 540 MB


def test_choosing_the_path(smollm2_dir, tiny_gguf):
    assert not Engine(smollm2_dir, progress=False).quantized  # a directory holds float weights
    with pytest.raises(ValueError, match="needs a .gguf target"):
        Engine(smollm2_dir, dtype="gguf", progress=False)
    assert Engine(tiny_gguf, dtype="gguf", progress=False).quantized
    assert not Engine(tiny_gguf, dtype="bfloat16", progress=False).quantized


def test_quantised_generation_is_deterministic(smollm2_quant_engine):
    msgs = [[{"role": "user", "content": p}] for p in PROMPTS[:2]]
    params = SamplingParams(max_tokens=24, ignore_eos=True)
    first = [r.token_ids for r in smollm2_quant_engine.generate(msgs, params)]
    again = [smollm2_quant_engine.generate([m], params)[0].token_ids for m in msgs]
    assert first == again
    text = smollm2_quant_engine.generate(msgs[:1], SamplingParams(max_tokens=24))[0].text
    assert len(text.split()) >= 3


def test_pack_fallback_covers_all_rows(tiny_gguf):
    """Vocabulary sizes that are not a multiple of the 16-row tile are padded, not cut."""
    target = load_gguf_target(tiny_gguf, progress=False)
    rows = target.embed.rows
    assert rows % 16 != 0
    _, tensors = read_gguf_header(tiny_gguf)
    t = tensors["token_embd.weight"]
    raw = np.fromfile(tiny_gguf, dtype=np.uint8, count=t.n_bytes, offset=t.data_offset)
    expected = gguf.quants.dequantize(raw.reshape(rows, -1), t.tensor_type)
    assert torch.equal(target.embed.dequantize(), torch.from_numpy(expected.astype(np.float32)))
