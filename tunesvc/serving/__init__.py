"""Serving: the config to launch a kernel with, here and now, from winners tuned before.

The layer is :mod:`tunesvc.serving.runtime` (what to launch, here and now, memoised, failing
open), :mod:`tunesvc.serving.source` (the one source of winners, a database or a bundle: a
kernel's winners in its space, its selector, a sibling GPU model's winners),
:mod:`tunesvc.serving.chain` (the one fallback chain, exact -> predicted -> nearest ->
transferred -> heuristic, for shipped and captured kernels alike),
:mod:`tunesvc.serving.transfer` (a sibling GPU model's winners),
:mod:`tunesvc.serving.selector` (the selector's model: its JSON and its pick),
:mod:`tunesvc.serving.on_miss` (where mode 'tune' hands a miss to the tuning side),
:mod:`tunesvc.serving.launch` and :mod:`tunesvc.serving.ops`.

It imports no tuning (the sweep, search strategies, measurers, selector fitting), no capture
and no fleet (:mod:`tunesvc.fleet`): tests/test_imports.py asserts it. What happens on a miss in
mode 'tune' is a policy the tuning side hands over (:mod:`tunesvc.serving.on_miss`).
"""
