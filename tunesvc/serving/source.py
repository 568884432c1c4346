"""Where winners come from: a database or a bundle, read through one protocol.

:class:`WinnerSource` answers, for one device, a kernel's winners, its selector and a sibling
GPU model's winners, each checked against the kernel's space; :class:`DatabaseSource` reads a
database (a path or URL, or an open store), :class:`BundleSource` a bundle from `tune export`
(a path, or its data already read). The one chain (:mod:`tunesvc.serving.chain`) decides what a
key is served from what a source gives; the runtime, a sweep's "what was served before"
(:func:`tunesvc.tuning.selector_fit.untuned_answer`) and `tune lookup` read through a source.

A bundle is read with :mod:`json` only: a deployment that ships a bundle never imports
SQLAlchemy (the database source imports the store where it reads, not here).
"""

from __future__ import annotations

import contextlib
import os
from abc import ABC
from abc import abstractmethod
from dataclasses import dataclass
from dataclasses import field
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING
from typing import Any

from tunesvc import settings
from tunesvc.errors import TunesvcError
from tunesvc.serving import transfer as transfers
from tunesvc.settings import GRAPH
from tunesvc.space import config_hash

if TYPE_CHECKING:
    from collections.abc import Callable
    from collections.abc import Iterable

    from tunesvc.device import Device
    from tunesvc.serving.selector import Selector
    from tunesvc.space import Config
    from tunesvc.store import BaseStore
    from tunesvc.template import Template


@dataclass(frozen=True)
class Winners:
    """One GPU model's winners of one kernel read from a source: those in the kernel's space, and
    the keys of those outside it (said by the caller: the runtime warns once, strict raises)."""

    #: shape key -> config, each config with every parameter it lacks at its first choice
    table: dict[str, Config]
    #: (shape key, why) of each stored winner outside the space, in stored order
    outside: tuple[tuple[str, str], ...] = ()
    #: the model they were measured on, as answers name it, and its hardware id
    model: str = ""
    hardware_id: str = ""
    #: a sibling's: shape key -> the winner's time and the heuristic's there, ms (transfers.SiblingTable)
    winner_ms: dict[str, float] = field(default_factory=dict)
    heuristic_ms: dict[str, float] = field(default_factory=dict)

    def sibling(self) -> transfers.SiblingTable | None:
        """These winners as a sibling model's table for the chain's transferred step; None where none fits."""
        if not self.table:
            return None
        return transfers.SiblingTable(self.model, self.hardware_id, self.table, self.winner_ms, self.heuristic_ms)


def in_space(template: Template, table: dict[str, Config], model: str = "", hardware_id: str = "") -> Winners:
    """The winners of ``table`` whose configs lie in ``template``'s space, each with every
    parameter it lacks at its first choice (a config stored before the parameter existed).

    A stored config comes from a database or bundle, which anyone may have written: one with an
    unknown parameter, a value outside the choices (BLOCK_M=10**30) or no parameter at all would
    make the kernel raise in the user's program, so its key is left out like an untuned one.
    """
    if not table:
        return Winners(table, (), model, hardware_id)
    space = template.space
    checked: dict[int, Config | str] = {}  # by id: a bundle's winners share its few configs
    good: dict[str, Config] = {}
    bad: list[tuple[str, str]] = []
    for key, config in table.items():
        result = checked.get(id(config))
        if result is None:
            result = checked[id(config)] = space.stored_config(config)
        if isinstance(result, str):
            bad.append((key, result))
        else:
            good[key] = result
    return Winners(good, tuple(bad), model, hardware_id)


class WinnerSource(ABC):
    """The winners tuned before, for one device (``device``), as a database or a bundle holds them.

    **What it answers.** :meth:`winners`: the device's model's winners of a kernel's current
    version (matched by hardware id: GPU model, capability, SM count); :meth:`selector`: the
    kernel's selector fitted for that version and model; :meth:`sibling`: the winners of a
    sibling GPU model (same capability and SM count, another hardware id; see
    :mod:`tunesvc.serving.transfer`), the one with the most keys of the kernel. Winners of other
    models and other kernel versions are never given as this model's. :meth:`stored` and
    :meth:`sibling_stored` give them unchecked, by kernel name, for a kernel that is not
    imported (a captured kernel named in `tune lookup`), where the version may be unknown.

    **The space check.** Every winner given by :meth:`winners` and :meth:`sibling` lies in the
    kernel's space (:func:`in_space`); those outside it are named in :attr:`Winners.outside`.
    A selector whose data is damaged or whose candidates lie outside the space raises
    :class:`~tunesvc.errors.TunesvcError`, as a source that cannot be read does: what to do
    about either (warn once, use heuristics; or raise) is the caller's.

    **Reading.** Each call reads the source (a bundle's file once: its data is kept), so a
    caller keeps what it needs (the runtime loads a kernel once). Where a database holds a key
    measured under several software stacks, the newest measurement is its winner.

    **Timing.** A key may hold a graph and an eager winner (see tunesvc.bench): :meth:`stored` and
    :meth:`winners` give each key the winner of the timing asked for (default graph), else the
    key's only winner, whichever timing it has. Selectors and siblings' winners are graph's.

    A source holds
    no connection between calls, unless it was given an open store, which it uses and never
    closes (and which serves one thread at a time, as every store does); otherwise any thread may
    call it. Records out: plain dicts and frozen values, never ORM rows.
    """

    device: Device

    @abstractmethod
    def where(self) -> str:
        """Where winners are read from, as messages name it: a bundle's or SQLite file's absolute
        path, a server URL without its password, or why there is none."""

    @property
    @abstractmethod
    def location(self) -> str | os.PathLike:
        """The bundle or database as given (a path, a URL), as error messages quote it."""

    @abstractmethod
    def on(self, device: Device) -> WinnerSource:
        """The same source, answering for ``device`` (another GPU model this process drives)."""

    @abstractmethod
    def stored(self, kernel: str, version: str | None, timing: str = GRAPH) -> dict[str, Config]:
        """The device's model's winners of ``kernel`` at ``version``, unchecked, shape key ->
        config; ``version`` None: whichever version the source holds (of a database's, the newest
        measurement of each key); of each key, its winner of ``timing``, else its only one."""

    @abstractmethod
    def sibling_stored(
        self, kernel: str, version: str | None, heuristic: Callable[[str], Config | None] | None = None
    ) -> transfers.SiblingTable | None:
        """A sibling model's winners of ``kernel`` at ``version``, unchecked (None: no sibling
        holds any); ``version`` None: the newest version the source holds of the kernel.
        ``heuristic``: the heuristic's config of a sibling key (None: none), whose time on the
        sibling the table then holds where a trial measured it (:attr:`SiblingTable.heuristic_ms`)."""

    @abstractmethod
    def selector_data(self, template: Template) -> dict[str, Any] | None:
        """The JSON of ``template``'s selector for this device's model and its current version, unchecked."""

    @abstractmethod
    def captured(self, kernel: str) -> bool:
        """Whether the source holds kernel ``kernel`` as a captured one may be named (a database:
        a captured kernel of that name is recorded; a bundle: it has a section of that name)."""

    def winners(self, template: Template, timing: str = GRAPH) -> Winners:
        """This device's model's winners of ``template``'s current version (of ``timing``, else
        each key's only one), checked against its space."""
        return in_space(
            template,
            self.stored(template.name, template.version, timing),
            model=self.device.name,
            hardware_id=self.device.hardware_id,
        )

    def sibling(self, template: Template) -> Winners | None:
        """A sibling model's winners of ``template``'s current version, checked against its space
        (None: no sibling holds any)."""
        found = self.sibling_stored(
            template.name, template.version, lambda key: heuristic_at(template, key, self.device)
        )
        if found is None:
            return None
        checked = in_space(template, found.winners, model=found.name, hardware_id=found.hardware_id)
        return replace(checked, winner_ms=found.winner_ms, heuristic_ms=found.heuristic_ms)

    def selector(self, template: Template) -> Selector | None:
        """The kernel's selector for this device's model and current version (None: none); a
        selector whose data is damaged or whose candidates lie outside the space raises."""
        from tunesvc.serving.selector import Selector

        data = self.selector_data(template)
        if data is None:
            return None
        where = f"the selector of {template.name} in {self.location}"
        selector = Selector.from_dict(data, where)
        if selector.version != template.version or selector.hardware_id != self.device.hardware_id:
            return None
        for config in selector.candidates:
            why = template.space.stored_config(config)
            if isinstance(why, str):
                raise TunesvcError(f"{where} has a candidate outside the space ({why}); refit it with `tune selector`.")
        return selector


class DatabaseSource(WinnerSource):
    """The winners in a database: ``db`` a path or SQLAlchemy URL (opened read-only for each read,
    then closed), or an open store (used, never closed), or None for ./tune.db where it exists.

    A database that does not exist holds no selector and no sibling's winners. Asked for its
    winners, a path given that does not exist is an error (the path is wrong), unless
    ``absent_is_empty`` (mode 'tune', which creates it on its first miss); ./tune.db that does not
    exist holds none.
    """

    def __init__(
        self, db: str | os.PathLike | BaseStore | None, device: Device, *, absent_is_empty: bool = False
    ) -> None:
        self.db = db
        self.device = device
        self.absent_is_empty = absent_is_empty

    def _path(self) -> str | os.PathLike | None:
        """The database to read (an open store's: its own), or None: no database."""
        if self.db is not None:
            return self.db if isinstance(self.db, (str, os.PathLike)) else self.db.where
        default = settings.DEFAULT_DB
        return default if Path(default).exists() or self.absent_is_empty else None

    @property
    def location(self) -> str | os.PathLike:
        return self._path() or settings.DEFAULT_DB

    def where(self) -> str:
        db = self._path()
        if db is None:
            return f"no database: {Path('tune.db').resolve()} does not exist (set TUNESVC_DB or TUNESVC_BUNDLE)"
        text = str(db)
        if "://" not in text or text.startswith("sqlite:///"):
            return f"database {Path(text.removeprefix('sqlite:///')).resolve()}"
        from tunesvc.store import database_name  # a server URL, its password hidden

        return f"database {database_name(text)}"

    def on(self, device: Device) -> DatabaseSource:
        return DatabaseSource(self.db, device, absent_is_empty=self.absent_is_empty)

    def _read(self, *, absent: bool) -> contextlib.AbstractContextManager[BaseStore] | None:
        """The store to read, as a context (an open store is lent, a path opened and closed
        after the read), or None where there is no database and ``absent`` says none is to read."""
        if self.db is not None and not isinstance(self.db, (str, os.PathLike)):
            return contextlib.nullcontext(self.db)
        db = self._path()
        if db is None or (absent and not database_exists(db)):
            return None
        from tunesvc.store import Store  # the database path only: bundles never import SQLAlchemy

        return contextlib.closing(Store(db, readonly=True))

    def stored(self, kernel: str, version: str | None, timing: str = GRAPH) -> dict[str, Config]:
        reader = self._read(absent=self.absent_is_empty)
        if reader is None:
            return {}
        with reader as store:
            entries = store.winners(kernel=kernel, hardware_id=self.device.hardware_id, version=version, timing=None)
        return served_per_key(entries, timing)

    def sibling_stored(
        self, kernel: str, version: str | None, heuristic: Callable[[str], Config | None] | None = None
    ) -> transfers.SiblingTable | None:
        reader = self._read(absent=True)
        if reader is None:
            return None
        with reader as store:
            if version is None:
                every = store.winners(kernel=kernel)
                if not every:
                    return None
                version = max(every, key=lambda e: e.updated_at).kernel_version
            table = transfers.pick_sibling(store.sibling_winners(kernel, version, self.device))
            if table is None or heuristic is None:
                return table
            # the heuristic's time at each sibling key: one more query, of the heuristics' configs only
            hashes = {key: config_hash(config) for key in table.winners if (config := heuristic(key))}
            times = store.trial_times(kernel, version, table.hardware_id, hashes=set(hashes.values()))
        measured = {key: ms for key, digest in hashes.items() if (ms := times.get(key, {}).get(digest)) is not None}
        return replace(table, heuristic_ms=measured)

    def selector_data(self, template: Template) -> dict[str, Any] | None:
        reader = self._read(absent=True)
        if reader is None:
            return None
        with reader as store:
            return store.selector(template.name, template.version, self.device.hardware_id)

    def captured(self, kernel: str) -> bool:
        reader = self._read(absent=True)
        if reader is None:
            return False
        with reader as store:
            return bool(store.captured_kernels(kernel))


class BundleSource(WinnerSource):
    """The winners in a bundle (``path``, a JSON file from `tune export`; ``data``: the bundle
    already read by :func:`tunesvc.serving.bundle_format.read_bundle`, else read here on first use, its header
    checked then and each kernel's section when that kernel is first asked for).

    A bundle holds one device's winners and one version per kernel: it gives its winners to that
    device's model, and to a sibling model as the sibling's. Where the file cannot be read, each
    kernel's winners raise the error, and the selector and sibling winners of the unread bundle
    are None (the failure is said once, with the winners).
    """

    def __init__(self, path: str | os.PathLike, device: Device, *, data: dict[str, Any] | None = None) -> None:
        self.path = path
        self.device = device
        self.data = data
        self._unreadable = False

    @property
    def location(self) -> str | os.PathLike:
        return self.path

    def where(self) -> str:
        return f"bundle {Path(self.path).resolve()}"

    def on(self, device: Device) -> BundleSource:
        return BundleSource(self.path, device, data=self.data)

    def _data(self) -> dict[str, Any]:
        if self.data is None:  # read once; each kernel's section is checked when first loaded
            from tunesvc.serving.bundle_format import read_bundle

            try:
                self.data = read_bundle(self.path, check_kernels=False)
            except Exception:
                self._unreadable = True
                raise
            self._unreadable = False
        return self.data

    def _read_data(self) -> dict[str, Any]:
        """The bundle's data for a selector or sibling: {} where reading it failed (said by its winners)."""
        return {} if self._unreadable and self.data is None else self._data()

    @property
    def hardware_id(self) -> str:
        """The hardware id of the device the bundle holds the winners of."""
        return str(self._data()["device"]["hardware_id"])

    def stored(self, kernel: str, version: str | None, timing: str = GRAPH) -> dict[str, Config]:
        from tunesvc.serving.bundle_format import kernel_tables

        data = self._data()
        if data["device"]["hardware_id"] != self.device.hardware_id or kernel not in data["kernels"]:
            return {}
        graph, eager = kernel_tables(self.path, data, kernel)  # checks the section, of any version
        if version is not None and data["kernels"][kernel]["version"] != version:
            return {}
        return {**graph, **eager} if timing != GRAPH else {**eager, **graph}

    def sibling_stored(
        self, kernel: str, version: str | None, heuristic: Callable[[str], Config | None] | None = None
    ) -> transfers.SiblingTable | None:
        data = self._read_data()
        info = data.get("device", {})
        section = data.get("kernels", {}).get(kernel)
        if (
            not transfers.is_sibling(
                self.device, info.get("capability", ""), info.get("sm_count", 0), info.get("hardware_id", "")
            )
            or not isinstance(section, dict)
            or (version is not None and section.get("version") != version)
        ):
            return None
        from tunesvc.serving.bundle_format import kernel_configs

        winners = kernel_configs(self.path, data, kernel)
        name = info.get("name") or info["hardware_id"]
        raw = section["winners"]  # checked by kernel_configs: each time finite and positive
        return transfers.SiblingTable(
            name,
            info["hardware_id"],
            dict(winners),
            winner_ms={key: float(raw[key]["time_ms"]) for key in winners},
            # the heuristic's time there, as `tune export` wrote it (a bundle holds no trials)
            heuristic_ms={key: float(ms) for key in winners if (ms := raw[key].get("heuristic_ms")) is not None},
        )

    def selector_data(self, template: Template) -> dict[str, Any] | None:
        from tunesvc.serving.bundle_format import bundle_selector

        return bundle_selector(self._read_data(), template, self.device)

    def captured(self, kernel: str) -> bool:
        return kernel in self._data()["kernels"]


def heuristic_at(template: Template, key: str, device: Device) -> Config | None:
    """The heuristic's config of ``template`` for a stored shape key on ``device`` (None: none,
    e.g. a captured kernel whose config list is not known here, or a key that is no problem of it)."""
    try:
        return template.heuristic(template.problem_of_key(key), device) or None
    except Exception:  # a stored key anyone may have written: no heuristic, so no evidence, never an error
        return None


def served_per_key(entries: Iterable[Any], timing: str = GRAPH) -> dict[str, Config]:
    """Shape key -> config of stored winner entries of both timings: each key's newest winner of
    ``timing``, else its newest of the other (the key's only one)."""
    entries = list(entries)
    mine = [e for e in entries if e.timing == timing]
    return {**newest_per_key(e for e in entries if e.timing != timing), **newest_per_key(mine)}


def newest_per_key(entries: Iterable[Any]) -> dict[str, Config]:
    """Shape key -> config of stored winner entries: the newest measurement wins where several
    software stacks tuned the same key."""
    return {e.shape_key: {**e.config} for e in sorted(entries, key=lambda e: e.updated_at)}


def database_exists(db: str | os.PathLike) -> bool:
    """Whether the database is there to read; False for a path the system cannot look up (a
    name too long, a folder that is a file): no database, where the runtime falls back."""
    text = str(db)
    if "://" not in text or text.startswith("sqlite:///"):
        try:
            return Path(text.removeprefix("sqlite:///")).exists()
        except OSError:
            return False
    return True  # a server database: the store reports it if it is not there


def stored_winners(db: str | os.PathLike, template: Template, device: Device, *, readonly: bool) -> dict[str, Config]:
    """The winners of ``template`` (its current version) on ``device``'s model in a database,
    shape key -> config, unchecked; ``readonly=False`` creates the database if it does not exist."""
    from tunesvc.store import Store  # the database path only: bundles never import SQLAlchemy

    store = Store(db, readonly=readonly)
    try:
        return DatabaseSource(store, device).stored(template.name, template.version)
    finally:
        store.close()
