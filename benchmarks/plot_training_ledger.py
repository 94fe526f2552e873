#!/usr/bin/env python
"""The drafter training ledger (docs/TRAINING.md, section 6a) as a figure: tau on HumanEval and
MT-Bench by run, at T=0 and T=1, DSpine against its DFlash twin, against the issue's goals.

The ledger's markdown table is the single source of truth: this script parses it every time, so
a new row there is a new point here with nothing else to update.

    python benchmarks/plot_training_ledger.py [--ledger docs/TRAINING.md]
        [--out benchmarks/results/training_ledger.png]

Writes the PNG, the parsed rows beside it (same stem, .json), and prints a markdown table: per
DSpine run, HumanEval / MT-Bench tau at T=0 and the change against the last committed run before
it (what the 5%-commit rule compares; the ledger's own percentages for runs measured beside run
10 "in the same call" may differ, since that call re-measured run 10).
"""
from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import RESULTS, ROOT, markdown_table, save_json  # noqa: E402

HEADER = "| run | date | commit | drafter |"
# Column titles of the tau cells -> the row keys of their T=0 / T=1 numbers.
TAU_COLUMNS = {"HumanEval T=0 / T=1": ("humaneval_t0", "humaneval_t1"),
               "MT-Bench T=0 / T=1": ("mtbench_t0", "mtbench_t1")}
# Decimals only: a note in a tau cell ("measured in run 11's session") must not read as a tau.
TAU = re.compile(r"\d+\.\d+")
# The goals, per temperature: {benchmark key: tau}.
GOALS = {0: {"humaneval": 3.5, "mtbench": 3.0}, 1: {"humaneval": 2.5, "mtbench": 2.5}}
BENCHES = {"humaneval": ("HumanEval", "C0"), "mtbench": ("MT-Bench", "C1")}
DRAFTERS = {"dspine": ("DSpine", "-", 7), "dflash": ("DFlash", "--", 5)}  # label, line, marker size


def _cells(line: str) -> list[str]:
    return [c.strip().replace("**", "") for c in line.strip().strip("|").split("|")]


def _table_lines(text: str) -> tuple[list[str], list[str]]:
    """The header's cells and the table's row lines (after the |---| separator)."""
    lines = text.splitlines()
    start = next((i for i, line in enumerate(lines) if line.strip().startswith(HEADER)), None)
    if start is None:
        raise ValueError(f"no training ledger: no line starts with {HEADER!r}")
    rows = []
    for line in lines[start + 2:]:
        if not line.strip().startswith("|"):
            break
        rows.append(line)
    return _cells(lines[start]), rows


def _drafter(cell: str) -> str | None:
    """'dspine' / 'dflash', or None for a lost run (its cell is '- (lost: ...)')."""
    return next((key for key, (label, _, _) in DRAFTERS.items() if cell.startswith(label)), None)


def _taus(cell: str) -> tuple[float | None, float | None]:
    found = [float(x) for x in TAU.findall(cell)[:2]]
    return tuple(found + [None] * (2 - len(found)))


def parse_ledger(markdown_text: str) -> list[dict]:
    """One dict per table row, in table order (``order``); taus are None where the run was lost.
    Columns are found by their titles, so a column added to the ledger does not shift them."""
    header, lines = _table_lines(markdown_text)
    rows = []
    for order, line in enumerate(lines):
        cells = _cells(line)
        if len(cells) != len(header):
            raise ValueError(f"ledger row {order} has {len(cells)} cells, the header "
                             f"{len(header)}: {line[:80]!r}")
        cell = dict(zip(header, cells))
        row = {"run": cell["run"], "order": order, "drafter": _drafter(cell["drafter"])}
        for title, keys in TAU_COLUMNS.items():
            row.update(zip(keys, _taus(cell[title])))
        row["committed"] = cell["committed"].lower().startswith("yes")
        row["continued_from_shipped"] = "shipped run" in cell["drafter"]
        rows.append(row)
    return rows


def run_ids(rows: list[dict]) -> list[str]:
    """The x axis: each run once, in ledger order (a run's DSpine and DFlash rows share an id)."""
    return list(dict.fromkeys(r["run"] for r in rows))


def _series(ax, rows, x_of, drafter: str, bench: str, t: int) -> None:
    """One drafter's tau on one benchmark: a line through the measured runs (a lost run is
    skipped, not a break), filled markers where the run was committed, hollow where not."""
    label, style, size = DRAFTERS[drafter]
    name, color = BENCHES[bench]
    pts = [(x_of[r["run"]], r[f"{bench}_t{t}"], r["committed"]) for r in rows
           if r["drafter"] == drafter and r[f"{bench}_t{t}"] is not None]
    ax.plot([p[0] for p in pts], [p[1] for p in pts], style, color=color, label=f"{label} {name}")
    for committed in (True, False):
        sel = [p for p in pts if p[2] == committed]
        ax.plot([p[0] for p in sel], [p[1] for p in sel], "o", ms=size, color=color,
                markerfacecolor=color if committed else "white", linestyle="none")


def _panel(ax, rows, runs: list[str], t: int) -> None:
    x_of = {run: i for i, run in enumerate(runs)}
    for drafter in DRAFTERS:
        for bench in BENCHES:
            _series(ax, rows, x_of, drafter, bench, t)
    goals = GOALS[t]
    shared = len(set(goals.values())) == 1  # both benchmarks, one goal (T=1): one grey line
    for bench, goal in goals.items():
        color = "grey" if shared else BENCHES[bench][1]
        ax.axhline(goal, linestyle=":", color=color, linewidth=1.2)
        text = "goal" if shared else f"{BENCHES[bench][0]} goal"
        ax.annotate(f"{text} {goal:g}", (0, goal), xytext=(2, 2), textcoords="offset points",
                    color=color, fontsize=8)
    lost = {r["run"] for r in rows if r["drafter"] is None}
    ax.set_xticks(range(len(runs)), runs)
    for tick in ax.get_xticklabels():  # lost runs stay on the axis, greyed: the gaps are real
        if tick.get_text() in lost:
            tick.set_color("grey")
            tick.set_fontstyle("italic")
    ax.set_title(f"T={t}" + (" (greedy)" if t == 0 else " (sampled)"))
    ax.set_xlabel("run (ledger order; grey italic: run lost)")
    ax.set_ylabel("tau (tokens per round)")
    ax.margins(y=0.08)  # room above a goal line that tops the data (T=1) for its label
    ax.grid(alpha=0.3)


def plot(rows: list[dict], out_png: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.lines import Line2D

    runs = run_ids(rows)
    fig, axes = plt.subplots(1, 2, figsize=(14, 5.2))
    for t, ax in enumerate(axes):
        _panel(ax, rows, runs, t)
    handles, _ = axes[0].get_legend_handles_labels()
    handles += [Line2D([], [], marker="o", color="black", linestyle="none", label="committed"),
                Line2D([], [], marker="o", color="black", markerfacecolor="white",
                       linestyle="none", label="not committed")]
    fig.legend(handles=handles, loc="lower center", ncol=len(handles), fontsize=9, frameon=False)
    fig.suptitle("DSpine drafter for SmolLM2-135M-Instruct: tau by run "
                 "(HumanEval / MT-Bench, H200)")
    fig.tight_layout(rect=(0, 0.06, 1, 1))
    out_png = Path(out_png)
    out_png.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out_png, dpi=120)
    plt.close(fig)


def _tau(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"  # markdown_table's 3 digits would round


def _change(value: float | None, base: float | None) -> str:
    return "-" if value is None or base is None else f"{(value / base - 1) * 100:+.1f}%"


def change_table(rows: list[dict]) -> str:
    """Per DSpine run: T=0 taus and the change against the last committed DSpine run before it."""
    body, base = [], None
    for r in rows:
        if r["drafter"] != "dspine":
            continue
        he, mt = r["humaneval_t0"], r["mtbench_t0"]
        vs = (f"{_change(he, base['humaneval_t0'])} / {_change(mt, base['mtbench_t0'])} "
              f"vs {base['run']}" if base else "-")
        body.append([r["run"], _tau(he), _tau(mt), vs, "yes" if r["committed"] else "no"])
        if r["committed"]:
            base = r
    return markdown_table(["run", "HumanEval T=0", "MT-Bench T=0",
                           "change vs last committed", "committed"], body)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--ledger", default=str(ROOT / "docs" / "TRAINING.md"),
                   help="markdown file holding the ledger table (default: %(default)s)")
    p.add_argument("--out", default=str(RESULTS / "training_ledger.png"),
                   help="PNG to write; the rows go beside it as .json (default: %(default)s)")
    args = p.parse_args(argv)
    rows = parse_ledger(Path(args.ledger).read_text())
    out = Path(args.out)
    plot(rows, out)
    json_path = save_json(out.stem, {"ledger": str(args.ledger), "rows": rows}, out.parent)
    print(change_table(rows))
    print(f"\n{out}\n{json_path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
