"""The command-line tools, run as a user would (subprocesses)."""
import json
import subprocess
import sys

import pytest

from random_drafts import write_tiny_random_draft


def _run(args, stdin=None, env_extra=None):
    import os

    env = dict(os.environ, **(env_extra or {}))
    return subprocess.run([sys.executable, "-m"] + args, input=stdin, capture_output=True,
                          text=True, timeout=600, env=env)


@pytest.mark.parametrize("tool", ["dspine_engine.cli.generate", "dspine_engine.cli.bench",
                                  "dspine_engine.cli.train"])
def test_help_explains(tool):
    out = _run([tool, "--help"])
    assert out.returncode == 0 and "usage:" in out.stdout
    assert len(out.stdout.splitlines()) > 8


def test_generate_streams_answer_and_stats(tiny_llama):
    out = _run(["dspine_engine.cli.generate", "--model", str(tiny_llama), "--max-new-tokens",
                "12", "--quiet", "--json-stats", "Hello there"])
    assert out.returncode == 0, out.stderr
    stats = json.loads(out.stderr.strip().splitlines()[-1])
    assert stats["new_tokens"] == 12 or stats["finish_reason"] == "stop"
    assert stats["tokens_per_second"] > 0 and stats["device"] == "cpu"


def test_generate_reads_stdin_and_raw_mode(tiny_llama):
    out = _run(["dspine_engine.cli.generate", "--model", str(tiny_llama), "--no-chat",
                "--max-new-tokens", "5", "--quiet"], stdin="Once upon a time")
    assert out.returncode == 0, out.stderr
    assert "tok/s" in out.stderr.splitlines()[-1]


@pytest.mark.parametrize("args,message", [
    (["--temperature", "-1"], "temperature"),
    (["--top-p", "2"], "top_p"),
    (["--model", "/no/such/model"], "not found"),
    (["--spec-policy", "greedy"], "invalid choice: 'greedy'"),
    (["--num-speculative-tokens", "0"], "must be a positive integer, got '0'"),
    (["--num-speculative-tokens", "x"], "must be a positive integer, got 'x'"),
    (["--tensor-parallel-size", "0"], "must be a positive integer, got '0'"),
    (["--tensor-parallel-size", "3"], "tensor_parallel_size 3 does not divide the target's "
                                      "num_attention_heads (4)"),
    (["--kv-cache-dtype", "fp8"], "invalid choice: 'fp8'"),
    (["--kv-cache-dtype", "bfloat16"], "kv_cache_dtype='bfloat16' cannot run with a float32 "
                                       "model on cpu"),
])
def test_generate_errors_are_clear(tiny_llama, args, message):
    base = ["dspine_engine.cli.generate", "--quiet", "--model", str(tiny_llama)]
    out = _run(base + args + ["hi"])
    assert out.returncode != 0 and message in out.stderr
    assert "Traceback" not in out.stderr


def test_generate_with_draft_prints_tau(tiny_llama, tmp_path):
    write_tiny_random_draft(tmp_path / "draft", seed=1)
    out = _run(["dspine_engine.cli.generate", "--model", str(tiny_llama), "--draft",
                str(tmp_path / "draft"), "--max-new-tokens", "20", "--quiet", "--json-stats",
                "Hi"])
    assert out.returncode == 0, out.stderr
    stats = json.loads(out.stderr.strip().splitlines()[-1])
    assert stats["tau"] >= 1.0 and len(stats["acceptance_by_position"]) == 15
    assert stats["spec_policy"] == "auto" and stats["path"]
    assert sum(stats["verify_lengths"].values()) == stats["rounds"]


def test_generate_more_drafts_than_the_block_is_a_clear_error(tiny_llama, tmp_path):
    write_tiny_random_draft(tmp_path / "draft", seed=1)
    out = _run(["dspine_engine.cli.generate", "--model", str(tiny_llama), "--draft",
                str(tmp_path / "draft"), "--num-speculative-tokens", "16", "--quiet", "Hi"])
    assert out.returncode == 1 and "num_speculative_tokens 16 exceeds" in out.stderr
    assert "Traceback" not in out.stderr


@pytest.mark.parametrize("argv,device,expected", [
    ([], "cuda", "default"),       # the shipped drafter; the auto policy drafts where it pays
    ([], "cpu", None),             # it does not pay on the CPU yet: autoregressive
    (["--spec-policy", "fixed"], "cuda", "default"),
    (["--spec-policy", "fixed"], "cpu", None),
    (["--draft", "default"], "cpu", "default"),
    (["--no-draft"], "cuda", None),
    (["--model", "some/dir"], "cuda", None),  # the shipped drafter fits SmolLM2 only
    (["--draft", "my/draft"], "cpu", "my/draft"),
])
def test_generate_draft_choice(argv, device, expected):
    from dspine_engine.cli.generate import _draft_choice, build_parser

    args = build_parser().parse_args(argv + ["--device", device, "--quiet", "hi"])
    assert _draft_choice(args) == expected


@pytest.mark.parametrize("argv,expected", [([], "auto"), (["--draft-block", "full"], "full"),
                                           (["--draft-block", "verified"], "verified")])
def test_generate_draft_block_reaches_the_engine_settings(argv, expected):
    from dspine_engine.cli.generate import build_parser, spec_settings

    args = build_parser().parse_args(argv + ["--quiet", "hi"])
    assert spec_settings(args)["draft_block"] == expected


@pytest.mark.parametrize("argv,expected", [([], "exact"), (["--attention", "fast"], "fast")])
def test_attention_flag_reaches_the_engine_settings(argv, expected):
    from dspine_engine.cli.bench import build_parser as bench_parser
    from dspine_engine.cli.generate import build_parser, spec_settings

    assert spec_settings(build_parser().parse_args(argv + ["--quiet", "hi"]))["attention"] == expected
    assert bench_parser().parse_args(["e2e"] + argv).attention == expected
    with pytest.raises(SystemExit):
        build_parser().parse_args(["--attention", "exactly", "hi"])


@pytest.mark.parametrize("argv,expected", [([], "float32"), (["--kv-cache-dtype", "float16"],
                                                             "float16")])
def test_kv_cache_dtype_flag_reaches_the_engine(tiny_llama, argv, expected):
    """On a float32 model auto keeps the cache float32; float16 halves it (the CPU mixes)."""
    from dspine_engine.cli.bench import build_parser as bench_parser

    out = _run(["dspine_engine.cli.generate", "--model", str(tiny_llama), "--max-new-tokens", "5",
                "--quiet", "--json-stats"] + argv + ["Hi"])
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stderr.strip().splitlines()[-1])["kv_cache_dtype"] == expected
    for cmd in ("e2e", "accept"):
        rest = ["--draft", "x"] if cmd == "accept" else []
        assert bench_parser().parse_args([cmd] + rest + argv).kv_cache_dtype == (
            "auto" if not argv else expected)


def test_generate_default_drafter_on_the_default_model():
    out = _run(["dspine_engine.cli.generate", "--draft", "default", "--device", "cpu",
                "--max-new-tokens", "24", "--quiet", "--json-stats", "Write a Python hello world."])
    assert out.returncode == 0, out.stderr
    stats = json.loads(out.stderr.strip().splitlines()[-1])
    assert stats["tau"] >= 1.0 and len(stats["acceptance_by_position"]) == 15
    assert out.stdout.strip()


def test_bench_accept_writes_json_and_plot(tiny_llama, tmp_path):
    write_tiny_random_draft(tmp_path / "draft", seed=2)
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text('{"prompt": "Hello"}\n{"messages": [{"role": "user", "content": "Hi"}]}\n')
    out = _run(["dspine_engine.cli.bench", "accept", "--target", str(tiny_llama), "--draft",
                str(tmp_path / "draft"), "--prompts", str(prompts), "--max-new-tokens", "20",
                "--out", str(tmp_path / "res"), "--name", "acc", "--quiet"])
    assert out.returncode == 0, out.stderr
    res = json.loads((tmp_path / "res" / "acc.json").read_text())
    assert res["num_prompts"] == 2 and res["rounds"] > 0 and res["tau"] >= 1.0
    assert len(res["acceptance_by_position"]) == 15
    assert (tmp_path / "res" / "acc.png").stat().st_size > 1000


def test_generate_invalid_utf8_on_stdin(tiny_llama):
    out = subprocess.run([sys.executable, "-m", "dspine_engine.cli.generate", "--model",
                          str(tiny_llama), "--quiet"], input=b"caf\xe9 \xff", capture_output=True,
                         timeout=600)
    err = out.stderr.decode()
    assert out.returncode == 2 and "not valid UTF-8" in err and "Traceback" not in err


def test_generate_into_a_closed_pipe(tiny_llama):
    """`dspine-generate ... | head -c 1`: the reader leaves early; no traceback."""
    cmd = (f"{sys.executable} -m dspine_engine.cli.generate --model {tiny_llama} --quiet "
           "--no-chat --max-new-tokens 64 --temperature 1 --seed 1 'Once upon a time' | head -c 1")
    out = subprocess.run(["bash", "-o", "pipefail", "-c", cmd], capture_output=True, text=True,
                         timeout=600)
    assert len(out.stdout) == 1 and "Traceback" not in out.stderr, out.stderr
    assert out.returncode in (0, 141)


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="checks the no-CUDA message")
def test_generate_cuda_without_cuda(tiny_llama):
    out = _run(["dspine_engine.cli.generate", "--model", str(tiny_llama), "--device", "cuda",
                "--quiet", "hi"])
    assert out.returncode == 1 and "CUDA is not available" in out.stderr
    assert "Traceback" not in out.stderr


def test_bench_e2e_stop_at_eos_ends_answers_where_the_model_does(smollm2_engine):
    """`dspine-bench e2e --stop-at-eos` counts the answers users get; the default counts fixed-
    length answers (the model writes on past its end-of-sequence token)."""
    from dspine_engine.cli.bench import throughput

    prompts = ["Answer with one word: what colour is the sky?", "Say hello."]
    eos = smollm2_engine.tokenizer.eos_token_ids
    fixed, fixed_ids = throughput(smollm2_engine, prompts, 48, 2)
    real, real_ids = throughput(smollm2_engine, prompts, 48, 2, stop_at_eos=True)
    assert all(len(ids) == 48 for ids in fixed_ids) and fixed["tokens"] == 96
    assert all(len(ids) < 48 and ids[-1] in eos for ids in real_ids)
    assert real["tokens"] == sum(len(ids) for ids in real_ids)
    assert all(f[:len(r)] == r for f, r in zip(fixed_ids, real_ids))
    # A concurrency above the prompt count is recorded with the requests that ran.
    capped, _ = throughput(smollm2_engine, prompts, 4, 8)
    assert capped["concurrency"] == 8 and capped["requests"] == 2 and fixed["requests"] == 2
    # Both requests ran every fixed-length round together; with EOS the batch drained as they
    # ended (plain decoding: a round a token after the prefill's first).
    steps = [len(ids) - 1 for ids in real_ids]
    assert fixed["mean_batch"] == 2.0
    assert real["mean_batch"] == pytest.approx(sum(steps) / max(steps))
