"""Which model a request's ``model`` names (chat.server.reply.admission.Admission.check_model): the base model by
its name, no name or a ``--served-model-alias``; a loaded LoRA adapter by its own name, even where an alias's glob
matches that name too; anything else ``model_not_found``."""

from types import SimpleNamespace

import pytest

from chat.protocol.errors import ErrorCode
from chat.server.errors import RequestError
from chat.server.reply.adapters import AdapterSelector
from chat.server.reply.admission import Admission
from tests.chat.server.reply.conftest import Bank


def admission(bank, aliases=()):
    runtime = SimpleNamespace(adapters=bank)
    return Admission(engine=None, gate=None, adapters=AdapterSelector(runtime, "base-model"), aliases=aliases)


def test_the_base_model_by_its_name_no_name_or_an_alias():
    a = admission(Bank("claude-sql"), aliases=["claude-*", "gpt-4o"])
    assert a.check_model(None) is None
    assert a.check_model("base-model") is None
    assert a.check_model("claude-sonnet-4-5") is None
    assert a.check_model("gpt-4o") is None


def test_an_adapter_by_its_name_wins_over_an_alias_that_matches_it():
    bank = Bank("claude-sql")
    a = admission(bank, aliases=["claude-*"])
    assert a.check_model("claude-sql") is bank.named["claude-sql"]


@pytest.mark.parametrize("bank", [Bank("sql"), None])
def test_any_other_name_is_model_not_found(bank):
    a = admission(bank, aliases=["claude-*"])
    for name in ("gpt-4o", "Claude-x", "sql-2", ""):
        with pytest.raises(RequestError) as raised:
            a.check_model(name)
        assert raised.value.code == ErrorCode.MODEL_NOT_FOUND
