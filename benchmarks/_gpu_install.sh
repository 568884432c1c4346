# Sourced by benchmarks/adopt-gpu.sh and benchmarks/gemm-gpu.sh on the lent GPU machine, from the
# repo root with .whl carried: the carried wheels once per machine into /tmp/site, this checkout's
# tunesvc afresh into /tmp/tsvc, both on PYTHONPATH (exits the caller if an install fails).
rm -rf /tmp/tsvc
[ -f /tmp/site/.installed ] || { python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl && touch /tmp/site/.installed; } || exit 1
python3 -m pip install -q --no-index --no-deps --no-build-isolation --no-compile --target /tmp/tsvc . || exit 1
export PYTHONPATH=/tmp/tsvc:/tmp/site PYTHONUNBUFFERED=1
