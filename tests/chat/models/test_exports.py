"""The public surface of chat.models, and its promise to be the only importer of transformers."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import chat.models

ROOT = Path(__file__).resolve().parents[3]


def test_public_names():
    assert sorted(chat.models.__all__) == [
        "InvalidSettingError",
        "ModelAdapter",
        "ModelError",
        "ModelFileError",
        "ModelLoadError",
        "RunState",
        "RunStateError",
        "UnknownModelError",
        "UnsupportedArchitectureError",
        "load_model",
        "load_renderer",
    ]
    for name in chat.models.__all__:
        assert getattr(chat.models, name) is not None


def test_importing_the_package_loads_no_transformers():
    code = "import sys, chat.models; sys.exit('transformers' in sys.modules or 'torch' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], cwd=ROOT).returncode == 0


def test_nothing_is_downloaded():
    """The package sets HF_HUB_OFFLINE before its modules import transformers: huggingface_hub reads it once, when it
    is first imported (by the renderer's module here, at its top)."""
    code = (
        "import sys\nfrom chat.models import load_renderer\n"
        "import huggingface_hub.constants as c\nsys.exit(not c.HF_HUB_OFFLINE)"
    )
    env = {k: v for k, v in os.environ.items() if k not in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")}
    assert subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, timeout=120).returncode == 0


def test_no_other_package_imports_transformers():
    """chat.models, and the test scaffolding that builds tiny transformers models (chat.tools.testing)."""
    pattern = re.compile(r"^\s*(import transformers|from transformers)", re.M)
    allowed = (ROOT / "chat" / "models", ROOT / "chat" / "tools" / "testing")
    offenders = [
        str(path.relative_to(ROOT))
        for folder in ("cache", "chat", "modalities")
        for path in (ROOT / folder).rglob("*.py")
        if not any(place in path.parents for place in allowed) and pattern.search(path.read_text())
    ]
    assert offenders == []
