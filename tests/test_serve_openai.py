"""dspine-serve on the default model, through the real `openai` client: chat and completions,
streamed and not, autoregressive and with the shipped drafter. The text is the engine's greedy
output (for the drafter too: speculative decoding is lossless), usage counts the engine's tokens,
and streamed pieces join to the whole text."""
import subprocess
import sys

import pytest

pytest.importorskip("fastapi", reason="needs the serve extras (pip install -e '.[serve]')")
openai = pytest.importorskip("openai")

from serve_harness import Server  # noqa: E402

MODEL = "SmolLM2-135M-Instruct"
CHATS = [[{"role": "user", "content": "Write a haiku about the sea."}],
         [{"role": "system", "content": "You answer in one sentence."},
          {"role": "user", "content": "What is a prime number?"}]]
PROMPT = "The three primary colors are"
MAX_TOKENS = 12


@pytest.fixture(scope="module", params=["ar", "dspine"])
def server(request, smollm2_dir):
    draft = ["--no-draft"] if request.param == "ar" else ["--draft", "default"]
    with Server(draft) as s:
        yield s


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0,
                         timeout=120)


@pytest.fixture(scope="module")
def expected(smollm2_quant_engine):
    """The engine's greedy answers (autoregressive, in this process), on the weights the server
    loads by default on a CPU: the model's own GGUF blocks."""
    from dspine_engine import SamplingParams

    tok = smollm2_quant_engine.tokenizer
    prompts = CHATS + [tok.encode(PROMPT)]  # completions send raw text: no chat template
    return smollm2_quant_engine.generate(prompts, SamplingParams(max_tokens=MAX_TOKENS))


def _usage_matches(usage, result):
    assert usage.prompt_tokens == result.stats.prompt_tokens
    assert usage.completion_tokens == len(result.token_ids)
    assert usage.total_tokens == usage.prompt_tokens + usage.completion_tokens


@pytest.mark.parametrize("i", range(len(CHATS)))
def test_chat_equals_engine_greedy(client, expected, i):
    r = client.chat.completions.create(model=MODEL, messages=CHATS[i], temperature=0,
                                       max_completion_tokens=MAX_TOKENS)
    assert r.object == "chat.completion" and r.model == MODEL and len(r.choices) == 1
    assert r.choices[0].message.role == "assistant"
    assert r.choices[0].message.content == expected[i].text
    assert r.choices[0].finish_reason == expected[i].finish_reason
    _usage_matches(r.usage, expected[i])


def test_chat_equals_dspine_generate(client, server):
    """The same prompt through `dspine-generate` (greedy, same draft choice) gives the same
    text as the server."""
    draft = "--no-draft" if "--no-draft" in server.args else "--draft=default"
    out = subprocess.run([sys.executable, "-m", "dspine_engine.cli.generate", draft, "--quiet",
                          "--max-new-tokens", str(MAX_TOKENS), CHATS[0][0]["content"]],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    r = client.chat.completions.create(model=MODEL, messages=CHATS[0], temperature=0,
                                       max_tokens=MAX_TOKENS)
    assert out.stdout == r.choices[0].message.content + "\n"


def test_chat_stream_joins_to_the_text(client, expected):
    chunks = list(client.chat.completions.create(
        model=MODEL, messages=CHATS[0], temperature=0, max_tokens=MAX_TOKENS, stream=True,
        stream_options={"include_usage": True}))
    pieces = [c.choices[0].delta.content or "" for c in chunks if c.choices]
    assert chunks[0].choices[0].delta.role == "assistant"
    assert len([p for p in pieces if p]) > 1  # it really streamed
    assert "".join(pieces) == expected[0].text
    finish = [c.choices[0].finish_reason for c in chunks if c.choices and
              c.choices[0].finish_reason]
    assert finish == [expected[0].finish_reason]
    assert chunks[-1].choices == [] and all(c.usage is None for c in chunks[:-1])
    _usage_matches(chunks[-1].usage, expected[0])


def test_completion_equals_engine_greedy(client, expected):
    r = client.completions.create(model=MODEL, prompt=PROMPT, temperature=0,
                                  max_tokens=MAX_TOKENS)
    assert r.object == "text_completion"
    assert r.choices[0].text == expected[2].text
    _usage_matches(r.usage, expected[2])


def test_completion_stream_joins_to_the_text(client, expected):
    chunks = list(client.completions.create(model=MODEL, prompt=PROMPT, temperature=0,
                                            max_tokens=MAX_TOKENS, stream=True))
    assert "".join(c.choices[0].text for c in chunks) == expected[2].text
    assert chunks[-1].choices[0].finish_reason == expected[2].finish_reason
    assert all(c.usage is None for c in chunks)  # no include_usage: no usage chunk


def test_sampling_parameters_reach_the_engine(client, server, smollm2_quant_engine):
    """temperature, top_p, top_k (extra), seed and stop as the engine reads them: the same
    seeded sample as the engine's (autoregressive server only: a drafted sample follows the same
    distribution but not the same draw)."""
    from dspine_engine import SamplingParams

    if "--no-draft" not in server.args:
        pytest.skip("seeded draws are compared on the autoregressive server")
    params = SamplingParams(max_tokens=MAX_TOKENS, temperature=0.8, top_p=0.9, top_k=40,
                            seed=1234, stop=["\n"])
    want = smollm2_quant_engine.generate([CHATS[1]], params)[0]
    r = client.chat.completions.create(model=MODEL, messages=CHATS[1], temperature=0.8,
                                       top_p=0.9, seed=1234, stop="\n", max_tokens=MAX_TOKENS,
                                       extra_body={"top_k": 40})
    assert r.choices[0].message.content == want.text
    assert r.choices[0].finish_reason == want.finish_reason


def test_models_lists_the_served_model(client):
    models = client.models.list().data
    assert [m.id for m in models] == [MODEL]
