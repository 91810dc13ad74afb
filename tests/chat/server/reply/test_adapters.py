"""Which LoRA adapter a request's ``model`` selects (``chat/server/reply/adapters.py``): the base by its name or no
name, an adapter by its own, anything else ``model_not_found``; the turns put under it, ``/v1/models``' cards, and
the names a WebSocket may pick as adapters come and go. (Aliases: test_admission.py; over HTTP: test_lora_http.py.)"""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from chat.engine.events import TurnRequest
from chat.protocol.errors import ErrorCode
from chat.server.errors import RequestError
from chat.server.reply.adapters import AdapterSelector, LiveModels, prepared_under, with_adapter
from chat.server.reply.reader import Prepared
from tests.chat.server.reply.conftest import Bank


def selector(bank) -> AdapterSelector:
    return AdapterSelector(SimpleNamespace(adapters=bank), "base")


def test_the_base_by_its_name_or_no_name_an_adapter_by_its_own():
    bank = Bank("sql")
    chooser = selector(bank)
    assert chooser.select(None) is None and chooser.select("base") is None
    assert chooser.select("sql") is bank.named["sql"]


@pytest.mark.parametrize("bank", [Bank("sql"), None])  # None: a runtime without an adapter bank
def test_any_other_name_is_model_not_found_naming_what_is_served(bank):
    with pytest.raises(RequestError) as info:
        selector(bank).select("sql2")
    assert (info.value.code, info.value.param) == (ErrorCode.MODEL_NOT_FOUND, "model")
    assert "'base'" in str(info.value) and ("'sql'" in str(info.value)) == (bank is not None)


def test_a_turn_is_put_under_the_selected_adapter_and_the_base_leaves_it_as_it_is():
    bank = Bank("sql")
    request = TurnRequest([{"role": "user", "content": "hi"}])
    assert selector(bank).apply(request, "base") is request
    assert selector(bank).apply(request, "sql").adapter is bank.named["sql"]
    assert with_adapter(request, None) is request
    prepared = Prepared([request, request])
    assert prepared_under(prepared, None) is prepared
    under = prepared_under(prepared, bank.named["sql"])
    assert [t.adapter for t in under.turns] == [bank.named["sql"]] * 2 and prepared.turns[0].adapter is None


def test_models_cards_name_each_adapter_with_its_parent_and_root():
    assert selector(Bank("a", "b")).cards() == [
        {"id": n, "object": "model", "created": 0, "owned_by": "local", "root": f"/adapters/{n}", "parent": "base"}
        for n in ("a", "b")
    ]
    assert selector(None).cards() == [] and selector(None).names() == ["base"]


def test_live_models_follow_the_adapters_loaded_at_the_time_of_asking():
    bank = Bank("a")
    live = LiveModels(selector(bank))
    assert list(live) == ["base", "a"] and len(live) == 2 and "a" in live and live[0] == "base"
    bank.named["b"] = SimpleNamespace(name="b", source="/adapters/b")  # loaded later
    assert "b" in live and len(live) == 3 and repr(live) == "['base', 'a', 'b']"
    del bank.named["a"]  # unloaded
    assert "a" not in live and list(live) == ["base", "b"]
