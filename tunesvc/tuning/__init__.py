"""Tuning: finding and judging configs on the device, offline or on a miss.

The layer is :mod:`tunesvc.tuning.sweep` (with :mod:`tunesvc.search` and :mod:`tunesvc.bench`),
:mod:`tunesvc.tuning.key` (one key's tuning, which the sweep, capture, the cross-measure and
``tune verify`` call: measure, check, re-time the finalists by one rule, store trials and winner),
:mod:`tunesvc.tuning.on_miss` (the policy that mode 'tune' of the runtime hands a miss to),
:mod:`tunesvc.tuning.selector_fit` (fitting a selector from the stored trials) and
:mod:`tunesvc.tuning.selector_measure` (cross-measuring its candidates, the held-out
evaluation). It may import serving; serving never imports it.
"""
