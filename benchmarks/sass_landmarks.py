"""The order of a kernel's landmark instructions in its SASS, from `cuobjdump -sass`: wgmma issues
and waits, warpgroup arrives, exp2 (MUFU) and max runs, packs to 16 bits, mbarrier and named
barrier operations, branches. It answers questions about what ptxas did with the source order,
e.g. whether a `wgmma.wait_group 0` stayed after the softmax it was written after, without a
profile.

    cuobjdump -sass -fun MANGLED_NAME lib.so > k.sass
    python benchmarks/sass_landmarks.py k.sass [--from 0x4000 --to 0x8000]

Consecutive instructions of one landmark kind print as one line with their count; other
instructions are skipped (their number between two landmarks is shown as `+n`).
"""
from __future__ import annotations

import argparse
import re
import sys

from ncu_sass_summary import mnemonic

_LINE = re.compile(r"/\*([0-9a-fA-F]{4,})\*/\s+(.*?)\s*;")
# (kind, test on the opcode with its modifiers); the first that matches names the instruction.
_KINDS = [
    ("wgmma", lambda op: op.startswith("HGMMA")),
    ("wgmma wait", lambda op: op.startswith("WARPGROUP.DEPBAR")),
    ("wgmma arrive", lambda op: op.startswith("WARPGROUP.ARRIVE")),
    ("exp2", lambda op: op.startswith("MUFU.EX2")),
    ("max", lambda op: op.startswith("FMNMX")),
    ("pack", lambda op: op.startswith("F2FP")),
    ("mbarrier", lambda op: op.startswith("SYNCS")),
    ("named barrier", lambda op: op.startswith("BAR.")),
    ("branch", lambda op: op.startswith("BRA")),
]


def instructions(text: str) -> list[tuple[int, str]]:
    """(address, instruction text, predicate guard included) per instruction line."""
    out = []
    for line in text.splitlines():
        m = _LINE.search(line)
        if m:
            out.append((int(m.group(1), 16), m.group(2).strip()))
    return out


def kind_of(instruction: str) -> str | None:
    op = mnemonic(instruction)
    return next((kind for kind, test in _KINDS if op and test(op)), None)


def landmarks(instrs: list[tuple[int, str]], lo: int = 0, hi: int | None = None) -> list[tuple[int, str, int, str, int]]:
    """Runs of one landmark kind: (first address, kind, count, first instruction, instructions
    skipped since the previous run)."""
    runs: list[list] = []
    skipped = 0
    for address, text in instrs:
        if address < lo or (hi is not None and address > hi):
            continue
        kind = kind_of(text)
        if kind is None:
            skipped += 1
            continue
        if runs and runs[-1][1] == kind and skipped == 0:
            runs[-1][2] += 1
        else:
            runs.append([address, kind, 1, text, skipped])
        skipped = 0
    return [tuple(r) for r in runs]


def format_runs(runs) -> str:
    lines = []
    for address, kind, count, first, skipped in runs:
        gap = f"+{skipped} " if skipped else ""
        lines.append(f"{gap:>6}0x{address:05x} {kind} x{count}: {first}")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("sass", help="cuobjdump -sass output of one kernel")
    ap.add_argument("--from", dest="lo", default="0", help="first address (hex or decimal)")
    ap.add_argument("--to", dest="hi", default=None, help="last address (hex or decimal)")
    args = ap.parse_args(argv)
    instrs = instructions(open(args.sass).read())
    if not instrs:
        print(f"{args.sass}: no SASS instructions found", file=sys.stderr)
        return 1
    hi = int(args.hi, 0) if args.hi else None
    print(format_runs(landmarks(instrs, int(args.lo, 0), hi)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
