"""dspine_engine/lossless.py: comparing greedy outputs with a reference and measuring how close
to a tie each first difference is (what the GPU lossless tests, drafter_eval and `dspine-bench
e2e` rely on to tell a bf16 tie from a wrong accepted token)."""
from dspine_engine import SamplingParams
from dspine_engine.lossless import (NEAR_TIE_LOGITS, all_near_ties, compare_outputs,
                                    compare_with_ties, describe, first_difference, tie_gaps,
                                    tie_report)


def test_first_difference_and_compare_outputs():
    assert first_difference([1, 2, 3], [1, 2, 3]) is None
    assert first_difference([1, 2, 3], [1, 5, 3]) == 1
    assert first_difference([1, 2], [1, 2, 3]) == 2
    report = compare_outputs([[1, 2], [3, 4], [5]], [[1, 2], [3, 9], [5, 6]])
    assert report["identical"] == 1 and report["total"] == 3
    assert report["differences"] == [{"prompt": 1, "first_difference_at_token": 1},
                                     {"prompt": 2, "first_difference_at_token": 1}]


def test_ties_tell_a_tie_from_a_wrong_token(smollm2_engine, smollm2_dir, tmp_path):
    """On the default model: our fp32 greedy token is transformers' best (gap ~0), a token
    swapped in for it is far from the best, so a wrong accepted token cannot pass as a bf16 tie;
    a length difference is no tie either. The report form: equal outputs leave nothing to
    report, an unreadable target becomes an error field (a benchmark keeps its other numbers),
    and the log line says which."""
    prompt = "Write a haiku about the sea."
    ids = [smollm2_engine.encode_prompt(prompt)]
    ref = smollm2_engine.generate(prompt, SamplingParams(max_tokens=8, ignore_eos=True))[0].token_ids
    wrong = list(ref)
    wrong[5] = 1234 if ref[5] != 1234 else 1235
    gaps = tie_gaps(smollm2_dir, ids, [ref], [wrong])
    assert [(d["prompt"], d["first_difference_at_token"]) for d in gaps] == [(0, 5)]
    assert gaps[0]["gap_reference"] < 1e-3
    assert gaps[0]["gap_other"] > NEAR_TIE_LOGITS
    assert not all_near_ties(gaps)
    assert tie_gaps(smollm2_dir, ids, [ref], [ref]) == []
    assert not all_near_ties(tie_gaps(smollm2_dir, ids, [ref], [ref[:6]]))

    report = tie_report(smollm2_dir, ids, [ref], [wrong])
    assert report["gaps"] == gaps
    assert report["largest_gap"] > report["limit"] and not report["all_near_ties"]
    same = tie_report(smollm2_dir, ids, [ref], [ref])
    assert same["gaps"] == [] and same["largest_gap"] is None and same["all_near_ties"]
    assert "error" in tie_report(tmp_path / "missing", ids, [ref], [wrong])
    assert describe(compare_with_ties(smollm2_dir, ids, [ref], [ref])) == "identical 1/1"
    assert compare_with_ties(smollm2_dir, ids, [ref], [wrong])["ties"] == report
    line = describe({"identical": 0, "total": 1, "ties": report})
    assert line.startswith("identical 0/1 (NOT all at near-ties, largest gap ")
