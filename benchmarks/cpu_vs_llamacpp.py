"""Our CPU decoding vs llama.cpp (llama-cpp-python) on the same GGUF, prompts and threads.

Every answer runs in a fresh process (so peak RSS is per configuration), configurations take
turns (A B C A B C ...) so that a noisy shared machine hurts them alike, and the table reports
medians with the spread (min-max) over prompts x repeats. Both sides get the same prompt token
ids (our chat template; llama.cpp is fed the ids), greedy, a fixed number of new tokens (EOS
ignored; --stop-at-eos: ours only, up to that many), after a short warm-up generation in the same
process.

Configurations (--configs, comma-separated):
  llamacpp     llama.cpp through llama-cpp-python (installed with --install if missing; it is
               not a dependency of the project)
  gguf         ours, autoregressive, on the GGUF's own Q4_1/Q8_0 blocks (the CPU default)
  gguf-spec    ours on the same blocks, speculative with the shipped DSpine drafter, every
               round verifying the whole block (spec_policy fixed)
  gguf-spec4   the same, every round verifying 3 drafts (fixed, num_speculative_tokens 3)
  gguf-auto    the same under dynamic verification (spec_policy auto: its cached cost
               profile, measured on first use)
  fp32         ours, autoregressive, dequantised fp32 weights (dtype="float32")

    python benchmarks/cpu_vs_llamacpp.py [--configs llamacpp,gguf,gguf-spec,fp32]
        [--prompts 4] [--prompt-set mtbench|humaneval] [--repeats 3] [--new-tokens 128]
        [--threads 2] [--context 0] [--out-name NAME] [--install] [--cpu-time]

--cpu-time runs our configurations on one kernel thread (torch's too) and times them in CPU
seconds of the process (the first token read off the stream), as round_profile.py --cpu-time
does: on a machine shared with other jobs one process an answer moves 2-3x in wall time
between answers, the CPU clock only with the work (memory stalls included). Not with llamacpp.

--stop-at-eos ends our answers at EOS, as the H200's end-to-end benchmark does: the tokens a
model writes after its answer's end are not an answer (their acceptance is not the drafter's on
real output), and greedy speculative and autoregressive answers stop at the same token. Not with
llamacpp, whose comparison needs equal lengths.

--context T puts a document before each question so that every prompt holds T tokens (the
other MT-Bench questions, repeated: decoding then reads a long KV cache, where attention
weighs); its results go to cpu_vs_llamacpp_ctxT.json and their own table.

Writes benchmarks/results/cpu_vs_llamacpp.json and the "cpu-vs-llamacpp" table of
docs/BENCHMARKS.md (--no-doc to skip). Decode tok/s counts the tokens after the first over the
time after the first; prefill tok/s is prompt tokens over the time to the first token; end to
end is new tokens over the whole answer.
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import markdown_table, run_info, save_json, update_doc_section  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
CONFIGS = ("llamacpp", "gguf", "gguf-spec", "gguf-spec4", "gguf-auto", "fp32")
# The drafted configurations: their engine settings beside draft="default".
SPEC_SETTINGS = {"gguf-spec": dict(spec_policy="fixed"),
                 "gguf-spec4": dict(spec_policy="fixed", num_speculative_tokens=3),
                 "gguf-auto": dict(spec_policy="auto")}
WARMUP_TOKENS = 8


# ---------------------------------------------------------------------------- workers

def _peak_rss_mb() -> float:
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _worker_llamacpp(job: dict) -> dict:
    from llama_cpp import Llama

    model = Llama(model_path=job["gguf"], n_threads=job["threads"],
                  n_threads_batch=job["threads"], n_ctx=job["n_ctx"], verbose=False)

    def answer(ids, n):
        start = time.perf_counter()
        tokens, first = [], None
        for tok in model.generate(ids, top_k=1, temp=0.0, reset=True):
            tokens.append(int(tok))
            if first is None:
                first = time.perf_counter()
            if len(tokens) == n:
                break
        return tokens, start, first, time.perf_counter()

    answer(job["warmup_ids"], WARMUP_TOKENS)
    tokens, start, first, end = answer(job["ids"], job["new_tokens"])
    return dict(tokens=tokens, start=start, first=first, end=end, tau=1.0)


def _answer_cpu_time(engine, ids: list[int], params) -> dict:
    """One greedy answer timed in process CPU seconds; the first token's time off the stream."""
    tokens, first, last = [], None, None
    start = time.process_time()
    for last in engine.stream(ids, params):
        tokens += last.new_token_ids
        if first is None and tokens:
            first = time.process_time()
    return dict(tokens=tokens, start=start, first=first, end=time.process_time(),
                tau=last.stats.tau)


def _worker_ours(job: dict) -> dict:
    import torch

    cpu_time = job.get("cpu_time", False)
    torch.set_num_threads(1 if cpu_time else job["threads"])
    from dspine_engine import Engine, SamplingParams

    config = job["config"]
    drafted = SPEC_SETTINGS.get(config)
    engine = Engine(None, draft="default" if drafted else None,
                    device="cpu", dtype="float32" if config == "fp32" else "gguf",
                    progress=False, max_num_seqs=1, kv_cache_tokens=job["n_ctx"],
                    **(drafted or {}), **(dict(cpu_threads=1) if cpu_time else {}))
    engine.generate([job["warmup_ids"]], SamplingParams(max_tokens=WARMUP_TOKENS,
                                                        ignore_eos=True))
    params = SamplingParams(max_tokens=job["new_tokens"], ignore_eos=not job["stop_at_eos"])
    if cpu_time:
        return _answer_cpu_time(engine, job["ids"], params)
    start = time.perf_counter()
    result = engine.generate([job["ids"]], params)[0]
    end = time.perf_counter()
    # The engine's own clock starts at admission; the first token's time is on that clock.
    first = end - (result.stats.elapsed - result.stats.time_to_first_token)
    return dict(tokens=list(result.token_ids), start=start, first=first, end=end,
                tau=result.stats.tau)


def worker_main(job_path: str) -> None:
    job = json.loads(Path(job_path).read_text())
    run = _worker_llamacpp if job["config"] == "llamacpp" else _worker_ours
    out = run(job)
    n, prompt = len(out["tokens"]), len(job["ids"])
    out.update(config=job["config"], prompt_index=job["prompt_index"], prompt_tokens=prompt,
               prefill_tps=prompt / (out["first"] - out["start"]),
               decode_tps=(n - 1) / (out["end"] - out["first"]),
               e2e_tps=n / (out["end"] - out["start"]), peak_rss_mb=_peak_rss_mb())
    print("RESULT " + json.dumps(out), flush=True)


# ---------------------------------------------------------------------------- driver

def _ensure_llamacpp(install: bool) -> str:
    try:
        import llama_cpp
    except ImportError:
        if not install:
            sys.exit("llama-cpp-python is not installed: pass --install (it builds llama.cpp, "
                     "several minutes) or pip install llama-cpp-python yourself")
        subprocess.run([sys.executable, "-m", "pip", "install", "llama-cpp-python"], check=True)
        import llama_cpp
    return llama_cpp.__version__


def _run_job(job: dict, tmp: Path) -> dict:
    path = tmp / f"job-{job['config']}-{job['prompt_index']}.json"
    path.write_text(json.dumps(job))
    env = dict(__import__("os").environ, PYTHONPATH=str(ROOT))
    proc = subprocess.run([sys.executable, __file__, "--worker", str(path)], env=env,
                          capture_output=True, text=True)
    for line in proc.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[len("RESULT "):])
    raise RuntimeError(f"worker {job['config']} failed (exit code {proc.returncode}):\n{proc.stderr[-3000:]}")


def _summary(values: list[float]) -> dict:
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def _agreement(rows: list[dict], a: str, b: str) -> dict:
    """Greedy tokens of configs a and b on each prompt: identical answers and first divergence."""
    by = {}
    for r in rows:
        by.setdefault((r["config"], r["prompt_index"]), r["tokens"])
    prompts = sorted({r["prompt_index"] for r in rows})
    same, firsts = 0, []
    for p in prompts:
        x, y = by.get((a, p)), by.get((b, p))
        if x is None or y is None:
            continue
        diverge = next((i for i, (u, v) in enumerate(zip(x, y)) if u != v), None)
        same += diverge is None
        firsts.append(diverge if diverge is not None else len(x))
    return {"identical": f"{same}/{len(firsts)}", "first_divergence": firsts}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--configs", default=",".join(CONFIGS))
    ap.add_argument("--prompts", type=int, default=4, help="chat prompts of --prompt-set")
    ap.add_argument("--prompt-set", choices=("mtbench", "humaneval"), default="mtbench")
    ap.add_argument("--out-name", help="results JSON name (default cpu_vs_llamacpp[_ctxT])")
    ap.add_argument("--repeats", type=int, default=3, help="runs of every (config, prompt)")
    ap.add_argument("--new-tokens", type=int, default=128)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--context", type=int, default=0,
                    help="tokens of every prompt, a document before the question (0: the "
                         "question alone)")
    ap.add_argument("--install", action="store_true", help="pip install llama-cpp-python")
    ap.add_argument("--no-doc", action="store_true", help="do not update docs/BENCHMARKS.md")
    ap.add_argument("--cpu-time", action="store_true",
                    help="ours on one kernel thread, timed in process CPU seconds (see above)")
    ap.add_argument("--stop-at-eos", action="store_true",
                    help="our answers end at EOS (see above); not with llamacpp")
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        return worker_main(args.worker)
    configs = [c.strip() for c in args.configs.split(",") if c.strip()]
    unknown = set(configs) - set(CONFIGS)
    if unknown:
        ap.error(f"unknown configs {sorted(unknown)}; choose from {CONFIGS}")
    if args.cpu_time and "llamacpp" in configs:
        ap.error("--cpu-time times our engine only (llama.cpp keeps its own threads)")
    if args.stop_at_eos and "llamacpp" in configs:
        ap.error("--stop-at-eos: llama.cpp's comparison needs answers of equal length")
    llamacpp_version = _ensure_llamacpp(args.install) if "llamacpp" in configs else None

    import tempfile

    from tqdm.auto import tqdm

    from dspine_engine.datasets import humaneval_prompts, mtbench_prompts
    from dspine_engine.models.default_model import default_gguf_path, default_model_dir
    from dspine_engine.models.tokenizer import Tokenizer

    gguf = str(default_gguf_path())
    tokenizer = Tokenizer(default_model_dir())
    questions = mtbench_prompts() if args.prompt_set == "mtbench" else humaneval_prompts()
    ids = [_prompt_ids(tokenizer, q, questions, args.context)
           for q in questions[:args.prompts + 1]]
    warmup, ids = ids[-1], ids[:-1]
    n_ctx = max(len(x) for x in ids) + args.new_tokens + 64
    rows = []
    order = [(r, p, c) for r in range(args.repeats) for p in range(len(ids))
             for c in (configs if (r + p) % 2 == 0 else configs[::-1])]
    with tempfile.TemporaryDirectory() as tmp:
        for _, p, c in tqdm(order, desc="answers", unit="answer"):
            job = dict(config=c, prompt_index=p, ids=ids[p], warmup_ids=warmup, gguf=gguf,
                       threads=args.threads, new_tokens=args.new_tokens, n_ctx=n_ctx,
                       cpu_time=args.cpu_time, stop_at_eos=args.stop_at_eos)
            rows.append(_run_job(job, Path(tmp)))

    summary = {}
    for c in configs:
        mine = [r for r in rows if r["config"] == c]
        summary[c] = {k: _summary([r[k] for r in mine])
                      for k in ("decode_tps", "e2e_tps", "prefill_tps", "peak_rss_mb", "tau")}
    info = run_info("cpu")
    info["threads"] = 1 if args.cpu_time else args.threads
    info["clock"] = "process CPU time" if args.cpu_time else "wall"
    payload = {"info": info, "llama_cpp_python": llamacpp_version, "gguf": gguf,
               "prompts": args.prompts, "repeats": args.repeats, "new_tokens": args.new_tokens,
               "stop_at_eos": args.stop_at_eos,
               "summary": summary, "rows": [{k: v for k, v in r.items()
                                             if k not in ("start", "first", "end")}
                                            for r in rows]}
    if "llamacpp" in configs and "gguf" in configs:
        payload["greedy_agreement_gguf_vs_llamacpp"] = _agreement(rows, "gguf", "llamacpp")
    for spec in [c for c in configs if c in SPEC_SETTINGS and "gguf" in configs]:
        payload[f"greedy_agreement_{spec}_vs_ar"] = _agreement(rows, spec, "gguf")
    payload["context_tokens"] = args.context
    payload["prompt_set"] = args.prompt_set
    suffix = f"_ctx{args.context}" if args.context else ""
    save_json(args.out_name or "cpu_vs_llamacpp" + suffix, payload)
    body = _table(payload, configs)
    print(body)
    if not args.no_doc:
        update_doc_section("cpu-vs-llamacpp" + suffix.replace("_", "-"), body, info)


def _prompt_ids(tokenizer, question: str, others: list[str], context: int) -> list[int]:
    """The chat prompt of ``question``; with ``context`` > 0, after a document of the other
    questions (repeated, cut at a token) sized so the whole prompt holds ``context`` tokens."""
    plain = tokenizer.encode_chat([{"role": "user", "content": question}])
    if context <= len(plain):
        return plain
    text = "\n\n".join(q for q in others if q != question)
    filler = tokenizer.encode(text, add_special_tokens=False)
    need = context - len(plain) - 8  # the joining words below
    filler = (filler * (need // len(filler) + 1))[:need]
    document = tokenizer.decode(filler)
    content = f"Document:\n{document}\n\nQuestion: {question}"
    return tokenizer.encode_chat([{"role": "user", "content": content}])


_SET_NAMES = {"mtbench": "MT-Bench", "humaneval": "HumanEval"}


def _table(payload: dict, configs: list[str]) -> str:
    s = payload["summary"]
    names = {"llamacpp": f"llama.cpp (llama-cpp-python {payload['llama_cpp_python']})",
             "gguf": "ours, GGUF blocks (default)", "gguf-spec": "ours, GGUF + shipped drafter",
             "gguf-spec4": "ours, GGUF + shipped drafter, 3 drafts a round",
             "gguf-auto": "ours, GGUF + shipped drafter, auto policy", "fp32": "ours, fp32"}
    base = s.get("llamacpp") or s.get("gguf")

    def cell(c, key, digits=1):
        v = s[c][key]
        return f"{v['median']:.{digits}f} ({v['min']:.{digits}f}-{v['max']:.{digits}f})"

    rows = [[names[c], cell(c, "decode_tps"), cell(c, "e2e_tps"), cell(c, "prefill_tps", 0),
             f"{s[c]['peak_rss_mb']['median']:.0f}", f"{s[c]['tau']['median']:.2f}",
             f"{s[c]['decode_tps']['median'] / base['decode_tps']['median']:.2f}x"]
            for c in configs]
    table = markdown_table(["configuration", "decode tok/s", "end-to-end tok/s",
                            "prefill tok/s", "peak RSS MB", "tau", "decode vs first"], rows)
    notes = [f"SmolLM2-135M-Instruct, its own Q4_1 GGUF ({Path(payload['gguf']).name}), greedy, "
             f"{payload['prompts']} {_SET_NAMES[payload.get('prompt_set', 'mtbench')]} chat "
             "prompts"
             + (f" of {payload['context_tokens']} tokens (a document of the other questions "
                "before each)" if payload.get("context_tokens") else "")
             + (f" x up to {payload['new_tokens']} new tokens (answers end at EOS), "
                if payload.get("stop_at_eos") else
                f" x {payload['new_tokens']} new tokens (EOS ignored), ")
             + f"{payload['info']['threads']} threads"
             + (" (times in process CPU seconds)" if payload["info"].get("clock") ==
                "process CPU time" else "") + ", concurrency 1, one process "
             f"per answer, configurations alternating, {payload['repeats']} repeats: medians "
             "(min-max) over prompts x repeats. \"decode vs first\" is relative to the first "
             "row's configuration."]
    if "greedy_agreement_gguf_vs_llamacpp" in payload:
        a = payload["greedy_agreement_gguf_vs_llamacpp"]
        notes.append(f"Greedy answers identical to llama.cpp's: {a['identical']} (first "
                     f"differing token per prompt and repeat: {a['first_divergence']}).")
    for spec in SPEC_SETTINGS:
        if f"greedy_agreement_{spec}_vs_ar" in payload:
            a = payload[f"greedy_agreement_{spec}_vs_ar"]
            notes.append(f"{spec} vs autoregressive (ours, same blocks): {a['identical']} "
                         "identical.")
    return "\n\n".join(notes) + "\n\n" + table + "\n"


if __name__ == "__main__":
    main()
