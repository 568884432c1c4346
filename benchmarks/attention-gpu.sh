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
# .gpu/attention-work.tgz is resumed, and so is a folder left on a warm machine (remove it to start
# afresh). ATTENTION_RUN stamps the rows, so that forward and backward rows of several calls make
# one run (forward+backward against SDPA). ATTENTION_END: seconds after the start by which steps
# must end (540).
WORK=attention-work END=${ATTENTION_END:-540} LOG=attention.log
SAVED=(benchmarks/results/heldout.csv benchmarks/results/heldout_reasons.csv)
source benchmarks/_gpu_steps.sh
[ -f $W/heldout.db ] || { cp tune.db.example $W/heldout.db && chmod u+w $W/heldout.db; }
step_command() {
  case $1 in
    heldout) cmd=(python3 "$R/benchmarks/heldout.py" --db $W/heldout.db --size medium
      --kernels attention,attention_bwd --shapes "$2" --run "${ATTENTION_RUN:-attention}" --picks $W/picks.json) ;;
    tests) cmd=(python3 -m pytest -q -p no:cacheprovider --rootdir "$R" -c "$R/pyproject.toml" -m gpu "$R/tests" -k "$2") ;;
    *) return 1 ;;
  esac
}
run_steps "$@"
