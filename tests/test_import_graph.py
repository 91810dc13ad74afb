"""The source tree's import graph (``cache/``, ``modalities/``, ``chat/``), read from the files' syntax: every import,
at module level or inside a function, of a module of the tree. It has no circle, and no module imports from a floor
above its own: ``FLOORS`` lists the floors, lowest first (docs/architecture.md draws them). A package's own
``__init__`` importing its modules is not an edge from a floor to itself that could make a circle through the package:
``from pkg import sub`` is an edge to ``pkg.sub`` alone.

Inside ``chat/models`` (issue 38): the own decoder (``chat.models.decoder``) and transformers' forward
(``chat.models.hf``) never import each other, outside ``chat.models.hf`` a module imports of transformers only
what ``TRANSFORMERS_OUTSIDE_HF`` lists for it, each with its reason, and the modules that load a model or its renderer
(``IMPORTS_AT_THE_TOP``) import at their top, never inside a function."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("cache", "modalities", "chat")
FLOORS = (  # lowest first: a module may import from its own floor and the floors below it
    ("cache", "modalities"),  # pure data structures and torch; media decoding
    ("chat.protocol", "chat.engine"),  # the sans-I/O protocol; the engine (turns, scheduler, the runtime protocol)
    ("chat.models",),  # the runtimes the engine drives (the own decoder, transformers' forward)
    ("chat.server",),  # HTTP and WebSocket surfaces
    ("chat.cluster",),  # several engines behind Ray Serve
    ("chat.tools", "chat.cli", "chat"),  # benchmarks, clients, tests' helpers, the command line
)


def modules() -> dict[str, Path]:
    found = {}
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            parts = path.relative_to(ROOT).with_suffix("").parts
            name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
            found[name] = path
    return found


def imports(name: str, path: Path, known: dict[str, Path]) -> set[str]:
    """The tree's modules that ``name`` imports (each import resolved to the longest known module)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    targets: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            wanted = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join([*anchor, base] if base else anchor)
            wanted = [f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names]
        else:
            continue
        for target in wanted:
            while target and target not in known:
                target = target.rpartition(".")[0]
            if target and target != name:
                targets.add(target)
    return targets


def graph() -> dict[str, set[str]]:
    known = modules()
    return {name: imports(name, path, known) for name, path in known.items()}


def floor(name: str) -> int:
    best, level = -1, 0
    for index, names in enumerate(FLOORS):
        for prefix in names:
            if (name == prefix or name.startswith(prefix + ".")) and len(prefix) > best:
                best, level = len(prefix), index
    assert best >= 0, f"{name} is on no floor: add it to FLOORS"
    return level


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The graph's strongly connected components of more than one module (Tarjan's algorithm, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for start in sorted(edges):
        if start in index:
            continue
        work = [(start, iter(sorted(edges[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(edges.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def test_the_checks_see_a_circle_and_a_floor_broken():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []
    assert floor("chat.models.decoder.model") > floor("chat.engine.turn") > floor("cache.prefix_cache")
    assert floor("chat.tools.bench.chat_bench") == floor("chat") > floor("chat.cluster.ingress")


def test_the_graph_is_read_from_the_tree():
    edges = graph()
    assert "chat.models.kernels.dense_matrices" in edges["chat.models.kernels.matrices"]  # a module-level import
    assert "cache" in edges["chat.engine.engine"] or "cache.prefix_cache" in edges["chat.engine.engine"]
    assert len(edges) > 150


def test_no_import_circle():
    assert cycles(graph()) == []


def test_no_import_from_a_higher_floor():
    upward = sorted(
        f"{name} -> {target}" for name, targets in graph().items() for target in targets if floor(target) > floor(name)
    )
    assert upward == []


# ---------------------------------------------------------------- the two paths of chat/models

MODEL_PATHS = ("chat.models.decoder", "chat.models.hf")  # the own decoder | transformers' forward


def model_path(name: str) -> str | None:
    return next((p for p in MODEL_PATHS if name == p or name.startswith(p + ".")), None)


def test_the_two_model_paths_never_import_each_other():
    """The own decoder and transformers' forward share only chat/models' top-level modules and chat.models.kernels;
    neither imports the other (so either can change without the other's tests)."""
    crossing = sorted(
        f"{name} -> {target}"
        for name, targets in graph().items()
        for target in targets
        if model_path(name) and model_path(target) and model_path(name) != model_path(target)
    )
    assert crossing == []


# What of transformers a module of chat/models outside chat/models/hf/ may import, and why. Anything else of
# transformers (its models, Auto* model classes, cache classes, attention interfaces, GGUF tensor processors) is
# transformers' forward and belongs in chat/models/hf/. chat.models.decoder has no entry: it imports none.
TRANSFORMERS_OUTSIDE_HF = {
    "chat.models.chat_template": {
        "transformers.utils.chat_template_utils._compile_jinja_template",  # the template compiled as transformers
    },  # compiles it when it renders (the same sandbox and extensions)
    "chat.models.families": {
        "transformers.cache_utils.get_layer_types_and_kwargs",  # a config's layer kinds, as transformers reads them
    },
    "chat.models.gguf_files": {
        "transformers.AutoConfig",  # a GGUF file's metadata -> the family's config (no weights)
        "transformers.utils.logging",  # its progress bar off
        "transformers.integrations.gguf.GGUF_ARCHS",  # which file architectures transformers can configure
        "transformers.modeling_gguf_pytorch_utils.GGUF_SUPPORTED_ARCHITECTURES",
        "transformers.integrations.gguf.dequant.GGML_BLOCK",  # which block types it dequantizes
    },
    "chat.models.registry": {
        "transformers.utils.logging",  # the progress bar off while weights load
        # a directory the own decoder does not read itself (chat.models.decoder.checkpoint_weights reads a
        # safetensors checkpoint of its families, as gguf_weights a GGUF file): transformers' model, whose state
        # dict the decoder then takes (or whose forward serves it)
        "transformers.AutoModelForCausalLM",
        "transformers.GenerationConfig",  # a directory's generation settings, as transformers' model reads them
    },
    "chat.models.renderer_loading": {
        "transformers.AutoConfig",  # a directory's config, read before any weights to refuse a family early
        "transformers.AutoTokenizer",  # a directory's (or the tiny models') tokenizer
    },
    "chat.models.tiny.text": {  # the tiny seeded test models are built as transformers models from their configs
        "transformers",
        "transformers.AutoModelForCausalLM",
    },
}


def transformers_imports(path: Path) -> set[str]:
    """Every name ``path`` imports from transformers, module level or in a function: ``transformers.x.Y``."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.split(".")[0] == "transformers"}
        elif (
            isinstance(node, ast.ImportFrom) and not node.level and (node.module or "").split(".")[0] == "transformers"
        ):
            found |= {f"{node.module}.{a.name}" for a in node.names}
    return found


def transformers_outside_hf() -> list[str]:
    unlisted = []
    for name, path in sorted(modules().items()):
        if not name.startswith("chat.models") or model_path(name) == "chat.models.hf":
            continue
        if name == "chat.models.tiny.media":  # test scaffolding of the media models: transformers' configs whole
            continue
        allowed = TRANSFORMERS_OUTSIDE_HF.get(name, set())
        unlisted += [f"{name}: {imported}" for imported in sorted(transformers_imports(path) - allowed)]
    return unlisted


def test_only_chat_models_hf_imports_transformers_forward():
    assert transformers_outside_hf() == []


def test_the_transformers_check_sees_an_import_in_a_function(tmp_path):
    path = tmp_path / "probe.py"
    path.write_text("import torch\n\n\ndef load():\n    from transformers import AutoModelForCausalLM, AutoConfig\n")
    assert transformers_imports(path) == {"transformers.AutoModelForCausalLM", "transformers.AutoConfig"}


# ---------------------------------------------------------------- the loader's imports, at its top

# The modules that resolve a spec and load a model or its renderer import everything at their top, so that what they
# depend on reads at a glance (issue 38): what costs import time is placed where it is needed (the settings need no
# transformers: specs; an ingress needs no runtime: renderer_loading; transformers' forward loads on first use:
# chat.models.hf.FORWARD), never deferred into a function. Only an optional dependency (an extra of pyproject.toml,
# absent from a plain install) may be imported inside a function, listed here for its module with the reason.
IMPORTS_AT_THE_TOP = ("chat/models/registry.py", "chat/models/specs.py", "chat/models/renderer_loading.py")
OPTIONAL_IMPORTS: dict[str, set[str]] = {}  # module -> the top-level packages it may import in a function (none)


def function_local_imports(path: Path) -> list[str]:
    """``line: module`` of every import inside a function or method of ``path`` (nested ones included)."""
    found = set()
    for function in ast.walk(ast.parse(path.read_text(), str(path))):
        if not isinstance(function, ast.FunctionDef | ast.AsyncFunctionDef):
            continue
        for node in ast.walk(function):
            if isinstance(node, ast.Import):
                found |= {(node.lineno, alias.name) for alias in node.names}
            elif isinstance(node, ast.ImportFrom):
                found.add((node.lineno, "." * node.level + (node.module or "")))
    return [f"{line}: {module}" for line, module in sorted(found)]


def test_the_loading_modules_import_nothing_inside_a_function():
    deferred = []
    for name in IMPORTS_AT_THE_TOP:
        optional = OPTIONAL_IMPORTS.get(name, set())
        deferred += [
            f"{name}:{found}"
            for found in function_local_imports(ROOT / name)
            if found.split(": ")[1].split(".")[0] not in optional
        ]
    assert deferred == []


def test_the_function_import_check_sees_nested_and_method_imports(tmp_path):
    path = tmp_path / "probe.py"
    path.write_text(
        "import torch\n\n\ndef load():\n    def inner():\n        from transformers import AutoConfig\n"
        "    return inner\n\n\nclass Loader:\n    async def load(self):\n        import json, os.path\n"
        "        from . import sibling\n"
    )
    assert function_local_imports(path) == ["6: transformers", "12: json", "12: os.path", "13: ."]
