"""Bundles: the winners of one device as a reviewable, diff-friendly JSON file, out and in.

It owns the bundle format (``tunesvc-bundle``, its versions and the schema a bundle from anyone
is checked against before use), export (:func:`build_bundles` and :func:`write_bundles`, one file
per device, behind `tune export`), reading a bundle back (:func:`read_bundle`,
:func:`kernel_configs` and :func:`bundle_selector`, the runtime's bundle winner source) and import
(:func:`import_sources`, merging bundles and databases into a database, behind `tune import`).
The code is in :mod:`tunesvc.bundle._bundle`, with the format described in its docstring; the
names below are the ones the rest of tunesvc uses.
"""

from __future__ import annotations

from tunesvc.bundle._bundle import FORMAT
from tunesvc.bundle._bundle import FORMAT_VERSION
from tunesvc.bundle._bundle import READABLE
from tunesvc.bundle._bundle import ImportChange
from tunesvc.bundle._bundle import Imported
from tunesvc.bundle._bundle import SelectorChange
from tunesvc.bundle._bundle import build_bundles
from tunesvc.bundle._bundle import bundle_filename
from tunesvc.bundle._bundle import bundle_filenames
from tunesvc.bundle._bundle import bundle_selector
from tunesvc.bundle._bundle import import_sources
from tunesvc.bundle._bundle import kernel_configs
from tunesvc.bundle._bundle import read_bundle
from tunesvc.bundle._bundle import write_bundles

__all__ = [
    "FORMAT",
    "FORMAT_VERSION",
    "READABLE",
    "ImportChange",
    "Imported",
    "SelectorChange",
    "build_bundles",
    "bundle_filename",
    "bundle_filenames",
    "bundle_selector",
    "import_sources",
    "kernel_configs",
    "read_bundle",
    "write_bundles",
]
