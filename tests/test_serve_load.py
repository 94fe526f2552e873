"""dspine-serve under load: 32 concurrent streaming clients, three rounds of 80 requests of
mixed lengths and parameters (chat and completions, greedy and seeded sampling, top-k, top-p,
stop strings, ignore_eos), some disconnecting mid-stream. Every completed response must be
the engine's own output for that request, no request may fail, the KV pools must be fully free
after each round, and the server's memory must stay flat across the rounds. Plus the two
disconnect cases on their own: a client that leaves frees its pages at once.

The target is the tiny test model, decoding autoregressively: the server's part (routing,
streaming, aborts, admission between steps) is the same with a draft, and a random draft would
make every token cost a 16-token verify (test_serve_errors.py serves one)."""
import asyncio
import json
import random

import pytest

pytest.importorskip("fastapi", reason="needs the serve extras (pip install -e '.[serve]')")
httpx = pytest.importorskip("httpx")

from serve_harness import Server, metrics, sse_events, wait_for_metric, wait_idle  # noqa: E402

MODEL = "tiny"
CLIENTS = 32
REQUESTS_PER_ROUND = 80
ROUNDS = 3
SHUTDOWN_TIMEOUT = 0.5  # seconds SIGTERM lets in-flight requests run before aborting them
WORDS = ("the sea river stone light quiet morning city window garden bird song paper road "
         "winter fire cloud green small old").split()


@pytest.fixture(scope="module")
def server(tiny_llama):
    args = ["--model", str(tiny_llama), "--no-draft", "--served-model-name", MODEL,
            "--max-num-seqs", str(CLIENTS), "--shutdown-timeout", str(SHUTDOWN_TIMEOUT)]
    with Server(args) as s:
        yield s


def _specs(n: int, seed: int = 0) -> list[dict]:
    """Mixed requests: each dict has the endpoint, the JSON body, and whether the client
    leaves after a few chunks."""
    rng = random.Random(seed)
    specs = []
    for i in range(n):
        text = " ".join(rng.choice(WORDS) for _ in range(rng.randint(1, 60)))
        params = rng.choice([
            {"temperature": 0, "max_tokens": rng.choice([1, 2, 5, 12, 24])},
            {"temperature": 0.9, "top_p": 0.95, "seed": i, "max_tokens": 16},
            {"temperature": 1.0, "top_k": 8, "seed": 1000 + i, "max_tokens": 12},
            {"temperature": 0, "stop": rng.choice(["e", ["the", "\n"]]), "max_tokens": 20},
            {"temperature": 0.7, "seed": i, "ignore_eos": True, "max_tokens": 12},
        ])
        leaves = i % 8 == 3
        if leaves:  # a short prompt and a long answer: the client is gone long before its end
            text = " ".join(rng.choice(WORDS) for _ in range(3))
            params = {"temperature": 0, "max_tokens": 400, "ignore_eos": True}
        chat = i % 2 == 0
        body = {"model": MODEL, "stream": True, "stream_options": {"include_usage": True},
                **params}
        if chat:
            body["messages"] = [{"role": "user", "content": text}]
        else:
            body["prompt"] = text
        specs.append({"chat": chat, "body": body, "leaves": leaves})
    return specs


def _expected(engine, specs) -> list:
    """The engine's results for the specs that run to the end (one batched generate)."""
    from dspine_engine import SamplingParams

    keep = [s for s in specs if not s["leaves"]]
    prompts, params = [], []
    for s in keep:
        b = s["body"]
        prompts.append(b["messages"] if s["chat"] else engine.tokenizer.encode(b["prompt"]))
        params.append(SamplingParams(
            max_tokens=b["max_tokens"], temperature=b["temperature"], top_p=b.get("top_p", 1.0),
            top_k=b.get("top_k", 0), seed=b.get("seed"), stop=b.get("stop") or [],
            ignore_eos=b.get("ignore_eos", False)))
    return dict(zip(map(id, keep), engine.generate(prompts, params)))


async def _one(client: httpx.AsyncClient, spec: dict) -> dict:
    path = "/v1/chat/completions" if spec["chat"] else "/v1/completions"
    async with client.stream("POST", path, json=spec["body"]) as r:
        if r.status_code != 200:
            return {"status": r.status_code, "body": (await r.aread()).decode()}
        lines, chunks = [], 0
        async for line in r.aiter_lines():
            lines.append(line)
            chunks += line.startswith("data: {")
            if spec["leaves"] and chunks == 4:
                return {"status": 200, "left": True}  # closing the stream drops the connection
    events = sse_events(lines)
    if spec["chat"]:
        text = "".join(e["choices"][0]["delta"].get("content") or "" for e in events
                       if e["choices"])
    else:
        text = "".join(e["choices"][0]["text"] for e in events if e["choices"])
    finish = [e["choices"][0]["finish_reason"] for e in events
              if e["choices"] and e["choices"][0]["finish_reason"]]
    return {"status": 200, "text": text, "finish": finish, "usage": events[-1].get("usage"),
            "errors": [e for e in events if "error" in e]}


async def _round(url: str, specs: list[dict]) -> list[dict]:
    todo: asyncio.Queue = asyncio.Queue()
    for i, s in enumerate(specs):
        todo.put_nowait(i)
    results: list = [None] * len(specs)
    limits = httpx.Limits(max_connections=CLIENTS, max_keepalive_connections=CLIENTS)
    async with httpx.AsyncClient(base_url=url, timeout=300, limits=limits) as client:
        async def worker():
            while not todo.empty():
                i = todo.get_nowait()
                results[i] = await _one(client, specs[i])

        await asyncio.gather(*(worker() for _ in range(CLIENTS)))
    return results


def _pools_free(m: dict) -> None:
    assert m['dspine_kv_pages_used{pool="target"}'] == 0
    assert m['dspine_kv_pages_reserved{pool="target"}'] == 0
    assert m["dspine_requests_running"] == 0 and m["dspine_requests_waiting"] == 0


def test_32_streaming_clients_three_rounds(server, tiny_llama):
    from dspine_engine import Engine

    specs = _specs(REQUESTS_PER_ROUND)
    engine = Engine(tiny_llama, progress=False, max_num_seqs=CLIENTS)
    expected = _expected(engine, specs)
    rss = []
    for _ in range(ROUNDS):
        results = asyncio.run(_round(server.url, specs))
        for spec, got in zip(specs, results):
            assert got["status"] == 200, got
            if spec["leaves"]:
                assert got.get("left"), "a leaving client got its whole answer"
                continue
            want = expected[id(spec)]
            assert not got["errors"], got["errors"]
            assert got["text"] == want.text, json.dumps(spec["body"])
            assert got["finish"] == [want.finish_reason]
            assert got["usage"]["completion_tokens"] == len(want.token_ids)
            assert got["usage"]["prompt_tokens"] == want.stats.prompt_tokens
        m = wait_idle(server.url, timeout=10)
        _pools_free(m)
        rss.append(server.rss_bytes())
    served = sum(v for k, v in m.items() if k.startswith("dspine_requests_total{"))
    assert served == ROUNDS * REQUESTS_PER_ROUND

    def finished(reason):
        return sum(v for k, v in m.items() if k.startswith("dspine_requests_total{")
                   and f'finish_reason="{reason}"' in k)

    # Every leaver's request was aborted when the server saw the connection close, or, if a
    # loaded machine generated its 400 tokens first, ran to its length: none is lost or errs.
    # (That a disconnect aborts at once is test_disconnect_mid_stream_aborts_and_frees_pages.)
    leavers = ROUNDS * sum(s["leaves"] for s in specs)
    lengths = ROUNDS * sum(w.finish_reason == "length" for w in expected.values())
    leavers_done = finished("length") - lengths
    assert finished("abort") + leavers_done == leavers and 0 <= leavers_done < leavers
    assert not any(k.startswith("dspine_refused_requests_total") and v for k, v in m.items())
    assert "Traceback" not in server.text_log() and "ERROR" not in server.text_log()
    # Flat memory: after the first round has warmed every allocator and cache, the next two
    # rounds of the same load may not grow the server by more than a few MB.
    growth = rss[-1] - rss[0]
    assert growth < 24 * 2**20, f"RSS grew {growth / 2**20:.1f} MB over rounds: {rss}"


def test_disconnect_mid_stream_aborts_and_frees_pages(server):
    key = 'dspine_requests_total{endpoint="chat",finish_reason="abort"}'
    before = metrics(server.url).get(key, 0)
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "stream": True,
            "max_tokens": 400, "ignore_eos": True}
    with httpx.stream("POST", server.url + "/v1/chat/completions", json=body, timeout=60) as r:
        lines = r.iter_lines()
        for _ in range(4):  # the role chunk and a few tokens: the request is running
            while not next(lines):
                pass
    m = wait_idle(server.url, timeout=5)
    assert m["dspine_requests_in_flight"] == 0
    _pools_free(m)
    assert m[key] == before + 1


def test_disconnect_while_waiting_for_a_whole_answer_aborts(server):
    key = 'dspine_requests_total{endpoint="completion",finish_reason="abort"}'
    before = metrics(server.url).get(key, 0)
    body = {"model": MODEL, "prompt": "hi", "max_tokens": 400, "ignore_eos": True}
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(server.url + "/v1/completions", json=body, timeout=0.3)
    m = wait_idle(server.url, timeout=5)
    assert m["dspine_requests_in_flight"] == 0
    _pools_free(m)
    assert m[key] == before + 1


def test_sigterm_aborts_what_outlasts_the_shutdown_timeout_then_exits_0(server):
    """Last in this file: it stops the module's server. Answers far longer than the shutdown
    timeout are aborted by the engine at the deadline: each client gets a proper end
    (finish_reason "abort", usage, [DONE]), not a cut connection; the server exits with 0."""
    body = {"model": MODEL, "prompt": "hi", "stream": True, "max_tokens": 480,
            "ignore_eos": True, "stream_options": {"include_usage": True}}

    async def scenario():
        async with httpx.AsyncClient(base_url=server.url, timeout=60) as c:
            async def long_stream():
                async with c.stream("POST", "/v1/completions", json=body) as r:
                    return [line async for line in r.aiter_lines()]

            tasks = [asyncio.create_task(long_stream()) for _ in range(8)]
            await wait_for_metric(c, "dspine_requests_running", 8, tasks)
            server.send_sigterm()
            return await asyncio.gather(*tasks)

    streams = asyncio.run(scenario())
    assert server.wait() == 0, server.text_log()
    for lines in streams:
        events = sse_events(lines)  # ends with [DONE]
        assert [e["choices"][0]["finish_reason"] for e in events
                if e["choices"] and e["choices"][0]["finish_reason"]] == ["abort"]
        assert 0 < events[-1]["usage"]["completion_tokens"] < 480  # served until the deadline
    assert "Traceback" not in server.text_log()
