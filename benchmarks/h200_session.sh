#!/usr/bin/env bash
# One drafter session on H200s (kind nvidia-h200; the same calls use every GPU of an -x2/-x4/-x8
# machine: data generation and training run under torchrun, one rank per GPU for training,
# DATA_PROCS generator ranks per GPU), as device calls made back to back
# while the machine stays warm (each call within 30 s of the previous one's end).
# First, here: `bash benchmarks/h200_prepare.sh` (splits the GGUF into .stage_1..N to fit the
# 64 MiB a call carries beside the tree, fetches the wheels) and prints the calls:
#
#   stage K N   (carry .stage_K; the first also .whl)  K=1 copies the tree to /root/work,
#               installs the wheels and starts the extension build (detached); every K adds its
#               part of the payload (the GGUF, and the drafters to continue from); K=N joins,
#               checks and unpacks it into /root/stage.                               ~20 s each
#   data        converts the model, builds the prompt corpus and its held-out set, then runs
#               the generators (detached) for DATA_MIN minutes while the GPU tests and memcheck
#               run beside them; rank 0 merges the shards.                           ~7.5 min
#               DATA_TESTS=0: no tests beside them (a short call, tests already passed).
#               Kernel branches staged with BRANCHES= (h200_prepare.sh) run their GPU tests
#               beside the generators in any case (benchmarks/h200_branches.sh).
#               MPS=1: the generators share the GPU through CUDA MPS (kernels of different
#               processes run at once instead of time-sliced); if the daemon cannot start or a
#               client cannot reach it, the call goes on without it and says so.
#               Past CALL_S (540) seconds the call returns with the generators still running
#               (detached); the fit call then waits for them first.
#   fit         DSpine and its DFlash twin side by side (same batches; DDP over the GPUs),
#               sized to FIT_MIN minutes, checkpoints chosen on the held-out set.   ~FIT_MIN+1
#               TWIN=soft0 instead: the DSpine at SOFT, then the same DSpine at alpha 0 for
#               the same steps (the soft labels' ablation; FIT_MIN shared).         ~FIT_MIN+2
#               TWIN=none: the DSpine alone (no ablation; about 1.6x the steps).    ~FIT_MIN+1
#               A call may run 10 minutes: keep FIT_MIN <= 8 (<= 3.5 with TWIN=soft0).
#   gputest     (instead of data/fit/measure) every GPU test, the quantised CPU tests on the
#               host's CPU (AVX-512), the serve load benchmark; TEST_K narrows the GPU tests
#               (pytest -k; TEST_WORKERS the pytest-xdist workers: one per 14 GiB of the GPU's
#               memory, 2-12, so 5 on an H100, whose 80 GB twelve engine-test workers ran out of,
#               and 10 on an H200; TEST_S the tests' time limit, 400 s: at 300 s the 2026-12-04 run
#               stopped at ~97% with 8 workers, no failure; now 12 workers), then memcheck over
#               the tests MEMCHECK_K selects (default: the RoPE, walk and exact-segment ones;
#               MEMCHECK_S, 120 s). GPU_ONLY=1 stops after the GPU tests and memcheck (no
#               quantised CPU tests, AddressSanitizer build or serve benchmark).      ~9 min
#   measure     acceptance on HumanEval/MT-Bench at T=0/1 for both drafters, GPU lossless
#               check, end to end AR vs DSpine (fixed and dynamic verification, answers ending
#               at EOS), the step table, training speed;
#               returns results + drafters.                                          ~8 min
#               MEASURE="policytrace": auto vs fixed at c=1 on fresh engines, twice, and the
#               process's threads mid-run (issue 11's c=1 gap; e2e's c=1 comes after c=8). ~2 min
#               MEASURE="rounds": where a c=1 round's host time goes (round_profile.py on cuda:
#               launches, the draft's pieces, the verify's sync) beside the AR step.  ~1 min
#               MEASURE="branches": the kernel branches' benchmarks (h200_branches.sh bench,
#               BRANCH_BENCH="name=kernel_bench.py args;..."), before and after; with
#               BRANCH_NCU="name=kernel-regex ...;..." ncu on those kernels too. ~1-2 min each (+1-5 per ncu)
#               MEASURE="kernels" (not in the default set): benchmarks/attention_h200.sh on
#               the stage-1 build: attention GPU tests, memcheck subset, decode/verify rows
#               of benchmarks/kernel_bench.py beside SDPA (issue 12).                     ~4 min
#               MEASURE="rows" (not in the default set): benchmarks/gpu_row_exactness.py (is a
#               verify row bitwise the decoded row, per attention knob; GEMMs), the row-exact
#               kernel tests and the greedy lossless engine tests (tie-checked, and exact under
#               the row-exact knobs).                                                   ~3 min
#               MEASURE="exactab" (not in the default set): the row-exact attention's price:
#               kernel_bench.py --exact (both forms), then dspine-bench e2e at c=64/8/1 with
#               --attention fast, exact, and exact on the key split (DSPINE_ATTN_EXACT=2), in
#               turn, twice.                                                             ~9 min
#               MEASURE="roundkernels" (not in the default set): round_kernels.py: a c=1
#               round's device time by phase (CUDA events) and by kernel (torch.profiler),
#               AR step and drafted rounds at w=4 and 16; then step_table.py --kernels: the
#               Qwen3-8B-shaped round at batch 1 and 8, 1K, by kernel (issue 12 item 4). ~4 min
#               MEASURE="segments" (not in the default set): the row-exact attention at 256-key
#               segments (the default) and at 128 (DSPINE_ATTN_EXACT_SEGMENT): kernel_bench.py
#               --exact rows, the Qwen3-8B step table at 1K/8K, then e2e on the default model
#               at c = 8, 1, alternated twice: which size the default should be.     ~8 min
#               MEASURE="defaultsab" (not in the default set): e2e on the default model at
#               c = 32, 8, 1 under the GPU defaults (our GEMM for the lm_head, chained launches)
#               and under DSPINE_DENSE_CUDA=0 DSPINE_PDL=0, alternated, twice.          ~5 min
#               MEASURE="ncu" (not in the default set): ncu --set full on the walk's kernels at
#               c = 1 (V = 49152 and 151936) and batch 32, the Qwen3-8B 1K verify attention, the
#               top-k/top-p block verify at batch 32
#               (benchmarks/ncu_cases.py; NCU_CASES="case=kernel-regex ..." picks others). ~5 min
#               MEASURE="prefill" (not in the default set): kernel_bench.py --modes prefill
#               --sm90 compare: the wgmma kernel beside mma.sync and the SDPA backends (issue 12
#               item 1; the sm90 path is opt-in, DSPINE_ATTN_SM90).                   ~3 min
#               MEASURE="ttft" (not in the default set): benchmarks/prefill_ttft.py: time to
#               first token of 1K-8K prompts on the default model, prefill attention on the
#               wgmma kernel (the default on sm_90) against mma.sync (DSPINE_ATTN_SM90=0). ~2 min
#               MEASURE="tp" (not in the default set; a multi-GPU kind): benchmarks/tp_bench.py
#               --device cuda, TP = 1, 2, 4, 8 up to the GPUs, batch 1/8/32, the Qwen3-8B shape
#               with a random 5-layer draft (issue 15; DSPINE_TP_CUDA=1 for its first runs). ~8 min
#               MEASURE="floors" (not in the default set): kernel_bench.py --sampling-only:
#               the walk and the block verify at batch 32, V=151936 (every variant) and
#               greedy at batch 1, V=49152 (issue 12 item 3).                       ~1 min
#               MEASURE="splits" (not in the default set): kernel_bench.py on the decode and
#               verify rows of Qwen3-8B and SmolLM2 at 1-8K, batch 1 and 8, the fast plan's
#               split count against forced ones (--splits 1 2 4 8 16 32) and both exact forms:
#               is a verify block's time its split floor (issue 12 item 2).            ~2 min
#               MEASURE="hybrid" (not in the default set): the Qwen3.8-27B-shaped hybrid
#               step table (ReplaySSM commit, replay vs stored states) + gated_delta.py. ~6 min
#
# Results come back in $OUT/results.tar.gz; each drafter's shards as their own files (<= 15 MiB).
# Continuing (the accumulating runs of docs/TRAINING.md), in the fit call's environment:
#   INIT_DRAFT=DIR   the DSpine draft to start from (a committed drafter in the tree, or one
#                    staged through h200_prepare.sh's INIT_DIRS as /root/stage/init/<name>)
#   INIT_TWIN=DIR    the DFlash twin to start from (the previous run's), so both accumulate
#                    the same budget; without it the twin starts from INIT_DRAFT's weights.
#                    With INIT_TWIN alone, INIT_DRAFT is the shipped drafter (the tree's).
set -u
MODE=${1:-}
W=/root/work S=/root/stage R=/root/stage/results
export PYTHONPATH=$W:/root/site PYTHONUNBUFFERED=1 DSPINE_CACHE=/root/cache
export DSPINE_SMOLLM2_GGUF=$S/smollm2.gguf
# CUTLASS/CuTe headers of the nvidia-cutlass wheel (.whl, installed into /root/site by stage 1, as
# gguf is): a build that has the sm90 attention kernel (the `cute` branch) compiles it with
# them; its setup.py warns and builds without that path when they are missing.
export DSPINE_CUTLASS_INCLUDE=/root/site/cutlass_library/source/include
GPUS=$(nvidia-smi -L 2>/dev/null | wc -l); [ "$GPUS" -ge 1 ] || GPUS=1
DATA_MIN=${DATA_MIN:-5.5} DATA_PROCS=${DATA_PROCS:-4} FIT_MIN=${FIT_MIN:-6.5}  # per GPU: procs
BATCH=${BATCH:-$(( 64 / GPUS > 16 ? 64 / GPUS : 16 ))} LR=${LR:-6e-4}  # per-rank batch
NUM_PROMPTS=${NUM_PROMPTS:-400000} HELDOUT=${HELDOUT:-384} SEED=${SEED:-1}
KV_TOKENS=${KV_TOKENS:-400000} MAX_NEW=${MAX_NEW:-512} MAX_SEQS=${MAX_SEQS:-256}  # per rank
MAGPIE=${MAGPIE:-0.05}  # share of the corpus asked for as the target's own (Magpie) prompts
SAMPLED=${SAMPLED:-0.2}  # share of the answers sampled at T=1 (the rest greedy)
SOFT=${SOFT:-0}  # fit: alpha of the soft label (`dspine-train fit --soft-targets`)
TWIN=${TWIN:-dflash}  # fit: the twin; dflash (same batches, one process) or soft0 (the same
                      # DSpine at alpha 0, trained after the first for its step count: the
                      # soft labels' ablation; FIT_MIN is then split between the two), or
                      # none (the DSpine alone, for the whole FIT_MIN)
MIX=${MIX:-}  # prompt family shares for `dspine-train prompts --mix`, e.g. code=0.36,multiturn=0.16
DRAFT_ARCH=${DRAFT_ARCH:---layers 5 --intermediate 768 --rank 256 --top-k 8 --init-from-target}
# The compiler whose C++ runtime tests preload (CXX_LIB): the machine's torch loads an older
# libstdc++ first, and an exception thrown through it can crash (README); h200_branches.sh reads
# CXX_LIB too.
export HOST_CXX=$(command -v c++ || echo /opt/gcc/bin/g++)
export CXX_LIB=$($HOST_CXX -print-file-name=libstdc++.so 2>/dev/null)
t0=$(date +%s)
[ -f $S/commit ] && export DSPINE_COMMIT=$(cat $S/commit)
say() { echo "[$MODE $(( $(date +%s) - t0 ))s] $*" | tee -a $S/session.log; }
pack() {  # everything small in one archive; the drafters' shards travel as their own files
  (cd $S && tar czf $OUT/results.tar.gz --exclude='*.safetensors' --exclude='train_state*' \
     results session.log build.log data_stats.txt 2>/dev/null)
  for d in dspine dflash; do
    for f in $R/$d/model*.safetensors; do [ -f "$f" ] && cp "$f" $OUT/${d}_$(basename "$f"); done
  done
  return 0
}
sync_tree() {  # Python-only changes made since `stage 1` (this call's tree) into $W; the build stays
  tar --exclude='./.stage_*' --exclude=./.whl --exclude=./.git --exclude='*.so' -cf - . |
    (cd $W && tar xf -)
}

if [ "$MODE" = stage ]; then
  K=$2 N=$3
  mkdir -p $S $R/logs /root/site $W $DSPINE_CACHE/datasets
  cp .stage_$K/payload_part $S/payload_part_$K
  if [ "$K" = 1 ]; then
    cp .stage_1/payload.sha256 .stage_1/commit $S/
    tar --exclude='./.stage_*' --exclude=./.whl --exclude=./.git -cf - . | (cd $W && tar xf -)
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /root/site .whl/*.whl
    [ -f $DSPINE_CUTLASS_INCLUDE/cute/tensor.hpp ] || echo "no CUTLASS headers: a build with the sm90 attention kernel skips it"
    [ -d .whl/serve ] && python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir \
      --target /root/serve-site .whl/serve/*.whl  # apart: only the serve benchmark puts it on the path
    cp .whl/datasets/*.whl $DSPINE_CACHE/datasets/
    # Detached, and holding none of this call's output: the call returns while it builds.
    (cd $W && exec setsid nohup bash -c "DSPINE_CUDA_ARCHS='${BUILD_ARCHS:-80;90a}' MAX_JOBS=16 python3 setup.py build_ext --inplace > $S/build.log 2>&1; echo \$? > $S/build.rc") >/dev/null 2>&1 < /dev/null &
    nvidia-smi -L
  fi
  if [ "$K" = "$N" ]; then
    cat $(for k in $(seq 1 $N); do echo $S/payload_part_$k; done) > $S/payload.tar
    echo "$(cat $S/payload.sha256)  $S/payload.tar" | sha256sum -c - || { say "payload checksum failed"; exit 1; }
    tar -xf $S/payload.tar -C $S && rm $S/payload.tar $S/payload_part_*
    say "unpacked: $(cd $S && ls -d smollm2.gguf init/* 2>/dev/null | tr '\n' ' ')"
    # A slim tree (h200_prepare.sh SLIM=1) left the shipped drafter's shards out: put them back.
    shipped=$W/dspine_engine/drafters/smollm2-135m-dspine
    [ -d $S/init/$(basename $shipped) ] && ! ls $shipped/*.safetensors >/dev/null 2>&1 &&
      cp $S/init/$(basename $shipped)/*.safetensors $shipped/
  fi
  if [ -d .stage_branches ]; then  # kernel branches: built after the session's build, in turn
    mkdir -p /root/branch && cp -r .stage_branches/. /root/branch/
    setsid nohup bash $W/benchmarks/h200_branches.sh build > $S/branches_build.log 2>&1 < /dev/null &
    say "branches staged: $(ls /root/branch | tr '\n' ' ')"
  fi
  say "staged part $K of $N"; exit 0
fi

convert_model() {  # the default model's directory from the staged GGUF (once per machine)
  python3 -c "from dspine_engine.models.default_model import default_model_dir as d; print(d(progress=False))"
}
quant_cpu_tests() {  # the quantised CPU kernels on this host's CPU (AVX-512 VNNI, which CI lacks)
  { python3 -c "from dspine_engine import ops; print('quant isa', ops.quant_isa())"
    timeout 200 python3 -m pytest -q tests/test_quant_cpu.py -rf; } > $R/logs/quant_cpu.log 2>&1
  local rc=$?
  say "quant cpu rc $rc : $(head -1 $R/logs/quant_cpu.log) $(tail -1 $R/logs/quant_cpu.log)"
  grep -E "^(FAILED|Fatal)|File .*test_" $R/logs/quant_cpu.log | head -8
  # A crash (the AVX-512 embedding check): the native frames of the first crashing test.
  if [ "$rc" = 139 ] && command -v gdb >/dev/null; then
    local t; t=$(grep -oE "in test_[a-z_0-9]+" $R/logs/quant_cpu.log | head -1 | cut -c4-)
    timeout 120 gdb -q -batch -ex run -ex bt -ex "info registers rip rsp" -ex "x/6i \$pc" \
      --args python3 -m pytest -q -x tests/test_quant_cpu.py -k "$t" > $R/logs/quant_cpu_gdb.log 2>&1
    say "quant cpu crash under gdb: $(grep -E '^#[0-9]' $R/logs/quant_cpu_gdb.log | head -6 | cut -c1-160 | tr '\n' ';')"
  fi
  # The CPU-only AddressSanitizer run (which preloads the compiler's libstdc++) passes where this
  # build crashes on its first C++ exception: the same tests on the compiler's libstdc++ tell a
  # runtime mismatch (the process loads an older libstdc++ first) from a code fault.
  if [ "$rc" = 139 ]; then
    LD_PRELOAD=$CXX_LIB timeout 200 python3 -m pytest -q \
      tests/test_quant_cpu.py -rf > $R/logs/quant_cpu_preload.log 2>&1
    say "quant cpu on the compiler's libstdc++ rc $? : $(tail -1 $R/logs/quant_cpu_preload.log)"
    python3 -c "from dspine_engine import ops; print('libstdc++ loaded:', {l.split()[-1] for l in
      open('/proc/self/maps') if 'libstdc++' in l}, 'compiler:', '$CXX_LIB')" \
      >> $R/logs/quant_cpu_preload.log 2>&1
  fi
}

profile_generator() {  # where one generator rank's host-bound step goes (py-spy, 20 s, raw stacks)
  local launcher rank
  launcher=$(pgrep -f "torch.distributed.run.*--out $S/data.jsonl" | head -1)
  rank=$([ -n "$launcher" ] && pgrep -P "$launcher" | head -1)
  [ -n "$rank" ] && [ -x /root/site/bin/py-spy ] || { say "profile: no rank or no py-spy"; return 0; }
  timeout 60 /root/site/bin/py-spy record --pid "$rank" --duration 20 --rate 100 --nonblocking \
    --format raw --output $R/logs/generator_profile.txt > $R/logs/py_spy.log 2>&1
  say "profile rc $? ($(wc -l < $R/logs/generator_profile.txt 2>/dev/null) stacks)"
}

data_stats() {  # once the generators have ended: what they wrote, into data_stats.txt
  while pgrep -f "cli.train data" >/dev/null; do sleep 2; done
  for f in $R/logs/data.log $R/logs/heldout.log; do echo "$f: $(tail -c 2000 $f | tr '\r' '\n' | grep -E 'tokens/s|records' | tr '\n' ' ')"; done > $S/data_stats.txt
  say "data: $(head -1 $S/data_stats.txt)"
  stop_mps
}

start_mps() {  # CUDA MPS for the generators (the default pipe directory: every later process uses it)
  nvidia-cuda-mps-control -d > $R/logs/mps.log 2>&1 &&
    timeout 60 python3 -c "import torch; print(torch.ones(8, device='cuda').sum().item())" >> $R/logs/mps.log 2>&1
  local rc=$?
  if [ $rc = 0 ]; then touch $S/mps.on; say "MPS on"; else
    echo quit | timeout 10 nvidia-cuda-mps-control >/dev/null 2>&1
    say "MPS unavailable (rc $rc), generators time-slice: $(tail -2 $R/logs/mps.log | tr '\n' ' ')"
  fi
}

stop_mps() {  # once the generators are done: the fit and measure calls run as on a plain GPU
  # (run 12's e2e ran under the still-running daemon, 2026-12-03: not comparable with run 11's)
  # A client started while the daemon is still going away fails CUDA's initialisation (error
  # 805: run 13's fit, 2026-12-03, fell back to the CPU at 190 s a step): wait for the daemon
  # and its server to exit, then for a fresh process to see the GPU (the pipe directory removed
  # if it still does not), and end the call if it never does.
  [ -f $S/mps.on ] || return 0
  echo quit | timeout 30 nvidia-cuda-mps-control >/dev/null 2>&1
  for _ in $(seq 30); do pgrep -f "nvidia-cuda-mps-(control|server)" >/dev/null || break; sleep 1; done
  rm -f $S/mps.on
  cuda_ready || { rm -rf /tmp/nvidia-mps; cuda_ready; } ||
    { say "CUDA does not come back after MPS: $(tail -2 $R/logs/mps.log | tr '\n' ' ')"; pack; exit 1; }
  say "MPS off"
}

cuda_ready() {  # a fresh process sees the GPU, within 30 s
  for _ in $(seq 10); do
    python3 -c "import torch; assert torch.cuda.is_available(); torch.ones(1, device='cuda')" \
      >> $R/logs/mps.log 2>&1 && return 0
    sleep 3
  done
  return 1
}

wait_build() {
  while [ ! -f $S/build.rc ]; do sleep 2; done
  say "build rc $(cat $S/build.rc)"; tail -3 $S/build.log
  [ "$(cat $S/build.rc)" = 0 ] || exit 1
}

if [ "$MODE" = data ]; then
  sync_tree; cd $W; wait_build
  convert_model || exit 1
  timeout 180 python3 -m dspine_engine.cli.train prompts --out $S/prompts.jsonl --num $NUM_PROMPTS \
    --seed $SEED --magpie-share $MAGPIE ${MIX:+--mix $MIX} --heldout-out $S/heldout_prompts.jsonl --heldout-num $HELDOUT --quiet > $R/logs/prompts.log 2>&1
  say "prompts rc $? : $(tail -2 $R/logs/prompts.log | tr '\n' ' ')"
  # One torchrun: DATA_PROCS generator ranks per GPU, each answering every W-th prompt into its
  # own shard; rank 0 merges the shards into data.jsonl at the end (dspine-train merge's rule).
  gen() {  # $1 ranks, $2 prompts file, $3 output, $4 seed, $5 minutes
    OMP_NUM_THREADS=2 setsid nohup python3 -m torch.distributed.run --nproc-per-node $1 --master-port $((29500 + $4 % 100)) \
      -m dspine_engine.cli.train data --prompts $2 --out $3 --seed $4 --max-new-tokens $MAX_NEW \
      --max-num-seqs $MAX_SEQS --kv-cache-tokens $KV_TOKENS --sampled-share $SAMPLED --max-minutes $5 --quiet \
      > $R/logs/$(basename $3 .jsonl).log 2>&1 < /dev/null &
  }
  [ "${MPS:-0}" = 1 ] && start_mps
  [ -d /root/branch ] && { setsid nohup bash benchmarks/h200_branches.sh test > $S/branches_test.log 2>&1 < /dev/null & }
  gen 1 $S/heldout_prompts.jsonl $S/heldout.jsonl 999 2
  gen $((GPUS * DATA_PROCS)) $S/prompts.jsonl $S/data.jsonl $SEED $DATA_MIN
  say "generators started"
  sleep 45  # a generator that fails at start-up ends the call here, with its log, not minutes later
  if ! pgrep -f "cli.train data" >/dev/null; then
    say "generators died"; tail -40 $R/logs/data.log; pack; exit 1
  fi
  profile_generator &
  # Beside them (the GPU has room): every GPU test, then memcheck over the kernel tests (not the
  # test that provokes the RoPE device assertion on purpose: memcheck counts it as errors).
  [ "${DATA_TESTS:-1}" = 1 ] && {  # DATA_TESTS=0: a short data call, tests already run on this commit
  # On CXX_LIB, as the branch tests: without it the bad-metadata test's exception crashed its
  # worker and memcheck's run (2026-12-04).
  # Bounded by what is left of the call (CALL_S, less ~2.5 minutes for memcheck, the quantised
  # tests and the merge): beside the generators the suite ran past 300 s (2026-12-04) and the
  # call reached the device's 600 s limit, where a cut call brings nothing back. Alone it takes
  # ~240 s; `gputest` (or a measure call) runs it whole.
  tests_s=$(( ${CALL_S:-540} - ($(date +%s) - t0) - 150 )); [ $tests_s -gt 300 ] && tests_s=300
  [ $tests_s -lt 60 ] && tests_s=60
  LD_PRELOAD=$CXX_LIB timeout $tests_s python3 -m pytest -q -m gpu -n 4 tests -rf > $R/logs/gpu_tests.log 2>&1
  say "gpu tests rc $? : $(tail -1 $R/logs/gpu_tests.log)"; pack
  LD_PRELOAD=$CXX_LIB timeout 90 compute-sanitizer --tool memcheck python3 -m pytest -q -x -m gpu tests/test_kernels_gpu.py \
    -k "(paged_attention or walk or block_verify or injection or rope) and not outside_the_table" > $R/logs/memcheck.log 2>&1
  say "memcheck rc $? : $(grep -E 'ERROR SUMMARY|passed|failed' $R/logs/memcheck.log | tail -2 | tr '\n' ' ')"
  quant_cpu_tests; }
  # A call may run 10 minutes: past CALL_S of this script the call returns and the generators
  # (detached) go on; `fit` waits for them. A call cut at its limit brings nothing back.
  while pgrep -f "cli.train data" >/dev/null; do
    if [ $(( $(date +%s) - t0 )) -gt ${CALL_S:-540} ]; then
      say "generators still running; the fit call waits for them"; pack; exit 0
    fi
    sleep 2
  done
  data_stats; pack; exit 0
fi

if [ "$MODE" = gputest ]; then  # after the stage calls: every GPU test and the CPU's own ISA
  sync_tree; cd $W
  # Beside the GPU tests: a CPU-only AddressSanitizer build for the quantised kernels' tests.
  [ "${GPU_ONLY:-0}" = 1 ] || { rm -rf /tmp/asan && mkdir -p /tmp/asan && tar --exclude=./build --exclude='*.so' -cf - . | (cd /tmp/asan && tar xf -)
  (cd /tmp/asan && DSPINE_CUDA=0 DSPINE_SANITIZE=address MAX_JOBS=4 setsid nohup python3 setup.py build_ext --inplace > $S/asan_build.log 2>&1; echo $? > $S/asan_build.rc) >/dev/null 2>&1 < /dev/null & }
  wait_build
  convert_model >/dev/null || exit 1
  # A hung kernel fails its test, not the call (pytest-timeout, from .whl, where staged).
  per_test=""; python3 -c "import pytest_timeout" 2>/dev/null && per_test="--timeout ${TEST_TIMEOUT:-180} --timeout-method thread"
  # Workers by memory: the engine's tests hold up to ~12 GB each (37th session, H100).
  gpu_mib=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits 2>/dev/null | head -1)
  workers=$(( ${gpu_mib:-143360} / 14336 )); [ $workers -gt 12 ] && workers=12; [ $workers -lt 2 ] && workers=2
  LD_PRELOAD=$CXX_LIB timeout ${TEST_S:-400} python3 -m pytest -q -m gpu -n ${TEST_WORKERS:-$workers} tests -rf --durations=25 $per_test ${TEST_K:+-k "$TEST_K"} > $R/logs/gpu_tests.log 2>&1
  say "gpu tests rc $? : $(tail -1 $R/logs/gpu_tests.log)"; grep -E "^(FAILED|ERROR)" $R/logs/gpu_tests.log | head -20
  # memcheck over the kernels changed since the last run (MEMCHECK_K: a pytest -k; empty skips it)
  MEMCHECK_K=${MEMCHECK_K-rope or transition_walk or exact_segment}
  if [ -n "$MEMCHECK_K" ]; then
    LD_PRELOAD=$CXX_LIB timeout ${MEMCHECK_S:-120} compute-sanitizer --tool memcheck python3 -m pytest -q -m gpu \
      tests/test_kernels_gpu.py -k "($MEMCHECK_K) and not outside_the_table" > $R/logs/memcheck.log 2>&1
    say "memcheck rc $? : $(grep -E 'ERROR SUMMARY|passed|failed' $R/logs/memcheck.log | tail -2 | tr '\n' ' ')"
  fi
  [ "${GPU_ONLY:-0}" = 1 ] && { pack; exit 0; }  # the engine's GPU tests alone (a dispatch change)
  quant_cpu_tests; pack
  while [ ! -f $S/asan_build.rc ]; do sleep 2; done
  (cd /tmp/asan && PYTHONPATH=/tmp/asan:/root/site LD_PRELOAD=$($HOST_CXX -print-file-name=libasan.so):$CXX_LIB \
    ASAN_OPTIONS=detect_leaks=0:protect_shadow_gap=0:detect_odr_violation=0:alloc_dealloc_mismatch=0:log_path=$R/logs/asan \
    timeout 150 python3 -m pytest -q tests/test_quant_cpu.py -rf > $R/logs/quant_cpu_asan.log 2>&1); rc=$?
  say "asan build rc $(cat $S/asan_build.rc), quant cpu under asan rc $rc : $(tail -1 $R/logs/quant_cpu_asan.log)"
  ls $R/logs/asan.* >/dev/null 2>&1 && head -40 $R/logs/asan.*; pack
  PYTHONPATH=$PYTHONPATH:/root/serve-site timeout ${SERVE_S:-150} python3 benchmarks/serve_load.py \
    --device cuda --concurrency 1 8 32 --requests-per-client 2 --max-tokens 128 --out $R --no-doc \
    --quiet > $R/logs/serve_load.log 2>&1
  say "serve load rc $? : $(tail -3 $R/logs/serve_load.log | tr '\n' ' ')"; pack; exit 0
fi

if [ "$MODE" = fit ]; then
  sync_tree; cd $W
  [ -f $S/data_stats.txt ] || data_stats  # the data call returned before its generators ended
  # A call may run 600 s: the fit gets what waiting for the generators left (sizing keeps
  # `fit --max-minutes` inside its budget with ~50 s to spare, hence the small margin here).
  FIT_MIN=$(python3 -c "print(round(min($FIT_MIN, (575 - $(( $(date +%s) - t0 ))) / 60), 2))")
  say "fit budget $FIT_MIN min"
  # A twin continues a pair: its DSpine half is the shipped drafter unless INIT_DRAFT says otherwise.
  [ -n "${INIT_TWIN:-}" ] && INIT_DRAFT=${INIT_DRAFT:-$W/dspine_engine/drafters/smollm2-135m-dspine}
  init="$DRAFT_ARCH"; [ -n "${INIT_DRAFT:-}" ] && init="--draft $INIT_DRAFT --warmup ${WARMUP:-50}"
  [ -n "${INIT_TWIN:-}" ] && init="$init --ablation-draft $INIT_TWIN"
  fit() {  # fit OUT LOG ARGS...: one dspine-train fit on this run's data (--device cuda: a GPU
    # CUDA cannot reach ends the fit at once instead of training on the CPU)
    local out=$1 log=$2; shift 2
    python3 -m torch.distributed.run --nproc-per-node $GPUS -m dspine_engine.cli.train fit \
      --data $S/data.jsonl --eval-data $S/heldout.jsonl --out $out $init --batch-size $BATCH \
      --lr $LR --save-every 250 --eval-batches 6 --log-every 20 --quiet --device cuda "$@" > $log 2>&1
    say "fit $(basename $out) rc $? : $(tail -c 600 $log | tr '\r' '\n' | tail -3 | tr '\n' ' ')"
  }
  if [ "$TWIN" = dflash ]; then  # both in one process: the same batches, the budget shared
    fit $R/dspine $R/logs/fit.log --ablation-out $R/dflash --steps auto --max-minutes $FIT_MIN \
      --soft-targets $SOFT
  elif [ "$TWIN" = none ]; then  # the DSpine alone: the whole budget goes to the shipped line
    fit $R/dspine $R/logs/fit.log --steps auto --max-minutes $FIT_MIN --soft-targets $SOFT
  else  # soft0: the same DSpine at alpha 0 after it, for as many steps as the first one sized
    fit $R/dspine $R/logs/fit.log --steps auto --max-minutes $(python3 -c "print($FIT_MIN / 2)") \
      --soft-targets $SOFT
    steps=$(grep -o "sized to the budget: [0-9]*" $R/logs/fit.log | grep -o "[0-9]*$" | tail -1)
    fit $R/dspine_a0 $R/logs/fit_a0.log --steps ${steps:?the first fit did not size itself} \
      --soft-targets 0
  fi
  pack; exit 0
fi

if [ "$MODE" = measure ]; then  # MEASURE picks the parts; EVAL_ALSO="NAME=DIR ..." adds drafters
  sync_tree; cd $W                # to the acceptance table (e.g. the shipped one, side by side)
  wait_build; convert_model >/dev/null || exit 1  # a measure right after the stage calls
  MEASURE=${MEASURE:-eval e2e steps speed}  # and "tests": the engine's GPU tests on a free GPU
  also=""; for d in ${EVAL_ALSO:-}; do also="$also --draft $d"; done
  # The drafter measured: this run's fit, or the shipped one when no fit ran on this machine.
  drafter=$R/dspine; [ -f $drafter/config.json ] || drafter=$W/dspine_engine/drafters/smollm2-135m-dspine
  case " $MEASURE " in *" eval "*)
  for d in dflash dspine_a0; do [ -f $R/$d/config.json ] && also="--draft $d=$R/$d $also"; done
  timeout 240 python3 benchmarks/drafter_eval.py --draft dspine=$drafter $also \
    --lossless 20 --lossless-dtypes bfloat16 --out $R > $R/logs/drafter_eval.log 2>&1
  say "drafter eval rc $? : $(grep tau $R/logs/drafter_eval.log | tr '\n' ';')"; pack;; esac
  case " $MEASURE " in *" e2e "*|*" policytrace "*|*" exactab "*|*" segments "*|*" defaultsab "*)  # the end-to-end prompts: 40 MT-Bench + 40 HumanEval
  python3 -c "
from dspine_engine.datasets import humaneval_prompts, mtbench_prompts; import json
ps = mtbench_prompts()[:40] + humaneval_prompts()[:40]
open('$S/e2e_prompts.jsonl','w').write(''.join(json.dumps({'prompt': p})+'\\n' for p in ps))";; esac
  case " $MEASURE " in *" e2e "*)
  # The answers users get (stop at EOS), AR vs DSpine under fixed and dynamic verification.
  timeout 300 python3 -m dspine_engine.cli.bench e2e --prompts $S/e2e_prompts.jsonl --max-new-tokens 256 \
    --draft dspine=$drafter --spec-policy fixed auto --reprofile --stop-at-eos --concurrency 64 32 8 1 \
    --out $R --name e2e_h200 --quiet > $R/logs/e2e.log 2>&1
  say "e2e rc $?"; pack;; esac
  case " $MEASURE " in *" exactab "*)  # the row-exact attention's price: kernels, then end to end
  timeout 120 python3 benchmarks/kernel_bench.py --attention-only --modes decode verify --exact \
    --out $R > $R/logs/kernel_exact.log 2>&1
  say "kernel bench --exact rc $?"
  # --attention fast / exact (row tiles) / exact on the key split (DSPINE_ATTN_EXACT=2), in turn, twice.
  for rep in 1 2; do for form in fast exact exact_ks; do
    att=$form; env=""; [ $form = exact_ks ] && { att=fast; env="DSPINE_ATTN_EXACT=2"; }
    env $env timeout 65 python3 -m dspine_engine.cli.bench e2e --prompts $S/e2e_prompts.jsonl \
      --max-new-tokens 256 --draft dspine=$drafter --spec-policy fixed --stop-at-eos \
      --concurrency 64 8 1 --attention $att --out $R --name exactab_${form}_$rep --quiet \
      > $R/logs/exactab_${form}_$rep.log 2>&1
    say "exactab $form $rep rc $?: $(grep -E 'c=' $R/logs/exactab_${form}_$rep.log | cut -c1-40 | tr '\n' ';')"
  done; done; pack;; esac
  case " $MEASURE " in *" defaultsab "*)  # the 37th session's GPU defaults against the old ones
  # End to end on the default model at c = 32, 8, 1 (fixed policy, answers end at EOS): our GEMM
  # for the lm_head and chained launches (DSPINE_DENSE_CUDA=auto, DSPINE_PDL unset) against cuBLAS
  # everywhere and unchained launches (DSPINE_DENSE_CUDA=0 DSPINE_PDL=0), alternated, twice.
  for rep in 1 2; do for form in defaults old; do
    env=""; [ $form = old ] && env="DSPINE_DENSE_CUDA=0 DSPINE_PDL=0"
    env $env timeout 90 python3 -m dspine_engine.cli.bench e2e --prompts $S/e2e_prompts.jsonl \
      --max-new-tokens 256 --draft dspine=$drafter --spec-policy fixed --stop-at-eos \
      --concurrency 32 8 1 --out $R --name defaultsab_${form}_$rep --quiet > $R/logs/defaultsab_${form}_$rep.log 2>&1
    say "defaultsab $form $rep rc $?: $(grep -E 'c=' $R/logs/defaultsab_${form}_$rep.log | cut -c1-60 | tr '\n' ';')"
  done; done; pack;; esac
  case " $MEASURE " in *" segments "*)  # issue 12: the row-exact mode's segment size, 256 (default) vs 128
  for seg in 256 128; do
    DSPINE_ATTN_EXACT_SEGMENT=$seg timeout 120 python3 benchmarks/kernel_bench.py --attention-only \
      --modes decode verify --shapes Qwen3-8B SmolLM2 --ctxs 1024 4096 32768 --batches 1 8 32 --exact \
      --out $R/segments_$seg > $R/logs/kernel_segments_$seg.log 2>&1
    say "kernel bench segment $seg rc $?"
    DSPINE_ATTN_EXACT_SEGMENT=$seg timeout 150 python3 benchmarks/step_table.py --batches 1 8 \
      --contexts 1024 8192 --iters 10 --out $R/segments_$seg > $R/logs/step_table_segments_$seg.log 2>&1
    say "step table segment $seg rc $? : $(grep -E '^\| (1|8) \|' $R/logs/step_table_segments_$seg.log | cut -c1-100 | tr '\n' ' ')"
  done
  # End to end on the default model at c = 8 and 1 (fixed policy), the two sizes alternated, twice.
  for rep in 1 2; do for seg in 256 128; do
    DSPINE_ATTN_EXACT_SEGMENT=$seg timeout 70 python3 -m dspine_engine.cli.bench e2e \
      --prompts $S/e2e_prompts.jsonl --max-new-tokens 256 --draft dspine=$drafter --spec-policy fixed \
      --stop-at-eos --concurrency 8 1 --out $R --name segments_${seg}_$rep --quiet \
      > $R/logs/segments_e2e_${seg}_$rep.log 2>&1
    say "e2e segment $seg $rep rc $?: $(grep -E 'c=' $R/logs/segments_e2e_${seg}_$rep.log | cut -c1-40 | tr '\n' ';')"
  done; done; pack;; esac
  case " $MEASURE " in *" ncu "*)  # issue 12: why the latency-bound kernels take what they take
  # NCU_CASES="case=kernel-regex ...": benchmarks/ncu_cases.py cases, 2 launches each profiled in
  # full; the details page comes back as CSV (the .ncu-rep stays: it is large).
  for spec in ${NCU_CASES:-walk_b1_v49152=walk_ walk_b1_v151936=walk_ walk_b32_v151936=walk_ verify_qwen3_1k_b1=paged_attention_mma block_verify_topk_b32=block_verify}; do
    c=${spec%%=*} k=${spec#*=}
    timeout 150 ncu --set full -k "regex:$k" --launch-count 2 -f -o /tmp/ncu_$c \
      python3 benchmarks/ncu_cases.py $c --repeats 2 > $R/logs/ncu_$c.log 2>&1
    say "ncu $c ($k) rc $?"
    ncu --import /tmp/ncu_$c.ncu-rep --page details --csv > $R/ncu_$c.csv 2>&1
  done; pack;; esac
  case " $MEASURE " in *" roundkernels "*)  # issue 12 item 4: a round's device time by phase and by kernel
  timeout 150 python3 benchmarks/round_kernels.py --widths 4 16 --out $R > $R/logs/round_kernels.log 2>&1
  say "round kernels rc $? : $(grep -E '^\| (round|kernels a round|kernel time a round)' $R/logs/round_kernels.log | tr '\n' ' ')"
  # The Qwen3-8B-shaped round (random weights) at batch 1 and 8, 1K context, kernel by kernel.
  timeout 240 python3 benchmarks/step_table.py --batches 1 8 --contexts 1024 --iters 10 --kernels \
    --out $R > $R/logs/step_table_kernels.log 2>&1
  say "step table --kernels rc $? : $(grep -E '^\| (1|8) \|' $R/logs/step_table_kernels.log | cut -c1-120 | tr '\n' ' ')"
  pack;; esac
  case " $MEASURE " in *" splits "*)  # issue 12 item 2: the split plan's floor against forced counts
  timeout 240 python3 benchmarks/kernel_bench.py --attention-only --modes decode verify \
    --shapes Qwen3-8B SmolLM2 --ctxs 1024 4096 8192 --batches 1 8 --splits 1 2 4 8 16 32 --exact \
    --out $R/splits > $R/logs/kernel_splits.log 2>&1
  say "kernel splits rc $?"; pack;; esac
  case " $MEASURE " in *" prefill "*)  # issue 12 item 1: the sm90 kernel against mma.sync and cuDNN
  timeout 240 python3 benchmarks/kernel_bench.py --attention-only --modes prefill --sm90 compare \
    --out $R/prefill > $R/logs/kernel_prefill.log 2>&1
  say "kernel prefill rc $?"; sed -n '/^| shape/,/^$/p' $R/logs/kernel_prefill.log | head -20; pack;; esac
  case " $MEASURE " in *" ttft "*)  # the engine's prefill on the wgmma kernel vs mma.sync (default model)
  timeout 240 python3 benchmarks/prefill_ttft.py --out $R --no-doc > $R/logs/prefill_ttft.log 2>&1
  say "prefill ttft rc $?"; sed -n '/^| prompt/,/^wrote/p' $R/logs/prefill_ttft.log; pack;; esac
  case " $MEASURE " in *" tp "*)  # issue 15: the engine at TP = 1, 2, 4, 8 (as the GPUs allow)
  sizes=$(for n in 1 2 4 8; do [ $n -le $GPUS ] && echo -n "$n "; done)
  DSPINE_TP_CUDA=1 timeout 480 python3 benchmarks/tp_bench.py --device cuda --tp $sizes --draft \
    --batches 1 8 32 --tokens 64 --trials 2 --workdir /root/tp_work --out $R > $R/logs/tp_bench.log 2>&1
  say "tp bench rc $? : $(grep -E '^\| [0-9]+ \|' $R/logs/tp_bench.log | tr '\n' ' ' | cut -c1-600)"; pack;; esac
  case " $MEASURE " in *" floors "*)  # issue 12 item 3: the walk and the block verify (no attention sweep)
  timeout 120 python3 benchmarks/kernel_bench.py --sampling-only --out $R > $R/logs/kernel_floors.log 2>&1
  say "kernel floors rc $? : $(grep -E '^\| (transition_walk|block_verify) \| greedy' $R/logs/kernel_floors.log | tr '\n' ' ')"
  pack;; esac
  case " $MEASURE " in *" policytrace "*)  # issue 11: auto vs fixed at c=1, each a fresh engine
  # (e2e's c=1 runs after c=64/32/8 on the same engines), twice, and the process's threads mid-run
  head -40 $S/e2e_prompts.jsonl > $S/trace_prompts.jsonl
  for rep in 1 2; do
    python3 -m dspine_engine.cli.bench e2e --prompts $S/trace_prompts.jsonl --max-new-tokens 256 \
      --draft dspine=$drafter --spec-policy fixed auto \
      --no-ar --stop-at-eos --concurrency 1 --out $R --name policytrace_$rep --quiet \
      > $R/logs/policytrace_$rep.log 2>&1 &
    sleep 20; ps -L -o pid,tid,pcpu,stat,comm -p "$(pgrep -f "name policytrace_$rep" | head -1)" \
      > $R/logs/policytrace_threads_$rep.txt 2>&1; wait
    say "policy trace $rep: $(grep -E "c=1" $R/logs/policytrace_$rep.log | tr '\n' ';')"
  done; pack;; esac
  case " $MEASURE " in *" tests "*)  # the engine's GPU tests alone on the GPU (no generators beside)
  LD_PRELOAD=$CXX_LIB timeout 280 python3 -m pytest -q -m gpu -n 4 tests/test_engine_gpu.py tests/test_spec_policy_gpu.py \
    tests/test_hybrid_engine.py -rf > $R/logs/engine_gpu_tests.log 2>&1
  say "engine gpu tests rc $? : $(tail -1 $R/logs/engine_gpu_tests.log)"
  grep -E "^(FAILED|ERROR)" $R/logs/engine_gpu_tests.log | head -10; pack;; esac
  case " $MEASURE " in *" rows "*)  # is a verify row the decoded row? (kernels, then the engine)
  timeout 60 python3 benchmarks/gpu_row_exactness.py --out $R > $R/logs/row_exactness.log 2>&1
  say "row exactness rc $? : $(grep -E '^\| (1|32) \|' $R/logs/row_exactness.log | tr '\n' ' ')"
  # The engine's lossless tests run in "tests" when it is asked for too (once a call is enough).
  files="tests/test_kernels_gpu.py"; case " $MEASURE " in *" tests "*) ;; *) files="$files tests/test_engine_gpu.py";; esac
  LD_PRELOAD=$CXX_LIB timeout 200 python3 -m pytest -q -m gpu -n 4 $files \
    -k "greedy_lossless or exact" -rA -W always > $R/logs/lossless_tests.log 2>&1
  say "lossless tests rc $? : $(tail -1 $R/logs/lossless_tests.log)"; pack;; esac
  case " $MEASURE " in *" steps "*)
  timeout 120 python3 benchmarks/step_table.py --out $R > $R/logs/step_table.log 2>&1
  say "step table rc $?"; pack;; esac
  case " $MEASURE " in *" rounds "*)
  timeout 150 python3 benchmarks/round_profile.py --device cuda --reps 21 --out $R > $R/logs/round_profile.log 2>&1
  say "round profile rc $?"; tail -14 $R/logs/round_profile.log; pack;; esac
  case " $MEASURE " in *" branches "*)  # the kernel branches' benchmarks, before and after
  bash benchmarks/h200_branches.sh bench > $S/branches_bench.log 2>&1
  say "branches bench: $(cat $R/branches/*/summary.log 2>/dev/null | tr '\n' ';')"; pack;; esac
  case " $MEASURE " in *" hybrid "*)  # Qwen3.8-27B-shaped hybrid: round, ReplaySSM commit, rollback
  timeout 400 python3 benchmarks/step_table.py --target qwen3.8-27b --out $R \
    > $R/logs/step_table_hybrid.log 2>&1
  say "hybrid step table rc $?"
  timeout 300 python3 benchmarks/gated_delta.py --out $R > $R/logs/gated_delta.log 2>&1
  say "gated delta rc $?"; pack;; esac
  case " $MEASURE " in *" kernels "*)  # issue 12: attention tests, memcheck, decode/verify vs SDPA
  NO_BUILD=1 OUT=$R/kernels bash benchmarks/attention_h200.sh > $R/logs/attention_h200.log 2>&1
  say "attention kernels rc $? : $(grep -E '^\[' $R/logs/attention_h200.log | tr '\n' ' ')"; pack;; esac
  case " $MEASURE " in *" speed "*)
  timeout 120 python3 benchmarks/train_speed.py --data $S/data.jsonl --steps 15 --out $R \
    > $R/logs/train_speed.log 2>&1
  say "train speed rc $?"; pack;; esac
  ls -la $OUT; exit 0
fi

echo "usage: h200_session.sh stage K N | data | fit | measure   (see the header)"; exit 2
