"""The pydantic types of a stored or shipped value, shared by bundles' schemas
(:mod:`tunesvc.bundle`) and the store's row checks (the rules: :mod:`tunesvc.checks`). Imported only where a
value is checked: pydantic takes a tenth of a second to import.
"""

from __future__ import annotations

from typing import Annotated
from typing import Any

from pydantic import AfterValidator
from pydantic import Field
from pydantic import StringConstraints
from pydantic import TypeAdapter

from tunesvc.checks import MAX_KEY
from tunesvc.checks import json_problem
from tunesvc.checks import key_problem
from tunesvc.space import MAX_CHOICE_VALUE
from tunesvc.space import MAX_TEXT_CHOICE


def _key(key: str) -> str:
    why = key_problem(key)
    if why is not None:
        raise ValueError(why.removeprefix("its "))
    return key


Name = Annotated[str, StringConstraints(pattern=r"^[A-Za-z_][A-Za-z0-9_]*$", max_length=64)]
Value = (
    Annotated[int, Field(strict=True, ge=-MAX_CHOICE_VALUE, le=MAX_CHOICE_VALUE)]
    | Annotated[str, StringConstraints(strict=True, max_length=MAX_TEXT_CHOICE)]
)
#: a non-empty table of parameter names to whole numbers or short texts
Config = Annotated[dict[Name, Value], Field(min_length=1)]
#: a shape key (see tunesvc.checks); a bundle's is never empty
Key = Annotated[str, StringConstraints(min_length=1, max_length=MAX_KEY), AfterValidator(_key)]
#: a measured time: finite and positive
Time = Annotated[float, Field(gt=0, allow_inf_nan=False)]

CONFIG: TypeAdapter[dict[str, int | str]] = TypeAdapter(Config)


def config_problem(config: Any) -> str | None:
    """Why ``config`` (decoded JSON) is not a config, else None."""
    from pydantic import ValidationError

    why = json_problem(config, "config")
    if why is not None:
        return why
    try:
        CONFIG.validate_python(config)
    except ValidationError as exc:
        error = exc.errors()[0]
        field = ".".join(str(part) for part in error["loc"] if part != "[key]")
        return f"its config is not one ({field + ': ' if field else ''}{error['msg']})"
    return None


def winner_problem(key: Any, config: Any, time_ms: Any) -> str | None:
    """Why a winner (shape key, decoded config, time) cannot be used, else None."""
    if not (isinstance(time_ms, (int, float)) and 0 < time_ms < float("inf")):
        return "its time is not a finite positive number"
    return key_problem(key) or config_problem(config)
