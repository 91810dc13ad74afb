"""The serving path imports none of ``chat.tools`` (client, evaluation, bench, terminal, test scaffolding)."""

import subprocess
import sys

SERVING_PATH = (
    "chat.cli",
    "chat.server.main",
    "chat.server.app",
    "chat.server.surfaces.ws",
    "chat.server.surfaces.openai_api",
    "chat.engine.engine",
    "chat.models.registry",
    "chat.models.specs",
    "chat.models.renderer_loading",
    "chat.models.adapter",
    "chat.models.decoder.runtime",
    "chat.models.hf.runtime",
    "chat.models.hf.multimodal",
    "chat.cluster",
)


def test_the_serving_path_imports_no_tools():
    code = (
        "import importlib, sys\n"
        f"for name in {SERVING_PATH!r}: importlib.import_module(name)\n"
        "print(sorted(m for m in sys.modules if m.startswith('chat.tools')))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_tiny_models_load_without_the_tools_package():
    """chat.models never imports upward into chat.tools: the tiny models live in chat.models.tiny."""
    code = (
        "import sys\n"
        "from chat.models import load_model\n"
        "model = load_model('tiny-llama')\n"
        "tools = sorted(m for m in sys.modules if m.startswith('chat.tools'))\n"
        "print(model.name, 'chat.models.tiny.text' in sys.modules, tools)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "tiny-llama True []"
