"""The progress display of `tune sweep`: one line per shape key that fits the terminal's width.

At 80 columns a key, its phase, the bar, the trials of the budget (``123/352``), the best time and
the clock do not all fit. The trials, the best time and the clock are always whole; the bar is
short; the key and its phase give way, the phase first, cut with "…". The lines end two columns
short of the terminal's edge: the ``^C`` a terminal echoes at Ctrl-C then ends the last line,
which the display's final draw overwrites; after a line of the full width it would wrap onto a
line of its own, and the final draw would draw the display again under the first. And only rich's
refresh thread draws while the display runs (see :meth:`SweepProgress.refresh`).
"""

from __future__ import annotations

from collections.abc import Iterable

from rich.console import Console
from rich.console import ConsoleOptions
from rich.console import RenderableType
from rich.console import RenderResult
from rich.progress import BarColumn
from rich.progress import MofNCompleteColumn
from rich.progress import Progress
from rich.progress import ProgressColumn
from rich.progress import Task
from rich.progress import TextColumn
from rich.progress import TimeElapsedColumn
from rich.table import Column
from rich.text import Text

#: columns left free at the right edge, where a terminal echoes ``^C``
ECHO_MARGIN = 2
#: the bar's width (rich's default is 40): the trials' count beside it says as much, and the key
#: has more use for the room
BAR_WIDTH = 10


class KeyColumn(ProgressColumn):
    """A task's shape key and its phase (dim), cut at the end with "…" where the line is too
    narrow. With the bar, the only columns the table narrows (rich narrows the widest first: this
    one, down to the bar's width)."""

    def __init__(self) -> None:
        super().__init__(table_column=Column())  # a column that may narrow; its text is cut, never wrapped

    def render(self, task: Task) -> Text:
        return Text.assemble(task.description, " ", (task.fields["phase"], "dim"), no_wrap=True, overflow="ellipsis")


class ShortOfTheEdge:
    """``renderable`` drawn :data:`ECHO_MARGIN` columns narrower than where it is drawn."""

    def __init__(self, renderable: RenderableType) -> None:
        self.renderable = renderable

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        yield from console.render(self.renderable, options.update_width(max(options.max_width - ECHO_MARGIN, 1)))


class SweepProgress(Progress):
    """rich's Progress, its lines :class:`ShortOfTheEdge`, drawn by rich's refresh thread alone
    (ten times a second) while it runs."""

    def get_renderables(self) -> Iterable[RenderableType]:
        yield ShortOfTheEdge(self.make_tasks_table(self.tasks))

    def refresh(self) -> None:
        """Nothing (rich's draws the display at once, in the calling thread; :meth:`add_task`
        calls it): Ctrl-C's KeyboardInterrupt is raised in the main thread, and in a draw there
        it can land after the console wrote the frame and before it let go of it, which the
        final draw then writes again, a second copy of the display under the first."""


def _whole() -> Column:
    """A column the table never narrows."""
    return Column(no_wrap=True)


def sweep_progress(console: Console, *, best: bool, disable: bool) -> SweepProgress:
    """A line per task: key and phase, bar, trials of its total, its ``best`` field where asked,
    and the time elapsed."""
    columns: list[ProgressColumn] = [
        KeyColumn(),
        BarColumn(bar_width=BAR_WIDTH),
        MofNCompleteColumn(table_column=_whole()),
    ]
    if best:
        columns.append(TextColumn("{task.fields[best]}", markup=False, table_column=_whole()))
    columns.append(TimeElapsedColumn(table_column=_whole()))
    return SweepProgress(*columns, console=console, disable=disable)
