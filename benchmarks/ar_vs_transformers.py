"""Autoregressive tokens/s: our engine vs transformers.generate on the same model and prompts.

Both run SmolLM2-135M-Instruct in fp32 on the CPU, greedy, the same chat prompts, a fixed number
of new tokens, in one process:
  - concurrency 1: prompts one after another (transformers: one generate call per prompt);
  - batched: all prompts at once (transformers: one left-padded generate call; ours: all
    requests in flight).
Greedy tokens are compared up to the first EOS (transformers' min_new_tokens suppresses EOS,
ours ignores it, so only the text before an EOS is comparable).

    python benchmarks/ar_vs_transformers.py [--prompts 8] [--new-tokens 64] [--threads 2]
"""
from __future__ import annotations

import argparse
import sys
import time

import torch

sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parent))
from common import markdown_table, run_info, save_json, update_doc_section  # noqa: E402


def _hf_generate(model, batch_ids: list[list[int]], new_tokens: int, pad: int) -> list[list[int]]:
    width = max(len(x) for x in batch_ids)
    ids = torch.tensor([[pad] * (width - len(x)) + x for x in batch_ids])
    mask = torch.tensor([[0] * (width - len(x)) + [1] * len(x) for x in batch_ids])
    with torch.no_grad():
        out = model.generate(ids, attention_mask=mask, max_new_tokens=new_tokens,
                             min_new_tokens=new_tokens, do_sample=False, pad_token_id=pad)
    return out[:, width:].tolist()


def _until_eos(tokens: list[int], eos: set[int]) -> list[int]:
    for i, t in enumerate(tokens):
        if t in eos:
            return tokens[:i]
    return tokens


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--no-doc", action="store_true", help="do not update docs/BENCHMARKS.md")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    from transformers import AutoModelForCausalLM

    from dspine_engine import Engine, SamplingParams
    from dspine_engine.datasets import mtbench_prompts
    from dspine_engine.models.default_model import default_model_dir

    model_dir = default_model_dir()
    engine = Engine(model_dir, device="cpu", dtype="float32", max_num_seqs=args.prompts)
    hf = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    prompts = mtbench_prompts()[: args.prompts]
    ids = [engine.tokenizer.encode_chat([{"role": "user", "content": p}]) for p in prompts]
    params = SamplingParams(max_tokens=args.new_tokens, ignore_eos=True)
    n_tokens = args.prompts * args.new_tokens
    pad = 2

    # Warm-up both (allocators, thread pools).
    engine.generate(ids[:1], SamplingParams(max_tokens=4))
    _hf_generate(hf, ids[:1], 4, pad)

    rows, outputs = [], {}
    t = time.perf_counter()
    outputs["ours_c1"] = [engine.generate([x], params)[0].token_ids for x in ids]
    rows.append(["ours", "1", n_tokens / (time.perf_counter() - t)])
    t = time.perf_counter()
    outputs["hf_c1"] = [_hf_generate(hf, [x], args.new_tokens, pad)[0] for x in ids]
    rows.append(["transformers", "1", n_tokens / (time.perf_counter() - t)])
    t = time.perf_counter()
    outputs["ours_batch"] = [r.token_ids for r in engine.generate(ids, params)]
    rows.append(["ours", str(args.prompts), n_tokens / (time.perf_counter() - t)])
    t = time.perf_counter()
    outputs["hf_batch"] = _hf_generate(hf, ids, args.new_tokens, pad)
    rows.append(["transformers", str(args.prompts), n_tokens / (time.perf_counter() - t)])

    eos = engine.eos_ids
    same = sum(_until_eos(a, eos) == _until_eos(b, eos)
               for a, b in zip(outputs["ours_c1"], outputs["hf_c1"]))
    ratio_c1 = rows[0][2] / rows[1][2]
    ratio_b = rows[2][2] / rows[3][2]
    for r in rows:
        r.append(r[2] / rows[1 if r[1] == "1" else 3][2])
    info = run_info("cpu")
    payload = {"info": info, "prompts": args.prompts, "new_tokens": args.new_tokens,
               "rows": [dict(impl=r[0], concurrency=r[1], tokens_per_second=r[2],
                             vs_transformers=r[3]) for r in rows],
               "greedy_identical_until_eos": f"{same}/{len(ids)}"}
    save_json("ar_vs_transformers_cpu", payload)
    table = markdown_table(["implementation", "concurrency", "tokens/s", "vs transformers"], rows)
    body = (f"SmolLM2-135M-Instruct, fp32, greedy, {args.prompts} MT-Bench prompts x "
            f"{args.new_tokens} new tokens. Greedy tokens identical to transformers (up to EOS): "
            f"{same}/{len(ids)}. Speed-up: {ratio_c1:.2f}x at concurrency 1, {ratio_b:.2f}x "
            f"batched.\n\n{table}\n")
    print(body)
    if not args.no_doc:
        update_doc_section("ar-vs-transformers-cpu", body, info)


if __name__ == "__main__":
    main()
