"""A tenant's policy (``chat/server/tenancy/policy.py``): its named fields parsed (integers or ``none``), refused by
name when unknown or malformed, and resolved over the server's defaults. (In the keys file: test_auth.py.)"""

from __future__ import annotations

import pytest

from chat.server.tenancy.policy import PolicyError, TenantPolicy, parse_policy
from chat.server.tenancy.ratelimit import Limits


def test_fields_are_read_as_integers_or_none_which_lifts_a_limit():
    policy = parse_policy({"concurrent_turns": "2", "tokens_per_minute": None, "priority": "-5"}, "entry 1")
    assert policy == TenantPolicy(Limits(concurrent_turns=2), frozenset({"tokens_per_minute"}), -5)
    assert parse_policy({"open_sessions": "none", "requests_per_minute": 60}, "x").lifted == {"open_sessions"}


def test_the_tenants_values_over_the_servers_defaults_lifted_ones_none():
    defaults = TenantPolicy(Limits(concurrent_turns=4, tokens_per_minute=100, open_sessions=3), priority=2)
    policy = parse_policy({"concurrent_turns": 1, "open_sessions": "none"}, "x")
    assert policy.resolve(defaults) == (Limits(concurrent_turns=1, tokens_per_minute=100), 2)
    assert TenantPolicy().resolve(TenantPolicy()) == (Limits(), 0)  # nothing anywhere: no limits, priority 0


@pytest.mark.parametrize(
    ("values", "says"),
    [
        ({"bogus": 1}, "unknown field 'bogus'"),
        ({"concurrent_turns": 0}, "concurrent_turns must be an integer >= 1"),
        ({"requests_per_minute": "lots"}, "requests_per_minute"),
        ({"priority": 101}, "priority must be an integer in [-100, 100]"),
        ({"priority": "none"}, "priority must be an integer"),
        ({"tokens_per_minute": True}, "tokens_per_minute"),
    ],
)
def test_a_malformed_field_is_refused_naming_it_and_where(values, says):
    with pytest.raises(PolicyError) as info:
        parse_policy(values, "keys file line 3")
    assert says in str(info.value) and str(info.value).startswith("keys file line 3: ")
