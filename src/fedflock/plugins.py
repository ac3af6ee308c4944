"""User extensions without a fork: modules that register algorithms, datasets, models, tasks or
objectives when imported.

A plugin is any module (a dotted name on the path, or a `.py` file) whose import registers its
components with the registries (`ALGORITHMS.register`, `register_task`, ...). fedflock imports
the modules named with `--plugin` (CLI), `plugins=` (Python API), `FEDFLOCK_PLUGINS`
(comma-separated, inherited by Flower's processes) and every entry point of the group
`fedflock.plugins` of installed packages.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
from collections.abc import Iterable
from importlib.metadata import EntryPoint, entry_points
from pathlib import Path
from types import ModuleType

from fedflock.errors import FedflockError

ENTRY_POINT_GROUP = "fedflock.plugins"
_loaded: dict[str, ModuleType] = {}
_named: list[str] = []  # the modules loaded by name or file (not entry points), in order


def _import(spec: str) -> ModuleType:
    """The plugin module; a plugin that is missing or fails as it imports is one user error
    naming it and the exception, never a traceback."""
    try:
        return _import_module(spec)
    except FedflockError:
        raise
    except ModuleNotFoundError as err:
        raise FedflockError(f"plugin {spec}: cannot import it ({err})") from None
    except Exception as err:  # the plugin's own code raised
        raise FedflockError(f"plugin {spec}: failed while importing "
                            f"({type(err).__name__}: {err})") from None


def _import_module(spec: str) -> ModuleType:
    path = Path(spec)
    if spec.endswith(".py"):
        if not path.is_file():
            raise FedflockError(f"plugin {spec}: no such file")
        name = f"fedflock_plugin_{path.stem}"
        module_spec = importlib.util.spec_from_file_location(name, path)
        assert module_spec is not None and module_spec.loader is not None
        module = importlib.util.module_from_spec(module_spec)
        sys.modules[name] = module  # dataclasses and pickling look the module up by name
        try:
            module_spec.loader.exec_module(module)
        except BaseException:
            del sys.modules[name]  # a failed plugin leaves nothing half-registered by name
            raise
        return module
    return importlib.import_module(spec)


def load_plugins(specs: Iterable[str] = (), entry_point_group: str | None = ENTRY_POINT_GROUP
                 ) -> list[str]:
    """Import the named plugin modules, those in FEDFLOCK_PLUGINS and the installed entry
    points (once each); returns the names loaded so far."""
    names = [s.strip() for s in os.environ.get("FEDFLOCK_PLUGINS", "").split(",") if s.strip()]
    names += [s for s in specs if s]
    for spec in names:
        key = str(Path(spec).resolve()) if spec.endswith(".py") else spec
        if key not in _loaded:
            _loaded[key] = _import(spec)
            _named.append(key)
    if entry_point_group:
        for point in entry_points(group=entry_point_group):
            if point.value not in _loaded:
                _loaded[point.value] = _import_entry_point(point)
    return sorted(_loaded)


def _import_entry_point(point: EntryPoint) -> ModuleType:
    try:
        return point.load()
    except Exception as err:
        raise FedflockError(f"plugin {point.value} (entry point {point.name}): failed while "
                            f"importing ({type(err).__name__}: {err})") from None


def named_plugins() -> list[str]:
    """The plugin modules loaded by name or file so far (`.py` files by absolute path): what
    processes started elsewhere, such as Flower's ServerApp and ClientApps, must load too
    (entry points they find themselves)."""
    return list(_named)


def plugin_search_path() -> list[str]:
    """The folders the plugins loaded by name were imported from (the current folder, a path
    added at run time): what another process's PYTHONPATH needs so the names import there too."""
    roots: list[str] = []
    for key in _named:
        file = getattr(_loaded[key], "__file__", None)
        if key.endswith(".py") or file is None:
            continue
        root = Path(os.path.abspath(file)).parent  # as imported: a symlink's name, not its target
        for _ in range(key.count(".") + (Path(file).name == "__init__.py")):
            root = root.parent
        if str(root) not in roots:
            roots.append(str(root))
    return roots
