"""Where a kernel's time goes, from the SASS source page of an Nsight Compute report: instructions
and stall samples by opcode, by loop (a backward branch and its target), and the hottest
instructions with their main stall reasons.

    ncu --import R.ncu-rep --page source --print-source sass --csv > R_sass.csv
    python benchmarks/ncu_sass_summary.py R_sass.csv [--top 15]

benchmarks/h200_quick.sh writes these CSVs next to each profile (`ncu_*_sass.csv`) and prints this
summary into the call's log. Samples are ncu's warp-state samples (all samples, issued or not);
instruction counts are warp-level executions.
"""
from __future__ import annotations

import argparse
import csv
import re
import sys
from collections import defaultdict
from dataclasses import dataclass, field

_BRANCH_TARGET = re.compile(r"\bBRA\b.*?(0x[0-9a-fA-F]+)\s*$")
_STALL_PREFIX = "stall_"


def mnemonic(source: str) -> str:
    """The instruction's opcode with its modifiers, without a predicate guard:
    `@!P0 LDG.E.128 R4, ...` -> `LDG.E.128` ("" for an empty line)."""
    words = source.split()
    if words and words[0].startswith("@"):
        words = words[1:]
    return words[0] if words else ""


@dataclass
class Instruction:
    address: int
    source: str
    executed: int
    samples: int
    stalls: dict[str, int] = field(default_factory=dict)

    @property
    def opcode(self) -> str:
        """The mnemonic without predicate and modifiers: `@!P0 LDG.E.128 R4, ...` -> `LDG`."""
        return mnemonic(self.source).split(".")[0] or "?"

    def top_stalls(self, n: int = 2) -> str:
        ranked = sorted(((v, k) for k, v in self.stalls.items() if v > 0), reverse=True)[:n]
        return ", ".join(f"{k} {v}" for v, k in ranked) or "-"


def _int(text: str) -> int:
    text = text.replace(",", "").strip()
    return int(float(text)) if text not in ("", "-") else 0


def read_sass_csv(path: str) -> tuple[str, list[Instruction]]:
    """The kernel's name and its instructions in address order."""
    with open(path, newline="") as f:
        rows = list(csv.reader(f))
    start = next((i for i, r in enumerate(rows) if r and r[0] == "Address"), None)
    if start is None:
        raise ValueError(f"{path}: no 'Address' header row (not an ncu --page source --csv export?)")
    kernel = next((r[1] for r in rows[:start] if len(r) > 1 and r[0] == "Kernel Name"), "?")
    header = rows[start]
    col = {name: i for i, name in enumerate(header)}
    for needed in ("Source", "Instructions Executed", "Warp Stall Sampling (All Samples)"):
        if needed not in col:
            raise ValueError(f"{path}: column {needed!r} missing")
    stall_cols = [(name[len(_STALL_PREFIX):], i) for name, i in col.items()
                  if name.startswith(_STALL_PREFIX) and "(Not Issued)" not in name]
    out = []
    for r in rows[start + 1:]:
        if len(r) < len(header) or not r[0].startswith("0x"):
            continue
        out.append(Instruction(int(r[0], 16), r[col["Source"]].strip(), _int(r[col["Instructions Executed"]]),
                               _int(r[col["Warp Stall Sampling (All Samples)"]]),
                               {name: _int(r[i]) for name, i in stall_cols}))
    out.sort(key=lambda ins: ins.address)
    return kernel, out


def loops(instrs: list[Instruction]) -> list[tuple[int, int]]:
    """(first, last) instruction indices of every backward branch's body, by start address (an
    enclosing loop before the loops it holds)."""
    index = {ins.address: i for i, ins in enumerate(instrs)}
    found = set()
    for i, ins in enumerate(instrs):
        m = _BRANCH_TARGET.search(ins.source)
        target = int(m.group(1), 16) if m else None
        if target is not None and target <= ins.address and target in index:
            found.add((index[target], i))
    return sorted(found, key=lambda span: (span[0], -span[1]))


def summarise(kernel: str, instrs: list[Instruction], top: int) -> str:
    total_exec = sum(i.executed for i in instrs) or 1
    total_samples = sum(i.samples for i in instrs) or 1
    base = instrs[0].address if instrs else 0
    lines = [f"kernel: {kernel}",
             f"{len(instrs)} SASS instructions, {total_exec:,} executed (warp level), {total_samples:,} stall samples"]

    reasons = defaultdict(int)
    for ins in instrs:
        for k, v in ins.stalls.items():
            reasons[k] += v
    ranked = sorted(reasons.items(), key=lambda kv: -kv[1])
    lines.append("stall reasons: " + ", ".join(f"{k} {100 * v / total_samples:.1f}%" for k, v in ranked[:8] if v))

    by_op = defaultdict(lambda: [0, 0, defaultdict(int)])
    for ins in instrs:
        entry = by_op[ins.opcode]
        entry[0] += ins.executed
        entry[1] += ins.samples
        for k, v in ins.stalls.items():
            entry[2][k] += v
    lines += ["", "| opcode | executed | % executed | samples | % samples | main stall |", "|---|---|---|---|---|---|"]
    for op, (ex, sa, st) in sorted(by_op.items(), key=lambda kv: -kv[1][1])[:top]:
        main = max(st.items(), key=lambda kv: kv[1], default=("-", 0))
        lines.append(f"| {op} | {ex:,} | {100 * ex / total_exec:.1f} | {sa:,} | {100 * sa / total_samples:.1f} | "
                     f"{main[0] if main[1] else '-'} |")

    spans = [(a, b) for a, b in loops(instrs) if any(i.executed for i in instrs[a:b + 1])]
    if spans:
        lines += ["", "| loop (offsets) | instructions | executed | % executed | samples | % samples |",
                  "|---|---|---|---|---|---|"]
        for first, last in spans[:top]:
            body = instrs[first:last + 1]
            ex, sa = sum(i.executed for i in body), sum(i.samples for i in body)
            lines.append(f"| 0x{instrs[first].address - base:x}-0x{instrs[last].address - base:x} | {len(body)} | "
                         f"{ex:,} | {100 * ex / total_exec:.1f} | {sa:,} | {100 * sa / total_samples:.1f} |")

    lines += ["", "| offset | instruction | samples | % samples | executed | main stalls |", "|---|---|---|---|---|---|"]
    for ins in sorted(instrs, key=lambda i: -i.samples)[:top]:
        if ins.samples == 0:
            break
        lines.append(f"| 0x{ins.address - base:x} | `{ins.source}` | {ins.samples:,} | "
                     f"{100 * ins.samples / total_samples:.1f} | {ins.executed:,} | {ins.top_stalls()} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("csv", help="ncu --page source --print-source sass --csv output")
    parser.add_argument("--top", type=int, default=15, help="rows per table (default 15)")
    args = parser.parse_args(argv)
    try:
        kernel, instrs = read_sass_csv(args.csv)
    except (OSError, ValueError) as e:
        print(f"ncu_sass_summary: {e}", file=sys.stderr)
        return 2
    if not instrs:
        print(f"ncu_sass_summary: {args.csv}: no instructions", file=sys.stderr)
        return 2
    print(summarise(kernel, instrs, args.top))
    return 0


if __name__ == "__main__":
    sys.exit(main())
