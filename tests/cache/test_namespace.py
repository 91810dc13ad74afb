"""cache.namespace: tagged namespace components (a LoRA adapter's ("lora", digest)) separate namespaces and never
collide with a salt (the digest files carry: test_disk_format)."""

from __future__ import annotations

import pytest
import torch

from cache import Namespace, NormalKV, PrefixCache

BASE = Namespace("model", "float32", "salt")


def test_components_separate_namespaces_and_are_tagged():
    lora = BASE.with_component("lora", "abc")
    assert lora != BASE and lora.components == (("lora", "abc"),)
    assert lora == Namespace("model", "float32", "salt", (("lora", "abc"),))
    assert Namespace("model", "float32", "abc") != Namespace("model", "float32", "", (("lora", "abc"),))
    assert lora.with_component("lora", "def") == BASE.with_component("lora", "def")  # replaced, not added
    two = BASE.with_component("zeta", "1").with_component("lora", "abc")
    assert two.components == (("lora", "abc"), ("zeta", "1"))  # sorted by tag: one namespace in any order


@pytest.mark.parametrize(
    "components",
    [(("lora", "a"), ("lora", "b")), (("z", "a"), ("a", "b")), (("", "a"),), (("lora",),), (("lora", 3),)],
)
def test_malformed_components_are_refused(components):
    with pytest.raises((TypeError, ValueError)):
        Namespace("model", "float32", "", components)


def test_the_cache_never_matches_across_components():
    cache = PrefixCache()
    layers = [NormalKV(torch.zeros(1, 2, 8, 4), torch.zeros(1, 2, 8, 4))]
    cache.insert(BASE, list(range(8)), layers)
    assert cache.lookup(BASE, list(range(9))) is not None
    assert cache.lookup(BASE.with_component("lora", "abc"), list(range(9))) is None
    assert cache.lookup(Namespace("model", "float32", "abc"), list(range(9))) is None
