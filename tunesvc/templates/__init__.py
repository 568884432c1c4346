"""The shipped templates: what tuning and lookups need to know about each kernel family of
:mod:`tunesvc.kernels` (dims, presets, shape keys, heuristics, costs), one module per family.

They live apart from the kernels because those import torch and Triton (seconds on a small
machine), which `tune kernels`, `tune space` and `tune lookup` never need: a template imports its
family's kernel module when it first makes inputs, launches or checks a candidate.

This package's root holds only two loaders, which the package root (:mod:`tunesvc`) sets, as it
hands serving its tune-on-miss policy: :func:`kernels_of` (a family's kernel module) and
:func:`module_of` (a template module, for :func:`tunesvc.template.get_template`). So the templates
never import the kernels, which import them (for their ``TEMPLATE``), and the catalogue in
:mod:`tunesvc.template` never imports the templates, which subclass its ``Template``: each
dependency runs one way.
"""

from __future__ import annotations

from collections.abc import Callable
from types import ModuleType

#: the loaders :func:`use_loaders` set: module name -> module of tunesvc.kernels / tunesvc.templates
_loaders: dict[str, Callable[[str], ModuleType]] = {}


def use_loaders(*, kernels: Callable[[str], ModuleType], templates: Callable[[str], ModuleType]) -> None:
    """Set how a family's kernel module and a template module are found (the package root calls it)."""
    _loaders.update(kernels=kernels, templates=templates)


def kernels_of(family: str) -> ModuleType:
    """The module of :mod:`tunesvc.kernels` named ``family`` (a template's ``kernel_module``)."""
    return _loaders["kernels"](family)


def module_of(name: str) -> ModuleType:
    """The module of this package named ``name`` (a value of :data:`tunesvc.template.SHIPPED`)."""
    return _loaders["templates"](name)
