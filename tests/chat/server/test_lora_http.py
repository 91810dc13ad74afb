"""LoRA adapters over HTTP and the WebSocket: ``model: NAME`` selects one, ``/v1/models`` lists them with their
parent, vLLM's load/unload routes for admin keys, ``--lora`` at start; the cache never crosses adapters."""

from __future__ import annotations

import asyncio
import json

import pytest
from fastapi.testclient import TestClient
from websockets.asyncio.client import connect

from cache import PrefixCache
from chat.engine.engine import Engine
from chat.models import load_model
from chat.models.errors import AdapterFileError, InvalidSettingError
from chat.server.app import create_app
from chat.server.runner import BackgroundServer
from chat.server.settings import ServerSettings
from chat.server.surfaces.lora_api import load_adapters
from tests.chat.models.lora_helpers import make_peft_adapter

pytest.importorskip("peft")

USER_KEY, ADMIN_KEY = "user-key-0123456789abcdef", "admin-key-0123456789abcdef"
USER = {"authorization": f"Bearer {USER_KEY}"}
ADMIN = {"authorization": f"Bearer {ADMIN_KEY}"}
PROMPT = [5, 17, 23, 99, 41, 8, 63, 12]


@pytest.fixture(scope="module")
def made(tmp_path_factory):
    root = tmp_path_factory.mktemp("http-adapters")
    return {
        "one": make_peft_adapter(root / "one", seed=21),
        "two": make_peft_adapter(root / "two", seed=22, r=2),
        "narrow": narrowed(make_peft_adapter(root / "narrow", seed=23)[0]),
    }


def narrowed(path):
    """The adapter in ``path`` with layer 0's q update cut to 32 output rows: as if made for another model."""
    from safetensors.torch import load_file, save_file

    file = path / "adapter_model.safetensors"
    tensors = load_file(str(file))
    key = "base_model.model.model.layers.0.self_attn.q_proj.lora_B.weight"
    tensors[key] = tensors[key][:32].contiguous()
    save_file(tensors, str(file))
    return path, None


@pytest.fixture(scope="module")
def served(made):
    runtime = load_model("tiny-llama", weights="float32")
    load_adapters(runtime, [f"one={made['one'][0]}"], max_loras=2)
    engine = Engine(runtime, cache=PrefixCache())
    settings = ServerSettings(api_keys=f"{USER_KEY} alice\n{ADMIN_KEY} ops admin", keys_poll_s=0)
    app = create_app(engine, settings, model_name=runtime.name)
    with TestClient(app) as client:
        yield client, runtime
    engine.close()


def complete(client, model, prompt=PROMPT, max_tokens=5):
    body = {"model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0}
    response = client.post("/v1/completions", json=body, headers=USER)
    assert response.status_code == 200, response.text
    return response.json()


def greedy(model, prompt, n):
    import torch

    with torch.no_grad():
        out = model.generate(torch.tensor([prompt]), max_new_tokens=n, do_sample=False, min_new_tokens=n)
    return out[0, len(prompt) :].tolist()


def test_models_lists_adapters_with_their_parent(served):
    client, runtime = served
    data = client.get("/v1/models", headers=USER).json()["data"]
    assert data[0]["id"] == runtime.name
    one = next(card for card in data if card["id"] == "one")
    assert one["parent"] == runtime.name and one["object"] == "model"


def test_model_name_selects_the_adapter(served, made):
    client, runtime = served
    tokenizer = runtime._tokenizer
    under = complete(client, "one")["choices"][0]["text"]
    reference = greedy(made["one"][1], PROMPT, 5)
    assert under == tokenizer.decode(reference)
    base = complete(client, runtime.name)["choices"][0]["text"]
    assert base != under


def test_prefixes_never_cross_between_adapter_and_base(served):
    client, runtime = served
    prompt = [70, *PROMPT, 77, 78, 79, 80, 81, 82, 83, 84]  # a first token no other test's prompt has
    first = complete(client, "one", prompt, 1)["usage"]
    again = complete(client, "one", prompt, 1)["usage"]
    base = complete(client, runtime.name, prompt, 1)["usage"]
    assert first["prompt_tokens_details"]["cached_tokens"] == 0
    assert again["prompt_tokens_details"]["cached_tokens"] > 0
    assert base["prompt_tokens_details"]["cached_tokens"] == 0


def test_unknown_model_is_404(served):
    client, _ = served
    response = client.post("/v1/completions", json={"model": "nobody", "prompt": PROMPT}, headers=USER)
    assert response.status_code == 404 and response.json()["error"]["code"] == "model_not_found"


def test_anthropic_messages_select_the_adapter_as_chat_completions_do(served):
    """``model: NAME`` on /v1/messages computes under the adapter exactly as /v1/chat/completions does (the same
    greedy reply, not the base's); count_tokens takes the name; an unknown name is Anthropic's not_found_error."""
    client, runtime = served
    messages = [{"role": "user", "content": "Tell me about the sea."}]

    def chat(model):
        body = {"model": model, "messages": messages, "max_tokens": 6, "temperature": 0}
        response = client.post("/v1/chat/completions", json=body, headers=USER)
        assert response.status_code == 200, response.text
        return response.json()["choices"][0]["message"]["content"]

    def anthropic(model):
        body = {"model": model, "messages": messages, "max_tokens": 6, "temperature": 0}
        response = client.post("/v1/messages", json=body, headers=USER)
        assert response.status_code == 200, response.text
        reply = response.json()
        assert reply["model"] == model
        return "".join(block["text"] for block in reply["content"] if block["type"] == "text")

    under = anthropic("one")
    assert under == chat("one")
    assert under != anthropic(runtime.name) and anthropic(runtime.name) == chat(runtime.name)
    counted = client.post("/v1/messages/count_tokens", json={"model": "one", "messages": messages}, headers=USER)
    base = client.post("/v1/messages/count_tokens", json={"model": runtime.name, "messages": messages}, headers=USER)
    assert counted.status_code == 200 and counted.json() == base.json()
    for path, extra in (("/v1/messages", {"max_tokens": 6}), ("/v1/messages/count_tokens", {})):
        response = client.post(path, json={"model": "nobody", "messages": messages, **extra}, headers=USER)
        assert response.status_code == 404, response.text
        assert response.json()["type"] == "error" and response.json()["error"]["type"] == "not_found_error"


def test_load_and_unload_need_an_admin_key(served, made):
    client, _ = served
    body = {"lora_name": "two", "lora_path": str(made["two"][0])}
    refused = client.post("/v1/load_lora_adapter", json=body, headers=USER)
    assert refused.status_code == 401 and "admin" in refused.json()["error"]["message"]
    refused = client.post("/v1/unload_lora_adapter", json={"lora_name": "one"}, headers=USER)
    assert refused.status_code == 401


def test_load_select_reload_unload(served, made):
    client, _ = served
    body = {"lora_name": "two", "lora_path": str(made["two"][0])}
    loaded = client.post("/v1/load_lora_adapter", json=body, headers=ADMIN)
    assert loaded.status_code == 200 and loaded.text == "Success: LoRA adapter 'two' added successfully."
    assert "two" in [c["id"] for c in client.get("/v1/models", headers=USER).json()["data"]]
    prompt = [90, *PROMPT, 91, 92, 93, 94, 95, 96, 97, 98]  # a first token no other test's prompt has
    assert complete(client, "two", prompt, 1)["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
    assert complete(client, "two", prompt, 1)["usage"]["prompt_tokens_details"]["cached_tokens"] > 0
    again = client.post("/v1/load_lora_adapter", json=body, headers=ADMIN)
    assert again.status_code == 400 and "already been loaded" in again.json()["error"]["message"]
    inplace = {"lora_name": "two", "lora_path": str(made["two"][0]), "load_inplace": True, "scale": 0.5}
    assert client.post("/v1/load_lora_adapter", json=inplace, headers=ADMIN).status_code == 200
    reloaded = complete(client, "two", prompt, 1)
    assert reloaded["usage"]["prompt_tokens_details"]["cached_tokens"] == 0  # another scale: no stale hit
    gone = client.post("/v1/unload_lora_adapter", json={"lora_name": "two"}, headers=ADMIN)
    assert gone.status_code == 200 and gone.text == "Success: LoRA adapter 'two' removed successfully."
    missing = client.post("/v1/unload_lora_adapter", json={"lora_name": "two"}, headers=ADMIN)
    assert missing.status_code == 404
    response = client.post("/v1/completions", json={"model": "two", "prompt": PROMPT}, headers=USER)
    assert response.status_code == 404


def test_bad_loads_are_typed_400s_and_change_nothing(served, made, tmp_path):
    client, runtime = served
    before = client.get("/v1/models", headers=USER).json()
    cases = [
        ({"lora_name": "x", "lora_path": str(tmp_path / "missing")}, "no such adapter"),
        ({"lora_name": "x", "lora_path": str(made["narrow"][0])}, "layers.0.q"),
        ({"lora_name": "x y", "lora_path": str(made["two"][0])}, "lora_name"),
        ({"lora_name": runtime.name, "lora_path": str(made["two"][0])}, "base model's name"),
        ({"lora_name": "x", "lora_path": str(made["two"][0]), "lora_int_id": 3}, "lora_int_id"),
    ]
    for body, says in cases:
        response = client.post("/v1/load_lora_adapter", json=body, headers=ADMIN)
        assert response.status_code == 400, (body, response.text)
        assert says in response.json()["error"]["message"], response.json()
    assert client.get("/v1/models", headers=USER).json() == before


def test_websocket_session_model_selects_the_adapter(made):
    runtime = load_model("tiny-llama", weights="float32")
    load_adapters(runtime, [f"one={made['one'][0]}"], max_loras=2)
    engine = Engine(runtime, cache=PrefixCache())
    app = create_app(engine, ServerSettings(), model_name=runtime.name)

    async def session(model):
        async with connect(srv.url.replace("http://", "ws://") + "/v1/ws") as ws:
            await ws.send(
                json.dumps({"type": "session.create", "model": model, "sampling": {"temperature": 0, "max_tokens": 6}})
            )
            replies = []
            for text in ("hello there", "and more"):
                await ws.send(json.dumps({"type": "turn.create", "content": text}))
                while True:
                    event = json.loads(await asyncio.wait_for(ws.recv(), 30))
                    if event["type"] in ("reply.done", "error"):
                        break
                assert event["type"] == "reply.done", event
                replies.append((event["text"], event["usage"]["prompt_tokens_details"]["cached_tokens"]))
            return replies

    async def unknown():
        async with connect(srv.url.replace("http://", "ws://") + "/v1/ws") as ws:
            await ws.send(json.dumps({"type": "session.create", "model": "nobody"}))
            return json.loads(await asyncio.wait_for(ws.recv(), 30))

    srv = BackgroundServer(app)
    try:
        with srv:
            under = asyncio.run(session("one"))
            base = asyncio.run(session(runtime.name))
            refused = asyncio.run(unknown())
    finally:
        engine.close()
    assert under[1][1] > 0 and base[0][1] == 0  # each model's own history serves it; never the other's
    assert [t for t, _ in under] != [t for t, _ in base]
    assert refused["type"] == "error" and refused["code"] == "unknown_model"


# ==================================================================== --lora at start


def test_load_adapters_at_start_refusals(made, tmp_path):
    runtime = load_model("tiny-llama", weights="float32")
    with pytest.raises(AdapterFileError):
        load_adapters(runtime, [f"a={tmp_path / 'none'}"], max_loras=2)
    with pytest.raises(InvalidSettingError, match="taken"):
        load_adapters(runtime, [f"tiny-llama={made['one'][0]}"], max_loras=2)
    hybrid = load_model("tiny-qwen3next")
    with pytest.raises(InvalidSettingError, match="transformers' forward"):
        load_adapters(hybrid, [f"a={made['one'][0]}"], max_loras=2)
    assert load_adapters(hybrid, [], max_loras=2) == []  # no adapters asked for: nothing to refuse


def test_serve_flags_reach_the_settings():
    from chat.cli import build_parser
    from chat.cli.serve import server_settings

    args = build_parser().parse_args(["serve", "--lora", "a=/x:2", "--lora", "b=/y", "--max-loras", "3"])
    settings = server_settings(args)
    assert settings.lora == ["a=/x:2", "b=/y"] and settings.max_loras == 3
