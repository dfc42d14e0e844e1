"""The house rules of ARCHITECTURE.md, checked on the code's own imports and docstrings.

Every `import` and `from ... import` in edgekv/ counts, wherever it stands: at the top, inside
a function (a lazy import) or under `if TYPE_CHECKING:`. A test here fails with the
offending file and import, so a change that knots the house again says where.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "edgekv"


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {_module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def _imports(name: str, path: Path) -> list[tuple[int, str]]:
    """(line, imported edgekv module) for every import statement of the module."""
    is_package = path.name == "__init__.py"
    out = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name) for a in node.names if a.name.startswith("edgekv")]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = name.split(".") if is_package else name.split(".")[:-1]
                base = base[: len(base) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if not target.startswith("edgekv"):
                continue
            # `from pkg import module` imports the module; `from module import name`, the module
            subs = [f"{target}.{a.name}" for a in node.names if f"{target}.{a.name}" in MODULES]
            out += [(node.lineno, m) for m in subs] or [(node.lineno, target)]
    return [(line, m) for line, m in out if m in MODULES]


GRAPH = {name: _imports(name, path) for name, path in MODULES.items()}


def _violations(importers: str, forbidden: tuple[str, ...]) -> list[str]:
    return [f"{MODULES[name].relative_to(ROOT)}:{line} imports {target}"
            for name, edges in GRAPH.items() if name.startswith(importers)
            for line, target in edges if target.startswith(forbidden)]


def test_the_graph_covers_the_package():
    # a parser that found no imports would pass every rule below
    assert len(MODULES) > 100 and sum(len(e) for e in GRAPH.values()) > 300
    assert ("edgekv.kv.cache" in {t for _, t in GRAPH["edgekv.session"]})


def test_backends_import_neither_the_cache_nor_the_models():
    """A backend is handed what it needs (backends/contract.py records, duck-typed caches)."""
    assert _violations("edgekv.backends", ("edgekv.kv", "edgekv.models")) == []


def test_models_import_no_kernel_and_no_cache():
    """A model calls its backend and its cache's `attend`, nothing below them."""
    assert _violations("edgekv.models", ("edgekv.kernels", "edgekv.kv")) == []


def test_kernels_import_nothing_above_them():
    """The kernels are the ground floor: numbers in, numbers out (the GGUF format registry and
    the errors are all they may read)."""
    assert _violations("edgekv.kernels", ("edgekv.kv", "edgekv.models", "edgekv.backends", "edgekv.session",
                                          "edgekv.loader", "edgekv.api", "edgekv.cli", "edgekv.server")) == []


def test_the_cache_imports_no_model_and_no_loader():
    """The cache is handed its backend and its key map; calibration is handed its network."""
    assert _violations("edgekv.kv", ("edgekv.models", "edgekv.loader", "edgekv.session", "edgekv.api")) == []


def _cycles() -> list[list[str]]:
    """The strongly connected components of more than one module, or of one importing itself (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for _, w in GRAPH[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1 or any(t == v for _, t in GRAPH[v]):
                found.append(sorted(component))

    for v in GRAPH:
        if v not in index:
            visit(v)
    return found


def test_no_import_loops():
    assert _cycles() == []


def test_a_loop_is_found(monkeypatch):
    """The loop finder itself: a made-up edge back from the cache to the session closes a loop."""
    monkeypatch.setitem(GRAPH, "edgekv.kv.cache", GRAPH["edgekv.kv.cache"] + [(0, "edgekv.session")])
    assert any("edgekv.kv.cache" in c and "edgekv.session" in c for c in _cycles())


# ---- docstrings that name files -------------------------------------------------------------

_PATH = re.compile(r"(?<![\w/.-])((?:[\w-]+/)*[\w-]+\.(?:py|cu|cuh|md|sh|json|txt))(?![\w/])")
# names that are not this repository's files (another project's, or an example a user writes)
_ELSEWHERE = {"convert_hf_to_gguf.py", "run.c", "tokenizer.json", "config.json", "tokenizer_config.json",
              "generation_config.json", "chat_template.jinja", "model.safetensors", "tokenizer.model",
              "llama-vocab.cpp", "llama-kv-cache.h", "ggml-backend.cpp", "gguf_reader.py", "merges.txt",
              "chat_template.json", "special_tokens_map.json", "added_tokens.json",
              "DESIGN.md"}  # the team's design guide, kept beside the repository, not in it


def _resolves(name: str, module: Path) -> bool:
    if name.rsplit("/", 1)[-1] in _ELSEWHERE or name.startswith(("/", "~")):
        return True
    bases = [module.parent, PACKAGE, ROOT, PACKAGE / "kernels", PACKAGE / "kv", PACKAGE / "backends", ROOT / "native",
             ROOT / "tests", ROOT / "tests" / "reference"]
    return any((base / name).exists() for base in bases)


def _named_files(path: Path) -> list[str]:
    tree = ast.parse(path.read_text(), str(path))
    docs = [ast.get_docstring(node) or "" for node in ast.walk(tree)
            if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))]
    return sorted({m.group(1) for doc in docs for m in _PATH.finditer(doc)})


@pytest.mark.parametrize("name", sorted(MODULES))
def test_files_named_in_docstrings_exist(name):
    """A docstring that points at a file (`kv/cache.py`, `backends/base.py`, `tools/x.py`) points at
    one that exists: beside the module, in edgekv/, kernels/, kv/, backends/, native/, tests/ or the
    repository root (or is another project's file, _ELSEWHERE)."""
    path = MODULES[name]
    missing = [f for f in _named_files(path) if not _resolves(f, path)]
    assert missing == [], f"{path.relative_to(ROOT)} names files that do not exist: {missing}"


def test_a_stale_docstring_is_found(tmp_path):
    stale = tmp_path / "stale.py"
    stale.write_text('"""The cache lives in kv/ring.py and row_transforms.py."""\n')
    assert [f for f in _named_files(stale) if not _resolves(f, stale)] == ["kv/ring.py", "row_transforms.py"]
