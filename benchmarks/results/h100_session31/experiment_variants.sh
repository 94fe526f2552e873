#!/bin/bash
# The 31st session's experiment (not on main): on commit 3cf12c1 with experiment_variants.patch
# applied (git apply), builds each DSPINE_EXP_PV variant in turn and times its prefill:
#   VARIANTS="0 16 32 48" bash experiment_variants.sh      (from the repository root, on the GPU)
O=${OUT:-$PWD/exp_out}
for v in ${VARIANTS:-0 16 32 48}; do
  sed -i "s/^#define DSPINE_EXP_PV .*/#define DSPINE_EXP_PV $v/" csrc/cuda/attention_sm90.cuh
  echo "=================== variant $v"
  b="${BENCHV:-prefill}"; [ $v = 0 ] && b="${BENCH0:-prefill}"
  OUT=$O/v$v TESTS=${TESTV:-0} TEST_K="sm90" TEST_S=120 FLOORS=0 MEMCHECK_K="" SASS_LINES=0 BENCH="$b" bash benchmarks/h200_quick.sh 2>&1 | grep -v "^/opt/gcc\|^copying\|WARNING"
done
