#!/usr/bin/env bash
# One H200 session in two device calls (the default model's GGUF is larger than one call may
# carry, so it travels in two halves, .stage_a/ and .stage_b/, carried one per call):
#
#   call 1:  bash benchmarks/h200_session.sh stage      (carry .stage_a .whl)
#   call 2:  bash benchmarks/h200_session.sh run        (carry .stage_b; within 30 s of call 1)
#
# "stage" copies the tree to /root/work, installs the carried wheels and starts the extension
# build in the background. "run" reassembles the GGUF, then on two GPUs in parallel:
#   GPU1: self-generated training data -> DSpine and DFlash-ablation drafters (same data, steps,
#         batch) -> acceptance on HumanEval/MT-Bench at T=0/1 -> lossless check on the GPU;
#   GPU0: GPU kernel tests -> kernel benchmark (quick) -> end-to-end AR vs DFlash vs DSpine.
# Results are packed into $OUT as they are produced (at most 8 files come back).
set -u
MODE=${1:-run}
W=/root/work S=/root/stage
export PYTHONPATH=$W:/root/site PYTHONUNBUFFERED=1 DSPINE_CACHE=/root/cache
export DSPINE_SMOLLM2_GGUF=$S/smollm2.gguf
GGUF_SHA=b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53
STEPS=${STEPS:-250} SAMPLES=${SAMPLES:-2000}
t0=$(date +%s)
say() { echo "[$(( $(date +%s) - t0 ))s] $*" | tee -a $S/session.log; }

if [ "$MODE" = stage ]; then
  mkdir -p $S /root/site $W
  cp .stage_a/gguf_part_00 $S/
  tar --exclude=./.stage_a --exclude=./.stage_b --exclude=./.git -cf - . | (cd $W && tar xf -)
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /root/site .whl/*.whl
  cd $W && setsid nohup bash -c "DSPINE_CUDA_ARCHS=90a MAX_JOBS=16 python3 setup.py build_ext --inplace > $S/build.log 2>&1; echo \$? > $S/build.rc" >/dev/null 2>&1 < /dev/null &
  nvidia-smi -L; say "staged"
  exit 0
fi

R=$S/results; mkdir -p $R/logs
pack() {  # everything small in one archive; the DSpine shards travel as their own files
  (cd $S && tar czf $OUT/results.tar.gz --exclude='*.safetensors' results session.log build.log 2>/dev/null)
  [ -d $R/dspine ] && cp $R/dspine/model-*.safetensors $OUT/ 2>/dev/null
  return 0
}
cat $S/gguf_part_00 .stage_b/gguf_part_01 > $S/smollm2.gguf
echo "$GGUF_SHA  $S/smollm2.gguf" | sha256sum -c - || { say "GGUF checksum failed"; exit 1; }
while [ ! -f $S/build.rc ]; do sleep 2; done
say "build rc $(cat $S/build.rc)"; tail -3 $S/build.log
cd $W
python3 -c "from dspine_engine.models.default_model import default_model_dir as d; print(d(progress=False))" || exit 1
say "model converted"

gpu1() {
  export CUDA_VISIBLE_DEVICES=1
  python3 -m dspine_engine.cli.train data --out $S/data.jsonl --num $SAMPLES --max-new-tokens 512 \
    --max-num-seqs 128 --chunk 1024 --max-minutes 1.0 --quiet > $R/logs/data.log 2>&1
  say "data: $(wc -l < $S/data.jsonl) samples"
  common="--data $S/data.jsonl --steps $STEPS --batch-size 64 --lr 1e-3 --max-minutes 2.5 --quiet --save-every 100000"
  arch="--init --layers 3 --intermediate 768 --rank 128 --top-k 8"
  python3 -m dspine_engine.cli.train fit $common $arch --out $R/dspine > $R/logs/fit_dspine.log 2>&1 &
  python3 -m dspine_engine.cli.train fit $common $arch --out $R/dflash --ablation dflash > $R/logs/fit_dflash.log 2>&1 &
  timeout 150 compute-sanitizer --tool memcheck python3 -m pytest -q -x -m gpu tests/test_kernels_gpu.py \
    -k "rms_norm or rope or write_kv or injection or greedy_accepts or ties_go" > $R/logs/memcheck.log 2>&1 &
  wait
  say "training done"; rm -rf $R/dspine/train_state $R/dflash/train_state; pack
  python3 benchmarks/drafter_eval.py --draft dspine=$R/dspine --draft dflash=$R/dflash \
    --lossless 20 --out $R > $R/logs/drafter_eval.log 2>&1
  say "drafter eval done"; pack
}

gpu0() {
  export CUDA_VISIBLE_DEVICES=0
  timeout 120 python3 -m pytest -q -m gpu -n 8 tests/test_kernels_gpu.py > $R/logs/gpu_tests.log 2>&1
  say "gpu tests rc $?"; pack
  timeout 75 python3 benchmarks/kernels.py --quick --out $R > $R/logs/kernels.log 2>&1
  say "kernel bench rc $?"; pack
  while [ ! -f $R/dspine/config.json ] || [ ! -f $R/dflash/config.json ] || pgrep -f "cli.train fit" >/dev/null; do sleep 2; done
  python3 -c "
from dspine_engine.datasets import humaneval_prompts, mtbench_prompts; import json
ps = mtbench_prompts() + humaneval_prompts()[:48]
open('$S/e2e_prompts.jsonl','w').write(''.join(json.dumps({'prompt': p})+'\n' for p in ps))"
  python3 -m dspine_engine.cli.bench e2e --prompts $S/e2e_prompts.jsonl --max-new-tokens 256 \
    --draft dflash=$R/dflash --draft dspine=$R/dspine --concurrency 1 8 32 --out $R --quiet \
    > $R/logs/e2e.log 2>&1
  say "e2e rc $?"; pack
}

gpu1 & gpu0 & wait
say "all done"; pack
ls -la $OUT
