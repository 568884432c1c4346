"""Bundles: the winners of one device as a reviewable, diff-friendly JSON file, out and in.

It owns export (:func:`build_bundles` and :func:`write_bundles`, one file per device, behind
`tune export`) and import (:func:`import_sources`, merging bundles and databases into a database,
behind `tune import`), in :mod:`tunesvc.bundle._bundle`. The format (``tunesvc-bundle``, its
versions and the schema a bundle from anyone is checked against before use) and reading a bundle
back (:func:`read_bundle`, :func:`kernel_configs` and :func:`bundle_selector`, the runtime's
bundle winner source) are serving's (:mod:`tunesvc.serving.bundle_format`, described in its
docstring), re-exported here; the names below are the ones the rest of tunesvc uses.
"""

from __future__ import annotations

from tunesvc.bundle._bundle import ImportChange
from tunesvc.bundle._bundle import Imported
from tunesvc.bundle._bundle import SelectorChange
from tunesvc.bundle._bundle import build_bundles
from tunesvc.bundle._bundle import bundle_filename
from tunesvc.bundle._bundle import bundle_filenames
from tunesvc.bundle._bundle import import_sources
from tunesvc.bundle._bundle import write_bundles
from tunesvc.serving.bundle_format import FORMAT
from tunesvc.serving.bundle_format import FORMAT_VERSION
from tunesvc.serving.bundle_format import READABLE
from tunesvc.serving.bundle_format import bundle_selector
from tunesvc.serving.bundle_format import kernel_configs
from tunesvc.serving.bundle_format import read_bundle

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
