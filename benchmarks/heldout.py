"""Held-out shapes from real models: what the runtime launches untuned, and after a short sweep, against torch.

    python benchmarks/heldout.py --db heldout.db --size small --fit     # a subset, ~8 min on an H100 (estimated)
    python benchmarks/heldout.py --db heldout.db --size full --fit      # every shape
    python benchmarks/heldout.py --db heldout.db --size medium --gpus all   # the shapes spread over every GPU
    python benchmarks/heldout.py --list                                 # print the shapes; no GPU needed

The shapes come from models, not from the presets, and none has a shape key that a preset of its
kernel tunes (checked below, before anything runs): GEMMs of the attention and MLP projections of
Llama-3-70B, Qwen2.5-7B, Qwen2.5-32B and Mixtral-8x7B at M from 1 to 8192 tokens; decode
attention at contexts from a few hundred to 32k tokens and batches from 1 to 64 in those models'
head layouts; attention forward and backward at sequence lengths that are not powers of two, in
those models' layouts (D=128) and in three with D=64 (gpt-oss-120b's decoder, Whisper-large-v3's
encoder, ViT-L/16 at 384 pixels); layer and RMS norms at those hidden sizes. bf16 throughout.

--db should hold the presets' sweeps (a copy of tune.db.example): with --fit, each kernel's
selector is first fitted there (every stored winner measured on every tuned key, then the tree).
Then, before any held-out shape is tuned, what the runtime would launch for each is read: the
selector's pick, the nearest tuned key's winner (none where no tuned key fits: the rule then falls
back to the heuristic) and the heuristic. Per shape, a sweep of
--budget trials (Optuna TPE, warm-started from the runtime's untuned answer and the stored
neighbours, see tunesvc.tuning.sweep) then tunes it, and on
one set of random inputs the three untuned picks, the tuned winner and the torch peer (cuBLAS
through torch.matmul, SDPA, torch.compile'd norms) are checked against the reference and timed
from CUDA graphs over copies of the inputs that together exceed L2 twice (GPU time; see
tunesvc.bench.graph_time), in the same run: picks that are the same config share one timing, and
each distinct config and the peer are timed in three interleaved rounds (median). Rows go to
benchmarks/results/heldout.csv, one per (shape, pick), with the pick in the kernel column
(``matmul [selector]``), its config, its rate and its roofline fraction (the larger of its FLOPs
at the bf16 peak and its minimum bytes at the copy bandwidth measured in the run, over its time).
--ceiling N then adds random trials up to N per shape and times their
best beside the others (``matmul [space best of N]``, N the trials its key then holds; ``of all
N`` where that is every feasible config): whether a missed target is the short sweep's or the
space's. --gpus N runs N processes, one per GPU, each on a copy of --db (after --fit, which runs
once, first) and a share of the shapes dealt round-robin; their rows go to the same CSV files as
one run.

--candidates times, per shape, the best of the selector's candidates there (``matmul [best
candidate]``: a grid sweep of its candidates, each as the runtime could launch it, in a scratch
database): whether a pick outside 5% of tuned is the model's choice or the candidates' reach.
Beside heldout.csv, heldout_reasons.csv gets what may explain a missed target, timed in the same
run: GEMMs with M rounded up to the tuned config's BLOCK_M (ours and cuBLAS; a tile of BLOCK_M rows
computes its padding rows too), attention's and decode's tuned config against each SDPA backend by name,
with the kernel SDPA's default ran (from the profiler), the tuned config against another
library's Triton kernel for the same op where it is installed (TRITON_PEERS: FlagGems), and the
tuned winner against the peer as its sweep timed them (``[tuned, as its sweep timed it]``, timing
method ``sweep``): whether the sweep's own timing agreed with this one. --shapes and --run split
one run over several processes (e.g. device calls with a time limit).
"""

from __future__ import annotations

import argparse
import math
import os
import shutil
import statistics
import sys
import tempfile
from collections.abc import Callable
from typing import TYPE_CHECKING
from typing import Any

if TYPE_CHECKING:
    from tunesvc.tuning.sweep import ProblemResult

#: (model, hidden, intermediate, query heads, KV heads, head dim), from each model's config.json
MODELS = (
    ("Llama-3-70B", 8192, 28672, 64, 8, 128),
    ("Qwen2.5-7B", 3584, 18944, 28, 4, 128),
    ("Qwen2.5-32B", 5120, 27648, 40, 8, 128),
    ("Mixtral-8x7B", 4096, 14336, 32, 8, 128),
)
#: tokens per GEMM: decode batches to prefill chunks, most not powers of two
GEMM_M = (1, 24, 200, 1000, 3000, 8192)
#: decode: (batch, context) pairs, one sequence to a serving batch of 64 (issue 57's range: contexts
#: 500 to 32k, batch 1 to 64; 300 is shorter still). The models' GQA ratios are 8, 7, 5 and 4.
DECODE_BS = ((1, 300), (16, 1000), (4, 5000), (1, 12000), (8, 32768), (32, 700), (64, 1800))
#: attention forward and backward: (batch, sequence length), causal and not, in each decoder's layout
ATTENTION_BS = ((1, 1000), (2, 3000), (1, 7000))
#: attention layouts with D=64: (model, heads, head dim, (batch, sequence length) pairs, causal),
#: from each model's config.json (an encoder's attention is not causal)
ATTENTION_D64 = (
    ("gpt-oss-120b", 64, 64, ATTENTION_BS, (False, True)),
    ("Whisper-large-v3 encoder", 20, 64, ((8, 1500),), (False,)),
    ("ViT-L/16 at 384 px", 16, 64, ((32, 577),), (False,)),
)
#: norms: tokens
NORM_M = (1, 300, 5000)


#: GEMMs whose shape key a matmul preset tunes (Mixtral's 4096x4096 output projection at M=1 and
#: M=3000, Llama-3-70B's 8192x8192 one at M=8192): left out, the preset's winner would answer them
PRESET_KEYS = {(1, 4096, 4096), (3000, 4096, 4096), (8192, 8192, 8192)}


def gemm_shapes() -> list[dict[str, Any]]:
    """(M, N, K) of each model's fused QKV, output, fused gate/up and down projections."""
    shapes = []
    for _, hidden, inter, hq, hkv, d in MODELS:
        for n, k in ((hq * d + 2 * hkv * d, hidden), (hidden, hidden), (2 * inter, hidden), (hidden, inter)):
            shapes += [{"M": m, "N": n, "K": k} for m in GEMM_M if (m, n, k) not in PRESET_KEYS]
    return shapes


def decode_shapes() -> list[dict[str, Any]]:
    return [{"B": b, "HQ": hq, "HKV": hkv, "S": s, "D": d} for _, _, _, hq, hkv, d in MODELS for b, s in DECODE_BS]


def attention_shapes() -> list[dict[str, Any]]:
    layouts = [(hq, d, ATTENTION_BS, (False, True)) for _, _, _, hq, _, d in MODELS]
    layouts += [(h, d, bs, causals) for _, h, d, bs, causals in ATTENTION_D64]
    return [
        {"B": b, "H": h, "S": s, "D": d, "causal": causal}
        for h, d, bs, causals in layouts
        for b, s in bs
        for causal in causals
    ]


def norm_shapes() -> list[dict[str, Any]]:
    return [{"M": m, "N": hidden} for _, hidden, *_ in MODELS for m in NORM_M]


SHAPES: dict[str, Callable[[], list[dict[str, Any]]]] = {
    "matmul": gemm_shapes,
    "decode": decode_shapes,
    "attention": attention_shapes,
    # the same shapes' backward: with the forward's rows of one run, forward+backward against SDPA's
    "attention_bwd": attention_shapes,
    "layernorm": norm_shapes,
    "rmsnorm": norm_shapes,
}

#: --size small: a few shapes per kernel family, spread over models, M and context
SMALL = {
    "matmul": [(1, 10240, 8192), (200, 37888, 3584), (3000, 5120, 27648)],
    "decode": [(1, 64, 8, 12000, 128, False)],
    "attention": [(1, 28, 7000, 128, True)],
    "attention_bwd": [(1, 28, 7000, 128, True)],
    "rmsnorm": [(5000, 5120)],
}
#: --size medium's attention: D=128 and D=64, causal and not, short and long
MEDIUM_ATTENTION = [
    (1, 28, 7000, 128, True),
    (2, 64, 3000, 128, False),
    (1, 64, 1000, 128, False),
    (2, 40, 3000, 128, True),
    (1, 64, 7000, 64, True),
    (2, 64, 3000, 64, False),
    (8, 20, 1500, 64, False),
    (32, 16, 577, 64, False),
]
#: --size medium: more M and contexts, every family
MEDIUM = {
    # per M, two of the four models' projections, so that each model and each projection kind
    # (fused QKV, output, fused gate/up, down) appears
    "matmul": [
        (1, 10240, 8192),
        (1, 55296, 5120),
        (24, 8192, 28672),
        (24, 28672, 4096),
        (200, 37888, 3584),
        (200, 8192, 8192),
        (1000, 6144, 4096),
        (1000, 3584, 18944),
        (3000, 5120, 27648),
        (3000, 4096, 14336),
        (8192, 4608, 3584),
        (8192, 5120, 5120),
    ],
    "decode": [(1, 64, 8, 12000, 128, False), (16, 28, 4, 1000, 128, False), (8, 40, 8, 32768, 128, False)],
    "attention": MEDIUM_ATTENTION,
    "attention_bwd": MEDIUM_ATTENTION,
    "layernorm": [(300, 3584)],
    "rmsnorm": [(5000, 5120), (1, 8192)],
}


def held_out(size: str, kernels: list[str]) -> dict[str, list[dict[str, Any]]]:
    """The shapes of each kernel for --size, checked to lie outside every preset's keys."""
    from tunesvc.template import get_template

    out = {}
    for name in kernels:
        template = get_template(name)
        every = [template.problem(**shape, dtype="bfloat16") for shape in SHAPES[name]()]
        if size != "full":
            wanted = (SMALL if size == "small" else MEDIUM).get(name, [])
            every = [p for p in every if tuple(p[d] for d in template.dims) + _options(template, p) in wanted]
        assert_disjoint(template, every)
        if every:
            out[name] = every
    return out


def _options(template: Any, problem: dict[str, Any]) -> tuple:
    return tuple(problem[o] for o in template.options)


def assert_disjoint(template: Any, problems: list[dict[str, Any]]) -> None:
    """No held-out shape is a preset's shape, nor shares its shape key with one (in bf16, the
    held-out dtype): a shared key would be answered by the preset's own winner."""
    presets = [template.problem(**p) for ps in template.presets.values() for p in ps]
    preset_shapes = {tuple(p[d] for d in template.dims) for p in presets}
    preset_keys = {str(template.key({**p, "dtype": "bfloat16"})) for p in presets}
    for problem in problems:
        shape = tuple(problem[d] for d in template.dims)
        key = str(template.key(problem))
        assert shape not in preset_shapes, f"{template.name} {shape} is a preset's shape"
        assert key not in preset_keys, f"{template.name} {key} is a preset's shape key"


def compiled_norm(name: str) -> Callable | None:
    """torch.compile'd F.layer_norm / F.rms_norm (the norms' peer), or None where compiling fails."""
    import torch
    import torch.nn.functional as F

    try:
        torch._dynamo.reset()  # a fresh cache per shape: dynamic=False recompiles for each
        if name == "layernorm":
            return torch.compile(lambda x, w, b: F.layer_norm(x, (x.shape[-1],), w, b, 1e-5), dynamic=False)
        return torch.compile(lambda x, w: F.rms_norm(x, (x.shape[-1],), w, 1e-6), dynamic=False)
    except Exception as exc:  # a torch without a working compiler: reported, the row left out
        print(f"torch.compile unavailable: {type(exc).__name__}: {exc}", file=sys.stderr)
        return None


def peer_of(template: Any) -> tuple[str, Callable[[Any], Callable[[], Any] | None]]:
    """(peer name, inputs -> a call of the peer on them): torch.compile'd for the norms (compiled
    once per shape), the template's own peer otherwise."""
    if template.name in ("layernorm", "rmsnorm"):
        fn = compiled_norm(template.name)
        return "torch.compile", lambda inputs: None if fn is None else (lambda: fn(*inputs))
    return template.peer_name, template.peer


def untuned_picks(db: str, problems: dict[str, list[dict[str, Any]]]) -> dict[tuple[str, str], dict[str, Any]]:
    """(kernel, shape key) -> {"runtime": source, "selector"/"nearest"/"heuristic": config}, read
    from --db before any held-out shape is tuned."""
    from tunesvc.device import current_device
    from tunesvc.serving import selector as selector_model
    from tunesvc.serving.runtime import Runtime
    from tunesvc.store import Store
    from tunesvc.template import get_template
    from tunesvc.tuning import selector_fit

    device = current_device()
    runtime = Runtime(db=db)
    store = Store(db, readonly=True)
    picks = {}
    try:
        for name, shapes in problems.items():
            template = get_template(name)
            winners = selector_fit.tuned_winners(store, template, device.hardware_id)
            fitted = selector_model.stored_selector(store, template, device.hardware_id)
            for problem in shapes:
                key = str(template.key(problem))
                found = runtime.lookup(template, **problem)
                if found.source == "exact":
                    raise SystemExit(
                        f"{name} {key} is already tuned in {db}, so it is not held out; "
                        "start from a fresh copy of tune.db.example."
                    )
                source, matched, nearest = selector_fit.nearest_pick(winners, key, template, problem, device)
                entry = {"runtime": found.source, "nearest_source": source}
                if source == "nearest":  # else the rule fell back to the heuristic, timed as such
                    entry["nearest"] = nearest
                entry["heuristic"] = template.heuristic(problem, device)
                picked = fitted.pick(template, problem, device) if fitted is not None else None
                if picked is not None:
                    entry["selector"] = picked
                if fitted is not None:
                    entry["candidates"] = list(fitted.candidates)
                picks[(name, key)] = entry
                print(f"{name} {key}: runtime answers {found.source}; nearest {matched or '-'}", flush=True)
    finally:
        store.close()
    return picks


def kept_picks(path: str, db: str, problems: dict[str, list[dict[str, Any]]]) -> dict[tuple[str, str], dict[str, Any]]:
    """untuned_picks for the shapes ``path`` does not hold yet (read from --db now, before they are
    tuned), with those it holds, as an earlier call of the run read them; all written back."""
    import json

    from tunesvc.template import get_template

    kept = {}
    if os.path.exists(path):
        with open(path) as f:
            kept = {tuple(k.split("|", 1)): v for k, v in json.load(f).items()}
    new = {
        name: [p for p in shapes if (name, str(get_template(name).key(p))) not in kept]
        for name, shapes in problems.items()
    }
    kept |= untuned_picks(db, {name: shapes for name, shapes in new.items() if shapes})
    with open(path, "w") as f:
        json.dump({f"{name}|{key}": entry for (name, key), entry in kept.items()}, f)
    return kept


#: timing rounds per held-out shape, each config and the peer once per round, in turn (median)
ROUNDS = 3


def time_shape(
    template: Any,
    problem: dict[str, Any],
    configs: dict[str, Any],
    other_peers: dict[str, Callable[[Any], Callable[[], Any]]] | None = None,
) -> tuple[str, dict[str, float | None]]:
    """(peer name, label -> GPU ms) for each config (None where it is wrong or fails), "peer"
    and each of ``other_peers`` (name -> inputs -> a call) as "peer: <name>", on one set of
    inputs and its copies. Labels naming the same config share one timing; each distinct config
    and each peer are timed in ``ROUNDS`` rounds, in turn (the order reversed every other round),
    and keep their median: clocks and temperature drift between configs timed one after another,
    and a 5 us kernel's ratio would carry that drift."""
    import torch
    from _common import bench_graph_ms
    from _common import copies

    from tunesvc.bench import relative_error
    from tunesvc.device import current_device
    from tunesvc.space import config_hash

    device = current_device()
    inputs = template.make_inputs(problem, device)
    reference = template.reference(inputs)
    sets = copies(inputs, lambda: template.make_inputs(problem, device))
    calls: dict[str, list[Callable[[], Any]]] = {}  # by config hash, or "peer"
    configs_by = {config_hash(c): c for c in configs.values()}
    for label, config in configs.items():
        h = config_hash(config)
        if h in calls:
            continue
        try:
            err = relative_error(template.launch(inputs, config), reference)
        except Exception as exc:  # a pick that fails on this shape is data: no time
            print(f"  {label}: {type(exc).__name__}: {exc}", flush=True)
            continue
        if not err <= template.tolerance(problem):
            print(f"  {label}: relative error {err:.2e}: wrong, not timed", flush=True)
            continue
        calls[h] = [lambda s=s, c=config: template.launch(s, c) for s in sets]
    peer_name, make_peer = peer_of(template)
    if peer_calls := [call for s in sets if (call := make_peer(s)) is not None]:
        try:
            peer_calls[0]()  # compiles torch.compile's kernels outside the graph's capture
            calls["peer"] = peer_calls
        except Exception as exc:
            print(f"  peer {peer_name}: {type(exc).__name__}: {exc}", flush=True)
    for name, make in (other_peers or {}).items():
        try:
            other = [make(s) for s in sets]
            # first (on ``inputs``, sets[0]): a library's own autotuning runs outside the graph's capture
            out = other[0]()
            # a backward peer gives (dQ, dK, dV), the reference them stacked
            err = relative_error(torch.stack(out) if isinstance(out, tuple) else out, reference)
        except Exception as exc:  # e.g. an SDPA backend that does not take this shape: no time
            print(f"  peer {name}: {type(exc).__name__}: {exc}", flush=True)
            continue
        if not err <= template.tolerance(problem):
            print(f"  peer {name}: relative error {err:.2e}: wrong, not timed", flush=True)
            continue
        calls[f"peer: {name}"] = other
    samples: dict[str, list[float]] = {h: [] for h in calls}
    for r in range(ROUNDS):
        for h in list(calls) if r % 2 == 0 else reversed(list(calls)):
            try:
                samples[h].append(bench_graph_ms(calls[h]))
            except Exception as exc:  # a capture this one does not allow: no time
                print(
                    f"  {h if h.startswith('peer') else _short(configs_by[h])}: {type(exc).__name__}: {exc}", flush=True
                )
    median = {h: statistics.median(v) if v else None for h, v in samples.items()}
    times = {label: median.get(config_hash(config)) for label, config in configs.items()}
    for h in calls:
        if h.startswith("peer"):
            times[h] = median.get(h)
            print(f"  {h}: {_fmt(times[h])} ms", flush=True)
    times.setdefault("peer", None)
    for label, config in configs.items():
        print(f"  {label}: {_short(config)} {_fmt(times[label])} ms", flush=True)
    return peer_name, times


def launchable(template: Any, problem: dict[str, Any], candidates: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The selector's candidates as the runtime could launch them on ``problem``: each as it is,
    or, where it breaks a constraint there, the feasible config nearest it (none near: left out);
    each config once."""
    from tunesvc.device import current_device
    from tunesvc.space import config_hash

    device = current_device()
    out: dict[str, dict[str, Any]] = {}
    for config in candidates:
        if template.violations(config, problem, device):
            config = template.nearest_feasible(config, problem, device)
        if config is not None:
            out.setdefault(config_hash(config), dict(config))
    return list(out.values())


def best_candidate(template: Any, problem: dict[str, Any], candidates: list[dict[str, Any]], db: str) -> Any:
    """The fastest of ``candidates`` on ``problem``: a grid sweep of exactly them (finalists
    re-timed, as every sweep's are) in the scratch database ``db``, apart from --db's trials."""
    from tunesvc.store import Store
    from tunesvc.tuning.sweep import run_sweep

    store = Store(db)
    try:
        [result] = run_sweep(template, [problem], store, strategy="grid", candidates=candidates, refit_selector=False)
    finally:
        store.close()
    return result.winner


#: torch SDPA's backends by name, timed beside its default (attention's reasons)
SDPA_BACKENDS = ("FLASH_ATTENTION", "CUDNN_ATTENTION", "EFFICIENT_ATTENTION")


def sdpa_backends(template: Any) -> dict[str, Callable[[Any], Callable[[], Any]]]:
    """name -> inputs -> a call of SDPA held to that backend (``torch.nn.attention.sdpa_kernel``),
    for attention (forward and backward) and decode; none for other kernels or a torch without the backend."""
    if template.name not in ("attention", "attention_bwd", "decode"):
        return {}
    from torch.nn.attention import SDPBackend
    from torch.nn.attention import sdpa_kernel

    def make(backend: Any) -> Callable[[Any], Callable[[], Any]]:
        def on(inputs: Any) -> Callable[[], Any]:
            default = template.peer(inputs)

            def call() -> Any:
                with sdpa_kernel(backend):
                    return default()

            return call

        return on

    names = [n for n in SDPA_BACKENDS if hasattr(SDPBackend, n)]
    return {f"torch SDPA, {n} backend": make(getattr(SDPBackend, n)) for n in names}


def _sdpa_call(fn: Callable[..., Any], inputs: Any) -> Callable[[], Any]:
    return lambda: fn(inputs.q, inputs.k, inputs.v, is_causal=inputs.causal, scale=inputs.sm_scale)


def _operands_call(fn: Callable[..., Any], inputs: Any) -> Callable[[], Any]:
    return lambda: fn(*inputs)


#: third-party Triton kernels timed beside ours where their library is installed (reasons):
#: (template name, label, module, attribute, (function, inputs) -> a call of it on them)
TRITON_PEERS: tuple[tuple[str, str, str, str, Callable[[Callable[..., Any], Any], Callable[[], Any]]], ...] = (
    ("attention", "FlagGems SDPA (Triton)", "flag_gems.ops", "scaled_dot_product_attention", _sdpa_call),
    ("matmul", "FlagGems mm (Triton)", "flag_gems.ops", "mm", _operands_call),
)


def triton_peers(template: Any) -> dict[str, Callable[[Any], Callable[[], Any]]]:
    """name -> inputs -> a call of another library's Triton kernel for ``template``'s op, for each
    of TRITON_PEERS that imports here: what a Triton implementation other than ours reaches on
    the same shapes, where the target is the peer's (cuBLAS, cuDNN)."""
    import importlib

    found: dict[str, Callable[[Any], Callable[[], Any]]] = {}
    for kernel, label, module, attribute, call in TRITON_PEERS:
        if kernel != template.name:
            continue
        try:
            fn = getattr(importlib.import_module(module), attribute)
        except Exception as exc:  # not installed, or not importable with this torch: no row
            print(f"  {label}: not timed ({type(exc).__name__}: {exc})", flush=True)
            continue
        found[label] = lambda inputs, fn=fn, call=call: call(fn, inputs)
    return found


def busiest_kernel(call: Callable[[], Any]) -> str:
    """The name of the GPU kernel that takes the most device time in one ``call`` (torch.profiler):
    which kernel a library call dispatched to."""
    import torch
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile

    call()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        call()
        torch.cuda.synchronize()
    device_time = lambda e: getattr(e, "device_time_total", None) or getattr(e, "cuda_time_total", 0.0)
    events = [e for e in prof.key_averages() if device_time(e) > 0]
    return max(events, key=device_time).key if events else "-"


def padded(template: Any, problem: dict[str, Any], config: dict[str, Any]) -> dict[str, Any] | None:
    """For a GEMM whose M is not a multiple of ``config``'s BLOCK_M: the problem with M rounded up
    to one (the rows its tiles compute, padding included); None otherwise."""
    if template.name != "matmul" or problem["M"] % config["BLOCK_M"] == 0:
        return None
    rows = -(-problem["M"] // config["BLOCK_M"]) * config["BLOCK_M"]
    return template.problem(**{**problem, "M": rows})


def reasons(
    template: Any,
    problem: dict[str, Any],
    tuned: dict[str, Any] | None,
    times: dict[str, Any],
    swept: tuple[float | None, float | None] = (None, None),
) -> list[dict[str, Any]]:
    """heldout_reasons.csv's rows for one held-out shape (see the module's docstring); ``swept``:
    the tuned winner's and the peer's times as the sweep stored them."""
    from _common import result_row

    def row(
        at: dict[str, Any], peer: str, ours_ms: float, peer_ms: float, label: str = "tuned", how: str = "cuda_graph"
    ) -> dict[str, Any]:
        found = result_row(template, at, peer=peer, ours_ms=ours_ms, peer_ms=peer_ms, timing_method=how)
        return {**found, "kernel": f"{template.name} [{label}]"}

    ours = times.get("tuned")
    if tuned is None or ours is None:
        return []
    rows = []
    # the sweep times the template's own peer: comparable where this run times that one too
    if None not in swept and peer_of(template)[0] == template.peer_name:
        rows.append(row(problem, template.peer_name, swept[0], swept[1], "tuned, as its sweep timed it", "sweep"))
    rows += [
        row(problem, label.removeprefix("peer: "), ours, ms)
        for label, ms in times.items()
        if label.startswith("peer: ") and ms is not None
    ]
    if sdpa_backends(template) and times.get("peer") is not None:
        from tunesvc.device import current_device

        name = busiest_kernel(template.peer(template.make_inputs(problem, current_device())))
        print(f"  torch SDPA's default ran {name}", flush=True)
        rows.append(row(problem, f"torch SDPA, default: {name[:80]}", ours, times["peer"]))
    if (rounded := padded(template, problem, tuned)) is not None:
        _, at = time_shape(template, rounded, {"tuned": tuned})
        if at.get("tuned") is not None and at.get("peer") is not None:
            label = f"tuned, M={problem['M']} rounded up to BLOCK_M"
            rows.append(row(rounded, template.peer_name, at["tuned"], at["peer"], label))
    return rows


def _short(config: dict[str, Any]) -> str:
    return " ".join(f"{k}={v}" for k, v in config.items())


def ceiling_label(result: ProblemResult) -> str:
    """The ceiling sweep's row label: how many trials its key holds, and 'all' where the random
    sweep measured every feasible config (the space's best, not a sample's)."""
    return f"space best of {'all ' if result.stopped == 'exhausted' else ''}{result.trials_stored}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--db", default="heldout.db", help="a database holding the presets' sweeps")
    parser.add_argument("--size", choices=("small", "medium", "full"), default="small")
    parser.add_argument("--kernels", default=",".join(SHAPES), help="comma-separated subset of " + ",".join(SHAPES))
    parser.add_argument("--budget", type=int, default=32, help="trials per held-out shape (at most 32)")
    parser.add_argument("--no-sweep", action="store_true", help="time the untuned picks only")
    parser.add_argument("--fit", action="store_true", help="fit each kernel's selector in --db first (cross-measure)")
    parser.add_argument("--list", action="store_true", help="print the held-out shapes and exit")
    parser.add_argument(
        "--ceiling",
        type=int,
        default=0,
        help="after the sweep, random trials up to this many per shape; their best is timed as "
        "'space best of N' (what the space holds, beyond what the short sweep finds)",
    )
    parser.add_argument(
        "--candidates",
        action="store_true",
        help="also time the best of the selector's candidates at each shape ('best candidate')",
    )
    parser.add_argument(
        "--shapes", default="", help="only these shapes, by their --list index: e.g. 0-5 or 0,3,7 (default: all)"
    )
    parser.add_argument("--run", default="", help="stamp the rows with this run (default: this process's start)")
    parser.add_argument(
        "--picks",
        default="",
        help="a JSON file keeping the untuned picks read before each shape was first tuned: a run split "
        "over several calls on one --db reads them there (a shape tuned by an earlier call is no longer held out)",
    )
    parser.add_argument(
        "--gpus",
        default="1",
        help="spread the shapes over this many GPUs ('all': every visible one), one process each, "
        "each on its own copy of --db (after --fit, which runs once, first)",
    )
    args = parser.parse_args()
    kernels = [k for k in args.kernels.split(",") if k]
    unknown = sorted(set(kernels) - set(SHAPES))
    if unknown:
        parser.error(f"--kernels: unknown {', '.join(unknown)}; use some of {', '.join(SHAPES)}")
    if not 1 <= args.budget <= 32:
        parser.error("--budget must be between 1 and 32")
    problems = held_out(args.size, kernels)
    if args.list:
        for i, (name, p) in enumerate((name, p) for name, shapes in problems.items() for p in shapes):
            print(i, name, ",".join(f"{k}={v}" for k, v in p.items()))
        print(f"{sum(map(len, problems.values()))} shapes, disjoint from every preset's keys")
        return 0
    if args.shapes:
        try:
            wanted = indices(args.shapes)
        except ValueError:
            parser.error(f"--shapes {args.shapes!r}: give --list indices, e.g. 0-5 or 0,3,7")
        problems = subset(problems, wanted)

    from _common import copy_bandwidth
    from _common import geomean
    from _common import print_table
    from _common import require_gpu

    from tunesvc.device import current_device
    from tunesvc.store import Store
    from tunesvc.template import get_template
    from tunesvc.tuning import selector_fit
    from tunesvc.tuning import selector_measure
    from tunesvc.tuning.sweep import compile_pool
    from tunesvc.tuning.sweep import measuring_process

    require_gpu("benchmarks/heldout.py")
    import _common
    import torch

    if args.run:
        _common.RUN = args.run
    gpus = visible_gpus(args.gpus, torch.cuda.device_count())
    if len(gpus) > 1:
        existing_db(args.db)  # before --fit, which would create it
    device = current_device()
    if args.fit:
        store = Store(args.db)
        try:
            for name in problems:
                template = get_template(name)
                n = selector_measure.cross_measure(store, template, device)
                try:
                    fitted = selector_fit.refit(store, template, device)
                except selector_fit.SelectorWorse as exc:
                    print(f"{name}: {n} cross-measured trials; {exc}", flush=True)
                    continue
                print(f"{name}: {n} cross-measured trials; selector on {fitted.keys if fitted else 0} keys", flush=True)
        finally:
            store.close()
    if len(gpus) > 1:
        every = range(sum(map(len, problems.values())))  # --list's indices when --shapes chose none
        return spread(args, sorted(wanted) if args.shapes else list(every), gpus, _common.RUN)
    scratch = tempfile.mkdtemp(prefix="heldout-candidates-")
    picks = kept_picks(args.picks, args.db, problems) if args.picks else untuned_picks(args.db, problems)

    table, summary = [], {}
    # the kernel's bound in each row's roofline: the larger of its FLOPs at the bf16 peak and its
    # minimum bytes at the copy bandwidth measured now
    bandwidth = copy_bandwidth()
    print(f"copy bandwidth {bandwidth / 1e12:.2f} TB/s; {device.name}, {device.sm_count} SMs", flush=True)
    for name, shapes in problems.items():
        template = get_template(name)
        # one compile pool and one measuring process for the kernel's sweeps, as ``tune sweep`` over
        # several shapes has: their start-up (processes, CUDA contexts, imports) is paid once
        compiler = measurer = None
        if not args.no_sweep:
            compiler = compile_pool(template, shapes[0], strategy="optuna", budget=args.budget)
            measurer = measuring_process(template, shapes[0])
        try:
            _held_out_kernel(
                name, template, shapes, picks, args, scratch, compiler, measurer, bandwidth, table, summary
            )
        finally:
            for part in (measurer, compiler):
                if part is not None:
                    part.close()
    print_table(
        f"Held-out shapes, bf16, GPU ms from CUDA graphs (sweeps: Optuna, {args.budget} trials)",
        ["kernel", "shape key", "runtime", "selector", "nearest", "heuristic", "tuned", "peer", "peer / tuned"],
        table,
    )
    for name, entry in summary.items():
        line = [f"{name}:"]
        for label in ("selector", "nearest", "best candidate"):
            ratios = entry[label]
            if ratios:
                within = sum(r >= 1 / 1.05 for r in ratios) / len(ratios)
                line.append(f"{label} within 5% of tuned on {within:.0%} of {len(ratios)}, worst {min(ratios):.2f}x;")
        vs = entry["tuned_vs_peer"]
        if vs:
            line.append(f"tuned / peer geometric mean {geomean(vs):.3f}x, lowest {min(vs):.2f}x")
        print(" ".join(line), flush=True)
    if both := together(
        summary.get("attention", {}).get("times", {}), summary.get("attention_bwd", {}).get("times", {})
    ):
        print(
            f"attention forward+backward: tuned / peer geometric mean {geomean(both.values()):.3f}x, "
            f"lowest {min(both.values()):.2f}x at {min(both, key=both.__getitem__)}, over {len(both)} shapes",
            flush=True,
        )
    shutil.rmtree(scratch, ignore_errors=True)
    return 0


def _shape_of(template: Any, problem: dict[str, Any]) -> str:
    return ",".join(f"{k}={problem[k]}" for k in (*template.dims, *template.options))


def together(forward: dict[str, tuple[float, float]], backward: dict[str, tuple[float, float]]) -> dict[str, float]:
    """shape -> the peer's forward+backward time over ours, for the shapes both directions timed
    (each direction's tuned config and peer, (ours ms, peer ms), interleaved in the same run)."""
    return {
        shape: (forward[shape][1] + backward[shape][1]) / (forward[shape][0] + backward[shape][0])
        for shape in forward.keys() & backward.keys()
    }


def _held_out_kernel(
    name: str,
    template: Any,
    shapes: list[dict[str, Any]],
    picks: dict[tuple[str, str], dict[str, Any]],
    args: argparse.Namespace,
    scratch: str,
    compiler: Any,
    measurer: Any,
    bandwidth: float,
    table: list[list[Any]],
    summary: dict[str, dict[str, Any]],
) -> None:
    """One kernel's held-out shapes in turn: sweep, time the picks, the tuned winner and the
    peers, record; its rows go to ``table`` and its ratios to ``summary``."""
    import torch
    from _common import record
    from _common import result_row
    from gemm_heldout import PEAK_TFLOPS

    from tunesvc.store import Store
    from tunesvc.tuning.sweep import run_sweep

    for problem in shapes:
        key = str(template.key(problem))
        pick = picks[(name, key)]
        configs = {label: pick[label] for label in ("selector", "nearest", "heuristic") if label in pick}
        swept: tuple[float | None, float | None] = (None, None)
        if not args.no_sweep:
            sweeps = [("tuned", "optuna", args.budget)]
            if args.ceiling > args.budget:
                sweeps.append((f"space best of {args.ceiling}", "random", args.ceiling))
            for label, strategy, budget in sweeps:
                store = Store(args.db)
                try:
                    [result] = run_sweep(
                        template,
                        [problem],
                        store,
                        strategy=strategy,
                        budget=budget,
                        workers=compiler.workers if compiler is not None else 0,
                        compiler=compiler,
                        measurer=measurer,
                    )
                finally:
                    store.close()
                if result.winner is not None:
                    if strategy == "random":
                        label = ceiling_label(result)
                    configs[label] = result.winner
                    if label == "tuned":
                        swept = (result.winner_ms, result.peer_ms)
        if args.candidates and pick.get("candidates"):
            fits = launchable(template, problem, pick["candidates"])
            best = best_candidate(template, problem, fits, f"{scratch}/candidates.db") if fits else None
            if best is not None:
                configs["best candidate"] = best
        print(f"{name} {key}: timing {', '.join(configs)} and the peer", flush=True)
        others = sdpa_backends(template) | triton_peers(template)
        peer_name, times = time_shape(template, problem, configs, others)
        torch.cuda.empty_cache()  # the shape's inputs, copies and reference: the measuring process needs room
        peer_ms = times.get("peer")
        tuned_ms = times.get("tuned")
        cost = template.cost(problem)
        bound_ms = max(cost.flops / (PEAK_TFLOPS * 1e12), cost.bytes / bandwidth) * 1e3
        # a memory-bound kernel's rate in GB/s (its bytes), a compute-bound one's in TFLOP/s
        unit, work = (
            ("TFLOP/s", cost.flops) if name in ("matmul", "attention", "attention_bwd") else ("GB/s", cost.bytes)
        )
        rows = []
        for label in configs:
            ours = times[label]
            if ours is not None and peer_ms is not None:
                row = result_row(
                    template,
                    problem,
                    peer=peer_name,
                    ours_ms=ours,
                    peer_ms=peer_ms,
                    timing_method="cuda_graph",
                    rate_unit=unit,
                    work=work,
                )
                row.update(kernel=f"{name} [{label}]", roofline=f"{bound_ms / ours:.3f}", config=_short(configs[label]))
                rows.append(row)
        if rows:
            record("heldout", rows)  # per shape: a run stopped by a time limit keeps what it measured
        if explained := reasons(template, problem, configs.get("tuned"), times, swept):
            record("heldout_reasons", explained)
        entry = summary.setdefault(name, {"selector": [], "nearest": [], "best candidate": [], "tuned_vs_peer": []})
        if "best candidate" in configs and tuned_ms is not None and times.get("best candidate"):
            entry["best candidate"].append(tuned_ms / times["best candidate"])
        for label in ("selector", "nearest"):
            # the selector's column is what the runtime launches: its pick, else the nearest rule's
            picked = label if label in configs else "nearest"
            if tuned_ms is not None and picked in configs:
                ms = times.get(picked)
                entry[label].append(tuned_ms / ms if ms else 0.0)
        if tuned_ms is not None and peer_ms is not None:
            entry["tuned_vs_peer"].append(peer_ms / tuned_ms)
            entry.setdefault("times", {})[_shape_of(template, problem)] = (tuned_ms, peer_ms)
        table.append(
            [
                name,
                key,
                pick["runtime"],
                *(_fmt(times.get(label)) for label in ("selector", "nearest", "heuristic", "tuned", "peer")),
                f"{peer_ms / tuned_ms:.2f}x" if tuned_ms and peer_ms else "-",
            ]
        )


def visible_gpus(text: str, torch_count: int) -> list[str]:
    """The CUDA_VISIBLE_DEVICES entries of --gpus N (the first N visible) or 'all'."""
    visible = [g for g in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if g] or [
        str(i) for i in range(torch_count)
    ]
    if text == "all":
        return visible
    if not text.isdigit() or not 1 <= int(text) <= len(visible):
        raise SystemExit(f"--gpus {text!r}: give 'all' or a number from 1 to {len(visible)} (the GPUs visible here).")
    return visible[: int(text)]


def child_commands(
    args: argparse.Namespace, shapes: list[int], gpus: list[str], run: str, dbs: list[str]
) -> list[tuple[str, list[str]]]:
    """(GPU, argv) of each process of a spread run: shapes dealt round-robin, so each GPU gets
    GEMMs of every size; every flag passed on but --fit (done once, first), --gpus and --shapes."""
    passed = ["--size", args.size, "--kernels", args.kernels, "--budget", str(args.budget), "--run", run]
    passed += ["--ceiling", str(args.ceiling)] if args.ceiling else []
    passed += [flag for flag, on in (("--candidates", args.candidates), ("--no-sweep", args.no_sweep)) if on]
    return [
        (gpu, [sys.executable, __file__, "--db", db, *passed, "--shapes", ",".join(map(str, shapes[i :: len(gpus)]))])
        for i, (gpu, db) in enumerate(zip(gpus, dbs))
        if shapes[i :: len(gpus)]
    ]


def existing_db(db: str) -> None:
    """Refuse a --db that does not exist: the copies each GPU gets must hold the presets' sweeps."""
    if not os.path.isfile(db):
        raise SystemExit(f"--db {db}: no such file; give a copy of tune.db.example (the presets' sweeps).")


def spread(args: argparse.Namespace, shapes: list[int], gpus: list[str], run: str) -> int:
    """Run the shapes on several GPUs at once, one process per GPU (a GPU's timings are its own:
    each has its own clock and power cap), each on a copy of --db; the rows of all go to the same
    CSV files, stamped with one run. Non-zero when any process failed."""
    import subprocess

    existing_db(args.db)
    folder = tempfile.mkdtemp(prefix="heldout-gpus-")
    dbs = []
    for gpu in gpus:
        dbs.append(os.path.join(folder, f"gpu{gpu}.db"))
        shutil.copyfile(args.db, dbs[-1])
    children = [
        (gpu, subprocess.Popen(argv, env={**os.environ, "CUDA_VISIBLE_DEVICES": gpu}))
        for gpu, argv in child_commands(args, shapes, gpus, run, dbs)
    ]
    failed = [gpu for gpu, child in children if child.wait() != 0]
    shutil.rmtree(folder, ignore_errors=True)
    if failed:
        print(f"held-out run {run}: the processes on GPU {', '.join(failed)} failed (their logs are above)", flush=True)
    return 1 if failed else 0


def indices(text: str) -> set[int]:
    """--shapes' indices: "0-5", "0,3,7" or both ("0-2,9"); ValueError on anything else."""
    out: set[int] = set()
    for part in text.split(","):
        first, _, last = part.partition("-")
        out.update(range(int(first), int(last or first) + 1))
    return out


def subset(problems: dict[str, list[dict[str, Any]]], wanted: set[int]) -> dict[str, list[dict[str, Any]]]:
    """The shapes whose --list index is in ``wanted``, by kernel (kernels left with none dropped)."""
    out: dict[str, list[dict[str, Any]]] = {}
    i = 0
    for name, shapes in problems.items():
        for problem in shapes:
            if i in wanted:
                out.setdefault(name, []).append(problem)
            i += 1
    return out


def _fmt(ms: float | None) -> str:
    return "-" if ms is None or math.isnan(ms) else f"{ms:.4g}"


if __name__ == "__main__":
    sys.exit(main())
