"""Load benchmark of dspine-serve through its HTTP API: requests/s, output tokens/s, time to
first token and inter-token latency (p50/p99) at concurrency 1, 8 and 32, autoregressive vs
the shipped DSpine drafter.

Each request is a streamed chat completion (greedy, a fixed answer length via ignore_eos, usage
in the last chunk) of a prompt from the set; `concurrency` clients keep one request each in
flight. TTFT = request sent -> first content chunk. Inter-token latency (ITL) of a request =
(last chunk - first chunk) / (tokens - 1), i.e. the mean gap per generated token (a drafted
round delivers several tokens in one chunk, so chunk gaps alone would flatter AR). tau is the
server's tokens per round over the level, 1 + accepted drafts / rounds (from /metrics). Greedy answers of the drafted server
are compared with the autoregressive server's (same prompts, same lengths).

  python benchmarks/serve_load.py                      # starts an AR and a DSpine server
  python benchmarks/serve_load.py --device cuda        # the H200: a few minutes
  python benchmarks/serve_load.py --url http://127.0.0.1:8000 --label mine   # a running one

Writes benchmarks/results/<name>.json after every level and a table in docs/BENCHMARKS.md.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
from pathlib import Path

import httpx
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import markdown_table, run_info, save_json, update_doc_section  # noqa: E402

MODES = ("ar", "dspine")
METRICS = ("requests_per_s", "output_tokens_per_s", "ttft_ms_p50", "ttft_ms_p99", "itl_ms_p50",
           "itl_ms_p99", "tau")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--url", default=None, help="measure this running server (one mode) instead "
                   "of starting servers")
    p.add_argument("--label", default="server", help="the mode name of the --url server")
    p.add_argument("--api-key", default=None, help="the --url server's key")
    p.add_argument("--modes", nargs="+", default=list(MODES), choices=MODES,
                   help="servers to start (default: ar dspine)")
    p.add_argument("--model", default=None, help="target (default: SmolLM2-135M-Instruct)")
    p.add_argument("--draft", default="default",
                   help="the draft of the dspine server (default: the shipped drafter)")
    p.add_argument("--device", default="cpu", help="device of the started servers")
    p.add_argument("--dtype", default="auto")
    p.add_argument("--concurrency", type=int, nargs="+", default=[1, 8, 32])
    p.add_argument("--requests-per-client", type=int, default=4,
                   help="requests per level = this x concurrency, at least 8 (default 4)")
    p.add_argument("--max-tokens", type=int, default=128, help="tokens per answer")
    p.add_argument("--prompts", default="mtbench", help="humaneval, mtbench or a JSONL file")
    p.add_argument("--repeats", type=int, default=1,
                   help="runs of each level; the table shows medians (default 1)")
    p.add_argument("--name", default=None, help="results file stem (default serve_load_<dev>)")
    p.add_argument("--out", default=None, help="results directory (default benchmarks/results)")
    p.add_argument("--no-doc", action="store_true", help="do not update docs/BENCHMARKS.md")
    p.add_argument("--quiet", action="store_true")
    return p


# ------------------------------------------------------------------------------ one request
async def _request(client: httpx.AsyncClient, model: str, prompt, max_tokens: int) -> dict:
    messages = prompt if isinstance(prompt, list) else [{"role": "user", "content": prompt}]
    body = {"model": model, "messages": messages,
            "temperature": 0, "max_tokens": max_tokens, "ignore_eos": True, "stream": True,
            "stream_options": {"include_usage": True}}
    t0 = time.perf_counter()
    times, text, tokens = [], [], 0
    async with client.stream("POST", "/v1/chat/completions", json=body) as r:
        if r.status_code != 200:
            raise RuntimeError(f"HTTP {r.status_code}: {(await r.aread()).decode()[:300]}")
        async for line in r.aiter_lines():
            if not line.startswith("data: {"):
                continue
            event = json.loads(line[6:])
            if event.get("usage"):
                tokens = event["usage"]["completion_tokens"]
            if event["choices"] and event["choices"][0]["delta"].get("content"):
                times.append(time.perf_counter())
                text.append(event["choices"][0]["delta"]["content"])
    ttft = times[0] - t0 if times else float("nan")
    itl = (times[-1] - times[0]) / (tokens - 1) if tokens > 1 and times else float("nan")
    return {"ttft": ttft, "itl": itl, "tokens": tokens, "text": "".join(text)}


# ------------------------------------------------------------------------------ one level
def _engine_counters(client: httpx.Client) -> tuple[float, float]:
    """(accepted draft tokens, rounds) so far, from /metrics."""
    found = {}
    for line in client.get("/metrics").text.splitlines():
        name, _, value = line.partition(" ")
        if name in ("dspine_engine_accepted_draft_tokens_total", "dspine_engine_rounds_total"):
            found[name] = float(value)
    return (found["dspine_engine_accepted_draft_tokens_total"],
            found["dspine_engine_rounds_total"])


async def _level(url: str, headers: dict, model: str, prompts: list[str], concurrency: int,
                 n: int, max_tokens: int) -> tuple[dict, list[str]]:
    todo = list(range(n))
    results: list = [None] * n
    limits = httpx.Limits(max_connections=concurrency)
    async with httpx.AsyncClient(base_url=url, headers=headers, timeout=3600,
                                 limits=limits) as client:
        async def worker():
            while todo:
                i = todo.pop(0)
                results[i] = await _request(client, model, prompts[i % len(prompts)], max_tokens)

        t0 = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        seconds = time.perf_counter() - t0
    ttft = np.array([r["ttft"] for r in results]) * 1e3
    itl = np.array([r["itl"] for r in results if np.isfinite(r["itl"])]) * 1e3
    tokens = sum(r["tokens"] for r in results)
    row = {"concurrency": concurrency, "requests": n, "seconds": seconds,
           "output_tokens": tokens, "requests_per_s": n / seconds,
           "output_tokens_per_s": tokens / seconds,
           "ttft_ms_p50": float(np.percentile(ttft, 50)),
           "ttft_ms_p99": float(np.percentile(ttft, 99)),
           "itl_ms_p50": float(np.percentile(itl, 50)) if len(itl) else float("nan"),
           "itl_ms_p99": float(np.percentile(itl, 99)) if len(itl) else float("nan")}
    return row, [r["text"] for r in results]


def measure(url: str, mode: str, args, prompts: list[str], headers: dict) -> tuple[list, dict]:
    """Every level against one server: rows (medians over repeats, raw runs kept) and the
    answers of the last run of each level."""
    with httpx.Client(base_url=url, headers=headers, timeout=60) as c:
        model = c.get("/v1/models").json()["data"][0]["id"]
        asyncio.run(_level(url, headers, model, prompts, 2, 2, 8))  # warm-up
        rows, answers = [], {}
        for conc in args.concurrency:
            n = max(8, args.requests_per_client * conc)
            runs = []
            for _ in range(args.repeats):
                before = _engine_counters(c)
                run, texts = asyncio.run(_level(url, headers, model, prompts, conc, n,
                                                args.max_tokens))
                after = _engine_counters(c)
                rounds = after[1] - before[1]
                run["tau"] = 1 + (after[0] - before[0]) / rounds if rounds else float("nan")
                runs.append(run)
            row = {"mode": mode, "concurrency": conc, "requests": n,
                   **{k: statistics.median(r[k] for r in runs) for k in METRICS}, "runs": runs}
            rows.append(row)
            answers[conc] = texts
            if not args.quiet:
                print(f"{mode:>7} c={conc:<3} {row['requests_per_s']:6.2f} req/s "
                      f"{row['output_tokens_per_s']:8.1f} tok/s  TTFT p50 "
                      f"{row['ttft_ms_p50']:7.1f} ms  ITL p50 {row['itl_ms_p50']:6.1f} ms  "
                      f"tau {row['tau']:.2f}", file=sys.stderr)
    return rows, answers


def _server_args(args, mode: str) -> list[str]:
    out = ["--no-draft"] if mode == "ar" else ["--draft", args.draft]
    out += ["--device", args.device, "--dtype", args.dtype, "--log-level", "warning",
            "--max-num-seqs", str(max(args.concurrency))]
    if args.model:
        out += ["--model", args.model]
    return out + (["--quiet"] if args.quiet else [])


def main(argv=None) -> int:
    from dspine_engine.datasets import load_prompts

    args = build_parser().parse_args(argv)
    prompts = load_prompts(args.prompts)
    info = run_info(args.device)
    tag = "cpu" if args.device == "cpu" else info["device"].split()[-1].lower()
    name = args.name or f"serve_load_{tag}"
    result = {"info": info, "prompts": args.prompts, "max_tokens": args.max_tokens,
              "repeats": args.repeats, "rows": []}
    answers = {}
    if args.url:
        headers = {"Authorization": f"Bearer {args.api_key}"} if args.api_key else {}
        rows, answers[args.label] = measure(args.url, args.label, args, prompts, headers)
        result["rows"] += rows
    else:
        from dspine_engine.serve.launcher import ServerProcess

        for mode in args.modes:
            with ServerProcess(_server_args(args, mode), echo=not args.quiet) as server:
                rows, answers[mode] = measure(server.url, mode, args, prompts, {})
            result["rows"] += rows
            save_json(name, result, args.out)
    _compare_with_ar(result["rows"], answers)
    path = save_json(name, result, args.out)
    table = _table(result["rows"])
    print(table + f"\n\nwrote {path}")
    if not args.no_doc:
        note = (f"Streamed chat completions of {args.prompts} prompts, greedy, "
                f"{args.max_tokens} tokens each (ignore_eos), max(8, "
                f"{args.requests_per_client} x concurrency) requests per level, median of "
                f"{args.repeats} run(s). ITL = (last chunk - first chunk) / (tokens - 1).")
        update_doc_section(name, note + "\n\n" + table, info)
    return 0


def _compare_with_ar(rows: list[dict], answers: dict) -> None:
    if "ar" not in answers:
        return
    for row in rows:
        if row["mode"] == "ar":
            continue
        ref, got = answers["ar"][row["concurrency"]], answers[row["mode"]][row["concurrency"]]
        row["greedy_equal_to_ar"] = f"{sum(a == b for a, b in zip(ref, got))}/{len(ref)}"


def _table(rows: list[dict]) -> str:
    ar = {r["concurrency"]: r for r in rows if r["mode"] == "ar"}
    header = ["mode", "concurrency", "requests", "req/s", "output tok/s", "vs AR",
              "TTFT p50 ms", "TTFT p99 ms", "ITL p50 ms", "ITL p99 ms", "tau", "= AR greedy"]
    body = []
    for r in rows:
        base = ar.get(r["concurrency"])
        speed = r["output_tokens_per_s"] / base["output_tokens_per_s"] if base else float("nan")
        body.append([r["mode"], r["concurrency"], r["requests"], r["requests_per_s"],
                     r["output_tokens_per_s"], speed, r["ttft_ms_p50"], r["ttft_ms_p99"],
                     r["itl_ms_p50"], r["itl_ms_p99"], r["tau"], r.get("greedy_equal_to_ar", "")])
    return markdown_table(header, body)


if __name__ == "__main__":
    sys.exit(main())
