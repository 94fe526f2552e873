"""Greedy outputs against a reference: which ones differ, where, and how close to a tie the
target was there.

On the CPU (fp32) speculative output equals autoregressive output token for token. On a GPU in
bf16 a verify row and the same row decoded run different kernels (GEMM shapes, attention
variants), so where the target's two best tokens are within bf16 rounding the greedy choice can
go either way (docs/DECISIONS.md, "What lossless means on a GPU"; the engine's default row-exact
attention removes the attention's part, `attention="fast"` keeps it). `tie_gaps` measures that:
at each output's first difference, how far each of the two tokens is below the target's best
fp32 logit, computed by transformers (an implementation independent of ours). A bf16 tie shows
both gaps near 0; a wrong accepted token sits several logits below the best.
"""
from __future__ import annotations

# Both tokens within this many logits of the best fp32 logit: a tie for a bf16 forward. The
# default model's bf16 logits differ from fp32 by ~0.1-0.3 (30 layers of bf16 rounding).
NEAR_TIE_LOGITS = 0.5


def first_difference(a: list[int], b: list[int]) -> int | None:
    """The first position where two token lists differ (the shorter one's end counts), or None."""
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def compare_outputs(ref: list[list[int]], got: list[list[int]]) -> dict:
    """How many greedy outputs equal the reference, and where the others first differ."""
    diffs = [{"prompt": i, "first_difference_at_token": first_difference(a, b)}
             for i, (a, b) in enumerate(zip(ref, got)) if a != b]
    return {"identical": len(ref) - len(diffs), "total": len(ref), "differences": diffs[:20]}


def tie_gaps(model_dir, prompt_ids: list[list[int]], ref: list[list[int]],
             got: list[list[int]]) -> list[dict]:
    """For each output that differs from its reference: the prompt's index, the first differing
    position and, under the target's fp32 logits after the prompt and the common prefix, how far
    below the best the reference's token (``gap_reference``) and the other one (``gap_other``)
    are; a length difference (no token to compare) reads as infinite gaps. Needs transformers
    (the ``bench`` or ``test`` extra) and a model directory it can read."""
    import torch
    from transformers import AutoModelForCausalLM

    model = None
    gaps = []
    for i, (g, r) in enumerate(zip(got, ref)):
        pos = first_difference(r, g)
        if pos is None:
            continue
        if pos >= min(len(g), len(r)):
            gaps.append({"prompt": i, "first_difference_at_token": pos,
                         "gap_reference": float("inf"), "gap_other": float("inf")})
            continue
        if model is None:
            model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32).eval()
        with torch.no_grad():
            logits = model(torch.tensor([list(prompt_ids[i]) + r[:pos]])).logits[0, -1]
        best = logits.max().item()
        gaps.append({"prompt": i, "first_difference_at_token": pos,
                     "gap_reference": round(best - logits[r[pos]].item(), 4),
                     "gap_other": round(best - logits[g[pos]].item(), 4)})
    return gaps


def all_near_ties(gaps: list[dict], limit: float = NEAR_TIE_LOGITS) -> bool:
    """Every first difference is a tie: both tokens within ``limit`` of the best logit."""
    return all(max(d["gap_reference"], d["gap_other"]) <= limit for d in gaps)


def tie_report(model_dir, prompt_ids, ref, got) -> dict:
    """`tie_gaps` of the outputs that differ, the largest gap and whether all are near-ties; the
    error instead where the target cannot be read in fp32 by transformers (not installed, or a
    GGUF-only target), so a benchmark keeps its other numbers."""
    try:
        gaps = tie_gaps(model_dir, prompt_ids, ref, got)
    except Exception as e:  # a report field, not a reason to lose the run's other numbers
        return {"error": f"{type(e).__name__}: {e}"}
    largest = max((max(d["gap_reference"], d["gap_other"]) for d in gaps), default=None)
    return {"gaps": gaps, "largest_gap": largest, "limit": NEAR_TIE_LOGITS,
            "all_near_ties": all_near_ties(gaps)}


def compare_with_ties(model_dir, prompt_ids, ref, got) -> dict:
    """`compare_outputs`, and where outputs differ the `tie_report` of the differences (the
    prompts' token ids as the engine encoded them, the target from its model directory)."""
    report = compare_outputs(ref, got)
    if report["identical"] < report["total"]:
        report["ties"] = tie_report(model_dir, prompt_ids, ref, got)
    return report


def describe(report: dict) -> str:
    """One line for a log: identical count, and how the differences stand against ties."""
    line = f"identical {report['identical']}/{report['total']}"
    ties = report.get("ties")
    if ties is None:
        return line
    if "error" in ties:
        return f"{line} (tie check unavailable: {ties['error'][:80]})"
    verdict = "all at near-ties" if ties["all_near_ties"] else "NOT all at near-ties"
    return f"{line} ({verdict}, largest gap {ties['largest_gap']} logits)"
