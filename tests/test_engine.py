"""Engine behaviour on the CPU: batching, streaming, stop conditions, seeds, the step API, and
bad input (each a clear error that leaves the other requests untouched)."""
import json
import shutil

import pytest

from dspine_engine import Engine, KVCacheFullError, SamplingParams
from dspine_engine.models.config import ModelConfigError
from engine_rounds import pools_whole

PROMPTS = ["Name three fruits.", "Write a short poem about rain.",
           "What is 12 times 11? Explain step by step.", "Hello!"]


def test_batched_equals_one_by_one(smollm2_engine):
    params = SamplingParams(max_tokens=40, ignore_eos=True)
    batched = smollm2_engine.generate(PROMPTS, params)
    for prompt, res in zip(PROMPTS, batched):
        alone = smollm2_engine.generate(prompt, params)[0]
        assert res.token_ids == alone.token_ids
        assert res.text == alone.text and res.stats.new_tokens == 40


def test_stream_concatenates_to_generate(smollm2_engine):
    params = SamplingParams(max_tokens=48)
    pieces = list(smollm2_engine.stream(PROMPTS[1], params))
    assert pieces[-1].finished and all(not p.finished for p in pieces[:-1])
    assert len(pieces) > 5  # text arrives as it is produced, not at the end
    full = smollm2_engine.generate(PROMPTS[1], params)[0]
    assert "".join(p.new_text for p in pieces) == full.text
    assert sum((p.new_token_ids for p in pieces), []) == full.token_ids
    assert pieces[-1].stats.new_tokens == len(full.token_ids)


def test_stop_conditions(smollm2_engine):
    eng = smollm2_engine
    # EOS: a chat answer ends with <|im_end|> well before the limit.
    res = eng.generate("What is the capital of France?", SamplingParams(max_tokens=200))[0]
    assert res.finish_reason == "stop" and res.token_ids[-1] in eng.eos_ids
    assert "<|im_end|>" not in res.text
    # max tokens
    res = eng.generate(PROMPTS[1], SamplingParams(max_tokens=7, ignore_eos=True))[0]
    assert res.finish_reason == "length" and len(res.token_ids) == 7
    # stop string: cut from the text, generation ends there
    free = eng.generate(PROMPTS[1], SamplingParams(max_tokens=60, ignore_eos=True))[0].text
    stop = free.split()[3]
    res = eng.generate(PROMPTS[1], SamplingParams(max_tokens=60, stop=[stop]))[0]
    assert res.finish_reason == "stop" and stop not in res.text
    assert free.startswith(res.text) and len(res.text) < len(free)
    # stop token id
    tok = free_ids = eng.generate(PROMPTS[1], SamplingParams(max_tokens=10))[0].token_ids
    res = eng.generate(PROMPTS[1], SamplingParams(max_tokens=10, stop_token_ids=[free_ids[4]]))[0]
    assert res.token_ids == tok[:5] and res.finish_reason == "stop"


def test_sampling_seeded_and_diverse(smollm2_engine):
    p = SamplingParams(max_tokens=24, temperature=1.0, top_p=0.95, top_k=50, seed=123)
    a = smollm2_engine.generate([PROMPTS[1]] * 2, p)
    b = smollm2_engine.generate(PROMPTS[1], p)[0]
    assert a[0].token_ids == a[1].token_ids == b.token_ids  # same seed -> same output
    others = {tuple(smollm2_engine.generate(PROMPTS[1], SamplingParams(
        max_tokens=24, temperature=1.0, seed=s))[0].token_ids) for s in range(4)}
    assert len(others) > 1
    assert a[0].stats.seed == 123


def test_step_api_join_leave_abort(smollm2_engine):
    eng = smollm2_engine
    free_before = eng.target_kv.pool.free_pages
    long_id = eng.add_request(PROMPTS[1], SamplingParams(max_tokens=100, ignore_eos=True))
    seen, steps = {}, 0
    late = None
    while eng.has_unfinished():
        for out in eng.step():
            seen.setdefault(out.request_id, []).append(out)
        steps += 1
        if steps == 3:
            late = eng.add_request(PROMPTS[0], SamplingParams(max_tokens=5, ignore_eos=True))
        if steps == 12:
            assert eng.abort(long_id)
            assert not eng.abort(long_id)  # already aborted
    assert seen[late][-1].finished and seen[late][-1].finish_reason == "length"
    last = seen[long_id][-1]
    assert last.finished and last.finish_reason == "abort"
    assert sum(len(o.new_token_ids) for o in seen[long_id]) < 100
    assert eng.target_kv.pool.free_pages == free_before  # every page came back
    assert eng.target_kv.pool.available == eng.target_kv.pool.num_pages
    assert not eng.abort("no-such-request")


@pytest.mark.parametrize("bad", [
    dict(temperature=-1.0), dict(temperature=float("nan")), dict(top_p=0.0), dict(top_p=1.5),
    dict(top_k=-3), dict(max_tokens=0), dict(stop=[""]), dict(stop_token_ids=[10**9]),
    dict(seed="x"),
])
def test_invalid_sampling_params(smollm2_engine, bad):
    with pytest.raises(ValueError):
        smollm2_engine.add_request("hi", SamplingParams(**bad))
    assert not smollm2_engine.has_unfinished()


def test_bad_prompts(smollm2_engine):
    eng = smollm2_engine
    for prompt in ("", [], [1, -5], [10**9], 42, [{"role": "user"}]):
        with pytest.raises(ValueError):
            eng.add_request(prompt)
    with pytest.raises(ValueError, match="context"):
        eng.add_request(list(range(1, 9000)))


def test_bad_request_does_not_stop_the_batch(tiny_llama):
    eng = Engine(tiny_llama, progress=False, kv_cache_tokens=256, page_size=16)
    params = SamplingParams(max_tokens=8, ignore_eos=True)
    results = eng.generate(["one", list(range(3, 600)), "two", "three"],
                           [params, params, params, SamplingParams(temperature=-2)])
    assert [r.finish_reason for r in results] == ["length", "error", "length", "error"]
    assert "context" in results[1].error and "temperature" in results[3].error
    assert len(results[0].token_ids) == len(results[2].token_ids) == 8
    huge = SamplingParams(max_tokens=480, ignore_eos=True)  # fits the context, not the pool
    with pytest.raises(KVCacheFullError, match="pool holds"):
        eng.add_request("x" * 10, huge)
    assert huge.max_tokens == 480  # the caller's params are never modified
    assert not eng.has_unfinished()


def test_only_the_prompts_prefill_calls_attention_as_a_prefill(tiny_llama, tmp_path, monkeypatch):
    """The target tells the attention op which calls prefill a prompt (AttnMeta.prefill): on
    Hopper those take the wgmma kernel even in exact mode, which is right only because their rows
    are computed there and nowhere else. Speculative rounds, plain decode steps and the draft's
    own attention must never say so."""
    from dspine_engine.models import target as target_module
    from random_drafts import write_tiny_random_draft

    seen = []
    real = target_module.ops.paged_attention

    def recording(*args, **kwargs):
        seen.append((bool(args[12]) if len(args) > 12 else kwargs.get("prefill", False), args[6]))
        return real(*args, **kwargs)

    monkeypatch.setattr(target_module.ops, "paged_attention", recording)
    draft = write_tiny_random_draft(tmp_path / "draft", seed=3)
    for kwargs in ({}, {"draft": draft}):
        seen.clear()
        eng = Engine(tiny_llama, progress=False, page_size=16, **kwargs)
        eng.generate(["one two three", "a longer prompt of several words"],
                     SamplingParams(max_tokens=6, ignore_eos=True))
        layers = eng.target.config.num_layers
        prefills = [rows for flag, rows in seen if flag]
        assert prefills and len(prefills) % layers == 0, kwargs  # prefill batches, a call a layer
        assert all(rows > 1 for rows in prefills), prefills
        assert len(seen) > len(prefills)  # the decode steps / rounds ran, as non-prefills


def test_kv_pool_exhaustion_queues_then_serves(tiny_llama):
    # Each request reserves prompt + 200 + 1 tokens; the pool holds two at a time.
    eng = Engine(tiny_llama, progress=False, kv_cache_tokens=16 * 30, page_size=16)
    params = SamplingParams(max_tokens=200, ignore_eos=True)
    ids = [eng.add_request(f"request {i}", params) for i in range(5)]
    peak = 0
    done = {}
    while eng.has_unfinished():
        for out in eng.step():
            if out.finished:
                done[out.request_id] = out
        peak = max(peak, len(eng.scheduler.running))
        assert eng.target_kv.pool.free_pages >= 0
    assert peak == 2 and sorted(done) == sorted(ids)
    assert all(o.finish_reason == "length" for o in done.values())
    assert pools_whole(eng)  # every page and reservation came back


def test_model_loading_errors(tmp_path, tiny_llama):
    with pytest.raises(FileNotFoundError):
        Engine(tmp_path / "nope", progress=False)
    broken = tmp_path / "broken"
    shutil.copytree(tiny_llama, broken)
    (broken / "config.json").write_text("{not json")
    with pytest.raises(ModelConfigError, match="not valid JSON"):
        Engine(broken, progress=False)
    cfg = json.loads((tiny_llama / "config.json").read_text())
    for mutate, match in ((lambda c: c.update(architectures=["GPT2LMHeadModel"]), "unsupported"),
                          (lambda c: c.pop("hidden_size"), "hidden_size"),
                          (lambda c: c.update(num_key_value_heads=3), "multiple")):
        c = dict(cfg)
        mutate(c)
        (broken / "config.json").write_text(json.dumps(c))
        with pytest.raises(ModelConfigError, match=match):
            Engine(broken, progress=False)
    (broken / "config.json").write_text(json.dumps(cfg))
    (broken / "model.safetensors").write_bytes(b"garbage")
    with pytest.raises(ModelConfigError, match="cannot read"):
        Engine(broken, progress=False)
    (broken / "model.safetensors").unlink()
    with pytest.raises(FileNotFoundError, match="safetensors"):
        Engine(broken, progress=False)


def test_weights_of_wrong_shape(tmp_path, tiny_llama):
    bad = tmp_path / "shape"
    shutil.copytree(tiny_llama, bad)
    cfg = json.loads((bad / "config.json").read_text())
    cfg["intermediate_size"] = 128
    (bad / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ModelConfigError, match="shape"):
        Engine(bad, progress=False)


def test_engine_stats(smollm2_engine):
    before = smollm2_engine.stats.new_tokens
    res = smollm2_engine.generate(PROMPTS[:2], SamplingParams(max_tokens=16, ignore_eos=True))
    assert smollm2_engine.stats.new_tokens - before == 32
    s = res[0].stats
    assert s.prompt_tokens > 0 and s.new_tokens == 16 and s.rounds == 15 and s.tau == 1.0
    assert s.tokens_per_second > 0 and 0 < s.time_to_first_token <= s.elapsed
