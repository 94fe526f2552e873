"""Training prompts: the answering side (multi-turn records, the sampled share, sources, resume)
on a tiny target, and the prompt corpus builder (`dspine-train prompts`)."""
from __future__ import annotations

import json

import pytest

from dspine_engine.train.data import DataGenerator, GenerationConfig, load_prompts, read_samples


def _cli(*argv):
    from dspine_engine.cli.train import main

    assert main([str(a) for a in argv]) == 0


def _write_jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


@pytest.fixture(scope="module")
def tiny_engine(tiny_llama):
    from dspine_engine import Engine

    return Engine(tiny_llama, progress=False, max_num_seqs=8)


# ------------------------------------------------------------------------ answering (data.py)
MIXED = [{"turns": ["Write a haiku about rain.", "Now make it about snow."], "source": "writing"},
         {"prompt": "What is 7 times 8?", "source": "math"},
         {"turns": ["Name a prime.", "And a larger one?", "Their sum?"], "source": "multiturn"}]


def test_multi_turn_records_hold_the_conversation_and_target_answers(tiny_engine, tiny_llama,
                                                                    tmp_path):
    from dspine_engine import SamplingParams

    out = tmp_path / "data.jsonl"
    _cli("data", "--target", tiny_llama, "--prompts", _write_jsonl(tmp_path / "p.jsonl", MIXED),
         "--out", out, "--max-new-tokens", 6, "--quiet")
    recs = read_samples(out)
    assert [(r["index"], r.get("turn"), r.get("num_turns")) for r in recs] == [
        (0, 0, 2), (0, 1, 2), (1, None, None), (2, 0, 3), (2, 1, 3), (2, 2, 3)]
    assert [r["source"] for r in recs] == ["writing"] * 2 + ["math"] + ["multiturn"] * 3
    assert all(r["temperature"] == 0.0 for r in recs)
    tok = tiny_engine.tokenizer
    greedy = SamplingParams(max_tokens=6)
    for conv in ([recs[0], recs[1]], [recs[3], recs[4], recs[5]]):
        questions = MIXED[conv[0]["index"]]["turns"]
        messages = []
        for rec, question in zip(conv, questions):
            messages.append({"role": "user", "content": question})
            # The prompt is the whole conversation so far, rendered by the chat template, ...
            assert rec["prompt_ids"] == tok.encode_chat(messages)
            # ... and the response is the target's own answer to it.
            assert rec["response_ids"] == tiny_engine.generate([rec["prompt_ids"]],
                                                               greedy)[0].token_ids
            messages.append({"role": "assistant",
                             "content": tok.decode(rec["response_ids"]).strip()})
    # Training sees each answered turn as one sequence whose response starts after the context.
    from dspine_engine.train.trainer import SequenceData

    data = SequenceData(recs, max_len=4096)
    assert len(data) == 6 and data.starts == [len(r["prompt_ids"]) for r in recs]


def test_resume_drops_a_torn_conversation(tiny_llama, tmp_path):
    prompts = _write_jsonl(tmp_path / "p.jsonl", MIXED)
    straight = tmp_path / "straight.jsonl"
    args = ["--target", tiny_llama, "--prompts", prompts, "--max-new-tokens", 5, "--quiet"]
    _cli("data", *args, "--out", straight)
    lines = straight.read_text().splitlines(keepends=True)
    # Killed while writing the last conversation: its second turn is torn, its third missing.
    cut = tmp_path / "cut.jsonl"
    cut.write_text("".join(lines[:4]) + lines[4][:20])
    _cli("data", *args, "--out", cut)
    assert cut.read_text() == straight.read_text()
    # Killed after a whole turn but before the next one: the conversation is redone too.
    cut.write_text("".join(lines[:5]))
    _cli("data", *args, "--out", cut)
    assert cut.read_text() == straight.read_text()


def test_sampled_share_is_seeded_per_index(tiny_engine, tmp_path):
    from dspine_engine import SamplingParams

    prompts = load_prompts(_write_jsonl(tmp_path / "p.jsonl", [
        {"prompt": f"Tell me about the number {n}."} for n in range(12)]))
    cfg = GenerationConfig(max_new_tokens=8, sampled_share=0.5, chunk=5, seed=3)
    gen = DataGenerator(tiny_engine, tmp_path / "d.jsonl", cfg)
    assert gen.run(12, prompts) == 12
    recs = read_samples(tmp_path / "d.jsonl")
    temps = [r["temperature"] for r in recs]
    assert sorted(set(temps)) == [0.0, 1.0] and 2 <= temps.count(1.0) <= 10
    for r in recs:
        expect = tiny_engine.generate([r["prompt_ids"]], SamplingParams(
            max_tokens=8, temperature=r["temperature"], seed=gen._answer_seed(r["index"], 0)))
        assert r["response_ids"] == expect[0].token_ids
    # The choice depends on the index and the seed only, not on the chunking.
    other = DataGenerator(tiny_engine, tmp_path / "e.jsonl", GenerationConfig(
        max_new_tokens=8, sampled_share=0.5, chunk=12, seed=3))
    assert [other._temperature(i) for i in range(12)] == temps
    with pytest.raises(ValueError, match="sampled_share"):
        DataGenerator(tiny_engine, tmp_path / "f.jsonl", GenerationConfig(sampled_share=1.5))


def test_magpie_lines_mix_self_generation_into_a_prompts_file(tiny_llama, tmp_path):
    prompts = _write_jsonl(tmp_path / "p.jsonl", [{"prompt": "Say hi."}, {"magpie": True},
                                                  {"prompt": "Say bye.", "source": "chat"}])
    out = tmp_path / "d.jsonl"
    _cli("data", "--target", tiny_llama, "--prompts", prompts, "--out", out, "--max-new-tokens",
         4, "--user-max-tokens", 6, "--keep-truncated", "--quiet")
    recs = read_samples(out)
    assert [r["index"] for r in recs] == [0, 1, 2]
    assert "source" not in recs[0] and recs[1]["source"] == "magpie" and recs[1]["user"]
    assert recs[2]["source"] == "chat"


def test_bad_prompt_records_are_refused_with_the_line(tmp_path):
    for bad in ({"turns": ["ok", ""]}, {"turns": [3]}, {"nothing": 1}, [1, 2]):
        path = _write_jsonl(tmp_path / "bad.jsonl", [{"prompt": "fine"}, bad])
        with pytest.raises(ValueError, match="bad.jsonl:2"):
            load_prompts(path)
