"""EngineConfig, the one layer of input validation, and the context limits: every bad value is a
clear ValueError before anything runs (each case below used to hang, divide by zero, be silently
replaced, raise a raw TypeError/OverflowError, or read past the RoPE table)."""
import json
import shutil

import numpy as np
import pytest
import torch

from dspine_engine import Engine, EngineConfig, SamplingParams
from dspine_engine.engine.kv_cache import KVCache, resolve_kv_dtype
from dspine_engine.engine.sampling import MIN_TEMPERATURE
from dspine_engine.models.config import ModelConfigError
from dspine_engine.train.data import prompt_ids
from random_drafts import write_tiny_random_draft


@pytest.mark.parametrize("bad,match", [
    (dict(max_num_seqs=0), "max_num_seqs"), (dict(max_num_seqs=-2), "max_num_seqs"),
    (dict(max_num_seqs="4"), "max_num_seqs"), (dict(max_num_seqs=True), "max_num_seqs"),
    (dict(page_size=0), "page_size"), (dict(page_size=2.5), "page_size"),
    (dict(kv_cache_tokens=0), "kv_cache_tokens"), (dict(kv_cache_tokens=-16), "kv_cache_tokens"),
    (dict(kv_cache_tokens=8, page_size=16), "less than one page"),
    (dict(max_model_len=0), "max_model_len"), (dict(max_prefill_tokens=0), "max_prefill"),
    (dict(cuda_graphs="yes"), "cuda_graphs"), (dict(admission_batch=0), "admission_batch"),
    (dict(tensor_parallel_size=0), "tensor_parallel_size must be a positive integer, got 0"),
    (dict(tensor_parallel_size=1.5), "tensor_parallel_size"),
    (dict(cpu_threads=0), "cpu_threads must be a positive integer or None, got 0"),
    (dict(cpu_threads=2.0), "cpu_threads"), (dict(cpu_threads=True), "cpu_threads"),
    (dict(cpu_threads=5000), "cpu_threads must be at most 4096"),
    (dict(attention="exactly"), "attention must be one of exact, fast, got 'exactly'"),
    (dict(attention=True), "attention must be one of"),
    (dict(kv_cache_dtype="fp16"),
     "kv_cache_dtype must be one of auto, float16, bfloat16, float32, got 'fp16'"),
    (dict(kv_cache_dtype=torch.float16), "kv_cache_dtype must be one of"),
])
def test_bad_settings_are_refused_before_loading(tmp_path, bad, match):
    with pytest.raises(ValueError, match=match):
        Engine(tmp_path / "no-model-here", progress=False, **bad)  # fails before any loading
    with pytest.raises(ValueError, match=match):
        EngineConfig(**bad).validate()
    with pytest.raises(ValueError, match="unknown engine setting"):
        EngineConfig.from_kwargs(None, max_num_seq=4)


@pytest.mark.parametrize("value,match", [("0", "a positive integer"), ("-1", "a positive integer"),
                                         ("two", "a positive integer"),
                                         ("1.5", "a positive integer"), ("5000", "at most 4096")])
def test_bad_cpu_threads_env_is_refused_before_loading(tmp_path, monkeypatch, value, match):
    monkeypatch.setenv("DSPINE_CPU_THREADS", value)
    with pytest.raises(ValueError, match=f"DSPINE_CPU_THREADS must be {match}"):
        Engine(tmp_path / "no-model-here", progress=False)
    EngineConfig(cpu_threads=2).validate()  # a given setting does not read the variable


def test_config_object_and_keywords(tiny_llama):
    cfg = EngineConfig(max_num_seqs=3, page_size=8, kv_cache_tokens=512)
    eng = Engine(tiny_llama, progress=False, config=cfg, page_size=32)  # keyword wins
    assert (eng.config.max_num_seqs, eng.config.page_size) == (3, 32)
    assert cfg.page_size == 8  # the caller's config is not modified
    assert eng.target_kv.page_size == 32 and eng.target_kv.pool.num_pages == 16
    assert eng.max_model_len == 512 and eng.block == 1
    with pytest.raises(ValueError, match="exceeds the target's context"):
        Engine(tiny_llama, progress=False, max_model_len=513)
    with pytest.raises(ValueError, match="max_num_seqs"):
        eng.max_num_seqs = 4  # above the configured limit
    eng.max_num_seqs = 1
    assert eng.generate(["a", "b"], SamplingParams(max_tokens=3))[1].finish_reason != "error"


@pytest.mark.parametrize("kw,exact", [({}, True), ({"attention": "exact"}, True),
                                      ({"attention": "fast"}, False)])
def test_attention_setting_reaches_the_target(tiny_llama, kw, exact):
    """Row-exact attention is the default; the engine's target runs the mode it was given (a
    model loaded on its own runs "fast")."""
    eng = Engine(tiny_llama, progress=False, kv_cache_tokens=512, **kw)
    assert eng.config.attention == ("exact" if exact else "fast")
    assert eng.target.exact_attention is exact


@pytest.mark.parametrize("setting,dtype,expected", [
    ("auto", "float32", torch.float32), ("float32", "float32", torch.float32),
    ("float16", "float32", torch.float16), ("auto", "bfloat16", torch.bfloat16),
    ("bfloat16", "bfloat16", torch.bfloat16)])
def test_kv_cache_dtype_of_a_float_model(tiny_llama, setting, dtype, expected):
    """auto keeps a float model's cache in its dtype; float16 under float32 is the CPU's mix,
    and the page budget counts the cache's own bytes."""
    eng = Engine(tiny_llama, progress=False, dtype=dtype, kv_cache_tokens=512,
                 kv_cache_dtype=setting)
    assert eng.kv_dtype == expected
    assert all(t.dtype == expected for t in eng.target_kv.k + eng.target_kv.v)
    assert eng.generate(["a"], SamplingParams(max_tokens=3))[0].finish_reason == "length"


@pytest.mark.parametrize("setting,dtype,match", [
    ("bfloat16", "float32", "kv_cache_dtype='bfloat16' cannot run with a float32 model on cpu"
                            r".*use 'auto' or 'float16' or 'float32'"),
    ("float16", "bfloat16", "kv_cache_dtype='float16' cannot run with a bfloat16 model on cpu"
                            r".*use 'auto' or 'bfloat16'"),
    ("float32", "bfloat16", "kv_cache_dtype='float32' cannot run with a bfloat16 model")])
def test_kv_cache_dtype_the_kernels_cannot_mix_is_refused_at_construction(tiny_llama, setting,
                                                                          dtype, match):
    with pytest.raises(ValueError, match=match):
        Engine(tiny_llama, progress=False, dtype=dtype, kv_cache_dtype=setting)


def test_kv_cache_dtype_on_cuda_is_the_model_dtype_unless_asked():
    """CUDA's kernels take one element type: auto keeps the model's (the default unchanged),
    and the CPU's mix is refused there (checked without a GPU: the choice is host logic)."""
    cuda = torch.device("cuda")
    assert resolve_kv_dtype("auto", torch.bfloat16, cuda, False) == torch.bfloat16
    assert resolve_kv_dtype("float16", torch.float16, cuda, False) == torch.float16
    for compute in (torch.float32, torch.bfloat16):
        with pytest.raises(ValueError, match="kv_cache_dtype='float16' cannot run with a .* on "
                                             "cuda"):
            resolve_kv_dtype("float16", compute, cuda, False)
    assert resolve_kv_dtype("auto", torch.float32, torch.device("cpu"), True) == torch.float16


def test_bytes_per_page_follow_the_cache_dtype():
    fp32 = KVCache.bytes_per_page(30, 16, 3, 64, torch.float32)
    assert fp32 == 2 * 30 * 16 * 3 * 64 * 4
    assert KVCache.bytes_per_page(30, 16, 3, 64, torch.float16) * 2 == fp32


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-CUDA message")
def test_cuda_device_without_cuda(tiny_llama):
    with pytest.raises(ValueError, match="CUDA is not available"):
        Engine(tiny_llama, device="cuda", progress=False)
    with pytest.raises(ValueError, match="unknown device"):
        Engine(tiny_llama, device="tpu:x", progress=False)


@pytest.mark.parametrize("bad", [
    dict(top_k=2**31), dict(top_k=49153), dict(temperature=1e-39), dict(temperature=1e-6),
    dict(temperature=1e6), dict(seed=2**64), dict(seed=-1), dict(seed=1.5),
    dict(stop_token_ids=5), dict(stop=5), dict(stop=[None]), dict(max_tokens=True),
    dict(ignore_eos="no"), dict(detokenize=None), dict(top_p=True),
])
def test_sampling_params_refused_at_add_request(tiny_llama_engine, bad):
    with pytest.raises(ValueError):
        tiny_llama_engine.add_request("hi", SamplingParams(**bad))
    assert not tiny_llama_engine.has_unfinished()


def test_sampling_params_spellings(tiny_llama_engine):
    p = SamplingParams(stop=None, stop_token_ids=(3, 4), seed=2**64 - 1)
    p.validate(49152)
    assert p.stop == [] and p.stop_token_ids == [3, 4]
    assert tiny_llama_engine.generate("hi", p)[0].stats.seed == 2**64 - 1


def test_smallest_temperature_samples_like_greedy(tiny_llama_engine):
    """temperature ~1e-38 made 1/T denormal and sampled the last token id every time; the
    smallest allowed temperature now behaves like greedy decoding, as it should."""
    greedy = tiny_llama_engine.generate("Once upon", SamplingParams(max_tokens=8))[0]
    tiny = tiny_llama_engine.generate("Once upon", SamplingParams(
        max_tokens=8, temperature=MIN_TEMPERATURE, seed=3))[0]
    assert tiny.token_ids == greedy.token_ids and 49151 not in tiny.token_ids


def test_prompt_to_ids_one_way(tiny_llama, tmp_path):
    """Engine and trainer turn prompts into the same ids, also on a model without a chat
    template (the engine used to refuse chat messages there while the trainer joined them)."""
    plain = tmp_path / "no_template"
    shutil.copytree(tiny_llama, plain)
    tc = json.loads((plain / "tokenizer_config.json").read_text())
    tc.pop("chat_template", None)
    (plain / "tokenizer_config.json").write_text(json.dumps(tc))
    msgs = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello"},
            {"role": "user", "content": "Bye"}]
    for model in (tiny_llama, plain):
        eng = Engine(model, progress=False)
        for prompt in (msgs, [5, 6, 7]):
            assert eng.encode_prompt(prompt) == prompt_ids(eng.tokenizer, prompt)
    assert eng.encode_prompt(msgs) == eng.tokenizer.encode("Hi\n\nHello\n\nBye")
    assert eng.generate(msgs, SamplingParams(max_tokens=2))[0].finish_reason != "error"


def test_draft_shorter_than_the_context_is_refused(tiny_llama, tmp_path):
    draft = write_tiny_random_draft(tmp_path / "draft", seed=3)
    cfg = json.loads((draft / "config.json").read_text())
    cfg["max_position_embeddings"] = 256  # the target reaches 512
    (draft / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ModelConfigError, match="max_position_embeddings"):
        Engine(tiny_llama, draft=draft, progress=False)
    eng = Engine(tiny_llama, draft=draft, progress=False, max_model_len=256)
    assert eng.generate("hi", SamplingParams(max_tokens=4))[0].finish_reason == "length"


def test_verify_blocks_past_the_context_stay_in_the_rope_tables(tiny_llama, tmp_path):
    """A request that fills the context runs its last verify block up to B-1 positions past
    max_model_len (here the models' whole 512): the tables cover them, where the kernels used to
    read past the tables (and now refuse to)."""
    draft = write_tiny_random_draft(tmp_path / "draft", seed=4)
    eng = Engine(tiny_llama, draft=draft, progress=False)
    reach = eng.max_model_len + eng.block - 1
    assert eng.max_model_len == 512
    assert eng.target.cos_sin.shape[0] >= reach and eng.draft.bound.cos_sin.shape[0] >= reach
    res = eng.generate([list(range(5, 505))], SamplingParams(max_tokens=100, ignore_eos=True))[0]
    assert res.finish_reason == "length" and len(res.token_ids) == 12, res.error


def test_request_uniforms_are_the_generators_stream_whatever_the_draws():
    """RequestRNG draws ahead in chunks; every value must still be the seeded generator's next
    one, in order (what makes a sampled request's output depend on its seed alone)."""
    from dspine_engine.engine.sampling import RequestRNG

    rng, sizes = RequestRNG(123), [1, 31, 1, 200, 300, 7, 1000, 1]
    got = np.concatenate([rng.uniforms(n) for n in sizes])
    want = torch.rand(sum(sizes), generator=torch.Generator().manual_seed(123)).numpy()
    assert got.dtype == np.float32 and np.array_equal(got, want)
