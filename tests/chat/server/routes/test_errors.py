"""Errors as responses (``chat/server/routes/errors.py``): OpenAI's body with the status of its code, or Anthropic's
on its routes, ``Retry-After`` on a rate limit, and a path read without its mount prefix. (The one error table:
tests/chat/server/test_errors.py; through the app: test_http.py, test_anthropic.py.)"""

from __future__ import annotations

import json

from chat.protocol.errors import ErrorCode
from chat.server.errors import RequestError
from chat.server.routes.errors import error_response, routed_path
from chat.server.tenancy.ratelimit import RateLimitedError, Refusal


def test_openais_body_with_the_status_of_its_code():
    r = error_response(RequestError(ErrorCode.INVALID_SAMPLING, "temperature: too hot", param="temperature"))
    assert r.status_code == 400 and "retry-after" not in r.headers
    assert json.loads(r.body) == {
        "error": {
            "message": "temperature: too hot",
            "type": "invalid_request_error",
            "code": "invalid_sampling",
            "param": "temperature",
        }
    }


def test_anthropics_body_on_its_routes():
    r = error_response(RequestError(ErrorCode.MODEL_NOT_FOUND, "no such model"), "/v1/messages")
    assert r.status_code == 404 and json.loads(r.body)["error"]["type"] == "not_found_error"


def test_a_rate_limit_says_when_to_retry_on_both_surfaces():
    refused = RateLimitedError(Refusal("requests_per_minute", 60, retry_after_s=2.2))
    for path in ("/v1/chat/completions", "/v1/messages"):
        r = error_response(refused, path)
        assert r.status_code == 429 and r.headers["retry-after"] == "3", path


def test_an_internal_error_says_nothing_of_itself():
    r = error_response(RuntimeError("the secret at /etc/x"))
    assert r.status_code == 500 and "secret" not in r.body.decode()


def test_a_routed_path_is_read_without_the_mount_prefix():
    assert routed_path({"path": "/rr/v1/messages", "root_path": "/rr"}) == "/v1/messages"
    assert routed_path({"path": "/v1/messages"}) == "/v1/messages" and routed_path({}) == ""
