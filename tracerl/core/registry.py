"""One registry idiom for every pluggable name: estimators, aggregations, formats, verifiers, ...

A :class:`Registry` maps names to objects of one kind. ``get`` also accepts an import path
``package.module:attribute`` (the attribute may be dotted, ``module:Class.method``), so a user
plugs in their own component without registering it; the module is imported only when the
path is first resolved. Entries can also be registered lazily as such a path (``add_lazy``), so
a registry never has to import the module that implements an entry (and no import circle forms).

Every failure is a :class:`RegistryError` (a ``ValueError``) whose one line names what was asked
for: an unknown name lists the valid ones (``unknown verifier 'x'; valid: answered, em, f1``), a
path whose module or attribute is missing names the path and what is missing.

Pure Python: this module imports nothing from tracerl (it sits at the bottom of ``core``).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterator
from typing import Generic, TypeVar

T = TypeVar("T")


class RegistryError(ValueError):
    """An unknown name or an import path that does not resolve; the message is one line."""


def is_import_path(name: str) -> bool:
    """Whether ``name`` looks like ``package.module:attribute`` (a ``:`` with text on both sides)."""
    module, sep, attr = name.partition(":")
    return bool(sep and module.strip() and attr.strip())


def resolve_import_path(path: str, kind: str = "object") -> object:
    """Import ``package.module:attribute`` and return the attribute.

    Raises :class:`RegistryError` naming the path when the module cannot be imported (with the
    import error's own message, e.g. a missing dependency of that module) or has no such attribute.
    """
    if not is_import_path(path):
        raise RegistryError(f"{kind} import path {path!r} must look like package.module:attribute")
    module_name, _, attr_path = path.partition(":")
    try:
        obj: object = importlib.import_module(module_name.strip())
    except ImportError as err:  # ModuleNotFoundError included
        hint = " (is its folder on PYTHONPATH?)" if isinstance(err, ModuleNotFoundError) else ""
        raise RegistryError(f"{kind} {path!r}: cannot import module {module_name!r}: {err}{hint}") from None
    for part in attr_path.strip().split("."):
        if not hasattr(obj, part):
            raise RegistryError(f"{kind} {path!r}: module {module_name!r} has no attribute {attr_path!r}")
        obj = getattr(obj, part)
    return obj


class Registry(Generic[T]):
    """Objects of one ``kind`` by name, plus ``package.module:attribute`` import paths.

    ``kind`` is the singular noun used in messages (``"verifier"``, ``"advantage estimator"``).
    Iterating a registry yields its registered names in sorted order; ``name in registry`` is true
    for registered names only (use :meth:`get` or :meth:`check` to accept import paths too).
    """

    def __init__(self, kind: str, *, accept_paths: bool = True) -> None:
        self.kind = kind
        self.accept_paths = accept_paths
        """Whether :meth:`get` resolves ``package.module:attribute`` names."""
        self._entries: dict[str, T] = {}
        self._lazy: dict[str, str] = {}

    def add(self, name: str, obj: T) -> T:
        """Register ``obj`` as ``name`` (a name registered twice is an error) and return it."""
        self._check_new(name)
        self._entries[name] = obj
        return obj

    def add_lazy(self, name: str, path: str) -> None:
        """Register ``name`` as the import path ``path``, imported on first :meth:`get`."""
        self._check_new(name)
        if not is_import_path(path):
            raise RegistryError(f"{self.kind} {name!r}: {path!r} is not a package.module:attribute path")
        self._lazy[name] = path

    def register(self, name: str) -> Callable[[T], T]:
        """Decorator form of :meth:`add`: ``@REGISTRY.register("name")``."""

        def wrap(obj: T) -> T:
            return self.add(name, obj)

        return wrap

    def _check_new(self, name: str) -> None:
        if not isinstance(name, str) or not name or ":" in name:
            raise RegistryError(f"{self.kind} name {name!r} must be a non-empty string without ':'")
        if name in self._entries or name in self._lazy:
            raise RegistryError(f"{self.kind} {name!r} is already registered")

    def names(self) -> list[str]:
        """The registered names, sorted (import paths are not listed)."""
        return sorted([*self._entries, *self._lazy])

    def get(self, name: str) -> T:
        """The object registered as ``name``, or the attribute an import path names."""
        if name in self._entries:
            return self._entries[name]
        if name in self._lazy:
            obj: T = resolve_import_path(self._lazy[name], self.kind)  # type: ignore[assignment]
            self._entries[name] = obj
            del self._lazy[name]
            return obj
        if self.accept_paths and isinstance(name, str) and is_import_path(name):
            return resolve_import_path(name, self.kind)  # type: ignore[return-value]
        paths = " or a package.module:attribute path" if self.accept_paths else ""
        raise RegistryError(f"unknown {self.kind} {name!r}; valid: {', '.join(self.names())}{paths}")

    def check(self, name: str) -> None:
        """Raise :class:`RegistryError` unless :meth:`get` would succeed (imports a path's module)."""
        self.get(name)

    def __contains__(self, name: object) -> bool:
        return name in self._entries or name in self._lazy

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())

    def __len__(self) -> int:
        return len(self._entries) + len(self._lazy)

    def __repr__(self) -> str:
        return f"Registry({self.kind!r}, names={self.names()})"
