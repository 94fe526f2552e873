"""The loop driver: every output reaches its request, whoever drives the engine.

Before the driver, `generate()` and `stream()` each stepped the engine themselves and dropped
every output of other requests: two streams advanced in turn lost pieces and one then hung, and a
step-API request finished inside a `generate()` call was never delivered. Each test here failed
(or hung) that way; a deadline turns a hang into a failure.
"""
import asyncio
import dataclasses
import threading

import pytest

from dspine_engine import Engine, RequestHandle, SamplingParams

PROMPTS = ["The color I'm referring to", "Write a short poem", "Count to ten", "Hello there"]
NEW_TOKENS = 12


def P(prompt):  # noqa: N802
    """Seeded sampling, one seed per prompt: every request's tokens differ (the tiny random
    model's greedy answer is one token repeated), so a piece routed to the wrong request or lost
    shows, and each request's output is independent of the batch it shares."""
    return SamplingParams(max_tokens=NEW_TOKENS, ignore_eos=True, temperature=1.0,
                          seed=PROMPTS.index(prompt) if prompt in PROMPTS else 99)


@pytest.fixture(scope="module", params=["off", "on"], ids=["in-step", "overlapped"])
def engine(tiny_llama, request):
    """Every test runs with rounds in step and overlapped (a round in flight while the host
    routes the last one's outputs: driver.py)."""
    return Engine(tiny_llama, progress=False, max_num_seqs=8, overlap=request.param)


@pytest.fixture(scope="module")
def reference(engine):
    """Each prompt run alone: what every consumer must receive, complete and in order."""
    ref = {p: engine.generate(p, P(p))[0] for p in PROMPTS}
    assert len({tuple(r.token_ids) for r in ref.values()}) == len(PROMPTS)
    return ref


def within(seconds, fn):
    """Runs fn in a thread; fails (instead of hanging the suite) if it does not return."""
    box = {}

    def run():
        try:
            box["value"] = fn()
        except BaseException as e:  # re-raised in the test thread
            box["error"] = e

    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(seconds)
    assert not t.is_alive(), f"did not finish within {seconds}s (hang)"
    if "error" in box:
        raise box["error"]
    return box["value"]


def collect(outputs):
    outputs = list(outputs)
    finished = [o for o in outputs if o.finished]
    return "".join(o.new_text for o in outputs), sum((o.new_token_ids for o in outputs), []), \
        finished


def assert_complete(got, ref):
    text, tokens, finished = got
    assert tokens == ref.token_ids and text == ref.text
    assert len(finished) == 1 and finished[0].finish_reason == "length"  # exactly once


def test_interleaved_streams_get_complete_output(engine, reference):
    def interleave():
        streams = {p: engine.stream(p, P(p)) for p in PROMPTS[:2]}
        seen = {p: [] for p in streams}
        while streams:
            for p, s in list(streams.items()):
                out = next(s, None)
                if out is None:
                    del streams[p]
                else:
                    seen[p].append(out)
        return seen

    seen = within(120, interleave)
    for p, outs in seen.items():
        assert_complete(collect(outs), reference[p])
    assert not engine.has_unfinished()


def test_step_api_generate_and_streams_share_one_engine(engine, reference):
    """Two interleaved streams, a step-API request and a generate() call, all at once."""
    def mixed():
        rid = engine.add_request(PROMPTS[0], P(PROMPTS[0]))
        streams = [engine.stream(p, P(p)) for p in PROMPTS[1:3]]
        seen = {i: [next(s)] for i, s in enumerate(streams)}  # both streams started
        results = engine.generate([PROMPTS[3], PROMPTS[2]], [P(PROMPTS[3]), P(PROMPTS[2])])  # drives everyone
        for i, s in enumerate(streams):
            seen[i] += list(s)
        step_outs = []
        while engine.has_unfinished():
            step_outs += engine.step()
        return rid, seen, results, step_outs

    rid, seen, results, step_outs = within(180, mixed)
    assert [r.token_ids for r in results] == [reference[PROMPTS[3]].token_ids,
                                              reference[PROMPTS[2]].token_ids]
    assert all(o.request_id == rid for o in step_outs)  # step() returns its own requests only
    assert_complete(collect(step_outs), reference[PROMPTS[0]])
    for i, p in enumerate(PROMPTS[1:3]):
        assert_complete(collect(seen[i]), reference[p])
    assert engine.target_kv.pool.available == engine.target_kv.pool.num_pages


def test_submit_handles_async_iteration_stats_and_abort(engine, reference):
    async def read(handle, log):
        async for out in handle:
            log.append(out)

    async def main():
        handles = [engine.submit(p, P(p)) for p in PROMPTS[:3]]
        victim = engine.submit(PROMPTS[3], SamplingParams(max_tokens=200, ignore_eos=True))
        logs = [[] for _ in handles]
        tasks = [asyncio.create_task(read(h, log)) for h, log in zip(handles, logs)]
        while victim.stats.new_tokens < 3:  # live stats while it runs
            await asyncio.sleep(0.01)
            if all(t.done() for t in tasks):
                break
        assert victim.abort() and not victim.abort()
        await asyncio.gather(*tasks)
        return handles, logs, victim

    handles, logs, victim = within(180, lambda: asyncio.run(main()))
    for h, log, p in zip(handles, logs, PROMPTS):
        assert isinstance(h, RequestHandle) and h.done
        assert_complete(collect(log), reference[p])
        assert h.stats.new_tokens == NEW_TOKENS and h.stats.elapsed > 0
    assert victim.final.finish_reason == "abort" and victim.stats.new_tokens < 200
    assert victim.result().finish_reason == "abort"
    assert engine.target_kv.pool.available == engine.target_kv.pool.num_pages


def test_closing_a_stream_aborts_its_request(engine):
    stream = engine.stream(PROMPTS[0], SamplingParams(max_tokens=100, ignore_eos=True))
    next(stream)
    stream.close()
    assert not engine.has_unfinished()
    assert engine.target_kv.pool.available == engine.target_kv.pool.num_pages


def test_generate_never_leaves_requests_queued(engine, reference, monkeypatch):
    # Prompts that used to raise TypeErrors out of generate() are error results now ...
    results = engine.generate([PROMPTS[0], [{"role": "user", "content": None}], "bad \ud800"],
                              P(PROMPTS[0]))
    assert results[0].token_ids == reference[PROMPTS[0]].token_ids
    assert [r.finish_reason for r in results[1:]] == ["error", "error"]
    assert "string" in results[1].error and "Unicode" in results[2].error
    assert not engine.has_unfinished()
    # ... and an interrupted call (Ctrl-C inside a step) aborts what it queued.
    driver = engine._driver
    real_step, calls = driver._step, []

    def interrupted():
        calls.append(1)
        if len(calls) == 3:
            raise KeyboardInterrupt
        return real_step()

    monkeypatch.setattr(driver, "_step", interrupted)
    with pytest.raises(KeyboardInterrupt):
        engine.generate(PROMPTS, [P(p) for p in PROMPTS])
    monkeypatch.undo()
    assert not engine.has_unfinished()
    assert engine.target_kv.pool.available == engine.target_kv.pool.num_pages
    assert engine.generate(PROMPTS[1], P(PROMPTS[1]))[0].token_ids == reference[PROMPTS[1]].token_ids


def test_automatic_ids_never_collide_with_user_ids(tiny_llama):
    engine = Engine(tiny_llama, progress=False)  # fresh: its automatic ids start at req-0
    mine = [engine.add_request("hi", P("x"), request_id=f"req-{i}") for i in range(3)]
    auto = [engine.add_request("hi", P("x")) for _ in range(2)]
    results = engine.generate(["a", "b"], P("x"))  # automatic ids too
    assert len(set(mine + auto + [r.request_id for r in results])) == 7
    assert all(r.finish_reason == "length" for r in results)
    with pytest.raises(ValueError, match="already in use"):
        engine.add_request("hi", P("x"), request_id="req-0")
    done = set()
    while engine.has_unfinished():
        done |= {o.request_id for o in engine.step() if o.finished}
    assert done == set(mine + auto)


def test_one_bad_request_never_reaches_a_batch(engine, reference):
    good = engine.add_request(PROMPTS[0], P(PROMPTS[0]))
    with pytest.raises(ValueError, match="top_k"):
        engine.add_request(PROMPTS[1], SamplingParams(temperature=1.0, top_k=2**31))
    outs = []
    while engine.has_unfinished():
        outs += engine.step()
    assert [o.request_id for o in outs if o.finished] == [good]
    assert_complete(collect(outs), reference[PROMPTS[0]])


def test_token_ids_only_skips_detokenisation(engine, reference, monkeypatch):
    def no_decode(*a, **k):
        raise AssertionError("decode called for a detokenize=False request")

    monkeypatch.setattr(engine.tokenizer, "decode", no_decode)
    res = engine.generate(PROMPTS[:2], [dataclasses.replace(P(p), detokenize=False)
                                        for p in PROMPTS[:2]])
    assert [r.token_ids for r in res] == [reference[p].token_ids for p in PROMPTS[:2]]
    assert all(r.text == "" and r.finish_reason == "length" for r in res)
    with pytest.raises(ValueError, match="stop strings"):
        engine.add_request("hi", SamplingParams(detokenize=False, stop=["x"]))
