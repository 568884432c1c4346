#!/usr/bin/env bash
# benchmarks/adopt.py on the lent GPU machine, every step under a deadline so that one call of at most
# 600 s ends with its files: run from the repo root with .whl carried (../shared/gpu/README.md).
#   bash benchmarks/adopt-gpu.sh                     # adopt, then own/warm/compare on ADOPT_KERNELS
# A work folder carried in .gpu/adopt-work.tgz (a previous call's $OUT/work.tgz) is resumed.
# ADOPT_KERNELS (default: every kernel of tune.db.example), ADOPT_MAX_KEYS (default: all keys),
# ADOPT_END (seconds after the start at which compare must end; default 540), ADOPT_STEPS (default:
# adopt own warm compare), ADOPT_COMPILE_TIMEOUT (seconds a compile may take in own; default 120).
# Where a step's log is silent for a minute, every process's Python stack goes to stall.log (py-spy,
# where .whl carries it).
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
stalls() {  # a step silent for over 60 s: where each process is, once per silence
  local seen=""
  while sleep 15; do
    log=$(ls -t "$OUT"/*.log 2>/dev/null | grep -v stall | head -1); [ -n "$log" ] || continue
    stamp=$(stat -c %Y "$log"); [ $(($(date +%s) - stamp)) -gt 60 ] && [ "$seen" != "$log$stamp" ] || continue
    seen="$log$stamp"
    { echo "== $(date -u +%T) $log silent since $(date -u -d @"$stamp" +%T)"
      nvidia-smi --query-gpu=utilization.gpu,memory.used --format=csv,noheader
      for p in $(pgrep python3); do echo "-- $p $(tr '\0' ' ' < /proc/$p/cmdline | cut -c1-120)"
        timeout 10 /tmp/site/bin/py-spy dump --pid "$p" 2>&1 | head -30; done; } >> "$OUT/stall.log"
  done
}
[ -x /tmp/site/bin/py-spy ] && { stalls & }
trap 'save; kill %1 2>/dev/null' EXIT
cd /tmp || exit 1  # outside the checkout: the installed tunesvc (with its kernels) is the one imported
STEPS=${ADOPT_STEPS:-adopt own warm compare}
for step in $STEPS; do
  # each step's deadline leaves the steps still to run theirs (a step starts no key after it)
  later=30; [ -n "${STEPS#*"$step"}" ] && { [ "$step" = own ] && later=180 || later=90; }
  case $step in
    adopt) extra=(--cache "${ADOPT_CACHE:-as found}") ;;
    own) extra=(--deadline $((END - later - SECONDS)) --compile-timeout "${ADOPT_COMPILE_TIMEOUT:-120}") ;;
    warm) extra=(--deadline $((END - later - SECONDS))) ;;
    compare) extra=(--deadline $((END - SECONDS))) ;;
  esac
  python3 "$R/benchmarks/adopt.py" "$step" $ARGS "${extra[@]}" >> "$OUT/$step.log" 2>&1; tail -3 "$OUT/$step.log"
done
echo "elapsed $SECONDS s"
