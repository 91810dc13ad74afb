"""schemathesis against the server's own OpenAPI spec: whatever a generated request holds, the answer is never a
server error (5xx) and the server keeps serving. (Its strategies are driven directly with hypothesis: the
schemathesis pytest plugin does not run under this pytest.)"""

from __future__ import annotations

import httpx
import schemathesis
from hypothesis import HealthCheck, given, settings
from schemathesis.checks import not_a_server_error

from tests.chat.server.conftest import make_server


def test_no_generated_request_gets_a_server_error():
    engine, server = make_server()
    with server:
        schema = schemathesis.openapi.from_url(f"{server.url}/openapi.json")
        operations = [result.ok() for result in schema.get_all_operations()]
        assert {op.path for op in operations} >= {"/v1/chat/completions", "/v1/models", "/health", "/metrics"}
        calls: dict[str, int] = {}
        for operation in operations:

            @given(case=operation.as_strategy())
            @settings(max_examples=30, deadline=None, suppress_health_check=list(HealthCheck), database=None)
            def check(case):
                nonlocal calls
                if isinstance(case.body, dict) and "max_tokens" in case.body:
                    case.body["max_tokens"] = 4  # keep generations short
                response = case.call(base_url=server.url, timeout=30)
                case.validate_response(response, checks=[not_a_server_error])
                calls[case.operation.path] = calls.get(case.operation.path, 0) + 1

            check()
        assert calls.get("/v1/chat/completions", 0) >= 20, calls  # the endpoint with a body got real fuzzing
        assert httpx.get(f"{server.url}/health").json()["status"] == "ok"
    engine.close()
