"""The ingress holds the model's chat template and media kinds, never its weights (no Ray cluster: Ray Serve's context
and the replicas' handle are faked)."""

import asyncio
from types import SimpleNamespace

import pytest

pytest.importorskip("ray", reason="the cluster extra (turncache[cluster]) is not installed")

import torch

import chat.models
import chat.models.registry
from chat.cluster import ingress as ingress_module
from chat.cluster.ingress import ClusterIngress
from chat.cluster.prompt_keys import PromptKeyer
from chat.cluster.remote_engine import RemoteEngine
from chat.server.settings import ServerSettings
from chat.server.tenancy.auth import KeyRing


class NoHandle:
    """The EngineReplica deployment's handle; nothing is called on it here (``describe`` is faked)."""

    def options(self, **_):
        return self


@pytest.fixture
def no_serve(monkeypatch):
    """Ray Serve's replica context and Ray's node id, as an ingress replica sees them; no replica to describe."""
    context = SimpleNamespace(app_name="test-ingress", replica_id=SimpleNamespace(unique_id="i1"))
    monkeypatch.setattr(ingress_module.serve, "get_replica_context", lambda: context)
    monkeypatch.setattr(ingress_module.ray, "get_runtime_context", lambda: SimpleNamespace(get_node_id=lambda: "n1"))

    async def describe(self):
        return {}

    monkeypatch.setattr(RemoteEngine, "describe", describe)


def start_ingress(model: str, mode: str = "prefix") -> ClusterIngress:
    settings = ServerSettings(model=model)
    ingress = ClusterIngress.__new__(ClusterIngress)  # Ray Serve awaits the async __init__ itself
    policy = {"mode": mode, "imbalance": 4}
    asyncio.run(ingress.__init__(NoHandle(), settings, KeyRing({}), policy, 8))
    return ingress


def test_the_ingress_loads_no_weights(no_serve, monkeypatch):
    def no_weights(*_args, **_kwargs):
        raise AssertionError("the ingress loaded the model's weights")

    monkeypatch.setattr(chat.models, "load_model", no_weights)
    monkeypatch.setattr(chat.models.registry, "load_model", no_weights)
    monkeypatch.setattr(torch.nn.Parameter, "__new__", staticmethod(no_weights))  # what every weight is made as
    ingress = start_ingress("tiny-omni")
    assert ingress.runtime.name == "tiny-omni" and ingress.runtime.modalities == {"image", "audio", "video"}
    assert ingress.remote.runtime is ingress.runtime  # what engine_messages checks media parts with


def test_the_ingress_keys_turns_as_the_replicas_render_them(no_serve):
    ingress = start_ingress("tiny-llama")
    adapter = chat.models.load_model("tiny-llama")
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is the sea? " * 8}]
    expected = PromptKeyer(adapter.render, 8).digests(messages, "salt")  # what a replica's rendering keys
    assert expected and ingress.remote.keyer.digests(messages, "salt") == expected
