#!/usr/bin/env bash
# benchmarks/gemm_variants.py and benchmarks/gemm_heldout.py on the lent GPU machine, within one call
# of at most 600 s that ends with its files: run from the repo root with .whl carried
# (../shared/gpu/README.md). Each argument is one step, run in turn while time is left:
#   variants:SLICE   gemm_variants.py --shapes SLICE      (survey of the kernel forms)
#   sweep:SLICE      gemm_heldout.py --sweep --shapes SLICE (tune, 32 trials a shape)
#   time:SLICE       gemm_heldout.py --shapes SLICE        (the held-out target against cuBLAS)
#   example:BUDGET   tune sweep of matmul's llm, skinny and models presets (bf16, Optuna, BUDGET
#                    trials a key) into a copy of tune.db.example: this GPU's winners of its keys
#   e.g. bash benchmarks/gemm-gpu.sh variants:0:13 variants:13:
# The databases live in /tmp/gemm-work; a previous call's $OUT/work.tgz carried as
# .gpu/gemm-work.tgz is resumed. GEMM_END: seconds after the start by which steps must end (540).
WORK=gemm-work END=${GEMM_END:-540} LOG=gemm.log
SAVED=(benchmarks/data/gemm_variants.csv benchmarks/results/gemm_heldout.csv)
source benchmarks/_gpu_steps.sh
step_command() {
  case $1 in
    variants) cmd=(python3 "$R/benchmarks/gemm_variants.py" --db $W/variants.db --shapes "$2") ;;
    sweep) cmd=(python3 "$R/benchmarks/gemm_heldout.py" --db $W/heldout.db --sweep --shapes "$2") ;;
    time) cmd=(python3 "$R/benchmarks/gemm_heldout.py" --db $W/heldout.db --shapes "$2") ;;
    example)
      [ -f $W/example.db ] || cp $R/tune.db.example $W/example.db
      local shapes
      shapes=$(python3 -c "from tunesvc.templates.matmul import TEMPLATE as t; print(' '.join(f\"-s {p['M']}x{p['N']}x{p['K']}\" for n in ('llm', 'skinny', 'models') for p in t.presets[n]))")
      # shellcheck disable=SC2086  # the -s flags, one word each
      cmd=(python3 -m tunesvc sweep matmul $shapes --dtype bfloat16 --strategy optuna --budget "$2" --db $W/example.db -q) ;;
    *) return 1 ;;
  esac
}
run_steps "$@"
