"""``dp_accounting`` without its eager package import (start-up time of every process).

dp-accounting's ``dp_accounting/__init__.py`` imports every submodule, among them ``pld``
(``scipy.signal`` -> ``scipy.stats``) and ``mechanism_calibration`` (``scipy.optimize``):
about 1.7 s of an idle core, paid by every Ray actor that only needs event records and the
RDP accountant. :func:`install` (called by ``fedmem/__init__.py``) registers the package
module **without running its** ``__init__``: submodules (``dp_accounting.dp_event``,
``dp_accounting.rdp``, ...) import as usual, and an attribute of the package is resolved on
first use: a submodule is imported; a name the real ``__init__`` re-exports
(``GaussianDpEvent``, ``get_sigma_gaussian``, ...) is taken from the submodule the real
``__init__`` takes it from (read from its source, not hard-coded); anything else runs the
real ``__init__`` in place (the whole package, exactly as an eager import would have).
So ``dp_accounting.pld`` and ``dp_accounting.mechanism_calibration`` are imported only
where used (``Accountant(kind="pld")``, Gaussian calibration), and every object is the
very object an eager import gives (tests/test_lazy_imports.py checks this).

If the installed ``__init__`` holds anything but imports (another version), or
``dp_accounting`` is already imported, :func:`install` does nothing: the eager import.
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
import sys
import threading
import types

NAME = "dp_accounting"
_lock = threading.RLock()


def _reexports(path: str) -> dict[str, str] | None:
    """``{name: submodule}`` of ``from dp_accounting[.sub] import name`` in the package's
    ``__init__`` (``name`` itself a submodule when imported from the package), or None when
    the file holds anything else than a docstring and such imports."""
    try:
        with open(path, encoding="utf-8") as fh:
            tree = ast.parse(fh.read())
    except (OSError, SyntaxError, ValueError):
        return None
    out: dict[str, str] = {}
    for i, node in enumerate(tree.body):
        if i == 0 and isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant):
            continue
        if not isinstance(node, ast.ImportFrom) or node.level or not (node.module or "").startswith(NAME):
            return None
        sub = node.module[len(NAME) + 1:] if node.module != NAME else None
        for alias in node.names:
            if alias.name == "*" or (alias.asname and alias.asname != alias.name):
                return None
            out[alias.name] = sub if sub is not None else alias.name
    return out


class _LazyPackage(types.ModuleType):
    """The ``dp_accounting`` package module, its ``__init__`` not (yet) run."""

    def __getattr__(self, name: str):
        if name.startswith("__"):
            raise AttributeError(name)
        # No lock here: importlib's per-module locks make concurrent first uses safe (at worst
        # two threads store the same object).
        table = self.__dict__["_fedmem_reexports"]
        sub = table.get(name)
        if sub is not None:
            mod = importlib.import_module(f"{NAME}.{sub}")
            value = mod if sub == name else getattr(mod, name)
        else:
            try:
                value = importlib.import_module(f"{NAME}.{name}")
            except ModuleNotFoundError as exc:
                if exc.name != f"{NAME}.{name}":
                    raise
                load_fully(self)
                try:
                    return self.__dict__[name]
                except KeyError:
                    raise AttributeError(f"module {NAME!r} has no attribute {name!r}") from None
        self.__dict__[name] = value
        return value


def load_fully(module: types.ModuleType | None = None) -> types.ModuleType:
    """Run the real ``dp_accounting/__init__`` in place (idempotent)."""
    with _lock:
        module = module or sys.modules[NAME]
        if type(module) is _LazyPackage:
            module.__spec__.loader.exec_module(module)
            module.__class__ = types.ModuleType
        return module


def install() -> bool:
    """Register ``dp_accounting`` lazily; True when installed now (False: already imported,
    not installed, or an unexpected ``__init__``, so the ordinary eager import stands)."""
    with _lock:
        if NAME in sys.modules:
            return False
        module = new_lazy_module()
        if module is None:
            return False
        sys.modules[NAME] = module
        return True


def new_lazy_module() -> types.ModuleType | None:
    """A ``dp_accounting`` package module whose ``__init__`` has not run (not registered in
    ``sys.modules``: :func:`install` does that), or None when the installed package does
    not have the expected shape."""
    spec = importlib.util.find_spec(NAME)
    if spec is None or spec.origin is None or spec.loader is None or not spec.submodule_search_locations:
        return None
    table = _reexports(spec.origin)
    if table is None:
        return None
    module = importlib.util.module_from_spec(spec)
    module._fedmem_reexports = table
    module.__class__ = _LazyPackage
    return module
