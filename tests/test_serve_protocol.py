"""How request bodies become engine parameters (no server needed)."""
import pytest

pytest.importorskip("fastapi")

from dspine_engine.serve.errors import APIError  # noqa: E402
from dspine_engine.serve.protocol import ChatCompletionRequest, CompletionRequest  # noqa: E402

MSG = [{"role": "user", "content": "hi"}]


def test_openai_defaults_not_the_engines():
    p = ChatCompletionRequest(model="m", messages=MSG).sampling_params(default_max_tokens=77)
    assert (p.temperature, p.top_p, p.top_k, p.max_tokens, p.seed) == (1.0, 1.0, 0, 77, None)


def test_max_completion_tokens_wins_over_max_tokens():
    r = ChatCompletionRequest(model="m", messages=MSG, max_tokens=5, max_completion_tokens=9)
    assert r.sampling_params(256).max_tokens == 9
    assert ChatCompletionRequest(model="m", messages=MSG, max_tokens=5).sampling_params(
        256).max_tokens == 5


def test_parameters_are_carried_over():
    r = CompletionRequest(model="m", prompt="x", temperature=0.5, top_p=0.8, top_k=7, seed=3,
                          stop="END", ignore_eos=True, max_tokens=4)
    p = r.sampling_params(256)
    assert (p.temperature, p.top_p, p.top_k, p.seed, p.stop, p.ignore_eos, p.max_tokens) == (
        0.5, 0.8, 7, 3, ["END"], True, 4)
    assert CompletionRequest(model="m", prompt="x", stop=["a", "b"]).sampling_params(
        256).stop == ["a", "b"]


def test_neutral_values_of_unsupported_parameters_pass():
    r = ChatCompletionRequest(model="m", messages=MSG, n=1, presence_penalty=0,
                              frequency_penalty=0.0, logprobs=False, tool_choice="none",
                              response_format={"type": "text"}, logit_bias={})
    r.sampling_params(256)


def test_prompts_as_the_engine_reads_them():
    assert CompletionRequest(model="m", prompt=["one"]).engine_prompt() == "one"
    assert CompletionRequest(model="m", prompt=[5, 6]).engine_prompt() == [5, 6]
    assert CompletionRequest(model="m", prompt=[[5, 6]]).engine_prompt() == [5, 6]
    parts = [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]
    r = ChatCompletionRequest(model="m", messages=[{"role": "user", "content": parts}])
    assert r.engine_prompt() == [{"role": "user", "content": "ab"}]
    with pytest.raises(APIError, match="tool calls"):
        ChatCompletionRequest(model="m", messages=[{"role": "assistant"}]).engine_prompt()
