# The 2026-12-04 one-off diagnostic, kept with its logs: GPU greedy lossless per sm90 dispatch mode
# (run from the tree's root on a staged machine after `stage N N`, as a device call).
cd /root/work
export PYTHONPATH=/root/work:/root/site DSPINE_CACHE=/root/cache DSPINE_SMOLLM2_GGUF=/root/stage/smollm2.gguf
export LD_PRELOAD=$(c++ -print-file-name=libstdc++.so)
while [ ! -f /root/stage/build.rc ]; do sleep 2; done; echo "build rc $(cat /root/stage/build.rc)"
python3 -c "from dspine_engine.models.default_model import default_model_dir as d; print(d(progress=False))"
mkdir -p $OUT
for m in auto 0; do
  v=$m; [ $m = auto ] && v=""
  (DSPINE_ATTN_SM90=$v timeout 130 python3 -m pytest -q -m gpu -p no:cacheprovider \
    "tests/test_engine_gpu.py::test_greedy_lossless_on_gpu" \
    "tests/test_spec_policy_gpu.py::test_greedy_lossless_with_dynamic_verification_on_gpu" \
    -rf > $OUT/lossless_sm90_$m.log 2>&1; echo "sm90=$m rc $?" >> $OUT/summary.txt) &
done
timeout 60 python3 -m pytest -q -m gpu tests/test_kernels_gpu.py -k "rejects_bad_metadata" > $OUT/bad_metadata.log 2>&1
echo "bad metadata (preloaded libstdc++) rc $?" >> $OUT/summary.txt
wait; cat $OUT/summary.txt; for f in $OUT/lossless_*.log; do echo "== $f"; tail -3 $f; done
