"""`tune kernels` and `tune space`: the kernel templates and their config spaces, read from the
templates alone (no database; a shipped template imports neither torch nor Triton)."""

from __future__ import annotations

from typing import Annotated
from typing import Any

import typer
from rich.table import Table

from tunesvc.cli._common import JsonOption
from tunesvc.cli._common import KernelArgument
from tunesvc.cli._common import _config_text
from tunesvc.cli._common import _keyed_table
from tunesvc.cli._common import _print_json
from tunesvc.cli._common import app
from tunesvc.cli._common import console
from tunesvc.cli._common import user_errors
from tunesvc.errors import TunesvcError


@app.command()
@user_errors
def kernels(as_json: JsonOption = False) -> None:
    """List the kernel templates, their dims, version and space size."""
    from tunesvc.template import ALIASES
    from tunesvc.template import list_templates  # shipped templates: no torch; users' own may import it

    rows: list[dict[str, Any]] = [
        {
            "name": t.name,
            "aliases": sorted(alias for alias, name in ALIASES.items() if name == t.name),
            "dims": list(t.dims),
            "version": t.version,
            "space_size": t.space.size,
            "presets": sorted(t.presets),
            "space_file": str(t.space_path),
        }
        for t in list_templates()
    ]
    if as_json:
        return _print_json(rows)
    table = _keyed_table(
        "Kernel templates",
        ["kernel", "dims", "version", "configs", "presets"],
        [[r["name"], "x".join(r["dims"]), r["version"], str(r["space_size"]), ", ".join(r["presets"])] for r in rows],
        caption=_aliases_caption(rows),
        # the room that a 21-character kernel name needs beside the presets at 80 columns
        show_edge=False,
        pad_edge=False,
    )
    console.print(table)


def _aliases_caption(rows: list[dict[str, Any]]) -> str | None:
    """ "Also named ...": the library's function names that every command takes for a template's."""
    pairs = [f"{alias} = {r['name']}" for r in rows for alias in r["aliases"]]
    return f"Every command also takes the library's names: {', '.join(pairs)}." if pairs else None


@app.command()
@user_errors
def space(
    kernel: KernelArgument,
    shape: Annotated[
        str | None, typer.Option(help="Count feasible configs for this shape, e.g. 4096x4096x4096.")
    ] = None,
    dtype: Annotated[str, typer.Option(help="float16, bfloat16 or float32.")] = "float16",
    as_json: JsonOption = False,
) -> None:
    """Show a kernel's config space: parameters, constraints, and feasible configs for a shape."""
    # the template (a shipped one imports neither torch nor Triton); the device (torch on a GPU machine)
    from tunesvc.device import current_device
    from tunesvc.template import get_template

    template = get_template(kernel)
    sp = template.space
    data: dict[str, Any] = {
        "kernel": template.name,
        "file": sp.source,
        "size": sp.size,
        "parameters": {n: list(p.choices) for n, p in sp.parameters.items()},
        "constraints": {n: e.source for n, e in sp.constraints.items()},
    }
    if shape is not None:
        problem = template.parse_shape(shape, dtype)
        device = current_device()
        feasible = len(template.feasible(problem, device))
        if not feasible:  # a template's heuristic has nothing to pick from (an IndexError, for one)
            raise TunesvcError(
                f"No config of {template.name}'s space fits {template.key(problem)} on {device.name}: every one "
                "breaks a constraint; widen the space or give another shape."
            )
        data.update(
            shape_key=str(template.key(problem)),
            device=device.name,
            feasible=feasible,
            heuristic=template.heuristic(problem, device),
        )
    if as_json:
        return _print_json(data)
    table = Table(title=f"{template.name}: {sp.size} configs ({sp.source})")
    table.add_column("parameter")
    table.add_column("choices")
    for name, choices in data["parameters"].items():
        table.add_row(name, ", ".join(map(str, choices)))
    console.print(table)
    constraints = Table(title="Constraints")
    constraints.add_column("name")
    constraints.add_column("expression")
    for name, source in data["constraints"].items():
        constraints.add_row(name, source)
    console.print(constraints)
    if shape is not None:
        console.print(
            f"{data['shape_key']} on {data['device']}: {data['feasible']} feasible of {sp.size}; "
            f"heuristic {_config_text(data['heuristic'])}"
        )
