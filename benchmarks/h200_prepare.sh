#!/usr/bin/env bash
# Prepares, on this machine, what one H200 session carries (run from the repository root):
#   .whl/            the wheels the GPU machine lacks (gguf, nvidia-cutlass, the server's extras) and the
#                    evaluation-prompt wheels
#   .stage_1/ ...    one payload in parts: the default model's GGUF and, with
#                    INIT_DIRS="DIR ...", the drafter directories a run continues from (the
#                    previous run's DSpine and DFlash, as they came back); each part sized so
#                    that the working tree plus one part stays under the 64 MiB a device call
#                    may carry (the tree's size is measured now, so a larger committed drafter
#                    or more INIT_DIRS simply mean more parts)
# and prints the device calls to make, back to back (each within 30 s of the last one's end).
# BRANCHES="a b": kernel branches to build and test beside the session (benchmarks/
# h200_branches.sh): each branch's tree (without the drafter shards and benchmark results) in
# .stage_branches/<name>/, carried by the last stage call.
# Nothing here is committed: .whl/ and .stage*/ are ignored by git.
# `bash benchmarks/h200_prepare.sh wheels` fetches only the wheels benchmarks/h200_quick.sh carries.
#
# SLIM=1: the shipped drafter's shards (38 MiB of the 43 MiB tree) travel in the payload instead
# of with every call: they are taken out of git's index (still on disk, ignored through
# .git/info/exclude) until `bash benchmarks/h200_prepare.sh restore`, and `stage N N` puts them
# back into the device machine's tree. The GGUF + drafter then take 3 calls instead of 6. Commit
# nothing between the two commands (the index would record the shards as deleted).
set -euo pipefail
cd "$(git rev-parse --show-toplevel)"
SHIPPED=dspine_engine/drafters/smollm2-135m-dspine
EXCLUDE_LINE="/$SHIPPED/*.safetensors"
# The wheels h200_quick.sh carries (what its one call needs, ~6.6 MB): gguf; CUTLASS/CuTe headers
# (setup.py builds the sm90 attention kernel with them; installed into /root/site with the other
# .whl/*.whl, where setup.py finds cutlass_library on PYTHONPATH); pytest-timeout, a per-test
# limit, so a hung kernel fails its test instead of the whole call.
quick_wheels() {
  mkdir -p .whl
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 -d .whl gguf==0.19.0 nvidia-cutlass==4.2.0.0
  python3 -m pip download -q --no-deps --only-binary=:all: -d .whl pytest-timeout==2.4.0
}
if [ "${1:-}" = wheels ]; then quick_wheels; ls .whl/*.whl; exit 0; fi
if [ "${1:-}" = restore ]; then
  git reset -q -- "$SHIPPED"
  grep -vxF "$EXCLUDE_LINE" .git/info/exclude > .git/info/exclude.new || true
  mv .git/info/exclude.new .git/info/exclude
  git status --short -- "$SHIPPED"; echo "restored: $SHIPPED is tracked again"; exit 0
fi
if [ "${SLIM:-0}" = 1 ]; then
  git rm -r --cached -q "$SHIPPED/*.safetensors"
  grep -qxF "$EXCLUDE_LINE" .git/info/exclude || echo "$EXCLUDE_LINE" >> .git/info/exclude
  INIT_DIRS="${INIT_DIRS:-} $SHIPPED"
fi
rm -rf .stage_branches
for b in ${BRANCHES:-}; do
  mkdir -p .stage_branches/$b && git archive "$b" | tar x -C .stage_branches/$b
  rm -rf .stage_branches/$b/dspine_engine/drafters/*/model*.safetensors .stage_branches/$b/benchmarks/results
done
branch_bytes=$( [ -d .stage_branches ] && du -sb .stage_branches | cut -f1 || echo 0)
LIMIT_MIB=${LIMIT_MIB:-62}  # under the 64 MiB limit, with room for files made meanwhile
GGUF=${DSPINE_SMOLLM2_GGUF:-$(python3 -c "from dspine_engine.models.default_model import default_gguf_path as p; print(p())" 2>/dev/null || true)}
[ -f "$GGUF" ] || GGUF=$(ls ~/.cache/dspine_engine/gguf/*.gguf | head -1)

mkdir -p .whl/datasets
quick_wheels
# The server's extras (fastapi, uvicorn, ...), so the serve benchmark runs there too (~4 MB).
# Downloaded afresh: an older session's wheels beside the new ones (two versions of one
# package) make the install there refuse the whole set, and the serve benchmark then fails.
rm -rf .whl/serve
python3 -m pip download -q --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
  -d .whl/serve fastapi uvicorn prometheus_client httpx
# py-spy, to profile a generator rank on the GPU machine (its host-bound step).
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d .whl py-spy
python3 -c "from dspine_engine.datasets import humaneval_prompts, mtbench_prompts; humaneval_prompts(); mtbench_prompts()"
cp ~/.cache/dspine_engine/datasets/*.whl .whl/datasets/

# What travels with every call: tracked files + untracked files git does not ignore.
tree_bytes=$( { git ls-files -z; git ls-files -z --others --exclude-standard; } |
  du -cb --files0-from=- 2>/dev/null | tail -1 | cut -f1)
whl_bytes=$(du -sb .whl | cut -f1)
budget=$(( LIMIT_MIB * 1024 * 1024 - tree_bytes ))
first=$(( budget - whl_bytes ))  # the first call also carries .whl
[ "$first" -gt $((4 * 1024 * 1024)) ] || { echo "the tree ($tree_bytes B) leaves no room"; exit 1; }

# The payload: one uncompressed tar (the GGUF as smollm2.gguf, each INIT_DIRS entry as
# init/<its name>/), split into parts; the last stage call joins, checks and unpacks it.
rm -rf .stage_[0-9]* .payload && mkdir -p .payload/init
ln -s "$(readlink -f "$GGUF")" .payload/smollm2.gguf
for d in ${INIT_DIRS:-}; do
  [ -f "$d/config.json" ] || { echo "INIT_DIRS: $d has no config.json"; exit 1; }
  ln -s "$(readlink -f "$d")" .payload/init/$(basename "$d")
done
tar -chf .payload.tar -C .payload . && rm -rf .payload
size=$(stat -c %s .payload.tar) offset=0 part=1
while [ "$offset" -lt "$size" ]; do
  room=$([ $part = 1 ] && echo "$first" || echo "$budget")
  # The last part also carries the branches: leave them room when what is left would fill it.
  [ $(( size - offset )) -le "$room" ] && [ $(( size - offset + branch_bytes )) -gt "$room" ] &&
    room=$(( room - branch_bytes ))
  mkdir -p .stage_$part
  dd if=.payload.tar of=.stage_$part/payload_part bs=1M iflag=skip_bytes,count_bytes \
    skip=$offset count=$room status=none
  offset=$(( offset + $(stat -c %s .stage_$part/payload_part) ))
  part=$(( part + 1 ))
done
parts=$(( part - 1 ))
sha256sum .payload.tar | cut -d' ' -f1 > .stage_1/payload.sha256 && rm .payload.tar
git rev-parse --short HEAD > .stage_1/commit
echo "tree $((tree_bytes / 1048576)) MiB; payload (GGUF${INIT_DIRS:+ + ${INIT_DIRS}}) \
$((size / 1048576)) MiB in $parts parts"
echo "device calls (kind nvidia-h200), back to back:"
for p in $(seq 1 $parts); do
  carry=".stage_$p"; [ $p = 1 ] && carry=".stage_1 .whl"
  [ $p = $parts ] && [ -d .stage_branches ] && carry="$carry .stage_branches"
  echo "  bash benchmarks/h200_session.sh stage $p $parts      carry: $carry"
done
echo "  bash benchmarks/h200_session.sh data                carry: nothing"
init=""
for d in ${INIT_DIRS:-}; do
  case "$(basename "$d")" in dspine*) init="$init INIT_DRAFT=/root/stage/init/$(basename "$d")";;
    dflash*) init="$init INIT_TWIN=/root/stage/init/$(basename "$d")";; esac
done
echo " ${init} bash benchmarks/h200_session.sh fit   carry: nothing"
echo "  bash benchmarks/h200_session.sh measure             carry: nothing"
[ "${SLIM:-0}" = 1 ] && echo "after the stage calls, here: bash benchmarks/h200_prepare.sh restore"
exit 0
