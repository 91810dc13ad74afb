"""Who is calling: API keys, the tenants they belong to, and each tenant's cache salt.

A client presents a key as ``Authorization: Bearer KEY`` (HTTP and WebSocket) or ``?token=KEY`` (WebSocket only:
browsers cannot set headers on one). Keys come from three places, all optional, all merged:

- ``--auth-token`` / ``TURNCACHE_AUTH_TOKEN``: one key, of the tenant ``default``;
- ``--api-keys-file`` / ``TURNCACHE_API_KEYS_FILE``: a file of keys;
- ``TURNCACHE_API_KEYS``: the same format as the file, in the environment.

The file format is either a JSON object or lines (entries separated by newlines or commas; blank lines and lines
starting with ``#`` ignored)::

    {"KEY": "TENANT",                                   KEY TENANT
     "KEY2": {"tenant": "ops", "admin": true},           KEY2 ops admin
     "tenants": {"TENANT": {"requests_per_minute": 60,   tenant TENANT requests_per_minute=60 priority=5
                            "priority": 5}}}

A key is 16 to 512 characters of ``A-Z a-z 0-9 . _ ~ + / = -``; a tenant id is 1 to 64 characters of
``A-Z a-z 0-9 . _ -``. Several keys may name one tenant (key rotation). A key flagged ``admin`` reads every
tenant's figures in ``/metrics`` (``--auth-token``'s key is an admin key; on an open server everyone is). A tenant's
entry sets its limits and default priority (``chat/server/tenancy/policy.py``: fields, values, defaults). A malformed
source (an unknown field, a malformed limit, limits of a tenant that has no key) is refused with a :class:`KeysError`
naming it and the entry, never quoting a key: at start, and at a reload (``chat/server/tenancy/key_store.py``), which
then keeps the keys in force.

With at least one key, every protected request must carry a known key; its tenant owns the sessions it creates and
salts its cache entries with :func:`cache_salt` of the tenant id (never of the key). With none, the server is open:
every client is the tenant ``default`` (so anyone who knows a session id can resume it); a client may still send a
bearer token of its choosing, which is not checked and only gives it a cache namespace of its own.

Keys are kept only as SHA-256 digests and compared in constant time against every known key.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import re
from dataclasses import dataclass, field
from pathlib import Path

from chat.server.tenancy.policy import PolicyError, TenantPolicy, parse_policy

DEFAULT_TENANT = "default"  # the tenant of --auth-token, of every client of an open server, and of migrated sessions
KEY_RE = re.compile(r"[A-Za-z0-9._~+/=-]{16,512}")
TENANT_RE = re.compile(r"[A-Za-z0-9._-]{1,64}")
KEY_RULE = "a key is 16 to 512 characters of A-Z a-z 0-9 . _ ~ + / = -"
TENANT_RULE = "a tenant id is 1 to 64 characters of A-Z a-z 0-9 . _ -"


class KeysError(ValueError):
    """A source of keys is missing, unreadable or malformed. The message names the source, never a key."""


@dataclass(frozen=True, slots=True)
class Tenant:
    """Who a request acts for."""

    id: str  # owns the sessions it creates
    salt: str  # the cache namespace salt of its turns
    admin: bool = False  # the key is an admin key: /metrics shows every tenant's figures


@dataclass(frozen=True, slots=True)
class KeysFile:
    """What one source of keys holds."""

    keys: dict[str, str]  # key -> tenant id
    admins: frozenset[str] = frozenset()  # keys flagged admin
    policies: dict[str, TenantPolicy] = field(default_factory=dict)  # tenant id -> its limits and priority


def cache_salt(name: str) -> str:
    """The cache namespace salt of a tenant id (or of an open server's self-chosen token digest): one-way, 32 hex."""
    return hashlib.sha256(b"turncache-tenant\0" + name.encode()).hexdigest()[:32]


def _digest(key: str) -> bytes:
    return hashlib.sha256(key.encode()).digest()


def bearer_of(authorization: str | None) -> str | None:
    """The credential of an ``Authorization: Bearer ...`` header value, or None."""
    header = authorization or ""
    return header[7:] if header.lower().startswith("bearer ") else None


class KeyRing:
    """The known keys and their tenants. Build it with :meth:`from_sources` (or from a dict in tests)."""

    def __init__(
        self,
        keys: dict[str, str] | None = None,
        *,
        admins: frozenset[str] | set[str] = frozenset(),
        policies: dict[str, TenantPolicy] | None = None,
    ) -> None:
        # (sha256 of key, tenant id, admin flag) of every key
        self._keys = [(_digest(key), tenant, key in admins) for key, tenant in (keys or {}).items()]
        self.policies = dict(policies or {})  # tenant id -> its values from the keys file (absent: the defaults)

    def policy(self, tenant: str) -> TenantPolicy:
        """``tenant``'s values from the keys file (an empty policy: the server's defaults throughout)."""
        return self.policies.get(tenant, TenantPolicy())

    @property
    def open(self) -> bool:
        """True when no key is configured: every client gets in, as the tenant ``default``."""
        return not self._keys

    def tenants(self) -> set[str]:
        return {tenant for _, tenant, _ in self._keys}

    def authenticate(self, credential: str | None) -> Tenant | None:
        """The tenant a request with ``credential`` acts for, or None when it must be refused (401 / close 1008).

        On an open server nobody is refused; a credential then only picks a cache namespace of the client's own.
        """
        if self.open:
            name = "token:" + hashlib.sha256(credential.encode()).hexdigest() if credential else DEFAULT_TENANT
            return Tenant(DEFAULT_TENANT, cache_salt(name), admin=True)
        given = _digest(credential or "")
        found, admin = None, False
        for digest, tenant, flagged in self._keys:  # every key is compared: the time does not depend on which matched
            if hmac.compare_digest(given, digest):
                found, admin = tenant, flagged
        return None if found is None or credential is None else Tenant(found, cache_salt(found), admin)

    @classmethod
    def from_sources(
        cls, *, auth_token: str | None = None, keys_file: str | None = None, keys_env: str | None = None
    ) -> KeyRing:
        """Merge the three sources (see the module docstring).

        Raises:
            KeysError: a source is unreadable or malformed, a keys file holds no key, one key names two tenants, or
                two sources give one tenant values.
        """
        keys: dict[str, str] = {}
        admins: set[str] = set()
        policies: dict[str, TenantPolicy] = {}
        sources: list[tuple[str, KeysFile]] = []
        if auth_token:
            sources.append(("--auth-token", KeysFile({auth_token: DEFAULT_TENANT}, frozenset({auth_token}))))
        if keys_file:
            sources.append((f"--api-keys-file {keys_file}", read_keys_file(keys_file)))
        if keys_env:
            sources.append(("TURNCACHE_API_KEYS", parse_keys(keys_env, "TURNCACHE_API_KEYS")))
        for where, found in sources:
            for key, tenant in found.keys.items():
                if keys.setdefault(key, tenant) != tenant:
                    raise KeysError(f"{where}: a key is already given to tenant {keys[key]!r}, not {tenant!r}")
            admins |= found.admins
            for tenant, policy in found.policies.items():
                if policies.setdefault(tenant, policy) is not policy:
                    raise KeysError(f"{where}: tenant {tenant!r} has values in another source too")
        return cls(keys, admins=admins, policies=policies)


def read_keys_file(path: str) -> KeysFile:
    """The keys of a keys file.

    Raises:
        KeysError: the file cannot be read, is malformed, or holds no key.
    """
    where = f"--api-keys-file {path}"
    try:
        text = Path(path).expanduser().read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise KeysError(f"{where}: cannot be read ({type(exc).__name__})") from None
    found = parse_keys(text, where)
    if not found.keys:
        raise KeysError(f"{where}: holds no key (an empty keys file would leave the server open)")
    return found


def parse_keys(text: str, where: str) -> KeysFile:
    """Keys, admin flags and tenants' values from the JSON or the line format (see the module docstring).

    Raises:
        KeysError: naming ``where`` and the entry; never quoting a key.
    """
    if text.lstrip().startswith("{"):
        pairs, tenants = _json_entries(text, where)
    else:
        pairs, tenants = _line_entries(text, where)
    keys: dict[str, str] = {}
    admins: set[str] = set()
    for what, key, tenant, admin in pairs:
        if not isinstance(key, str) or not KEY_RE.fullmatch(key):
            raise KeysError(f"{where}: {what}: {KEY_RULE}")
        if not isinstance(tenant, str) or not TENANT_RE.fullmatch(tenant):
            raise KeysError(f"{where}: {what}: {TENANT_RULE}")
        if keys.setdefault(key, tenant) != tenant:
            raise KeysError(f"{where}: {what}: this key is already given to tenant {keys[key]!r}")
        if admin:
            admins.add(key)
    policies: dict[str, TenantPolicy] = {}
    for what, tenant, values in tenants:
        if not isinstance(tenant, str) or tenant not in keys.values():
            raise KeysError(f"{where}: {what}: names no tenant that has a key here")
        if tenant in policies:
            raise KeysError(f"{where}: {what}: tenant {tenant!r} is given values twice")
        try:
            policies[tenant] = parse_policy(values, f"{where}: {what}")
        except PolicyError as exc:
            raise KeysError(str(exc)) from None
    return KeysFile(keys, frozenset(admins), policies)


_Pair = tuple[str, object, object, bool]  # (entry name, key, tenant, admin flag): checked by parse_keys
_TenantValues = tuple[str, object, dict[str, object]]  # (entry name, tenant id, its fields)


def _json_entries(text: str, where: str) -> tuple[list[_Pair], list[_TenantValues]]:
    """Raises KeysError: not JSON, or an entry of the wrong shape."""
    try:
        entries = json.loads(text, object_pairs_hook=list)  # a list of pairs: a repeated key is seen
    except json.JSONDecodeError as exc:
        raise KeysError(f"{where}: not valid JSON (line {exc.lineno})") from None
    pairs: list[_Pair] = []
    tenants: list[_TenantValues] = []
    for n, (key, value) in enumerate(entries, 1):
        what = f"entry {n}"
        if key == "tenants":
            if not _is_object(value) or not all(_is_object(v) for _, v in value):
                raise KeysError(f"{where}: {what}: tenants is an object of tenant id -> object of values")
            tenants += [(f"tenants.{name}", name, dict(fields)) for name, fields in value]
        elif _is_object(value):  # {"tenant": ..., "admin": ...}
            fields = dict(value)
            unknown = set(fields) - {"tenant", "admin"}
            if unknown or not isinstance(fields.get("admin", False), bool):
                raise KeysError(f"{where}: {what}: a key's object holds 'tenant' and optionally 'admin' (true/false)")
            pairs.append((what, key, fields.get("tenant"), fields.get("admin", False)))
        else:
            pairs.append((what, key, value, False))
    return pairs, tenants


def _is_object(value: object) -> bool:
    """Whether a value parsed with ``object_pairs_hook=list`` was a JSON object (a list of pairs, which are tuples)."""
    return isinstance(value, list) and all(isinstance(pair, tuple) for pair in value)


def _line_entries(text: str, where: str) -> tuple[list[_Pair], list[_TenantValues]]:
    """Raises KeysError: a line of the wrong shape."""
    pairs: list[_Pair] = []
    tenants: list[_TenantValues] = []
    for n, line in enumerate(re.split(r"[\n,]", text), 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        fields = line.split()
        if fields[0] == "tenant":  # never a key: keys are at least 16 characters
            if len(fields) < 2 or any("=" not in f for f in fields[2:]):
                raise KeysError(f"{where}: entry {n}: expected 'tenant TENANT NAME=VALUE ...'")
            values = dict(f.partition("=")[::2] for f in fields[2:])
            tenants.append((f"entry {n}", fields[1], values))
        elif len(fields) == 2 or (len(fields) == 3 and fields[2] == "admin"):
            pairs.append((f"entry {n}", fields[0], fields[1], len(fields) == 3))
        else:
            raise KeysError(f"{where}: entry {n}: expected 'KEY TENANT' or 'KEY TENANT admin'")
    return pairs, tenants
