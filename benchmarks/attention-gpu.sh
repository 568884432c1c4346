#!/usr/bin/env bash
# Attention's held-out shapes (benchmarks/heldout.py --size medium, forward and backward) and GPU
# tests on the lent GPU machine, within one call of at most 600 s that ends with its files: run
# from the repo root with .whl carried (../shared/gpu/README.md). Each argument is one step, run
# in turn while time is left:
#   heldout:SLICE   heldout.py --kernels attention,attention_bwd --shapes SLICE (--list's indices):
#                   tune (Optuna, 32 trials a shape) and time against SDPA
#   tests:EXPR      the GPU tests that pytest -k EXPR selects
#   e.g. ATTENTION_RUN=r1 bash benchmarks/attention-gpu.sh heldout:0-7 tests:backward_peer
# The database lives in /tmp/attention-work (a copy of tune.db.example at first), with the untuned
# picks read before each shape was tuned (picks.json); a previous call's $OUT/work.tgz carried as
# .gpu/attention-work.tgz is resumed. ATTENTION_RUN stamps the rows,
# so that forward and backward rows of several calls make one run (forward+backward against SDPA).
# ATTENTION_END: seconds after the start by which steps must end (540).
source benchmarks/_gpu_install.sh
R=$PWD W=/tmp/attention-work END=${ATTENTION_END:-540}
[ -d $W ] || { mkdir -p $W; [ -f .gpu/attention-work.tgz ] && tar xzf .gpu/attention-work.tgz -C /tmp; }
[ -f $W/heldout.db ] || { cp tune.db.example $W/heldout.db && chmod u+w $W/heldout.db; }
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,power.limit --format=csv > "$OUT/gpu.txt"
save() {
  mkdir -p "$OUT/res"
  cp "$R"/benchmarks/results/heldout.csv "$R"/benchmarks/results/heldout_reasons.csv "$OUT/res/" 2>/dev/null
  tar czf "$OUT/work.tgz" -C /tmp attention-work
}
trap save EXIT
cd $W || exit 1  # outside the checkout: the installed tunesvc (with its kernels) is the one imported
for step in "$@"; do
  left=$((END - SECONDS))
  [ $left -gt 20 ] || { echo "no time left for $step"; break; }
  kind=${step%%:*} arg=${step#*:}
  case $kind in
    heldout) cmd=(python3 "$R/benchmarks/heldout.py" --db $W/heldout.db --size medium
      --kernels attention,attention_bwd --shapes "$arg" --run "${ATTENTION_RUN:-attention}" --picks $W/picks.json) ;;
    tests) cmd=(python3 -m pytest -q -p no:cacheprovider --rootdir "$R" -c "$R/pyproject.toml" -m gpu "$R/tests" -k "$arg") ;;
    *) echo "unknown step $step"; continue ;;
  esac
  echo "== $step ($left s left)" | tee -a "$OUT/attention.log"
  timeout $left "${cmd[@]}" >> "$OUT/attention.log" 2>&1; echo "exit $?" >> "$OUT/attention.log"
  tail -6 "$OUT/attention.log"
  save
done
echo "elapsed $SECONDS s"
