"""`tune report`: one self-contained HTML page about a database, to look at rather than read.

It opens with a summary (per kernel and device: the tuned kernels' speed-up over their torch
peers, as a geometric mean, best and worst) and a table of contents. By default it shows the
kernel versions that lookups use (the installed template's; for a captured or uninstalled
kernel, its newest stored version); ``all_versions`` adds the older ones, under their own
headings. Per kernel version and device: a table of the winners (tuned time against the heuristic's
trial, when the sweep measured it, and against the template's torch peer, when the sweep timed
it; achieved TFLOP/s; the fraction of the device's roofline from the template's
``cost(problem)`` and a small table of listed peaks), two convergence figures (best-so-far time
against trial index and against seconds of sweeping, one panel per shape key, one line per
search strategy) and a spread figure (every correct trial's time relative to the key's winner).

The page has no JavaScript and loads nothing: the figures are PNGs (256-colour palettes, a third
of the bytes of full colour for line plots) embedded as base64 data URIs, each stored once. The
database is only read.

The code is in three modules: :mod:`tunesvc.report._data` (the records and :func:`collect`),
:mod:`tunesvc.report._figures` (the matplotlib figures) and :mod:`tunesvc.report._html` (the page and
:func:`write_report`); the names below are the ones used outside them (the underscore names
they import from each other, such as ``_figures._short_key``, stay inside this package).
"""

from __future__ import annotations

from tunesvc.report._data import LISTED_PEAKS
from tunesvc.report._data import KeyReport
from tunesvc.report._data import Peak
from tunesvc.report._data import Progress
from tunesvc.report._data import Section
from tunesvc.report._data import Trace
from tunesvc.report._data import collect
from tunesvc.report._figures import DPI
from tunesvc.report._figures import FIGURES
from tunesvc.report._figures import STRATEGY_COLORS
from tunesvc.report._figures import _short_key
from tunesvc.report._figures import _spread_figure
from tunesvc.report._figures import convergence_figure
from tunesvc.report._html import REPORT_FILE
from tunesvc.report._html import SPEEDUP_NOTE
from tunesvc.report._html import SWEEP_FIGURES_NOTE
from tunesvc.report._html import WINNER_COLUMNS
from tunesvc.report._html import write_report

__all__ = [
    "DPI",
    "FIGURES",
    "LISTED_PEAKS",
    "REPORT_FILE",
    "SPEEDUP_NOTE",
    "STRATEGY_COLORS",
    "SWEEP_FIGURES_NOTE",
    "WINNER_COLUMNS",
    "KeyReport",
    "Peak",
    "Progress",
    "Section",
    "Trace",
    "_short_key",
    "_spread_figure",
    "collect",
    "convergence_figure",
    "write_report",
]
