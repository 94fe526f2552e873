"""Every refusal of dspine-serve, each with its status code and message, while another request
streams alongside and completes correctly; the queue-full 503; and a graceful SIGTERM
(in-flight requests finish, exit code 0). The target is the tiny test model with a tiny random draft, so both KV pools and
the speculative path are in play."""
import asyncio
import threading

import pytest

pytest.importorskip("fastapi", reason="needs the serve extras (pip install -e '.[serve]')")
httpx = pytest.importorskip("httpx")

from random_drafts import write_tiny_random_draft  # noqa: E402
from serve_harness import (Server, metrics, parse_metrics, sse_events,  # noqa: E402
                           wait_for_metric, wait_idle)

KEY = "test-key"
MODEL = "tiny"
AUTH = {"Authorization": f"Bearer {KEY}"}
LONG = 60  # tokens of the request that streams while the bad ones are refused
IN_FLIGHT = "dspine_requests_in_flight"


@pytest.fixture(scope="module")
def draft_dir(tmp_path_factory):
    return write_tiny_random_draft(tmp_path_factory.mktemp("serve_draft") / "draft", seed=3)


@pytest.fixture(scope="module")
def server(tiny_llama, draft_dir):
    # 8 KV pages of 16 tokens: the LONG request fits (prompt + 60 + one 16-token block), a
    # request for 200 tokens never can. 2 running seats + 1 queued: the 4th request is a 503.
    args = ["--model", str(tiny_llama), "--draft", str(draft_dir), "--api-key", KEY,
            "--served-model-name", MODEL, "--kv-cache-tokens", "128", "--max-num-seqs", "2",
            "--max-queue", "1"]
    with Server(args) as s:
        yield s


@pytest.fixture(scope="module")
def engine(tiny_llama, draft_dir):
    from dspine_engine import Engine

    return Engine(tiny_llama, draft=draft_dir, progress=False)


def _chat(content="Hello there", **kw):
    body = {"model": MODEL, "messages": [{"role": "user", "content": content}],
            "max_tokens": 8, "temperature": 0}
    body.update(kw)
    return body


def _stream_text(url, body, on_first=None) -> tuple[str, str]:
    """Streams a chat request; returns (text, finish_reason)."""
    with httpx.stream("POST", url + "/v1/chat/completions", json=dict(body, stream=True),
                      headers=AUTH, timeout=120) as r:
        assert r.status_code == 200, r.read()
        lines = []
        for line in r.iter_lines():
            lines.append(line)
            if on_first is not None and line.startswith("data: {") and len(lines) == 3:
                on_first()
    events = sse_events(lines)
    text = "".join(e["choices"][0]["delta"].get("content") or "" for e in events)
    return text, events[-1]["choices"][0]["finish_reason"]


BAD = [  # (body or raw bytes, status, words the message must contain)
    (b'{"model": "tiny", "messages": [', 400, "not valid JSON"),
    ({"messages": [{"role": "user", "content": "x"}]}, 400, "missing required field 'model'"),
    (_chat(temperature="hot"), 400, "temperature"),
    (_chat(model="gpt-4"), 400, "'gpt-4' is not served here"),
    (_chat(temperature=-1), 400, "temperature must be"),
    (_chat(top_p=0), 400, "top_p must be in (0, 1]"),
    (_chat(max_tokens=0), 400, "max_tokens must be"),
    (_chat(top_k=-3), 400, "top_k must be"),
    (_chat(stop=[""]), 400, "stop strings must be non-empty"),
    (_chat(n=3), 400, "n=3 is not supported"),
    (_chat(logprobs=True), 400, "logprobs are not supported"),
    (_chat(presence_penalty=0.5), 400, "presence_penalty is not supported"),
    (_chat(tools=[{"type": "function", "function": {"name": "f"}}]), 400, "tools"),
    (_chat(stream_options={"include_usage": True}), 400, "only allowed with stream=true"),
    ({"model": MODEL, "messages": []}, 400, "at least one message"),
    (_chat(messages=[{"role": "user", "content": [{"type": "image_url"}]}]), 400, "text only"),
    (_chat(content="word " * 700), 400, "but the context holds 512"),
    (_chat(max_tokens=200), 400, "KV pages"),
]
BAD_COMPLETIONS = [
    ({"model": MODEL, "prompt": "hi", "logprobs": 2}, 400, "logprobs are not supported"),
    ({"model": MODEL, "prompt": ["a", "b"]}, 400, "2 prompts in one request"),
    ({"model": MODEL, "prompt": [1, 2, 10**6]}, 400, "out of range"),
    ({"model": MODEL, "prompt": "hi", "echo": True}, 400, "echo is not supported"),
    ({"model": MODEL, "prompt": ""}, 400, "must not be empty"),
]


def _post(url, path, body, headers=AUTH):
    if isinstance(body, bytes):
        return httpx.post(url + path, content=body, timeout=60,
                          headers=dict(headers, **{"Content-Type": "application/json"}))
    return httpx.post(url + path, json=body, headers=headers, timeout=60)


def test_bad_requests_are_refused_while_another_streams(server, engine):
    from dspine_engine import SamplingParams

    body = _chat("Tell me a story", max_tokens=LONG, ignore_eos=True)
    result = {}
    streaming = threading.Thread(
        target=lambda: result.update(out=_stream_text(server.url, body)))
    streaming.start()
    for path, cases in (("/v1/chat/completions", BAD), ("/v1/completions", BAD_COMPLETIONS)):
        for bad, status, words in cases:
            r = _post(server.url, path, bad)
            assert r.status_code == status, (bad, r.text)
            err = r.json()["error"]
            assert words in err["message"], (bad, err)
            assert err["type"] == "invalid_request_error"
    streaming.join(120)
    want = engine.generate([[{"role": "user", "content": "Tell me a story"}]],
                           SamplingParams(max_tokens=LONG, ignore_eos=True))[0]
    assert result["out"] == (want.text, "length")
    # and the server still serves
    r = _post(server.url, "/v1/chat/completions", _chat())
    assert r.status_code == 200 and r.json()["choices"][0]["message"]["content"]
    assert metrics(server.url)['dspine_refused_requests_total{status="400"}'] >= len(BAD) + len(
        BAD_COMPLETIONS)


def test_metrics_report_tau_acceptance_and_tokens(server, engine):
    """After the speculative stream above: /metrics has the engine's own figures."""
    m = metrics(server.url)
    rounds = m["dspine_engine_rounds_total"]
    assert rounds > 0
    # Every round belongs to a verified batch of at most the engine's max_num_seqs sequences.
    batches = m["dspine_engine_batches_total"]
    assert 0 < batches <= rounds <= batches * engine.max_num_seqs
    assert m["dspine_tau"] == pytest.approx(
        1 + m["dspine_engine_accepted_draft_tokens_total"] / rounds)
    rates = {k: v for k, v in m.items() if k.startswith("dspine_acceptance_rate{")}
    assert set(rates) == {f'dspine_acceptance_rate{{position="{j}"}}'
                          for j in range(1, engine.block)}  # one per draft slot of a block
    assert all(0 <= v <= 1 for v in rates.values())
    assert m["dspine_engine_tokens_per_second"] > 0
    assert m["dspine_generation_tokens_total"] >= LONG
    # the engine counts every committed token, the server those of finished requests
    assert m["dspine_engine_generated_tokens_total"] >= m["dspine_generation_tokens_total"]


@pytest.mark.parametrize("headers", [{}, {"Authorization": "Bearer wrong"},
                                     {"Authorization": KEY}])
def test_wrong_api_key_is_401(server, headers):
    for path in ("/v1/models", "/v1/chat/completions"):
        r = _post(server.url, path, _chat(), headers) if "chat" in path else httpx.get(
            server.url + path, headers=headers)
        assert r.status_code == 401
        assert r.json()["error"]["code"] == "invalid_api_key"
        assert "--api-key" in r.json()["error"]["message"]
    assert httpx.get(server.url + "/health").status_code == 200  # open: for load balancers
    assert httpx.get(server.url + "/metrics").status_code == 200


def test_unknown_path_is_a_json_404(server):
    r = httpx.get(server.url + "/v1/nothing", headers=AUTH)
    assert r.status_code == 404 and "error" in r.json()


@pytest.fixture(scope="module")
def busy_server(tiny_llama, draft_dir):
    """2 running seats + 1 queued, with room for requests long enough that the queued one
    waits for seconds, not milliseconds: the fourth request meets a full queue on any machine
    (with the 128-token pool above, a slow CI machine once let the queue drain between the
    test's /metrics poll and its fourth request)."""
    args = ["--model", str(tiny_llama), "--draft", str(draft_dir), "--api-key", KEY,
            "--served-model-name", MODEL, "--kv-cache-tokens", "1024", "--max-num-seqs", "2",
            "--max-queue", "1"]
    with Server(args) as s:
        yield s


BUSY = 400  # tokens of each request that fills the busy server (the context holds 512)


def test_queue_full_is_503_with_a_clear_message(busy_server):
    """2 seats + 1 queue slot: three long requests are in flight, the fourth is refused, the
    three finish."""

    async def scenario():
        async with httpx.AsyncClient(base_url=busy_server.url, headers=AUTH, timeout=120) as c:
            async def long_request(i):
                return await c.post("/v1/chat/completions",
                                    json=_chat(f"story {i}", max_tokens=BUSY, ignore_eos=True))

            tasks = [asyncio.create_task(long_request(i)) for i in range(3)]
            await wait_for_metric(c, IN_FLIGHT, 3, tasks)
            refused = await c.post("/v1/chat/completions", json=_chat())
            still = parse_metrics((await c.get("/metrics")).text)[IN_FLIGHT]
            return refused, still, await asyncio.gather(*tasks)

    refused, still, served = asyncio.run(scenario())
    assert still == 3, "the queue drained before the fourth request: the test proves nothing"
    assert refused.status_code == 503, refused.text
    err = refused.json()["error"]
    assert err["code"] == "queue_full" and "at capacity" in err["message"]
    assert [r.status_code for r in served] == [200] * 3
    assert all(r.json()["usage"]["completion_tokens"] == BUSY for r in served)


def test_disconnect_frees_target_and_draft_pages(server):
    with httpx.stream("POST", server.url + "/v1/chat/completions", headers=AUTH, timeout=60,
                      json=_chat(max_tokens=LONG, ignore_eos=True, stream=True)) as r:
        lines = r.iter_lines()
        for _ in range(3):  # the role chunk and two tokens: the request is running
            while not next(lines):
                pass
    m = wait_idle(server.url, timeout=5)
    assert m["dspine_requests_in_flight"] == 0
    for pool in ("target", "draft"):
        assert m[f'dspine_kv_pages_used{{pool="{pool}"}}'] == 0
        assert m[f'dspine_kv_pages_reserved{{pool="{pool}"}}'] == 0
    assert m['dspine_requests_total{endpoint="chat",finish_reason="abort"}'] >= 1


def test_sigterm_finishes_in_flight_requests_then_exits_0(server, engine):
    """Last in this file: it stops the module's server."""
    from dspine_engine import SamplingParams

    text, reason = _stream_text(server.url, _chat("Tell me a story", max_tokens=40,
                                                  ignore_eos=True),
                                on_first=server.send_sigterm)
    want = engine.generate([[{"role": "user", "content": "Tell me a story"}]],
                           SamplingParams(max_tokens=40, ignore_eos=True))[0]
    assert (text, reason) == (want.text, "length")
    assert server.wait() == 0, server.text_log()  # the first SIGTERM alone stops it
    with pytest.raises(httpx.ConnectError):
        httpx.get(server.url + "/health", timeout=5)
    assert "Traceback" not in server.text_log()
