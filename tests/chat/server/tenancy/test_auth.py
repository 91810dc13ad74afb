"""API keys -> tenants: the keys file and environment formats, refusals that name the source but never a key, the
constant-time lookup's results, and cache salts derived from the tenant id rather than from the key."""

from __future__ import annotations

import json
import sys

import pytest

from chat.server.tenancy.auth import DEFAULT_TENANT, KeyRing, KeysError, cache_salt, parse_keys, read_keys_file

KEY_A = "alice-key-0123456789abcdef"
KEY_A2 = "alice-rotated-key-0123456789"
KEY_B = "bob-key-fedcba9876543210xyz"


def test_json_and_line_formats_give_the_same_keys(tmp_path):
    as_json = tmp_path / "keys.json"
    as_json.write_text(json.dumps({KEY_A: "alice", KEY_A2: "alice", KEY_B: "bob"}))
    as_lines = tmp_path / "keys.txt"
    as_lines.write_text(f"# tenants\n\n{KEY_A} alice\n  {KEY_A2}\talice , {KEY_B} bob\n")
    expected = {KEY_A: "alice", KEY_A2: "alice", KEY_B: "bob"}
    assert read_keys_file(str(as_json)).keys == read_keys_file(str(as_lines)).keys == expected


@pytest.mark.parametrize(
    ("text", "says"),
    [
        (f"{KEY_A}", "expected 'KEY TENANT'"),
        (f"{KEY_A} alice extra", "expected 'KEY TENANT'"),
        ("short-key alice", "16 to 512 characters"),
        (f"{KEY_A} al/ice", "tenant id"),
        (f'{{"{KEY_A}": "alice", "{KEY_A}": "bob"}}', "already given to tenant 'alice'"),
        (f"{KEY_A} alice\n{KEY_A} bob", "already given to tenant 'alice'"),
        (f'{{"{KEY_A}": ["alice"]}}', "tenant id"),
        (f'{{"{KEY_A}": "alice",', "not valid JSON"),
        ("# only a comment\n", "holds no key"),
        ("", "holds no key"),
    ],
)
def test_a_malformed_keys_file_is_refused_naming_the_file_not_the_key(tmp_path, text, says):
    path = tmp_path / "keys.conf"
    path.write_text(text)
    with pytest.raises(KeysError) as info:
        read_keys_file(str(path))
    message = str(info.value)
    assert str(path) in message and says in message, message
    assert KEY_A not in message and "short-key" not in message


def test_an_unreadable_keys_file_is_refused(tmp_path):
    with pytest.raises(KeysError, match="cannot be read"):
        read_keys_file(str(tmp_path / "missing"))
    binary = tmp_path / "binary"
    binary.write_bytes(b"\xff\xfe\x00")
    with pytest.raises(KeysError, match="cannot be read"):
        read_keys_file(str(binary))


def test_sources_merge_and_a_key_given_to_two_tenants_is_refused(tmp_path):
    path = tmp_path / "keys"
    path.write_text(f"{KEY_A} alice\n")
    ring = KeyRing.from_sources(auth_token="tok", keys_file=str(path), keys_env=f"{KEY_B} bob")
    assert ring.tenants() == {DEFAULT_TENANT, "alice", "bob"}
    with pytest.raises(KeysError) as info:
        KeyRing.from_sources(keys_file=str(path), keys_env=f"{KEY_A} bob")
    assert "TURNCACHE_API_KEYS" in str(info.value) and KEY_A not in str(info.value)
    with pytest.raises(KeysError, match="TURNCACHE_API_KEYS: entry 1"):
        KeyRing.from_sources(keys_env="not a valid entry")


def test_a_key_finds_its_tenant_and_the_salt_comes_from_the_tenant_id():
    ring = KeyRing({KEY_A: "alice", KEY_A2: "alice", KEY_B: "bob"})
    alice, rotated, bob = ring.authenticate(KEY_A), ring.authenticate(KEY_A2), ring.authenticate(KEY_B)
    assert alice is not None and rotated is not None and bob is not None
    assert alice == rotated  # two keys of one tenant: one owner, one cache namespace
    assert (alice.id, alice.salt) == ("alice", cache_salt("alice"))
    assert bob.id == "bob" and bob.salt != alice.salt
    assert KEY_A not in alice.salt and len(alice.salt) == 32
    for refused in (None, "", KEY_A + "x", KEY_A[:-1], "Bearer " + KEY_A, KEY_A.upper()):
        assert ring.authenticate(refused) is None, refused


def test_an_open_server_lets_everyone_in_as_one_tenant():
    ring = KeyRing()
    assert ring.open
    anonymous, with_token, other_token = ring.authenticate(None), ring.authenticate("abc"), ring.authenticate("xyz")
    assert anonymous.id == with_token.id == other_token.id == DEFAULT_TENANT  # sessions: one tenant
    assert len({anonymous.salt, with_token.salt, other_token.salt}) == 3  # a token still picks its cache namespace
    assert anonymous.salt == cache_salt(DEFAULT_TENANT)  # the same namespace as --auth-token's tenant


def test_the_keys_parser_reports_entries_of_an_environment_value():
    assert parse_keys(f"{KEY_A} alice,{KEY_B} bob", "env").keys == {KEY_A: "alice", KEY_B: "bob"}
    with pytest.raises(KeysError, match="env: entry 2"):
        parse_keys(f"{KEY_A} alice,{KEY_B}", "env")


def test_the_keys_file_example_of_the_security_doc_works(tmp_path):
    import re
    import subprocess
    from pathlib import Path

    doc = (Path(__file__).parents[4] / "docs" / "security.md").read_text()
    example = re.search(r"```sh\n(key\(\).*?)\nturncache serve --api-keys-file", doc, re.S)
    assert example is not None
    script = example.group(1).replace("/etc/turncache/keys", str(tmp_path / "keys"))
    subprocess.run(["bash", "-c", script.replace("python3", sys.executable)], check=True)
    keys = read_keys_file(str(tmp_path / "keys")).keys
    assert sorted(keys.values()) == ["alice", "bob"] and all(len(k) >= 40 for k in keys)


# ------------------------------------------------------------------ tenants' limits, priorities and admin keys

LIMITS_JSON = {
    KEY_A: "alice",
    KEY_B: {"tenant": "bob", "admin": True},
    "tenants": {"alice": {"requests_per_minute": 60, "tokens_per_minute": None, "priority": -5}},
}
LIMITS_LINES = (
    f"{KEY_A} alice\n{KEY_B} bob admin\ntenant alice requests_per_minute=60 tokens_per_minute=none priority=-5\n"
)


@pytest.mark.parametrize("text", [json.dumps(LIMITS_JSON), LIMITS_LINES], ids=["json", "lines"])
def test_both_formats_carry_limits_priorities_and_admin_flags(tmp_path, text):
    from chat.server.tenancy.policy import TenantPolicy
    from chat.server.tenancy.ratelimit import Limits

    path = tmp_path / "keys"
    path.write_text(text)
    found = read_keys_file(str(path))
    assert found.keys == {KEY_A: "alice", KEY_B: "bob"} and found.admins == {KEY_B}
    alice = found.policies["alice"]
    assert (alice.limits, alice.lifted, alice.priority) == (
        Limits(requests_per_minute=60),
        frozenset({"tokens_per_minute"}),
        -5,
    )
    ring = KeyRing.from_sources(keys_file=str(path))
    assert ring.authenticate(KEY_B).admin and not ring.authenticate(KEY_A).admin
    defaults = TenantPolicy(Limits(concurrent_turns=3, tokens_per_minute=1000), priority=7)
    assert ring.policy("alice").resolve(defaults) == (Limits(concurrent_turns=3, requests_per_minute=60), -5)
    assert ring.policy("bob").resolve(defaults) == (Limits(concurrent_turns=3, tokens_per_minute=1000), 7)


def test_the_auth_token_and_an_open_server_are_admins():
    assert KeyRing.from_sources(auth_token=KEY_A).authenticate(KEY_A).admin
    assert KeyRing().authenticate(None).admin


@pytest.mark.parametrize(
    ("text", "says"),
    [
        (f"{KEY_A} alice\ntenant alice rpm=5", "unknown field 'rpm'"),
        (f"{KEY_A} alice\ntenant alice requests_per_minute=0", "requests_per_minute must be an integer >= 1"),
        (f"{KEY_A} alice\ntenant alice requests_per_minute=ten", "requests_per_minute must be an integer or none"),
        (f"{KEY_A} alice\ntenant alice priority=101", "priority must be an integer in [-100, 100]"),
        (f"{KEY_A} alice\ntenant alice priority=none", "priority must be an integer in [-100, 100]"),
        (f"{KEY_A} alice\ntenant alice requests_per_minute", "expected 'tenant TENANT NAME=VALUE ...'"),
        (f"{KEY_A} alice\ntenant alcie requests_per_minute=5", "names no tenant that has a key here"),
        (f"{KEY_A} alice\ntenant alice priority=1\ntenant alice priority=2", "given values twice"),
        (f"{KEY_A} alice root", "expected 'KEY TENANT' or 'KEY TENANT admin'"),
        (json.dumps({KEY_A: {"tenant": "alice", "admin": "yes"}}), "optionally 'admin' (true/false)"),
        (json.dumps({KEY_A: {"tenant": "alice", "role": "x"}}), "optionally 'admin' (true/false)"),
        (json.dumps({KEY_A: "alice", "tenants": {"alice": {"concurrent_turns": 1.5}}}), "must be an integer or none"),
        (json.dumps({KEY_A: "alice", "tenants": {"alice": {"concurrent_turns": True}}}), "must be an integer or none"),
        (json.dumps({KEY_A: "alice", "tenants": ["alice"]}), "tenants is an object"),
    ],
)
def test_a_malformed_limit_or_an_unknown_field_is_refused_naming_it(tmp_path, text, says):
    path = tmp_path / "keys"
    path.write_text(text)
    with pytest.raises(KeysError) as info:
        read_keys_file(str(path))
    message = str(info.value)
    assert str(path) in message and says in message, message
    assert KEY_A not in message
