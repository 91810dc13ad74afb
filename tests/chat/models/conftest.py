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
