"""Benchmark scripts in their --tiny modes: the same code the GPU runs, on models small enough
for the CPU, so a broken benchmark shows up here and not in a scarce GPU session."""
import importlib.machinery
import json
import math
import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parent.parent / "benchmarks"
sys.path.insert(0, str(BENCHMARKS))

import common  # noqa: E402
import cpu_attention  # noqa: E402
import round_timeline  # noqa: E402
import step_table  # noqa: E402
import tp_bench  # noqa: E402
from random_drafts import write_tiny_random_draft  # noqa: E402

TIMES = ("draft_ms", "verify_ms", "block_verify_ms", "round_ms", "floor_ms", "floor_kv_ms",
         "round_over_floor", "round_over_floor_kv")


def test_benchmark_modules_do_not_shadow_installed_modules():
    """A benchmark script runs with benchmarks/ first on sys.path (and this file puts it there
    for the whole test process), so a module there named like an installed one replaces it for
    every importer: benchmarks/kernels.py did that to HF's `kernels` package, which transformers
    imports when it is installed (191 test errors in a fresh environment)."""
    others = [p for p in sys.path if p and Path(p).resolve() != BENCHMARKS]
    clashes = {p.stem: spec.origin for p in BENCHMARKS.glob("*.py")
               if (spec := importlib.machinery.PathFinder.find_spec(p.stem, others)) is not None}
    clashes.update({p.stem: "built in" for p in BENCHMARKS.glob("*.py")
                    if p.stem in sys.builtin_module_names})
    assert not clashes, f"benchmarks/ modules that shadow installed ones: {clashes}"


def test_step_table_tiny(tmp_path, capsys):
    block_verify = round_timeline.ops.block_verify
    assert step_table.main(["--tiny", "--iters", "1", "--timeline", "--out", str(tmp_path)]) == 0
    assert round_timeline.ops.block_verify is block_verify  # the timeline's wrappers are gone
    (path,) = tmp_path.glob("step_table_*_tiny.json")
    result = json.loads(path.read_text())
    assert result["complete"] and result["tiny"]
    batches, contexts = step_table.DEFAULTS[True]
    assert [(r["batch"], r["context"]) for r in result["rows"]] == [
        (b, c) for c in contexts for b in batches]
    assert result["ceilings"]["copy_GBps"] > 0
    assert result["target"]["weight_bytes"] > 0 and result["draft"]["weight_bytes"] > 0
    for row in result["rows"]:
        for key in TIMES:
            assert math.isfinite(row[key]) and row[key] > 0, (key, row)
        assert row["kv_bytes"] > 0
        # each graph's weights: the verify's are the target's less its embedding, the draft's
        # its own and the lm_head; the round's floor counts the two models' weights once
        assert 0 < row["draft_floor_ms"] < row["verify_floor_ms"] < row["floor_ms"]
        # --timeline: every engine call of the round, in order, then the rest; on the CPU the
        # device clock is the host's, so the two columns agree
        timeline = row["round_timeline"]
        assert list(timeline) == [f"{o}.{m}" for o, m in round_timeline.ROUND_CALLS] + ["end"]
        for call in timeline.values():
            assert call["host_us"] > 0 and call["device_us"] == pytest.approx(call["host_us"], abs=50)
    # No relation between the timings is asserted: one iteration on a shared 2-core machine
    # swings by seconds (a round measured faster than its draft alone under load).
    table = capsys.readouterr().out
    assert "| batch | context |" in table and str(path) in table
    assert "| runner.verify |" in table


def test_step_table_graph_kernels_say_the_idle_time():
    """--kernels' per-graph table (CUDA only, so its text is checked here on a made-up profile):
    the replay time no kernel covered (the union of the kernels' intervals: chained kernels
    overlap, so their summed time can exceed the replay), as microseconds and a share, then the
    largest kernels."""
    table = {"launches": 3.0, "busy_us": 2100.0, "covered_us": 1500.0,
             "kernels": [{"name": "gemm", "launches": 2.0, "us": 1200.0},
                         {"name": "norm", "launches": 1.0, "us": 300.0}]}
    row = {"batch": 8, "context": 1024, "draft_graph_ms": 2.0, "draft_kernels": table,
           "draft_floor_ms": 1.25}
    text = step_table.graph_kernels_markdown(row, "draft", top=1)
    assert text.startswith("Draft graph alone at batch 8, context 1024: 2.000 ms a replay (its "
                           "weights read once: 1.250 ms), 500 us of it with no kernel running (25%)")
    assert "| gemm | 2.0 | 1200.0 |" in text and "| norm |" not in text
    assert "(us by kind: GEMM 1,200, other 300)" in text


def test_kernel_kinds_name_what_the_round_spends_on():
    """The round's kernels by kind, from torch.profiler's names: cuBLAS's and ours (GEMMs, the
    split-K reduce with them), the attention with its split combine, the elementwise kernels, the
    walk and verify; the rest "other"."""
    names = {"nvjet_sm90_tst_192x16_64x8_2x1_v_bz_TNT": 100.0,
             "void dspine::gpu::dense_sm90_kernel<__nv_bfloat16, 128, 1, 1, true>(": 40.0,
             "void cublasLt::splitKreduce_kernel<32, 16, int, float>(": 5.0,
             "void dspine::gpu::paged_attention_mma_kernel<__nv_bfloat16, 128, false>(": 12.0,
             "void dspine::gpu::combine_splits_kernel<__nv_bfloat16, 128>(": 3.0,
             "void dspine::gpu::rms_norm_kernel<__nv_bfloat16, 8>(": 6.0,
             "void dspine::gpu::rope_write_kv_kernel<__nv_bfloat16, 8>(": 4.0,
             "void dspine::gpu::walk_topk_kernel<__nv_bfloat16, 8>(": 7.0,
             "void dspine::gpu::block_verify_kernel<__nv_bfloat16>(": 2.0,
             "Memset (Device)": 1.0}
    table = {"kernels": [{"name": n, "launches": 1.0, "us": us} for n, us in names.items()]}
    assert common.kernel_kinds(table) == {"attention": 15.0, "walk / verify": 9.0, "GEMM": 145.0,
                                          "norm / RoPE / SiLU": 10.0, "other": 1.0}


def test_covered_time_is_the_union_of_the_intervals():
    """Overlapping kernels (chained launches) count once; gaps not at all; order does not matter."""
    assert common.covered_us([(0, 10), (5, 12), (20, 25), (21, 22)]) == 17
    assert common.covered_us([(20, 25), (0, 10), (10, 11)]) == 16
    assert common.covered_us([]) == 0


def test_step_table_tiny_hybrid_target(tmp_path, capsys):
    """The hybrid target's table: the ReplaySSM commit timed in every row, the rollback
    alternatives (replay vs stored states) at its shape, the recurrent state in the floor."""
    assert step_table.main(["--tiny", "--target", "qwen3.8-27b", "--batches", "2", "--contexts",
                            "32", "--iters", "1", "--out", str(tmp_path)]) == 0
    (path,) = tmp_path.glob("step_table_*_tiny_qwen38-27b.json")
    result = json.loads(path.read_text())
    assert "Gated DeltaNet" in result["target"]["hybrid"]
    (row,) = result["rows"]
    for key in TIMES + ("commit_ms",):
        assert math.isfinite(row[key]) and row[key] > 0, (key, row)
    (roll,) = result["rollback"]
    assert roll["batch"] == 2 and roll["layers"] == 6
    assert 0 < roll["replay_bytes_per_seq"] < roll["stored_bytes_per_seq"]
    for key in ("plain_round_us", "replay_round_us", "stored_round_us"):
        assert math.isfinite(roll[key]) and roll[key] > 0, (key, roll)
    assert "ring verify + replay ms" in capsys.readouterr().out


def test_gated_delta_tiny_checks_transformers_on_gqa_heads(tmp_path, capsys):
    """A layer with 3 value heads per key head: transformers' functions get q/k repeated per
    value-head group (issue 14) and every row they are timed in carries the error of their
    outputs against ours, checked before the timing."""
    import gated_delta

    assert gated_delta.main(["--tiny", "--batches", "2", "--iters", "1", "--no-reference",
                             "--out", str(tmp_path)]) == 0
    result = json.loads((tmp_path / "gated_delta_cpu_tiny.json").read_text())
    assert result["tiny"] and result["layer"]["hv"] == 3 * result["layer"]["hk"]
    compared = [r for r in result["kernels"] if r["transformers_us"] is not None]
    ops_compared = {r["op"].split()[0].rstrip(",") for r in compared}
    assert ops_compared == {"decode", "verify", "conv1d", "prefill"}
    for row in compared:
        assert 0 <= row["transformers_rel_err"] < 1e-4, row
    assert "| transformers rel. err |" in capsys.readouterr().out


def test_train_vs_engine_tau_on_a_tiny_target(tiny_llama, tmp_path):
    """Both numbers on the same data: a tiny target, a random draft, self-generated records."""
    import train_vs_engine_tau
    from dspine_engine.cli.train import main as train_main

    data = tmp_path / "data.jsonl"
    assert train_main(["data", "--target", str(tiny_llama), "--out", str(data), "--num", "4",
                       "--user-max-tokens", "6", "--max-new-tokens", "24", "--keep-truncated",
                       "--quiet"]) == 0
    write_tiny_random_draft(tmp_path / "draft", seed=3)
    assert train_vs_engine_tau.main(["--data", str(data), "--target", str(tiny_llama), "--draft",
                                     str(tmp_path / "draft"), "--max-new-tokens", "24",
                                     "--out", str(tmp_path)]) == 0
    result = json.loads((tmp_path / "train_vs_engine_tau.json").read_text())
    assert result["records"] == 4 and result["engine"]["responses_identical_to_data"] == "4/4"
    for side in ("trainer", "engine"):
        assert 1.0 <= result[side]["tau"] <= 16.0


def test_engine_timeline_on_a_tiny_target(tiny_llama, tmp_path, capsys):
    """benchmarks/engine_timeline.py on the CPU: an engine's rounds back to back, each call of
    the round in the table (the draft's only in the DSpine rows), the whole batch's tokens
    counted, and the engine's methods its own again afterwards."""
    import engine_timeline
    from dspine_engine import ops

    block_verify = ops.block_verify
    write_tiny_random_draft(tmp_path / "draft", seed=3)
    assert engine_timeline.main(["--device", "cpu", "--concurrency", "1", "2", "--max-new-tokens",
                                 "12", "--skip", "1", "--target", str(tiny_llama), "--draft",
                                 str(tmp_path / "draft"), "--out", str(tmp_path)]) == 0
    assert ops.block_verify is block_verify
    rows = json.loads((tmp_path / "engine_timeline_cpu.json").read_text())["rows"]
    assert [(r["engine"], r["batch"]) for r in rows] == [("dspine", 1), ("dspine", 2), ("ar", 1),
                                                         ("ar", 2)]
    for row in rows:
        calls = [f"{o}.{m}" for o, m in round_timeline.ROUND_CALLS
                 if row["engine"] == "dspine" or m != "propose"]
        assert list(row["calls"]) == calls + ["end"], row["calls"]
        assert row["rounds"] > 0 and row["tokens_per_second"] > 0
        # the forwards and the block verify are part of the round, not all of it
        assert 0 < row["device_busy_us"] < row["round_us"] and row["device_waits_us"] > 0
        assert (row["tokens_per_round"] >= 1.0 if row["engine"] == "dspine"
                else row["tokens_per_round"] == 1.0)
    assert "| runner.read_back |" in capsys.readouterr().out
    # Overlapped rounds: a step launches one round and reads the one before it back.
    assert engine_timeline.main(["--device", "cpu", "--concurrency", "2", "--engines", "dspine",
                                 "--overlap", "on", "--max-new-tokens", "12", "--skip", "1",
                                 "--target", str(tiny_llama), "--draft", str(tmp_path / "draft"),
                                 "--out", str(tmp_path)]) == 0
    [row] = json.loads((tmp_path / "engine_timeline_cpu.json").read_text())["rows"]
    assert row["overlap"] == "on" and row["rounds"] > 0 and row["tokens_per_round"] >= 1.0
    assert "dspine (overlapped), concurrency 2" in capsys.readouterr().out


def test_host_overhead_data_mode(tmp_path, capsys):
    """The generator's loop with stubbed forwards: rows for each admission setting, and batched
    admission runs fewer prefill steps (the step counts are deterministic: seeded stubs)."""
    import host_overhead

    assert host_overhead.main(["--modes", "data", "--batches", "8", "--admission", "1", "4",
                               "--samples-per-seat", "3", "--out", str(tmp_path), "--no-doc"]) == 0
    rows = json.loads((tmp_path / "host_overhead_cpu.json").read_text())["rows"]
    by_admission = {r["admission_batch"]: r for r in rows}
    assert sorted(by_admission) == [1, 4]
    for r in rows:
        assert r["tokens_per_s"] > 0 and r["decode_step_us"] > 0 and r["steps"] > 20
        assert 0 < r["tokens_per_decode_step"] <= 8
    assert by_admission[4]["prefill_share"] < by_admission[1]["prefill_share"]
    assert "| engine | batch | admission |" in capsys.readouterr().out


def test_host_overhead_pair_mode(tmp_path):
    """fixed and auto engines stepped in turn: a row for each and one for their paired
    difference, per round and per sequence."""
    import host_overhead

    assert host_overhead.main(["--modes", "pair", "--batches", "2", "--rounds", "5",
                               "--out", str(tmp_path), "--no-doc"]) == 0
    rows = json.loads((tmp_path / "host_overhead_cpu.json").read_text())["rows"]
    by_mode = {r["mode"]: r for r in rows}
    assert sorted(by_mode) == ["pair: auto - spec", "pair: spec", "pair: spec_auto"]
    assert by_mode["pair: spec"]["us_per_round"] > 0
    assert by_mode["pair: spec_auto"]["us_per_round"] > 0
    for r in rows:
        assert r["batch"] == 2 and math.isfinite(r["us_per_round"])
        assert r["us_per_seq"] == r["us_per_round"] / 2


def test_cpu_attention_times_ours_and_sdpa_on_the_same_answer(tmp_path, capsys):
    assert cpu_attention.main(["--reps", "1", "--context", "20", "--out", str(tmp_path)]) == 0
    result = json.loads((tmp_path / "cpu_attention.json").read_text())
    assert [(r["mode"], r["batch"]) for r in result["rows"]] == [
        (m, b) for m, b, _ in cpu_attention.CASES]
    for row in result["rows"]:
        assert row["ours_us"] > 0 and row["sdpa_us"] > 0 and row["rel_err_vs_sdpa"] < 1e-5
    assert "| mode | batch |" in capsys.readouterr().out


def test_tp_bench_on_the_cpu(tmp_path, capsys):
    """benchmarks/tp_bench.py end to end at its smallest: the random checkpoint and draft it
    writes load through the engine at TP 1 and 2 (gloo), speculative rounds run, the two sizes
    answer alike, and the all-reduce of a round's rows is timed for TP 2."""
    assert tp_bench.main(["--tp", "1", "2", "--batches", "2", "--tokens", "4", "--trials", "1",
                          "--draft", "--workdir", str(tmp_path / "work"), "--out",
                          str(tmp_path), "--no-doc"]) == 0
    result = json.loads((tmp_path / "tp_cpu.json").read_text())
    rows = {r["tp"]: r for r in result["rows"]}
    assert set(rows) == {1, 2} and all(r["batch"] == 2 for r in rows.values())
    assert all(r["identical"] and r["tokens_per_second"] > 0 and r["steps"] > 0
               for r in rows.values())
    assert rows[1]["step_allreduce_ms"] == 0 and rows[2]["step_allreduce_ms"] > 0
    assert result["target_bytes"] > 0 and result["draft_bytes"] > 0
    assert "| 2 | 2 |" in capsys.readouterr().out


def _sass_csv(path, rows):
    """An ncu source-page export's shape: kernel row, header row, one row per instruction."""
    header = ["Address", "Source", "Warp Stall Sampling (All Samples)", "Instructions Executed",
              "stall_long_sb", "stall_wait", "stall_wait (Not Issued)"]
    lines = ['"Kernel Name","void k(int)",', ",".join(f'"{h}"' for h in header)]
    lines += [",".join(f'"{v}"' for v in row) for row in rows]
    path.write_text("\n".join(lines) + "\n")


def test_ncu_sass_summary_groups_opcodes_loops_and_hot_instructions(tmp_path, capsys):
    import ncu_sass_summary
    path = tmp_path / "k_sass.csv"
    _sass_csv(path, [  # address, source, samples, executed, long_sb, wait, wait (not issued)
        ("0x1000", "      LDG.E.128 R4, desc[UR4][R2.64]", "1", "10", "1", "0", "9"),
        ("0x1010", "@!P0  FFMA R5, R4, R6, R5", "30", "40", "28", "2", "9"),
        ("0x1020", "      FFMA R7, R4, R6, R7", "5", "40", "0", "5", "9"),
        ("0x1030", "@P1   BRA 0x1010", "4", "40", "0", "4", "9"),
        ("0x1040", "      EXIT", "0", "10", "0", "0", "0"),
    ])
    kernel, instrs = ncu_sass_summary.read_sass_csv(str(path))
    assert kernel == "void k(int)" and [i.opcode for i in instrs] == ["LDG", "FFMA", "FFMA", "BRA", "EXIT"]
    assert instrs[1].stalls == {"long_sb": 28, "wait": 2}  # the not-issued column is not a reason
    assert ncu_sass_summary.loops(instrs) == [(1, 3)]
    assert ncu_sass_summary.main([str(path), "--top", "3"]) == 0
    out = capsys.readouterr().out
    assert "5 SASS instructions, 140 executed (warp level), 40 stall samples" in out
    assert "| FFMA | 80 | 57.1 | 35 | 87.5 | long_sb |" in out          # two FFMAs summed
    assert "| 0x10-0x30 | 3 | 120 | 85.7 | 39 | 97.5 |" in out          # the loop's body
    assert "| 0x10 | `@!P0  FFMA R5, R4, R6, R5` | 30 | 75.0 | 40 | long_sb 28, wait 2 |" in out
    assert "stall reasons: long_sb 72.5%, wait 27.5%" in out


def test_ncu_sass_summary_refuses_a_file_that_is_not_an_export(tmp_path, capsys):
    import ncu_sass_summary
    path = tmp_path / "other.csv"
    path.write_text('"a","b"\n"1","2"\n')
    assert ncu_sass_summary.main([str(path)]) == 2
    assert "no 'Address' header row" in capsys.readouterr().err


def test_sass_landmarks_keeps_the_order_and_counts_runs(tmp_path, capsys):
    """cuobjdump's layout: runs of one landmark kind fold into a line with their count, other
    instructions between two runs show as +n, an address window cuts both ends."""
    import sass_landmarks
    path = tmp_path / "k.sass"
    path.write_text("\n".join([
        "        Function : k",
        "        /*0000*/                   HGMMA.64x128x16.F32.BF16 R88, gdesc[UR20], RZ, !UPT ;",
        "        /*0010*/                   HGMMA.64x128x16.F32.BF16 R88, gdesc[UR20], R88, gsb0 ;",
        "        /*0020*/                   FMUL.FTZ R24, R24, R7 ;",
        "        /*0030*/                   WARPGROUP.DEPBAR.LE gsb0, 0x0 ;",
        "        /*0040*/                   FMNMX.FTZ R7, R190, R89, !PT ;",
        "        /*0050*/                   MUFU.EX2 R7, R7 ;",
        "        /*0060*/                   MUFU.EX2 R8, R8 ;",
        "        /*0070*/              @!P0 BRA 0x0 ;",
        "        /*0080*/                   EXIT ;",
    ]) + "\n")
    instrs = sass_landmarks.instructions(path.read_text())
    assert len(instrs) == 9 and instrs[6] == (0x60, "MUFU.EX2 R8, R8")
    runs = sass_landmarks.landmarks(instrs)
    assert [(r[1], r[2], r[4]) for r in runs] == [
        ("wgmma", 2, 0), ("wgmma wait", 1, 1), ("max", 1, 0), ("exp2", 2, 0), ("branch", 1, 0)]
    assert [r[1] for r in sass_landmarks.landmarks(instrs, 0x30, 0x50)] == ["wgmma wait", "max", "exp2"]
    assert sass_landmarks.main([str(path), "--from", "0x30", "--to", "0x60"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].endswith("0x00030 wgmma wait x1: WARPGROUP.DEPBAR.LE gsb0, 0x0") and len(out) == 3
    assert "exp2 x2: MUFU.EX2 R7, R7" in out[2]


def test_the_sm90_kernel_is_built_with_no_part_cut():
    """`h200_quick.sh prefill-cuts` rewrites DSPINE_SM90_CUTS on the GPU machine to time the
    prefill with a part removed, and puts 0 back; a cut value committed by mistake would build a
    kernel with wrong outputs that only a GPU test run would catch, so the CPU checks the value."""
    header = BENCHMARKS.parent / "csrc" / "cuda" / "attention_sm90_cuts.h"
    defines = [line.split() for line in header.read_text().splitlines() if line.startswith("#define DSPINE_SM90_CUTS")]
    assert defines == [["#define", "DSPINE_SM90_CUTS", "0"]]
    quick = (BENCHMARKS / "h200_quick.sh").read_text()
    assert 's/^#define DSPINE_SM90_CUTS .*/#define DSPINE_SM90_CUTS 0/' in quick  # the word restores it


def test_prefill_ttft_rows_on_a_tiny_target(tiny_llama, tmp_path, capsys):
    """benchmarks/prefill_ttft.py at its smallest on the CPU: a row per length and batch, both
    settings timed, and (the knob being CUDA-only) both choosing the same first tokens."""
    import prefill_ttft

    assert prefill_ttft.main(["--target", str(tiny_llama), "--device", "cpu", "--dtype", "float32",
                              "--lengths", "12", "30", "--batches", "1", "2", "--reps", "2",
                              "--out", str(tmp_path), "--no-doc"]) == 0
    rows = json.loads((tmp_path / "prefill_ttft_cpu.json").read_text())["rows"]
    assert [(r["length"], r["batch"]) for r in rows] == [(12, 1), (12, 2), (30, 1), (30, 2)]
    for r in rows:
        assert all(ms > 0 for ms in r["ms"].values()) and len(r["ms"]) == 2
        assert r["same_first_tokens"] is True
    assert "| prompt tokens | batch |" in capsys.readouterr().out
