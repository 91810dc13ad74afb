"""cache/ is pure torch and data structures (safetensors for its files): it imports neither transformers, nor asyncio,
nor the rest of turncache."""

import ast
import sys
from pathlib import Path

import cache

ALLOWED_THIRD_PARTY = {"torch", "safetensors"}


def imported_roots(path: Path) -> set[str]:
    roots = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            roots.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            roots.add(node.module.split(".")[0])
    return roots


def test_cache_imports_only_the_standard_library_torch_safetensors_and_itself():
    sources = sorted(Path(cache.__file__).parent.glob("*.py"))
    assert len(sources) >= 6
    for path in sources:
        for root in imported_roots(path):
            allowed = root in sys.stdlib_module_names or root in ALLOWED_THIRD_PARTY or root == "cache"
            assert allowed, f"{path.name} imports {root}"
            assert root != "asyncio", f"{path.name} imports asyncio"
