"""Plug-in callables checked against their protocol when they are named, not when first called.

A config names a verifier or an environment factory by import path; a path that resolves to a
function of the wrong shape (``data.verifier=os:system``) used to pass the config check and fail
at the first answer, 130 lines deep. :class:`SignedRegistry` checks at resolution (so at config
load) that the object is callable with the protocol's positional arguments, and says in one
line what it takes and what the protocol calls it with.
"""

from __future__ import annotations

import inspect
from typing import Any, TypeVar

from tracerl.core.registry import Registry, RegistryError

T = TypeVar("T")


def check_signature(obj: Any, nargs: int, what: str, protocol: str) -> None:
    """Raise :class:`RegistryError` unless ``obj`` is callable with ``nargs`` positional arguments.

    ``what`` names the plug-in (``verifier 'os:system'``), ``protocol`` how it is called
    (``f(answer, task) -> float``). A callable whose signature cannot be read (some C functions)
    is accepted: nothing can be told about it before the call.
    """
    if not callable(obj):
        raise RegistryError(f"{what} is a {type(obj).__name__}, not a function {protocol}")
    try:
        signature = inspect.signature(obj)
    except (TypeError, ValueError):
        return
    try:
        signature.bind(*([None] * nargs))
    except TypeError:
        raise RegistryError(f"{what} takes {_shown(signature)}; it is called as {protocol}") from None


def _shown(signature: inspect.Signature) -> str:
    text = str(signature.replace(return_annotation=inspect.Signature.empty))
    return text if len(text) <= 120 else text[:117] + "..."


class SignedRegistry(Registry[T]):
    """A :class:`Registry` whose entries (registered or named by import path) must be callable as
    ``protocol`` with ``nargs`` positional arguments; checked by :meth:`get` (and so :meth:`check`)."""

    def __init__(self, kind: str, protocol: str, nargs: int) -> None:
        super().__init__(kind)
        self.protocol, self.nargs = protocol, nargs

    def get(self, name: str) -> T:
        obj = super().get(name)
        check_signature(obj, self.nargs, f"{self.kind} {name!r}", self.protocol)
        return obj
