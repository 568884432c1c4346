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
source benchmarks/_gpu_install.sh
R=$PWD W=/tmp/gemm-work END=${GEMM_END:-540}
[ -d $W ] || { mkdir -p $W; [ -f .gpu/gemm-work.tgz ] && tar xzf .gpu/gemm-work.tgz -C /tmp; }
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,power.limit --format=csv > "$OUT/gpu.txt"
save() {
  mkdir -p "$OUT/res"
  cp "$R"/benchmarks/data/gemm_variants.csv "$R"/benchmarks/results/gemm_heldout.csv "$OUT/res/" 2>/dev/null
  tar czf "$OUT/work.tgz" -C /tmp gemm-work
}
trap save EXIT
cd $W || exit 1  # outside the checkout: the installed tunesvc (with its kernels) is the one imported
for step in "$@"; do
  left=$((END - SECONDS))
  [ $left -gt 20 ] || { echo "no time left for $step"; break; }
  kind=${step%%:*} slice=${step#*:}
  case $kind in
    variants) cmd="python3 $R/benchmarks/gemm_variants.py --db $W/variants.db --shapes $slice" ;;
    sweep) cmd="python3 $R/benchmarks/gemm_heldout.py --db $W/heldout.db --sweep --shapes $slice" ;;
    time) cmd="python3 $R/benchmarks/gemm_heldout.py --db $W/heldout.db --shapes $slice" ;;
    example)
      [ -f $W/example.db ] || cp $R/tune.db.example $W/example.db
      shapes=$(python3 -c "from tunesvc.templates.matmul import TEMPLATE as t; print(' '.join(f\"-s {p['M']}x{p['N']}x{p['K']}\" for n in ('llm', 'skinny', 'models') for p in t.presets[n]))")
      cmd="python3 -m tunesvc sweep matmul $shapes --dtype bfloat16 --strategy optuna --budget $slice --db $W/example.db -q" ;;
    *) echo "unknown step $step"; continue ;;
  esac
  echo "== $step ($left s left)" | tee -a "$OUT/gemm.log"
  timeout $left $cmd >> "$OUT/gemm.log" 2>&1; echo "exit $?" >> "$OUT/gemm.log"
  tail -4 "$OUT/gemm.log"
  save
done
echo "elapsed $SECONDS s"
