"""The fleet: a sweep shared by many workers, and where those workers run.

It owns the batch queue and worker placement. :mod:`tunesvc.fleet.jobs` is the queue a shared
sweep's (kernel x shape) jobs go into, in the database's ``jobs`` table under a batch name, and
the worker that claims, heartbeats and finishes them (``python -m tunesvc.fleet.jobs``, or forked
by ``tune sweep --gpus``, one per GPU of a host); :mod:`tunesvc.fleet.cluster` places those same
workers on a Ray cluster's GPUs (``tune sweep --ray``); :mod:`tunesvc.fleet.batch` runs one
batch on either, reporting its progress through callbacks (the CLI draws them). The claims, heartbeats and the release of
a dead worker's job all live in the database, so placement only starts workers. It runs the
sweep (:mod:`tunesvc.tuning.sweep`) and so sits on the tuning side: serving never imports it
(tests/test_imports.py asserts it).
"""
