"""Write docs/settings.md from tunesvc.settings: ``python docs/settings_reference.py docs/settings.md``."""

from __future__ import annotations

import sys

from tunesvc import settings

INTRO = """# Settings

Every environment variable tunesvc reads, all in `tunesvc/settings.py`. A value that does not
parse is one warning and the default. Modes mean the same for shipped kernels, captured kernels
and `tune run`:

- `tune`: the stored winner; a miss is tuned now, stored and used from then on.
- `lookup`: the stored winner, else the fallback chain; nothing measured (a captured kernel's miss is recorded).
- `heuristic`: winners never read; the kernel's heuristic config (a captured kernel: the first config its pruning keeps).
- `off`: tunesvc steps aside: a captured kernel runs Triton's own autotuner, a shipped kernel its heuristic.

| variable | what it holds |
|---|---|
"""


def reference() -> str:
    return INTRO + "".join(f"| `{name}` | {what.replace('|', '/')} |\n" for name, what in settings.VARIABLES.items())


if __name__ == "__main__":
    with open(sys.argv[1], "w") as f:
        f.write(reference())
