"""The public surface of chat.models, and its promise to be the only importer of transformers."""

from __future__ import annotations

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
    code = "import sys, chat.models; sys.exit('transformers' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], cwd=ROOT).returncode == 0


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
