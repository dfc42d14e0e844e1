"""The test suite's own layout: a test module imports what it shares with others from a
helper module (tests/helpers/, or a helper beside the tests such as numpy_reference.py),
never from another test module, so that no test module's collection, fixtures and
module-level state ride along into another's. Checked by reading every tests/*.py and
tests/helpers/*.py with `ast`. (tests/aarch64/, run only under emulation by
tools/test_aarch64.sh, re-runs one of test_cache_types.py's tests by importing it: not
checked here.)"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent
REAL_MODEL_FIXTURES = {"smollm2_path", "gemma3_path"}  # conftest.py's


def _test_module_imports(source: str) -> list[tuple[int, str]]:
    """(line, name) of every import in `source` that names a test module (a dotted name with
    a part starting test_) or brings in a name starting test_, which pytest would collect a
    second time: import and from-import statements anywhere in the file, and
    importlib.import_module / __import__ calls with a literal name."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = "." * node.level + (node.module or "")
            names = [base] + [f"{base}.{alias.name}" for alias in node.names]
        elif (isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant)
              and isinstance(node.args[0].value, str)
              and getattr(node.func, "id", getattr(node.func, "attr", None)) in ("import_module", "__import__")):
            names = [node.args[0].value]
        else:
            continue
        bad = [name for name in names if any(part.startswith("test_") for part in name.split("."))]
        if bad:
            found.append((node.lineno, bad[0]))
    return found


@pytest.mark.parametrize("source, bad", [
    pytest.param("import test_server", True, id="import"),
    pytest.param("from test_server import serving", True, id="from-import"),
    pytest.param("def f():\n    from test_numerics import poisoned", True, id="inside-a-function"),
    pytest.param("import helpers.test_x as h", True, id="dotted"),
    pytest.param("from . import test_server", True, id="relative"),
    pytest.param("from helpers.server import test_the_port", True, id="a-test-collected-twice"),
    pytest.param("import importlib\nimportlib.import_module('test_quants')", True, id="import_module"),
    pytest.param("__import__('test_quants')", True, id="__import__"),
    pytest.param("from helpers.server import serving\nimport numpy_reference\nfrom edgekv.testing import tiny_model",
                 False, id="helpers"),
    pytest.param("x = 'test_server'\nimport pytest", False, id="a-string"),
])
def test_the_check_finds_imports_of_test_modules(source, bad):
    assert bool(_test_module_imports(source)) == bad, _test_module_imports(source)


def test_no_test_module_or_helper_imports_a_test_module():
    files = sorted(TESTS.glob("*.py")) + sorted((TESTS / "helpers").glob("*.py"))
    assert len(files) > 50 and (TESTS / "helpers" / "__init__.py") in files
    found = [f"{path.relative_to(TESTS)}:{line}: {name}" for path in files
             for line, name in _test_module_imports(path.read_text(encoding="utf-8"))]
    assert not found, ("a test module is imported; move what is shared into tests/helpers/ and import it "
                       "from there:\n" + "\n".join(found))


def test_helper_modules_are_not_collected_and_say_what_they_hold():
    helpers = sorted((TESTS / "helpers").glob("*.py"))
    assert len(helpers) > 1
    for path in helpers:
        assert not path.name.startswith("test_"), f"{path.name}: pytest would collect it as a test module"
        assert ast.get_docstring(ast.parse(path.read_text(encoding="utf-8"))), f"{path.name} has no docstring"


def test_a_test_that_takes_a_real_model_is_marked_slow(request):
    """`make test-fast` leaves out the tests marked slow (pyproject.toml: "needs a real model")
    and pulls no model: a test taking a real model's fixture without the mark would fetch one
    there. Checks the tests this run selected (a test that asks for the model by name at run
    time, through request.getfixturevalue or the catalog, is not seen here)."""
    unmarked = [item.nodeid for item in request.session.items
                if REAL_MODEL_FIXTURES & set(getattr(item, "fixturenames", ())) and not item.get_closest_marker("slow")]
    assert not unmarked, "these take a real model: mark them @pytest.mark.slow\n" + "\n".join(unmarked)
