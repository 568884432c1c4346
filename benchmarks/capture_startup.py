"""Host costs of capture, on whatever device there is: start-up hook, bundle load, cache hit.

    python benchmarks/capture_startup.py [--csv benchmarks/results/capture_startup.csv]

- ``interpreter start``: wall time of ``python -c pass`` with TUNESVC_CAPTURE unset and set
  (median of 20 runs each; the difference is what the .pth hook costs), and the hook module's
  own import time as ``-X importtime`` reports it when set;
- ``bundle 1000 first resolve``: a captured kernel's first key resolved from a 1,000-winner
  bundle (reading and checking the bundle, the kernel's version hash), in a fresh process;
- ``hit``: host time of one launch whose key is cached, triton's Autotuner against tunesvc's
  captured one, around a kernel whose ``run`` does nothing (what is left is the autotuner's own
  cost; median of 5 rounds of 200,000 launches).

Each figure is appended to the CSV as (metric, side, value, unit, device, triton, timestamp).
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import UTC
from datetime import datetime
from pathlib import Path

HERE = Path(__file__).parent
CSV = HERE / "results" / "capture_startup.csv"

NOOP = '''
import torch, triton
from triton.runtime.jit import KernelInterface

def body(x, y, out, n, flag, BLOCK):
    pass

class Noop(KernelInterface):
    """A kernel interface whose launch does nothing: what is timed is the autotuner around it."""

    def __init__(self):
        self.fn = body
        self.arg_names = ["x", "y", "out", "n", "flag", "BLOCK"]

    def run(self, *args, grid, warmup, **kwargs):
        return None

CONFIGS = [triton.Config({"BLOCK": b}, num_warps=w) for b in (16, 32, 64, 128) for w in (1, 2, 4)]
'''

BUNDLE_CHILD = (
    NOOP
    + """
import json, sys, time
start = time.perf_counter()
import tunesvc
from tunesvc._capture import STATS
kernel = tunesvc.autotune(configs=CONFIGS, key=["n"], bundle=sys.argv[1])(Noop())
x = torch.empty(4)
imported = time.perf_counter()
kernel[(1,)](x, x, x, 500, True)
done = time.perf_counter()
assert STATS["stored"] == 1, dict(STATS)
print(json.dumps({"first_resolve_ms": (done - imported) * 1e3}))
"""
)

NAME_CHILD = (
    NOOP
    + """
import json
from tunesvc._capture import kernel_name, kernel_version, config_dict
from tunesvc.device import current_device
from tunesvc.space import config_hash
d = current_device()
print(json.dumps({"name": kernel_name(Noop()), "version": kernel_version(Noop(), CONFIGS),
                  "configs": {config_hash(config_dict(c)): config_dict(c) for c in CONFIGS},
                  "device": {"hardware_id": d.hardware_id, "name": d.name, "capability": d.capability,
                             "sm_count": d.sm_count, "torch": d.torch, "triton": d.triton}}))
"""
)


def _wall(env: dict[str, str], runs: int = 20) -> float:
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        subprocess.run([sys.executable, "-c", "pass"], env=env, check=True)
        times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times)


def _hook_import_ms(env: dict[str, str]) -> float | None:
    done = subprocess.run([sys.executable, "-X", "importtime", "-c", "pass"], env=env, capture_output=True, text=True)
    for line in done.stderr.splitlines():
        if line.rstrip().endswith("_tunesvc_capture"):
            return int(line.split("|")[1]) / 1e3  # cumulative microseconds
    return None


def _child(code: str, folder: Path, *args: str) -> dict:
    script = folder / "child.py"
    script.write_text(code)
    done = subprocess.run([sys.executable, str(script), *args], capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"the measuring child failed:\n{done.stderr}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def _bundle(folder: Path) -> Path:
    info = _child(NAME_CHILD, folder)
    hashes = sorted(info["configs"])
    device = info["device"]
    winners = {
        f"n={n},x.dtype=float32,y.dtype=float32,out.dtype=float32": {
            "config": hashes[n % len(hashes)],
            "time_ms": 0.01,
        }
        for n in range(1, 1001)
    }
    bundle = {
        "format": "tunesvc-bundle",
        "format_version": 2,
        "device": {k: device[k] for k in ("hardware_id", "name", "capability", "sm_count")},
        "kernels": {
            info["name"]: {
                "version": info["version"],
                "torch": device["torch"],
                "triton": device["triton"],
                "configs": info["configs"],
                "winners": winners,
            }
        },
    }
    path = folder / "bundle.json"
    path.write_text(json.dumps(bundle, indent=2, sort_keys=True))
    return path


def _hits() -> tuple[float, float]:
    namespace: dict = {}
    exec(NOOP, namespace)
    from triton.runtime.autotuner import Autotuner

    import tunesvc

    noop, configs = namespace["Noop"], namespace["CONFIGS"]
    import torch

    x = torch.empty(4)
    theirs = Autotuner(
        noop(), noop().arg_names, configs, ["n", "flag"], None, None, do_bench=lambda f, quantiles: [1.0] * 3
    )
    with tempfile.TemporaryDirectory() as folder:
        ours = tunesvc.autotune(configs=configs, key=["n", "flag"], db=str(Path(folder) / "hit.db"))(noop())
        out = []
        for kernel in (theirs, ours):
            launch = kernel[(1,)]
            launch(x, x, x, 10, True)
            rounds = []
            for _ in range(5):
                start = time.perf_counter()
                for _ in range(200_000):
                    launch(x, x, x, 10, True)
                rounds.append((time.perf_counter() - start) / 200_000 * 1e6)
            out.append(statistics.median(rounds))
    return out[0], out[1]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--csv", type=Path, default=CSV)
    args = parser.parse_args()
    from tunesvc.device import current_device

    device = current_device()
    base = {k: v for k, v in os.environ.items() if not k.startswith("TUNESVC_")}
    rows = [
        ("interpreter start", "TUNESVC_CAPTURE unset", _wall(base), "ms"),
        ("interpreter start", "TUNESVC_CAPTURE=1", _wall({**base, "TUNESVC_CAPTURE": "1"}), "ms"),
    ]
    hook = _hook_import_ms({**base, "TUNESVC_CAPTURE": "1"})
    if hook is not None:
        rows.append(("hook import", "TUNESVC_CAPTURE=1", hook, "ms"))
    with tempfile.TemporaryDirectory() as folder:
        bundle = _bundle(Path(folder))
        first = _child(BUNDLE_CHILD, Path(folder), str(bundle))["first_resolve_ms"]
    rows.append(("bundle 1000 first resolve", "tunesvc", first, "ms"))
    theirs, ours = _hits()
    rows += [("hit", "triton.autotune", theirs, "us"), ("hit", "tunesvc", ours, "us")]
    stamp = datetime.now(UTC).isoformat(timespec="seconds")
    args.csv.parent.mkdir(parents=True, exist_ok=True)
    new = not args.csv.exists()
    with args.csv.open("a", newline="") as f:
        writer = csv.writer(f)
        if new:
            writer.writerow(["metric", "side", "value", "unit", "device", "triton", "timestamp"])
        for metric, side, value, unit in rows:
            writer.writerow([metric, side, f"{value:.4g}", unit, device.name, device.triton, stamp])
    print("| metric | side | value |")
    print("|---|---|---|")
    for metric, side, value, unit in rows:
        print(f"| {metric} | {side} | {value:.4g} {unit} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
