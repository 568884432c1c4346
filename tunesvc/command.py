"""The command that runs tunesvc's CLI, as hints name it (`` `tune show` ``, `` `tunesvc show` ``).

Ray installs a `tune` command of its own (Ray Tune's), and whichever of the two distributions pip
installed last owns that name: `pip install -e '.[ray]'` installs tunesvc, then Ray. A hint names
the command the user typed where it reached tunesvc, `python -m tunesvc` where that ran it, else
(a user's program, a test) `tune` where the `tune` beside this interpreter is tunesvc's and
`tunesvc`, a name no other package claims, where it is not.
"""

from __future__ import annotations

import functools
import re
import sys
from pathlib import Path


def program() -> str:
    """The command hints name (see the module docstring)."""
    invoked = Path(sys.argv[0]) if sys.argv and sys.argv[0] else None
    if invoked is not None and invoked.stem in ("tune", "tunesvc"):
        return invoked.stem
    if invoked is not None and invoked.name == "__main__.py" and invoked.parent.name == "tunesvc":
        return "python -m tunesvc"
    return "tune" if tune_is_tunesvc(Path(sys.executable).parent) else "tunesvc"


@functools.cache
def tune_is_tunesvc(scripts: Path) -> bool:
    """Whether the `tune` script in ``scripts`` (where pip puts this environment's commands) runs
    tunesvc; True where there is none to read (tunesvc not installed as scripts: the docs' name)."""
    try:
        with open(scripts / "tune", "rb") as script:
            head = script.read(4096)
    except OSError:
        return True
    return b"tunesvc" in head


def named(text: str) -> str:
    """``text`` with its hints (`` `tune show` ``, in backquotes) naming :func:`program`; words such
    as "tune it" are left alone."""
    name = program()
    return text if name == "tune" else re.sub(r"(?<=`)tune(?=[ `])", name, text)
