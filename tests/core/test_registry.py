"""The one registry idiom: names, decorator, lazy entries, import paths, one-line errors."""

from __future__ import annotations

import ast
import inspect
import sys
from pathlib import Path

import pytest

import tracerl.core.registry as registry_module
from tracerl.core.registry import Registry, RegistryError, is_import_path, resolve_import_path


def double(x: int) -> int:
    return 2 * x


class Holder:
    @staticmethod
    def triple(x: int) -> int:
        return 3 * x


def test_add_register_get_names() -> None:
    reg: Registry[object] = Registry("widget")
    assert reg.add("b", double) is double

    @reg.register("a")
    def a(x: int) -> int:
        return x + 1

    assert reg.get("a")(1) == 2 and reg.get("b")(5) == 10
    assert reg.names() == ["a", "b"] and list(reg) == ["a", "b"] and len(reg) == 2
    assert "a" in reg and "c" not in reg


def test_unknown_name_lists_the_valid_ones() -> None:
    reg: Registry[object] = Registry("verifier")
    for name in ("f1", "em"):
        reg.add(name, double)
    with pytest.raises(RegistryError) as err:
        reg.get("x")
    assert str(err.value) == "unknown verifier 'x'; valid: em, f1 or a package.module:attribute path"
    closed: Registry[object] = Registry("loss aggregation", accept_paths=False)
    closed.add("token-mean", double)
    with pytest.raises(RegistryError, match=r"^unknown loss aggregation 'tests:double'; valid: token-mean$"):
        closed.get("tests:double")  # a closed registry never imports


def test_duplicates_and_bad_names_are_errors() -> None:
    reg: Registry[object] = Registry("format")
    reg.add("react", double)
    with pytest.raises(RegistryError, match="format 'react' is already registered"):
        reg.add("react", double)
    with pytest.raises(RegistryError, match="already registered"):
        reg.add_lazy("react", "math:sqrt")
    for bad in ("", "a:b"):
        with pytest.raises(RegistryError, match="must be a non-empty string without ':'"):
            reg.add(bad, double)
    with pytest.raises(RegistryError, match="is not a package.module:attribute path"):
        reg.add_lazy("lazy", "math.sqrt")


def test_import_paths_resolve_lazily_with_dotted_attributes() -> None:
    here = __name__
    reg: Registry[object] = Registry("estimator")
    assert reg.get(f"{here}:double") is double
    assert reg.get(f"{here}:Holder.triple")(2) == 6
    assert reg.names() == []  # a resolved path is not registered
    assert is_import_path("a.b:c") and not is_import_path("a.b") and not is_import_path(":c")
    assert not is_import_path("a:")


def test_lazy_entries_import_on_first_get() -> None:
    module = "tests_registry_lazy_probe"
    sys.modules.pop(module, None)
    reg: Registry[object] = Registry("format")
    reg.add_lazy("probe", f"{module}:VALUE")
    assert reg.names() == ["probe"] and "probe" in reg
    with pytest.raises(RegistryError, match=f"format 'tests_registry_lazy_probe:VALUE': cannot import module '{module}'"):
        reg.get("probe")  # not importable yet: the error names the path
    reg2: Registry[object] = Registry("format")
    reg2.add_lazy("sqrt", "math:sqrt")
    import math

    assert reg2.get("sqrt") is math.sqrt and reg2.get("sqrt") is math.sqrt


@pytest.mark.parametrize(("path", "message"), [
    ("no_such_module_xyz:f", "verifier 'no_such_module_xyz:f': cannot import module 'no_such_module_xyz'"),
    ("math:no_such_function", "verifier 'math:no_such_function': module 'math' has no attribute 'no_such_function'"),
    ("math:pi.real.nope", "module 'math' has no attribute 'pi.real.nope'"),
])
def test_bad_paths_name_the_path(path: str, message: str) -> None:
    with pytest.raises(RegistryError) as err:
        resolve_import_path(path, "verifier")
    assert message in str(err.value) and "\n" not in str(err.value)
    with pytest.raises(ValueError):  # RegistryError is a ValueError: old callers keep working
        Registry("verifier").get(path)


def test_registry_module_imports_nothing_from_tracerl() -> None:
    tree = ast.parse(Path(inspect.getfile(registry_module)).read_text())
    imported = [n.module or "" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)]
    imported += [a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names]
    assert imported and not [m for m in imported if m.startswith("tracerl")]
