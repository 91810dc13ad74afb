"""chat.models.hf (the package): its two adapter modules, ``FORWARD``, load on first use as attributes of the package
(PEP 562), so that a module naming them at its top (chat.models.registry) does not import transformers' modeling.
That a load on the own decoder then never imports them: tests/chat/models/test_registry.py."""

from __future__ import annotations

import importlib

import pytest

from chat.models import hf


def test_the_forward_modules_are_the_packages_attributes():
    assert hf.FORWARD == ("runtime", "multimodal")
    for name in hf.FORWARD:
        assert getattr(hf, name) is importlib.import_module(f"chat.models.hf.{name}")
    assert hf.runtime.TransformersAdapter.__name__ == "TransformersAdapter"
    assert hf.multimodal.MultimodalAdapter.__name__ == "MultimodalAdapter"


def test_a_name_that_is_no_forward_module_is_no_attribute():
    with pytest.raises(AttributeError, match="no attribute 'nothing'"):
        hf.__getattr__("nothing")
    with pytest.raises(ImportError):
        from chat.models.hf import nothing  # noqa: F401
