"""Who is calling: API keys, the tenants they belong to, and each tenant's cache salt.

A client presents a key as ``Authorization: Bearer KEY`` (HTTP and WebSocket) or ``?token=KEY`` (WebSocket only:
browsers cannot set headers on one). Keys come from three places, all optional, all merged:

- ``--auth-token`` / ``TURNCACHE_AUTH_TOKEN``: one key, of the tenant ``default``;
- ``--api-keys-file`` / ``TURNCACHE_API_KEYS_FILE``: a file of keys;
- ``TURNCACHE_API_KEYS``: the same format as the file, in the environment.

The file format is either a JSON object ``{"KEY": "TENANT", ...}`` or lines ``KEY TENANT`` (entries separated by
newlines or commas; blank lines and lines starting with ``#`` ignored). A key is 16 to 512 characters of
``A-Z a-z 0-9 . _ ~ + / = -``; a tenant id is 1 to 64 characters of ``A-Z a-z 0-9 . _ -``. Several keys may name one
tenant (key rotation). A malformed source is refused at start with a :class:`KeysError` naming it and the entry, never
quoting a key.

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
from dataclasses import dataclass
from pathlib import Path

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

    def __init__(self, keys: dict[str, str] | None = None) -> None:
        self._keys = [(_digest(key), tenant) for key, tenant in (keys or {}).items()]  # (sha256 of key, tenant id)

    @property
    def open(self) -> bool:
        """True when no key is configured: every client gets in, as the tenant ``default``."""
        return not self._keys

    def tenants(self) -> set[str]:
        return {tenant for _, tenant in self._keys}

    def authenticate(self, credential: str | None) -> Tenant | None:
        """The tenant a request with ``credential`` acts for, or None when it must be refused (401 / close 1008).

        On an open server nobody is refused; a credential then only picks a cache namespace of the client's own.
        """
        if self.open:
            name = "token:" + hashlib.sha256(credential.encode()).hexdigest() if credential else DEFAULT_TENANT
            return Tenant(DEFAULT_TENANT, cache_salt(name))
        given = _digest(credential or "")
        found = None
        for digest, tenant in self._keys:  # every key is compared: the time does not depend on which one matched
            if hmac.compare_digest(given, digest):
                found = tenant
        return None if found is None or credential is None else Tenant(found, cache_salt(found))

    @classmethod
    def from_sources(
        cls, *, auth_token: str | None = None, keys_file: str | None = None, keys_env: str | None = None
    ) -> KeyRing:
        """Merge the three sources (see the module docstring).

        Raises:
            KeysError: a source is unreadable or malformed, a keys file holds no key, or one key names two tenants.
        """
        keys: dict[str, str] = {}
        sources: list[tuple[str, dict[str, str]]] = []
        if auth_token:
            sources.append(("--auth-token", {auth_token: DEFAULT_TENANT}))
        if keys_file:
            sources.append((f"--api-keys-file {keys_file}", read_keys_file(keys_file)))
        if keys_env:
            sources.append(("TURNCACHE_API_KEYS", parse_keys(keys_env, "TURNCACHE_API_KEYS")))
        for where, found in sources:
            for key, tenant in found.items():
                if keys.setdefault(key, tenant) != tenant:
                    raise KeysError(f"{where}: a key is already given to tenant {keys[key]!r}, not {tenant!r}")
        return cls(keys)


def read_keys_file(path: str) -> dict[str, str]:
    """The keys of a keys file.

    Raises:
        KeysError: the file cannot be read, is malformed, or holds no key.
    """
    where = f"--api-keys-file {path}"
    try:
        text = Path(path).expanduser().read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise KeysError(f"{where}: cannot be read ({type(exc).__name__})") from None
    keys = parse_keys(text, where)
    if not keys:
        raise KeysError(f"{where}: holds no key (an empty keys file would leave the server open)")
    return keys


def parse_keys(text: str, where: str) -> dict[str, str]:
    """Keys from a JSON object or ``KEY TENANT`` lines.

    Raises:
        KeysError: naming ``where`` and the entry; never quoting a key.
    """
    if text.lstrip().startswith("{"):
        try:
            entries = json.loads(text, object_pairs_hook=list)  # a list of pairs: a repeated key is seen
        except json.JSONDecodeError as exc:
            raise KeysError(f"{where}: not valid JSON (line {exc.lineno})") from None
        pairs = [(f"entry {n}", key, tenant) for n, (key, tenant) in enumerate(entries, 1)]
    else:
        pairs = []
        for n, line in enumerate(re.split(r"[\n,]", text), 1):
            line = line.strip()
            if not line or line.startswith("#"):
                continue
            fields = line.split()
            if len(fields) != 2:
                raise KeysError(f"{where}: entry {n}: expected 'KEY TENANT'")
            pairs.append((f"entry {n}", fields[0], fields[1]))
    keys: dict[str, str] = {}
    for what, key, tenant in pairs:
        if not isinstance(key, str) or not KEY_RE.fullmatch(key):
            raise KeysError(f"{where}: {what}: {KEY_RULE}")
        if not isinstance(tenant, str) or not TENANT_RE.fullmatch(tenant):
            raise KeysError(f"{where}: {what}: {TENANT_RULE}")
        if keys.setdefault(key, tenant) != tenant:
            raise KeysError(f"{where}: {what}: this key is already given to tenant {keys[key]!r}")
    return keys
