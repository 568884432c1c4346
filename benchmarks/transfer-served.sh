#!/usr/bin/env bash
# What the chain serves on a sibling GPU model in mode lookup, against the heuristic, the sibling's
# winner served blind and cuBLAS, with no sweeps: benchmarks/transfer.py --served-only on a copy of
# tune.db.example (H100 SXM winners), run on an H200 (~2-3 min). One gpu-run.sh step: run from the
# repo root on the lent GPU machine with .whl carried; rows in $OUT/results/transfer.csv, the log
# (per shape, the answer and why; the targets' summary) in $OUT/transfer.log.
STEPS=transfer ARGS_transfer="--served-only ${ARGS_transfer:-}" LIMIT_transfer=${LIMIT_transfer:-420} \
  exec bash "$(dirname "$0")/gpu-run.sh"
