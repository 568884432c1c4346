"""The shipped templates: what tuning and lookups need to know about each kernel family of
:mod:`tunesvc.kernels` (dims, presets, shape keys, heuristics, costs), one module per family.

They live apart from the kernels because those import torch and Triton (seconds on a small
machine), which `tune kernels`, `tune space` and `tune lookup` never need: a template imports its
family's kernel module when it first makes inputs, launches or checks a candidate.

They never import the kernels, which import them: a template finds its kernel module through
the loader of :mod:`tunesvc.shipped`, which the package root sets.
"""
