#!/usr/bin/env bash
# One batched GPU run: device fingerprint, GPU tests, then the chosen benchmarks, each under its
# own time limit, all writing into one database ($OUT/tune.db) and one log per step under $OUT;
# the benchmarks' CSV files that the run appended to (benchmarks/results/*.csv) are copied to $OUT/results.
# Run from the repo root on the lent GPU machine with .whl carried (see ../shared/gpu/README.md).
# A database carried in .gpu/tune.db is resumed, not restarted.
#
#   STEPS="tests matmul attention" bash benchmarks/gpu-run.sh
#
# Steps: tests launch capture conformance matmul64 matmulgrid matmul attention decode norms pointwise runtime sva stability groundtruth multigpu startup
# evaluate heldout transfer
# (each is benchmarks/<name>.py with --sweep where it takes one; LIMIT_<step>=seconds overrides
# the time limit, ARGS_<step>="..." adds arguments).
# evaluate: on a copy of tune.db.example ($OUT/selector.db), per kernel of EVAL_KERNELS, measures
# every winner on every tuned key, fits the selector and runs `tune evaluate` (rows: $OUT/evaluate.csv).
# conformance: benchmarks/conformance.py, libraries' own test suites without and twice with capture
# (needs .conformance carried: `python benchmarks/conformance.py fetch --wheels` here first; its
# wheels install into /tmp/conformance, ahead of .whl's); logs in $OUT/conformance-logs.tgz, rows in
# $OUT/conformance.csv (append them to benchmarks/data/conformance.csv, then run results_page.py).
# heldout: benchmarks/heldout.py on a fresh copy of $OUT/selector.db (else of tune.db.example),
# HELDOUT_SIZE=small (default, ~8 min on one GPU) | medium | full; HELDOUT_KERNELS limits the kernels;
# the shapes are spread over every GPU of the machine.
# transfer: benchmarks/transfer.py on a copy of tune.db.example (H100 SXM winners) on a sibling GPU model
# (an H200): transferred configs against configs tuned there and cuBLAS (~7 min; ARGS_transfer=--quick ~4;
# ARGS_transfer=--served-only ~2-3: no sweeps, what the chain serves against the heuristic; benchmarks/transfer-served.sh).
rm -rf /tmp/site /tmp/tsvc /tmp/conformance  # a warm machine keeps an earlier run's installs, which pip --target would not replace
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl \
  && python3 -m pip install -q --no-index --no-deps --no-build-isolation --no-compile --target /tmp/tsvc . || exit 1
export PYTHONPATH=/tmp/tsvc:/tmp/site PYTHONUNBUFFERED=1 R=$PWD
# the image may lack any of tunesvc's dependencies: one line naming them, before any step runs
missing=$(python3 -c "import importlib.util as u; print(*[m for m in ('sqlalchemy', 'optuna', 'alembic', 'pydantic') if u.find_spec(m) is None])")
[ -z "$missing" ] || { echo "missing on this machine: $missing; add their wheels to .whl (../shared/gpu/fetch-wheels NAME ..., pydantic with pydantic-core annotated-types typing-inspection)"; exit 1; }
nvidia-smi --query-gpu=name,driver_version --format=csv | tee "$OUT/gpu.txt"
cd /tmp || exit 1  # run from outside the checkout, so the installed tunesvc (with its kernels) is the one imported
[ -f "$R/.gpu/tune.db" ] && cp "$R/.gpu/tune.db" "$OUT/tune.db" && chmod u+w "$OUT/tune.db" \
  && python3 -m tunesvc db upgrade --db "$OUT/tune.db"
python3 -c "import tunesvc.device as d; print(d.current_device().to_dict())" | tee -a "$OUT/gpu.txt"

step() {  # step NAME DEFAULT_SECONDS COMMAND...
  local name=$1 default=$2; shift 2
  local var="LIMIT_$name" args="ARGS_$name" start=$SECONDS
  echo "=== $name (limit ${!var:-$default} s)" | tee -a "$OUT/steps.log"
  timeout "${!var:-$default}" "$@" ${!args} > "$OUT/$name.log" 2>&1
  echo "=== $name: exit $? after $((SECONDS - start)) s" | tee -a "$OUT/steps.log"
  tail -40 "$OUT/$name.log"
}

for s in ${STEPS:-tests matmul}; do
  case $s in
    tests) python3 -c "import fla, liger_kernel" 2>/dev/null \
        || echo "fla-core or liger-kernel is missing here: the library capture test will fail; carry their wheels and einops's in .whl"
      step tests 240 python3 -m pytest -q -p no:cacheprovider --rootdir "$R" -c "$R/pyproject.toml" -m gpu "$R/tests" ;;
    runtime) step runtime 120 python3 "$R/benchmarks/runtime_overhead.py" ;;
    launch) step launch 300 python3 "$R/benchmarks/launch_cost.py" --db "$R/tune.db.example" ;;
    matmulgrid) step matmulgrid 480 python3 "$R/benchmarks/matmul.py" --db "$OUT/tune.db" --sweep --strategy grid --budget 1000 --sweep-shapes 1x4096x4096,16x4096x4096,64x4096x4096 ;;
    matmul64) step matmul64 240 python3 "$R/benchmarks/matmul.py" --db "$OUT/tune.db" --sweep --budget 64 --sweep-shapes 1x4096x4096,16x4096x4096,64x4096x4096 ;;
    multigpu) step multigpu 540 python3 "$R/benchmarks/multi_gpu_sweep.py" ;;
    startup) step startup 240 python3 "$R/benchmarks/startup.py" ;;
    sva) step sva 300 python3 "$R/benchmarks/sweep_vs_autotune.py" ;;
    capture) step capture 540 python3 "$R/benchmarks/capture.py" --csv "$OUT/capture.csv" ;;
    conformance) python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/conformance \
        "$R"/.conformance/wheels/*.whl || { echo "no wheels in .conformance/wheels: fetch them and carry .conformance"; continue; }
      (export PYTHONPATH=/tmp/conformance:$PYTHONPATH
       step conformance 510 python3 "$R/benchmarks/conformance.py" --out "$OUT/conformance" --csv "$OUT/conformance.csv" \
         --timeout 120 --budget 420)
      # one file back: each run's log, JUnit XML and capture stats (what was tuned, stored, left to Triton)
      (cd "$OUT" && tar czf conformance-logs.tgz --exclude='*.db*' --exclude='triton-cache-*' conformance && rm -rf conformance) ;;
    stability) step stability 300 python3 "$R/benchmarks/sweep_stability.py" --db "$OUT/stability.db" ;;
    groundtruth) step groundtruth 540 python3 "$R/benchmarks/ground_truth.py" --db "$OUT/ground_truth.db" --out "$OUT/ground_truth.csv" ;;
    evaluate) [ -f "$OUT/selector.db" ] || { cp "$R/tune.db.example" "$OUT/selector.db" && chmod u+w "$OUT/selector.db"; }
      for k in ${EVAL_KERNELS:-matmul decode rmsnorm}; do
        step "evaluate_$k" 480 sh -c "python3 -m tunesvc selector $k --cross-measure --db '$OUT/selector.db' && python3 -m tunesvc evaluate $k --db '$OUT/selector.db' --csv '$OUT/evaluate.csv'"
      done ;;
    heldout) src="$OUT/selector.db"; [ -f "$src" ] || src="$R/tune.db.example"
      cp "$src" "$OUT/heldout.db" && chmod u+w "$OUT/heldout.db"
      step heldout 600 python3 "$R/benchmarks/heldout.py" --db "$OUT/heldout.db" --fit --size "${HELDOUT_SIZE:-small}" \
        --kernels "${HELDOUT_KERNELS:-matmul,decode,attention,layernorm,rmsnorm}" --gpus all ;;
    transfer) step transfer 540 python3 "$R/benchmarks/transfer.py" ;;
    *) step "$s" 300 python3 "$R/benchmarks/$s.py" --db "$OUT/tune.db" --sweep ;;
  esac
done
# only the CSV files this run appended to come back (the device returns at most 8 files)
mkdir -p "$OUT/results" && find "$R/benchmarks/results" -name '*.csv' -newer "$OUT/gpu.txt" -exec cp {} "$OUT/results/" \;
