"""One admission for every surface: the model named (the base model or one of its LoRA adapters), the grammar
compiled, the tenant's limits, then the tenant's view of the engine (its default priority, its turns counted) that
runs the request."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from fnmatch import fnmatchcase

from chat.engine.constraints import GrammarError, GrammarSpec
from chat.protocol.errors import ErrorCode
from chat.server.errors import RequestError
from chat.server.reply.adapters import AdapterSelector
from chat.server.reply.reader import Prepared
from chat.server.tenancy.auth import Tenant
from chat.server.tenancy.tenant_gate import TenantGate


async def check_grammar(engine, spec: GrammarSpec | None, field: str) -> None:
    """Compile ``spec`` (off the event loop; the engine then finds it compiled) so that a bad one is refused before
    anything runs. A cluster's ingress has no compiler: its replicas refuse it the same way.

    Raises:
        RequestError: ``invalid_grammar`` naming ``field``.
    """
    grammars = getattr(engine, "grammars", None)
    if spec is None or grammars is None:
        return
    try:
        await asyncio.to_thread(lambda: grammars().compile(spec))
    except GrammarError as exc:
        raise RequestError(ErrorCode.INVALID_GRAMMAR, f"{field}: {exc}", param=field) from None


class Admission:
    """check model -> (the surface builds its turns, under the adapter the model named) -> check grammar -> admit,
    the same for every route."""

    def __init__(self, engine, gate: TenantGate, adapters: AdapterSelector, aliases: Sequence[str] = ()) -> None:
        self.engine = engine  # the server's engine
        self.gate = gate  # the tenants' limits and engine views
        self.adapters = adapters  # the one model this server runs and its loaded LoRA adapters
        self.aliases = tuple(aliases)  # other names (exact, or globs) taken for the base model (--served-model-alias)

    def check_model(self, name: str | None):
        """The LoRA adapter ``name`` selects: None for the base model, by its name, no name or an alias (a glob
        matches case-sensitively); an adapter's own name wins over an alias that also matches it.

        Raises:
            RequestError: ``model_not_found``, a name that is neither the model, an alias nor a loaded adapter.
        """
        if name is not None and name not in self.adapters.names() and self.is_alias(name):
            return None
        return self.adapters.select(name)

    def is_alias(self, name: str) -> bool:
        return any(fnmatchcase(name, alias) for alias in self.aliases)

    async def admit(self, tenant: Tenant, prepared: Prepared):
        """The engine view that runs ``prepared`` for ``tenant``, once its grammar compiles and its turns fit the
        tenant's limits.

        Raises:
            RequestError (``invalid_grammar``), RateLimitedError.
        """
        await check_grammar(self.engine, prepared.turns[0].params.grammar, prepared.grammar_field)
        self.gate.admit(tenant.id, len(prepared.turns))
        return self.gate.engine_for(self.engine, tenant.id)
