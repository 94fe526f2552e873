"""benchmarks/serve_load.py on the tiny target (AR and a random draft), so a broken load
benchmark shows up in CI and not in a scarce GPU session."""
import json
import sys
from pathlib import Path

import pytest

pytest.importorskip("fastapi", reason="needs the serve extras (pip install -e '.[serve]')")

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))

import serve_load  # noqa: E402
from random_drafts import write_tiny_random_draft  # noqa: E402


def test_serve_load_tiny(tiny_llama, tmp_path):
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": f"Tell me about {w}."}) + "\n"
                               for w in ("rivers", "stones", "birds")))
    draft = write_tiny_random_draft(tmp_path / "draft", seed=2)
    assert serve_load.main(["--model", str(tiny_llama), "--draft", str(draft), "--concurrency",
                            "1", "3", "--requests-per-client", "1", "--max-tokens", "6",
                            "--prompts", str(prompts), "--out", str(tmp_path), "--no-doc",
                            "--quiet"]) == 0
    result = json.loads((tmp_path / "serve_load_cpu.json").read_text())
    rows = {(r["mode"], r["concurrency"]): r for r in result["rows"]}
    assert set(rows) == {("ar", 1), ("ar", 3), ("dspine", 1), ("dspine", 3)}
    for r in rows.values():
        assert r["requests"] == 8 and r["runs"][0]["output_tokens"] == 8 * 6
        assert r["requests_per_s"] > 0 and r["output_tokens_per_s"] > 0
        assert 0 < r["ttft_ms_p50"] <= r["ttft_ms_p99"]
        assert 0 < r["itl_ms_p50"] <= r["itl_ms_p99"]
        assert r["tau"] >= 1.0
    assert rows[("dspine", 3)]["greedy_equal_to_ar"] == "8/8"  # lossless through the server
