# Sourced by benchmarks/gemm-gpu.sh and benchmarks/attention-gpu.sh on the lent GPU machine, from
# the repo root with .whl carried: installs (benchmarks/_gpu_install.sh), then runs each of the
# caller's arguments as a step, in turn while time is left, from its work folder /tmp/$WORK
# (resumed from .gpu/$WORK.tgz, a previous call's $OUT/work.tgz), and after each step copies the
# files of SAVED (paths from the repo root) to $OUT/res and the work folder to $OUT/work.tgz.
# The caller sets WORK, END (seconds after the start by which steps must end), LOG (its log's
# name under $OUT) and SAVED, and defines step_command KIND ARG, which sets the array cmd to the
# step's command and returns 1 for a kind it does not know.
source benchmarks/_gpu_install.sh
R=$PWD W=/tmp/$WORK
[ -d $W ] || { mkdir -p $W; [ -f .gpu/$WORK.tgz ] && tar xzf .gpu/$WORK.tgz -C /tmp; }
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,power.limit --format=csv > "$OUT/gpu.txt"
save() {
  mkdir -p "$OUT/res"
  (cd "$R" && cp "${SAVED[@]}" "$OUT/res/" 2>/dev/null)
  tar czf "$OUT/work.tgz" -C /tmp $WORK
}
run_steps() {
  trap save EXIT
  cd $W || exit 1  # outside the checkout: the installed tunesvc (with its kernels) is the one imported
  for step in "$@"; do
    local left=$((END - SECONDS)) kind=${step%%:*} arg=${step#*:}
    [ $left -gt 20 ] || { echo "no time left for $step"; break; }
    step_command "$kind" "$arg" || { echo "unknown step $step"; continue; }
    echo "== $step ($left s left)" | tee -a "$OUT/$LOG"
    timeout $left "${cmd[@]}" >> "$OUT/$LOG" 2>&1; echo "exit $?" >> "$OUT/$LOG"
    tail -6 "$OUT/$LOG"
    save
  done
  echo "elapsed $SECONDS s"
}
