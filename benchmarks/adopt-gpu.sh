#!/usr/bin/env bash
# benchmarks/adopt.py on the lent GPU machine, every step under a deadline so that one call of at most
# 600 s ends with its files: run from the repo root with .whl carried (../shared/gpu/README.md).
#   bash benchmarks/adopt-gpu.sh                     # adopt, then own/warm/compare on ADOPT_KERNELS
# A work folder carried in .gpu/adopt-work.tgz (a previous call's $OUT/work.tgz) is resumed.
# ADOPT_KERNELS (default: every kernel of tune.db.example), ADOPT_MAX_KEYS (default: all keys),
# ADOPT_END (seconds after the start at which compare must end; default 540).
source benchmarks/_gpu_install.sh
R=$PWD W=/tmp/adopt-work END=${ADOPT_END:-540}
[ -d $W ] || { [ -f .gpu/adopt-work.tgz ] && tar xzf .gpu/adopt-work.tgz -C /tmp; }
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,power.limit --format=csv > "$OUT/gpu.txt"
ARGS="--work $W ${ADOPT_KERNELS:+--kernels $ADOPT_KERNELS} ${ADOPT_MAX_KEYS:+--max-keys $ADOPT_MAX_KEYS}"
# the device returns at most 8 files: the step logs go back as one archive
save() {
  mkdir -p "$OUT/res"; cp "$R"/benchmarks/results/adopt.csv "$R"/benchmarks/data/adopt_runs.csv "$OUT/res/" 2>/dev/null
  tar czf "$OUT/work.tgz" -C /tmp adopt-work
  (cd "$OUT" && tar czf logs.tgz --remove-files ./*.log 2>/dev/null)
}
trap save EXIT
cd /tmp || exit 1  # outside the checkout: the installed tunesvc (with its kernels) is the one imported
python3 "$R/benchmarks/adopt.py" adopt $ARGS --cache "${ADOPT_CACHE:-as found}" >> "$OUT/adopt.log" 2>&1; tail -3 "$OUT/adopt.log"
python3 "$R/benchmarks/adopt.py" own $ARGS --deadline $((END - 180 - SECONDS)) >> "$OUT/own.log" 2>&1; tail -2 "$OUT/own.log"
python3 "$R/benchmarks/adopt.py" warm $ARGS --deadline $((END - 90 - SECONDS)) >> "$OUT/warm.log" 2>&1; tail -2 "$OUT/warm.log"
python3 "$R/benchmarks/adopt.py" compare $ARGS --deadline $((END - SECONDS)) >> "$OUT/compare.log" 2>&1; tail -2 "$OUT/compare.log"
echo "elapsed $SECONDS s"
