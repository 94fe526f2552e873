#!/usr/bin/env bash
# Kernel branches checked on the GPU machine of a drafter session, beside it (issue 12's work
# rides along issue 9's device time). `BRANCHES="a b" bash benchmarks/h200_prepare.sh` exports
# each branch's tree into .stage_branches/<name>/ (the last stage call carries it); then, on the
# GPU machine, h200_session.sh calls this script:
#
#   build   (stage N N, detached) after the session's own build: each branch built in turn in
#           /root/branch/<name> (sm_90a only: BRANCH_ARCHS), so the two builds never share the
#           host (two at once delayed the generators by 70 s).
#   test    (data, detached, beside the generators) each branch's kernel GPU tests (pytest -m gpu
#           tests/test_kernels_gpu.py, BRANCH_K narrows them) and memcheck over BRANCH_MEMCHECK_K.
#   bench   (measure, MEASURE="branches", on the quiet GPU) benchmarks/kernel_bench.py of each branch
#           with its arguments from BRANCH_BENCH ("name=args;name=args"), on the branch's build
#           and then on the session's (main's) build with the branch's script: before and after
#           in one call; then Nsight Compute on the branch's kernels named in BRANCH_NCU.
#
# Everything lands in /root/stage/results/branches/<name>/ (packed with the session's results).
set -u
MODE=${1:?usage: h200_branches.sh build|test|bench}
S=/root/stage B=/root/branch
OUTB=$S/results/branches
mkdir -p "$OUTB"
names() { ls -d $B/*/ 2>/dev/null | xargs -n1 basename 2>/dev/null; }
# The GPU machine's torch loads an older libstdc++ than the compiler's: an exception whose message
# formats a number then crashes the process (README). The branch tests run on the compiler's
# (CXX_LIB: h200_session.sh's, which starts this script).
cxx_lib=${CXX_LIB:?run by h200_session.sh, which sets CXX_LIB}

if [ "$MODE" = build ]; then
  while [ ! -f $S/build.rc ]; do sleep 2; done
  for n in $(names); do
    mkdir -p "$OUTB/$n"
    (cd $B/$n && DSPINE_CUDA_ARCHS="${BRANCH_ARCHS:-90a}" MAX_JOBS=16 python3 setup.py build_ext --inplace \
      > "$OUTB/$n/build.log" 2>&1; echo $? > "$OUTB/$n/build.rc")
  done
  exit 0
fi

wait_built() {  # $1 branch: 0 once its build succeeded
  while [ ! -f "$OUTB/$1/build.rc" ]; do sleep 2; done
  [ "$(cat "$OUTB/$1/build.rc")" = 0 ]
}

if [ "$MODE" = test ]; then
  for n in $(names); do
    o=$OUTB/$n
    wait_built "$n" || { echo "build failed" > "$o/summary.log"; continue; }
    (cd $B/$n || exit 1
     export PYTHONPATH=$B/$n
     [ -f "$cxx_lib" ] && export LD_PRELOAD=$cxx_lib
     # 420 s: beside the generators verify-floor's 435 tests outran 300 s twice (2026-12-03);
     # --durations names the slow ones when it happens again
     timeout 420 python3 -m pytest -q -m gpu -n 2 tests/test_kernels_gpu.py -rf --durations=10 \
       ${BRANCH_K:+-k "$BRANCH_K"} \
       > "$o/tests.log" 2>&1
     echo "tests rc $?: $(tail -1 "$o/tests.log")" > "$o/summary.log"
     grep -E "^(FAILED|ERROR)" "$o/tests.log" | head -30 >> "$o/summary.log"
     [ -n "${BRANCH_MEMCHECK_K:-}" ] && {
       timeout 150 compute-sanitizer --tool memcheck --error-exitcode 9 python3 -m pytest -q -x -m gpu \
         tests/test_kernels_gpu.py -k "$BRANCH_MEMCHECK_K" > "$o/memcheck.log" 2>&1
       echo "memcheck rc $?: $(grep -E 'ERROR SUMMARY' "$o/memcheck.log" | tail -1)" >> "$o/summary.log"; })
  done
  exit 0
fi

# BRANCH_NCU="name=regex regex;...": Nsight Compute (--set full, 2 launches) on the branch's build
# for each kernel-name regex, run under its BRANCH_BENCH script and arguments; the report's details
# page comes back as CSV (the .ncu-rep stays on the machine: it is large).
profile() {  # $1 branch, $2 bench script, $3 its arguments
  local n=$1 kb=$2 args=$3 spec i=0
  IFS=';' read -ra spec <<< "${BRANCH_NCU:-}"
  for entry in "${spec[@]}"; do
    [ "${entry%%=*}" = "$n" ] || continue
    for k in ${entry#*=}; do
      i=$((i + 1))
      (cd $B/$n && PYTHONPATH=$B/$n timeout 300 ncu --set full -k "regex:$k" --launch-count 2 -f \
         -o /tmp/ncu_${n}_$i python3 $kb $args > "$OUTB/$n/ncu_$i.log" 2>&1
       echo "ncu $i ($k) rc $?" >> "$OUTB/$n/summary.log"
       ncu --import /tmp/ncu_${n}_$i.ncu-rep --page details --csv > "$OUTB/$n/ncu_$i.csv" 2>&1)
    done
  done
}

if [ "$MODE" = bench ]; then
  IFS=';' read -ra specs <<< "${BRANCH_BENCH:-}"
  for spec in "${specs[@]}"; do
    n=${spec%%=*} args=${spec#*=}
    [ -d "$B/$n" ] && wait_built "$n" || { echo "bench: no build of $n"; continue; }
    o=$OUTB/$n
    kb=benchmarks/kernel_bench.py; [ -f $B/$n/$kb ] || kb=benchmarks/kernels.py  # its name before 2026-12-03
    # The branch's kernels on its own build, then the same script on the session's build.
    (cd $B/$n && PYTHONPATH=$B/$n timeout 200 python3 $kb $args --out "$o/after" \
       > "$o/bench_after.log" 2>&1; echo "bench after rc $?" >> "$o/summary.log"
     PYTHONPATH=/root/work:/root/site timeout 200 python3 $kb $args --out "$o/before" \
       > "$o/bench_before.log" 2>&1; echo "bench before rc $?" >> "$o/summary.log")
    profile "$n" "$kb" "$args"
  done
  exit 0
fi
echo "usage: h200_branches.sh build|test|bench"; exit 2
