"""Where the shipped kernels and templates are found: two loaders the package root (:mod:`tunesvc`)
sets, as it hands serving its tune-on-miss policy.

A shipped template launches its family's kernel module (:mod:`tunesvc.kernels`), and the
catalogue (:func:`tunesvc.template.get_template`) loads the template modules
(:mod:`tunesvc.templates`); but the kernels import their templates (for their ``TEMPLATE``) and
the templates subclass the catalogue's ``Template``. Through these loaders each dependency runs
one way: kernels -> templates -> template, with the root, above them all, doing the importing.
"""

from __future__ import annotations

from collections.abc import Callable
from types import ModuleType

#: "kernels" / "templates" -> a module name -> that module of tunesvc.kernels / tunesvc.templates
_loaders: dict[str, Callable[[str], ModuleType]] = {}


def use_loaders(*, kernels: Callable[[str], ModuleType], templates: Callable[[str], ModuleType]) -> None:
    """Set how a family's kernel module and a template module are found (the package root calls it)."""
    _loaders.update(kernels=kernels, templates=templates)


def kernels_of(family: str) -> ModuleType:
    """The module of :mod:`tunesvc.kernels` named ``family`` (a template's ``kernel_module``)."""
    return _loaders["kernels"](family)


def template_module(name: str) -> ModuleType:
    """The module of :mod:`tunesvc.templates` named ``name`` (a value of :data:`tunesvc.template.SHIPPED`)."""
    return _loaders["templates"](name)
