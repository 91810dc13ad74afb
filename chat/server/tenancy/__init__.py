"""Who a request is and what it may do: keys and tenants (``auth``, ``key_store``), each tenant's limits and
priority (``policy``, ``ratelimit``), and the gate that admits its turns (``tenant_gate``)."""
