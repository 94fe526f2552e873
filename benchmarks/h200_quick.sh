#!/usr/bin/env bash
# One device call, no staging (when machines come and go and the stage/gputest sequence of
# h200_session.sh cannot count on a warm machine): build the extension, run the kernel GPU tests,
# the verify/walk floors and compute-sanitizer memcheck over a subset, logs into $OUT.
# Needs only the tree and the CUTLASS wheel (carry .whl/nvidia_cutlass-*.whl; the gguf wheel too
# if a chosen test reads GGUF files; pytest-timeout's for a per-test limit, TEST_TIMEOUT).
# The default model is not staged: tests that need it (the engine's, tensor parallelism's, whose
# tiny models borrow its tokenizer) would try to fetch it and fail, so they are not in the
# default TEST_FILES; they run in h200_session.sh gputest after the stage calls.
#
#   here:  bash benchmarks/h200_prepare.sh wheels     (the three wheels into .whl/)
#   carry: .whl/nvidia_cutlass-4.2.0.0-py3-none-any.whl .whl/gguf-0.19.0-py3-none-any.whl
#          .whl/pytest_timeout-2.4.0-py3-none-any.whl
#   bash benchmarks/h200_quick.sh                                              ~6-7 min
#
# Knobs: ARCHS (90a; "80;90a" for both), TESTS (1; 0 skips the tests), TEST_FILES
# (tests/test_kernels_gpu.py), TEST_K (pytest -k), TEST_S (150 s), FLOORS (1: kernel_bench.py --sampling-only, FLOORS_S s, 60), MEMCHECK_K (pytest -k of
# the memcheck run; empty skips it), MEMCHECK_FILES (its test files: tests/test_kernels_gpu.py), MEMCHECK_S (60 s), BENCH (words, each run after the rest,
# 60-200 s each; the prefill words' pages are in order, as the engine's pool hands out a prompt's,
# so the sm90 kernel's whole tiles go by TMA, except prefill-pages, which runs both orders):
#   prefill      the sm90 kernel against mma.sync and cuDNN (causal, Qwen3-8B and SmolLM2 heads)
#   prefill-cuts where the prefill's time goes: the sm90 kernel rebuilt without its K/V loads (1),
#                without its softmax (2), without both (3), Qwen3-8B heads at 8K; wrong outputs,
#                timing only (csrc/cuda/attention_sm90_cuts.h); the normal build is restored after
#   prefill-pages  Qwen3-8B heads at 4K and 8K, sm90 kernel only, pages of PAGES (16) tokens,
#                shuffled and in order (as the engine's pool hands out a prompt's), each with every
#                tile by cp.async and with the tiles on consecutive pages by TMA
#   prefill-async  the same with DSPINE_SM90_ARRIVE=async (the producer's arrivals handed to the
#                copy unit: attention_sm90.cuh, Sm90AsyncAnnouncer)
#   attention    decode and verify blocks on Qwen3-8B heads at 8K, batch 1 / 8 / 32
#   segments     the row-exact mode's decode / verify at 256 and SEGMENTS (128) keys a segment
#                (DSPINE_ATTN_EXACT_SEGMENT), 1K and 8K
#   round        the Qwen3-8B-shaped round at batch 1 and 8 (ROUND_BATCHES), 1K context, kernel by kernel
#                (step_table.py --kernels; random weights, no staged model), projections on cuBLAS
#                (DSPINE_DENSE_CUDA=0)
#   ncu          one profiled launch of the sm90 prefill kernel at 8K (ncu-async: with
#                DSPINE_SM90_ARRIVE=async). Every ncu word also writes its SASS source page
#                (ncu_<name>_sass.csv) and prints its summary (ncu_sass_summary.py: by opcode,
#                by loop, the hottest instructions; SASS_LINES of it, 45)
#   verify-splits  decode and verify blocks at 1K / 4K, batch 1 / 8, with 1-32 splits forced (the planner's
#                choice at short contexts)
#   ncu-verify   one of the round's attention (ncu_cases.py verify_qwen3_1k_b1)
#   ncu-dense    one launch each of our GEMM and cuBLAS's on Qwen3-8B's qkv and o at DENSE_ROWS
#                rows (16; "16 128" adds the batch-8 block) (ncu_cases.py dense_* / cublas_*):
#                where ours loses its ~4 us at 16 rows, and 11-12 at 128
#   ncu-walk     one of the walk's top-k kernel at batch 32
#   ncu-pairs    one of the walk's pair-score and chain kernel at batch 32
#   walk-splits  the walk floor with its rows sliced 1, 2, 4 and 8 ways (DSPINE_WALK_SPLITS)
#   dense        our CUDA GEMM for few rows against cuBLAS on the round's shapes (cuda_dense_gemm.py;
#                DENSE_ARGS adds its arguments, e.g. "--rows 1 16 64 --sweep": --sweep adds the Hopper
#                kernel under forced tile widths and CTA counts)
#   round-dense  the round as `round` with the projections on our GEMM (DSPINE_DENSE_CUDA=1)
#   round-pdl, round-dense-pdl  `round` and `round-dense` with our launches chained (DSPINE_PDL=1:
#                csrc/cuda/launch.cuh)
#   round-auto, round-auto-pdl  the round with DSPINE_DENSE_CUDA=auto (our GEMM for the lm_head
#                only), unchained and chained (round-auto-pdl: the engine's defaults since the 37th
#                session)
#   round-narrow `round-dense` with the Hopper GEMM's narrow wgmma (DSPINE_DENSE_SM90_WIDE=0; the
#                wide form is the default since the 37th session)
#   round-ks, round-auto-pdl-ks  `round` and `round-auto-pdl` with the row-exact attention on the
#                key-split variant (DSPINE_ATTN_EXACT=2: verify blocks 16 rows a CTA)
#   round-seg128, round-seg64  `round-auto-pdl` with the row-exact attention's segments of 128 / 64
#                keys (DSPINE_ATTN_EXACT_SEGMENT, 256 by default): at 1K a verify block's 4 CTAs a
#                KV head each stream 4 key tiles one after another (latency-bound, 32 CTAs)
#   sass-dense   the GEMM's SASS (cuobjdump): where its loads issue against its mmas
#   sass-sm90    the hd-128 prefill kernel's landmarks in SASS order (sass_landmarks.py): wgmma
#                issues and waits against the softmax's exp2 runs
set -u
O=${OUT:-$PWD/quick_out}; mkdir -p "$O"
t0=$(date +%s); say() { echo "[quick $(( $(date +%s) - t0 ))s] $*"; }
ls .whl/*.whl >/dev/null 2>&1 &&
  python3 -m pip install -q --no-index --no-deps --no-compile --target /root/site .whl/*.whl
export PYTHONPATH=$PWD:/root/site PYTHONUNBUFFERED=1
export DSPINE_CUTLASS_INCLUDE=/root/site/cutlass_library/source/include
# The tests run on the compiler's libstdc++ (the GPU machine's torch loads an older one first).
CXX_LIB=$($(command -v c++ || echo g++) -print-file-name=libstdc++.so)
# The Qwen3-8B-shaped round (random weights, no staged model) at batch 1 and 8 (ROUND_BATCHES), 1K
# context (ROUND_CONTEXTS), kernel by kernel (step_table.py --kernels: the round, then its draft and verify graphs
# alone, each with the time no kernel ran) and call by call (--timeline: host and device time to each
# engine call's return, where the round's time outside the graphs goes): round_word NAME DSPINE_DENSE_CUDA DSPINE_PDL.
round_word() {
  DSPINE_DENSE_CUDA=$2 DSPINE_PDL=$3 LD_PRELOAD=$CXX_LIB timeout 240 python3 benchmarks/step_table.py \
    --batches ${ROUND_BATCHES:-1 8} --contexts ${ROUND_CONTEXTS:-1024} --iters 10 --kernels --timeline --out "$O/$1" > "$O/$1.log" 2>&1
  say "$1 rc $?"; grep -E '^\| (batch|1|8|32) \|' "$O/$1.log" | cut -c1-150
  # each graph's replay against its weights' read floor, its idle share and its time by kind
  grep -E '^(Draft|Verify) graph alone' "$O/$1.log" | sed -E 's/; the [0-9]+ largest of .*//' 
  grep -E '^(Round timeline|\| (scheduler|runner|ops|end)[ .])' "$O/$1.log"
}
build() {  # the extension in place (ninja recompiles what changed), its log into $1
  DSPINE_CUDA_ARCHS=${ARCHS:-90a} MAX_JOBS=$(nproc) timeout 330 python3 setup.py build_ext --inplace > "$1" 2>&1
}
build "$O/build.log"
rc=$?; say "build rc $rc"; tail -2 "$O/build.log"; [ $rc = 0 ] || exit 1
grep -E "csrc/.*(warning|error)" "$O/build.log" | sort -u | head
# A hung kernel fails its test instead of the whole call, where pytest-timeout is carried
# (.whl/pytest_timeout-*.whl): the thread method ends the stuck worker, xdist starts another.
# 180 s a test: the batch-32 walk cases' CPU references took over 90 s beside the other batch-32
# cases at the end of a 12-worker run (H100, 26th session), and 90 killed them.
per_test=""; python3 -c "import pytest_timeout" 2>/dev/null && per_test="--timeout ${TEST_TIMEOUT:-180} --timeout-method thread"
if [ "${TESTS:-1}" = 1 ]; then  # TESTS=0: no tests (a baseline of a tree tested before: h200_ab.sh)
  LD_PRELOAD=$CXX_LIB timeout ${TEST_S:-150} python3 -m pytest -q -m gpu -n 12 ${TEST_FILES:-tests/test_kernels_gpu.py} \
    -rf --durations=10 $per_test ${TEST_K:+-k "$TEST_K"} > "$O/gpu_tests.log" 2>&1
  say "gpu tests rc $?: $(tail -1 "$O/gpu_tests.log")"; grep -E "^(FAILED|ERROR)" "$O/gpu_tests.log" | head -20
fi
if [ "${FLOORS:-1}" = 1 ]; then
  LD_PRELOAD=$CXX_LIB timeout ${FLOORS_S:-60} python3 benchmarks/kernel_bench.py --sampling-only --out "$O" > "$O/floors.log" 2>&1
  say "floors rc $?"; grep -E '^\| (transition_walk|block_verify)' "$O/floors.log" | head -30
fi
MEMCHECK_K=${MEMCHECK_K-rope or transition_walk or exact_segment}
if [ -n "$MEMCHECK_K" ]; then
  LD_PRELOAD=$CXX_LIB timeout ${MEMCHECK_S:-60} compute-sanitizer --tool memcheck python3 -m pytest -q -m gpu \
    ${MEMCHECK_FILES:-tests/test_kernels_gpu.py} -k "($MEMCHECK_K) and not outside_the_table" > "$O/memcheck.log" 2>&1
  say "memcheck rc $?: $(grep -E 'ERROR SUMMARY|passed|failed' "$O/memcheck.log" | tail -2 | tr '\n' ' ')"
fi
# Issue 12's kernel measurements, one side-by-side table each (kernel_bench.py, files in $O).
bench() {  # name, then kernel_bench.py's arguments; BENCH_S its limit, BENCH_COLS the columns shown
  local name=$1; shift
  LD_PRELOAD=$CXX_LIB timeout ${BENCH_S:-60} python3 benchmarks/kernel_bench.py --attention-only "$@" --out "$O/$name" \
    > "$O/$name.log" 2>&1
  say "$name rc $?"; grep -E '^\| (shape|Qwen|Smol)' "$O/$name.log" | cut -d'|' -f"${BENCH_COLS:-2-8,11-17}"
}
ncu_one() {  # name, kernel name regex, launches to skip, then the command: one launch, ncu --set full
  local name=$1 kernel=$2 skip=$3; shift 3
  LD_PRELOAD=$CXX_LIB timeout 90 ncu --set full --kernel-name "regex:$kernel" --launch-skip "$skip" --launch-count 1 \
    -o "$O/$name" "$@" > "$O/ncu_$name.log" 2>&1
  say "ncu $name rc $?"; ncu --import "$O/$name.ncu-rep" --page details > "$O/ncu_${name}_details.txt" 2>&1
  ncu --import "$O/$name.ncu-rep" --page source --print-source sass --csv > "$O/ncu_${name}_sass.csv" 2>&1
  grep -E '^  [a-z_ ].*\(|Duration|Issue Slots Busy|Warp Cycles Per Issued|DRAM Throughput|Grid Size|Registers' \
    "$O/ncu_${name}_details.txt"
  # The SASS page by opcode, by loop and its hottest instructions (ncu_sass_summary.py).
  python3 benchmarks/ncu_sass_summary.py "$O/ncu_${name}_sass.csv" --top 12 > "$O/ncu_${name}_summary.md" 2>&1
  head -"${SASS_LINES:-45}" "$O/ncu_${name}_summary.md"
}
profile() {  # name, kernel name regex, then kernel_bench.py's arguments
  local name=$1 kernel=$2; shift 2
  ncu_one "$name" "$kernel" 3 python3 benchmarks/kernel_bench.py "$@" --out "$O/ncu_$name"
}
for b in ${BENCH:-}; do case $b in
  prefill) bench prefill --modes prefill --shapes Qwen3-8B SmolLM2 --ctxs 4096 8192 --sm90 compare --page-order in-order ;;
  verify-splits) BENCH_S=150 BENCH_COLS=1- bench verify_splits --modes decode verify --shapes Qwen3-8B SmolLM2 \
      --ctxs 1024 4096 --batches 1 8 --splits 1 2 4 8 16 32 ;;  # every column: the forced counts' table too
  attention) bench attention --modes decode verify --shapes Qwen3-8B --ctxs 8192 --batches 1 8 32 ;;
  prefill-cuts)  # the sm90 kernel rebuilt with a part cut (attention_sm90_cuts.h), 8K prefill each;
    # the header goes back to 0 and the extension is rebuilt at the end (~3 min in all)
    h=csrc/cuda/attention_sm90_cuts.h
    for cut in 1 2 3; do
      sed -i "s/^#define DSPINE_SM90_CUTS .*/#define DSPINE_SM90_CUTS $cut/" $h
      build "$O/build_cut$cut.log" || { say "prefill-cuts: the build with cut $cut failed"; break; }
      bench prefill_cut$cut --modes prefill --shapes Qwen3-8B --ctxs 8192 --sm90 compare --page-order in-order
    done
    sed -i "s/^#define DSPINE_SM90_CUTS .*/#define DSPINE_SM90_CUTS 0/" $h
    build "$O/build_cut0.log"; say "prefill-cuts: cuts back to 0, rebuilt (rc $?)" ;;
  prefill-pages) for page in ${PAGES:-16}; do
      for order in shuffled in-order; do
        for loads in cp.async tma; do
          (export DSPINE_SM90_LOADS=$loads
           BENCH_COLS=2-4,7-8,11-12 bench prefill_page${page}_${order}_$loads --modes prefill --shapes Qwen3-8B \
             SmolLM2 --ctxs 4096 8192 --sm90 on --page-size $page --page-order $order)
        done
      done
    done ;;
  prefill-async) (export DSPINE_SM90_ARRIVE=async
    bench prefill_async --modes prefill --shapes Qwen3-8B SmolLM2 --ctxs 4096 8192 --sm90 compare --page-order in-order) ;;
  ncu) profile sm90_prefill paged_attention_sm90 --attention-only --modes prefill --shapes Qwen3-8B \
         --ctxs 8192 --sm90 on --page-order in-order ;;
  ncu-async) (export DSPINE_SM90_ARRIVE=async
    profile sm90_prefill_async paged_attention_sm90 --attention-only --modes prefill --shapes Qwen3-8B \
      --ctxs 8192 --sm90 on --page-order in-order) ;;
  segments)  # the row-exact segment size (default 256 keys) against SEGMENTS (128) at short contexts;
    # the columns shown are the exact modes' (18-19: row tiles, key split), which the size changes
    for seg in 256 ${SEGMENTS:-128}; do (export DSPINE_ATTN_EXACT_SEGMENT=$seg
      BENCH_COLS=2-7,18-19 bench segments_$seg --modes decode verify --shapes Qwen3-8B --ctxs 1024 8192 \
        --batches 1 8 --exact)
    done ;;
  round) round_word round 0 0 ;;  # issue 12 item 4: the Qwen3-8B-shaped round, cuBLAS projections
  ncu-verify)  # the round's attention: a 16-token verify block, Qwen3-8B heads, 1K, batch 1, exact
    ncu_one verify_1k paged_attention_mma 1 python3 benchmarks/ncu_cases.py verify_qwen3_1k_b1 --repeats 3 ;;
  ncu-dense)  # the third launch of each case (the first two pay the workspace and the tensor maps)
    for rows in ${DENSE_ROWS:-16}; do for shape in qkv o; do
      ncu_one dense_${shape}_$rows dense_sm90_kernel 2 python3 benchmarks/ncu_cases.py dense_${shape}_$rows --repeats 3
      ncu_one cublas_${shape}_$rows "nvjet|gemm|splitK" 2 python3 benchmarks/ncu_cases.py cublas_${shape}_$rows --repeats 3
    done; done ;;
  ncu-walk) profile walk_topk walk_topk_kernel --sampling-only ;;  # the batch-32 rows come first
  ncu-pairs) profile walk_pairs walk_pairs_kernel --sampling-only ;;  # the walk's second launch, batch 32
  walk-splits)  # the walk's top-k pass with rows sliced n ways (480 rows at batch 32 = 3.6 per SM:
    for n in 1 2 4 8; do  # does a second, partial wave of CTAs cost it half its bandwidth?)
      DSPINE_WALK_SPLITS=$n LD_PRELOAD=$CXX_LIB timeout ${FLOORS_S:-60} python3 benchmarks/kernel_bench.py --sampling-only \
        --out "$O/walk_splits_$n" > "$O/walk_splits_$n.log" 2>&1
      say "walk splits $n rc $?: $(grep -E '^\| transition_walk \| greedy \| 32' "$O/walk_splits_$n.log")"
    done ;;
  dense)
    LD_PRELOAD=$CXX_LIB timeout 240 python3 benchmarks/cuda_dense_gemm.py ${DENSE_ARGS:-} --out "$O/dense" > "$O/dense.log" 2>&1
    say "dense rc $?"; grep -E '^\| ' "$O/dense.log" ;;
  round-dense) round_word round_dense 1 0 ;;
  round-pdl) round_word round_pdl 0 1 ;;
  round-dense-pdl) round_word round_dense_pdl 1 1 ;;
  round-auto) round_word round_auto auto 0 ;;
  round-auto-pdl) round_word round_auto_pdl auto 1 ;;
  round-narrow) DSPINE_DENSE_SM90_WIDE=0 round_word round_narrow 1 0 ;;
  round-ks) DSPINE_ATTN_EXACT=2 round_word round_ks 0 0 ;;
  round-auto-pdl-ks) DSPINE_ATTN_EXACT=2 round_word round_auto_pdl_ks auto 1 ;;
  round-seg128|round-seg64)  # the defaults' round with the row-exact attention's segments of 128 / 64
    # keys (DSPINE_ATTN_EXACT_SEGMENT; 256 by default): more CTAs of shorter chains at 1K
    DSPINE_ATTN_EXACT_SEGMENT=${b#round-seg} round_word round_auto_pdl_${b#round-} auto 1 ;;
  sass-sm90)  # the hd-128 bf16 prefill kernel's landmarks in SASS order (sass_landmarks.py): where
    # ptxas put each wgmma wait against the softmax's exp2 runs
    so=$(ls dspine_engine/_C*.so | head -1)
    f="$O/sass_sm90_hd128.txt"
    cuobjdump -sass -fun "_ZN6dspine3gpu27paged_attention_sm90_kernelI13__nv_bfloat16Li128ELb1EEEvNS0_20PagedAttentionParamsENS0_12Sm90LoadMapsE" \
      "$so" > "$f" 2>&1
    python3 benchmarks/sass_landmarks.py "$f" > "$O/sass_sm90_landmarks.txt" 2>&1
    say "sass-sm90 rc $?: $(wc -l < "$O/sass_sm90_landmarks.txt") landmark runs"
    grep -vE ' branch x| mbarrier x' "$O/sass_sm90_landmarks.txt" | head -"${SASS_LINES:-45}" ;;
  sass-dense)
    so=$(ls dspine_engine/_C*.so | head -1)
    for ring in 0 1; do  # the register batches (b0) and the cp.async ring (b1), 16 rows, 1 column tile
      f="$O/sass_dense_16_1_ring$ring.txt"
      cuobjdump -sass -fun "_ZN6dspine3gpu17dense_rows_kernelI13__nv_bfloat16Li16ELi1ELb${ring}EEEvNS0_11DenseParamsE" "$so" > "$f" 2>&1
      say "sass-dense ring=$ring: $(grep -cE 'LDG' "$f") LDG, $(grep -cE 'LDGSTS' "$f") LDGSTS, $(grep -cE 'HMMA' "$f") HMMA"
      grep -oE '(LDGSTS|LDG|LDS|HMMA|BAR|BRA)[.A-Z0-9_]*' "$f" | tr '\n' ' ' | cut -c1-700; echo
    done ;;
  *) say "BENCH: unknown word $b (prefill, prefill-async, prefill-pages, prefill-cuts, attention, segments, round, ncu, ncu-async, ncu-verify, ncu-dense, ncu-walk, ncu-pairs, walk-splits, verify-splits, dense, round-dense, round-pdl, round-dense-pdl, round-auto, round-auto-pdl, round-narrow, round-ks, round-auto-pdl-ks, round-seg128, round-seg64, sass-dense, sass-sm90)" ;;
esac; done
# Everything but the profiles in one archive: a call brings back at most 8 files.
(cd "$O" && tar czf /tmp/quick_all.tgz --exclude='*.ncu-rep' . && rm -rf -- ./* && mv /tmp/quick_all.tgz all.tgz)
