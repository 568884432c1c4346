#!/usr/bin/env bash
# The foundation GPU run: device fingerprint, resource probe, GPU tests, GEMM sweep + benchmark.
# Run from the repo root on the lent GPU machine with .whl carried (see ../shared/gpu/README.md);
# logs and the database go to $OUT. A database carried in .gpu/tune.db is resumed, not restarted.
# PROBE=0 skips the resource probe.
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl \
  && python3 -m pip install -q --no-index --no-deps --no-build-isolation --no-compile --target /tmp/tsvc . || exit 1
export PYTHONPATH=/tmp/tsvc:/tmp/site PYTHONUNBUFFERED=1 R=$PWD
nvidia-smi --query-gpu=name,driver_version --format=csv | tee "$OUT/gpu.txt"
cd /tmp || exit 1  # run from outside the checkout, so the installed tunesvc (with its kernels) is the one imported
[ -f "$R/.gpu/tune.db" ] && cp "$R/.gpu/tune.db" "$OUT/tune.db" && chmod u+w "$OUT/tune.db" \
  && python3 -m tunesvc db upgrade --db "$OUT/tune.db"  # a database from an older schema
python3 -c "import tunesvc.device as d; print(d.current_device().to_dict())" | tee -a "$OUT/gpu.txt"
[ "${PROBE:-1}" = 1 ] && python3 "$R/benchmarks/probe_resources.py" 2>&1 | tee "$OUT/probe.log"
python3 -m pytest -q -x -p no:cacheprovider --rootdir "$R" -c "$R/pyproject.toml" "$R/tests/test_gpu.py" 2>&1 | tail -15 | tee "$OUT/gpu-tests.log"
timeout "${BENCH_TIMEOUT:-420}" python3 "$R/benchmarks/matmul.py" --db "$OUT/tune.db" --sweep --strategy optuna --budget 40 2>&1 | tee "$OUT/bench.log"
