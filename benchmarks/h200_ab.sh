#!/usr/bin/env bash
# Before and after in one device call, on one warm GPU (no second machine start, no card-to-card
# doubt): the tree as it travels (A: main), then the same tree with a patch applied (B: a branch),
# each through h200_quick.sh into $OUT/a and $OUT/b. B's kernel tests run (TEST_FILES, TEST_K,
# TEST_S as in h200_quick.sh); A's are skipped, A being main, tested before. The benches (AB_BENCH,
# h200_quick.sh's BENCH words) and the floors run on both.
#
#   here:  git diff main kernels-pending > .ab.patch     (.ab.patch listed in .git/info/exclude)
#   carry: .ab.patch and h200_quick.sh's wheels
#   AB_BENCH="verify-splits round ncu-walk" TEST_K="transition_walk or paged_attention" bash benchmarks/h200_ab.sh
#
# B's build recompiles what the patch touched (setup.py's ninja build keeps A's objects).
set -u
O=${OUT:-$PWD/ab_out}
P=${AB_PATCH:-.ab.patch}
[ -s "$P" ] || { echo "h200_ab.sh: no patch at $P (git diff main BRANCH > $P here, and carry it)"; exit 1; }
OUT=$O/a TESTS=0 MEMCHECK_K="" BENCH="${AB_BENCH:-}" bash benchmarks/h200_quick.sh
echo "[ab] applying $P"
if git apply --version >/dev/null 2>&1; then git apply "$P"; else patch -p1 --forward < "$P"; fi ||
  { echo "h200_ab.sh: the patch does not apply to this tree"; exit 1; }
OUT=$O/b BENCH="${AB_BENCH:-}" bash benchmarks/h200_quick.sh
