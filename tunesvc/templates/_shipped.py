"""The base of the shipped templates: their spaces are the files of :mod:`tunesvc.search_spaces`,
their kernels the modules of :mod:`tunesvc.kernels`."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

from tunesvc.errors import TunesvcError
from tunesvc.shipped import kernels_of
from tunesvc.template import Template


class ShippedTemplate(Template):
    """A template shipped with tunesvc: its space file is ``search_spaces/<name>.toml`` wherever
    tunesvc is installed (the template modules sit elsewhere than the kernels beside that folder)."""

    @property
    def space_path(self) -> Path:
        spec = importlib.util.find_spec("tunesvc.search_spaces")
        if spec is None or not spec.submodule_search_locations:
            raise TunesvcError("tunesvc.search_spaces is not installed; reinstall tunesvc.")
        return Path(next(iter(spec.submodule_search_locations))) / f"{self.name}.toml"

    @property
    def kernels(self) -> ModuleType:
        """The family's module of :mod:`tunesvc.kernels` (its Triton kernels and launches), imported
        when a method that makes inputs, launches or checks first needs it: it imports torch and
        Triton (seconds), and it imports this template's module: the loader is the package root's
        (:func:`tunesvc.shipped.use_loaders`), so the templates never import the kernels."""
        return kernels_of(self.kernel_module)
