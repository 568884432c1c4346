#!/usr/bin/env bash
# The conformance suite (benchmarks/conformance.py) on the lent GPU machine, its libraries spread
# over the machine's GPUs (one pytest process per GPU at a time, CUDA_VISIBLE_DEVICES), each
# library's three runs one after another on its GPU.
#
#   bash benchmarks/conformance-gpu.sh [suite|before|all]     (default: all)
#   bash benchmarks/conformance-gpu.sh suite 2/3   (the second of three calls: a share of the libraries)
#   CONFORMANCE_LIBRARIES="siglip-kernel mase-triton" bash benchmarks/conformance-gpu.sh   (a few)
#   CONFORMANCE_DRY=1 CONFORMANCE_GPUS=1 bash benchmarks/conformance-gpu.sh suite 1/4      (the deal only)
#
# One call may run 10 minutes: on one GPU the suite takes about 25 (its runs of the ten libraries
# one after another), so it is split into PARTS calls (the libraries dealt into GPUs x PARTS shares
# of about equal expected time); the rows of each call come back in its own $OUT.
#
#   suite:  every library, runs (a), (b), (c), with this checkout's tunesvc: conformance rows and
#           run (b)'s candidates and wrong_result rejections per kernel
#   before: every library, run (b) only, with the tunesvc tree under .conformance/trees/ (the one
#           `python benchmarks/conformance.py tree f744484^` exported): its rejections
#
# Needs, carried: .whl (../shared/gpu/fetch-wheels) and .conformance (`conformance.py fetch --wheels`
# and `conformance.py tree f744484^`, run here first). Writes under $OUT: conformance.csv and
# conformance_rejections.csv (the new rows only, with their header) and logs.tar.gz (the console
# of each GPU's share, each run's pytest log, JUnit XML and database).
set -uo pipefail
cd "$(dirname "$0")/.."
: "${OUT:?set OUT to the folder that comes back}"
what=${1:-all}
part=${2:-1/1}
case $what in suite | before | all) ;; *) echo "usage: $0 [suite|before|all] [PART/PARTS]" >&2; exit 2 ;; esac
k=${part%/*} parts=${part#*/}
[[ $k =~ ^[0-9]+$ && $parts =~ ^[0-9]+$ ]] && ((k >= 1 && k <= parts)) || { echo "PART/PARTS: e.g. 1/2" >&2; exit 2; }

gpus=${CONFORMANCE_GPUS:-$(nvidia-smi -L 2>/dev/null | grep -c '^GPU ')}
[ "$gpus" -ge 1 ] || { echo "no GPU visible" >&2; exit 1; }
# longest first (seconds of the three runs on an H200 in earlier rows), dealt to the GPU with the
# least so far: the shares end near one another
order=(liger-kernel cut-cross-entropy fla-core flag-gems torchao late-interaction-kernels siglip-kernel
  mase-triton gemlite conch-triton-kernels)
declare -A cost=([liger-kernel]=330 [cut-cross-entropy]=325 [fla-core]=215 [flag-gems]=200 [torchao]=180
  [late-interaction-kernels]=120 [siglip-kernel]=90 [mase-triton]=60 [gemlite]=60 [conch-triton-kernels]=30)
listed=${CONFORMANCE_LIBRARIES:-}  # a few of them (names as in LIBRARIES), else all
[ -n "$listed" ] || listed=$(python3 -c "import sys; sys.path.insert(0, 'benchmarks'); import conformance; print(' '.join(l.name for l in conformance.LIBRARIES))")
for lib in $listed; do [[ " ${order[*]} " == *" $lib "* ]] || order+=("$lib"); done  # one added later: last
# dealt into gpus x parts shares; this call runs part k's shares, one per GPU
slots=$((gpus * parts))
declare -a slot load share
for ((g = 0; g < slots; g++)); do slot[g]=""; load[g]=0; done
for lib in "${order[@]}"; do
  [[ " $listed " == *" $lib "* ]] || continue
  best=0
  for ((g = 1; g < slots; g++)); do ((load[g] < load[best])) && best=$g; done
  slot[best]="${slot[best]} $lib"
  load[best]=$((load[best] + ${cost[$lib]:-120}))
done
for ((g = 0; g < gpus; g++)); do share[g]=${slot[(k - 1) * gpus + g]}; done
if [ -n "${CONFORMANCE_DRY:-}" ]; then  # the deal only: which call runs what, expected seconds of (a)+(b)+(c)
  for ((g = 0; g < slots; g++)); do echo "part $((g / gpus + 1))/$parts, GPU $((g % gpus)): ${load[g]} s:${slot[g]}"; done
  exit 0
fi

# the image's packages, then the carried wheels (those of .conformance/wheels that .whl lacks)
wheels=(.whl/*.whl)
for w in .conformance/wheels/*.whl; do [ -e ".whl/$(basename "$w")" ] || wheels+=("$w"); done
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site "${wheels[@]}" \
  && python3 -m pip install -q --no-index --no-deps --no-build-isolation --no-compile --target /tmp/tsvc . \
  && export PYTHONPATH=/tmp/tsvc:/tmp/site PYTHONUNBUFFERED=1 || exit 1

gpus=$(python3 -c "import torch; print(torch.cuda.device_count())")
[ "$gpus" -ge 1 ] || { echo "no GPU visible" >&2; exit 1; }

# one pass over every GPU's share; $1: a name for its files, the rest: conformance.py's options
run_pass() {
  local name=$1
  shift
  local pids=()
  for ((g = 0; g < gpus; g++)); do
    [ -n "${share[g]}" ] || continue
    echo "$name: GPU $g:${share[g]}"
    # shellcheck disable=SC2086
    CUDA_VISIBLE_DEVICES=$g python3 benchmarks/conformance.py run --libraries ${share[g]} \
      --out "$OUT/work/$name-gpu$g" --csv "$OUT/work/$name-gpu$g.csv" \
      --rejections-csv "$OUT/work/$name-gpu$g.rejections.csv" "$@" >"$OUT/work/console-$name-gpu$g.log" 2>&1 &
    pids+=($!)
  done
  for pid in "${pids[@]}"; do wait "$pid"; done
}

mkdir -p "$OUT/work"
start=$(date +%s)
if [ "$what" != before ]; then run_pass suite; fi
if [ "$what" != suite ]; then
  tree=$(ls -d .conformance/trees/*/ 2>/dev/null | head -1)
  if [ -z "$tree" ]; then
    echo "no tunesvc tree under .conformance/trees: run \`python benchmarks/conformance.py tree f744484^\` here" >&2
  else
    run_pass before --runs b --tunesvc "$tree"
  fi
fi
echo "all passes: $(($(date +%s) - start)) s on $gpus GPU(s)"

# the new rows, one header each
for kind in "" .rejections; do
  dest="$OUT/conformance${kind:+_rejections}.csv"
  first=1
  for f in "$OUT"/work/*-gpu*"$kind".csv; do
    [ -e "$f" ] || continue
    [[ -z $kind && $f == *.rejections.csv ]] && continue
    if ((first)); then cat "$f"; first=0; else tail -n +2 "$f"; fi
  done >"$dest"
done
tail -n 40 "$OUT"/work/console-*.log
# logs, JUnit files and databases; Triton's caches and the installed trees stay behind
tar -czf "$OUT/logs.tar.gz" -C "$OUT" --exclude='triton-cache-*' --exclude='tunesvc-*' work && rm -rf "$OUT/work"
