"""Fixtures shared by the model tests."""

from __future__ import annotations

import pytest

from chat.models.kernels import native


@pytest.fixture(params=["native", "torch"])
def kernel_path(request):
    """The test runs once with turncache's native kernels (chat.models.kernels.native; skipped where they cannot be had)
    and once on torch's operations (the kernels turned off for the test, int8 matrices built within it included)."""
    if request.param == "torch":
        with native.disabled():
            yield request.param
    else:
        if native.kernels() is None:
            pytest.skip("no native kernels on this machine")
        yield request.param


@pytest.fixture(scope="module")
def runtime():
    """The LoRA tests' base: tiny-llama in float32 on the own decoder, one per test module (its adapter bank fills)."""
    from chat.models import load_model

    return load_model("tiny-llama", weights="float32")


@pytest.fixture(scope="module")
def adapters(tmp_path_factory):
    """Two adapters of tiny-llama made by peft (different seeds, ranks, targets) and their merged models."""
    from tests.chat.models.lora_helpers import make_peft_adapter

    pytest.importorskip("peft")
    root = tmp_path_factory.mktemp("adapters")
    one = make_peft_adapter(root / "one", seed=1, r=4, alpha=8)
    two = make_peft_adapter(root / "two", seed=2, r=8, alpha=4, target_modules=["q_proj", "v_proj", "down_proj"])
    return {"one": one, "two": two}
