"""``GET /health``, ``GET /metrics`` and ``GET /v1/models`` (``chat/server/routes/ops.py``): /metrics per tenant (an
admin key reads the server's metrics and every tenant's figures, labelled by tenant id; any other key reads its own
tenant's figures and nothing else), the served model listed. (The text: test_metrics_text.py.)"""

from __future__ import annotations

import re

import httpx
import openai

from tests.chat.server.conftest import make_server
from tests.chat.server.test_tenants import KEY_A, KEY_B

KEY_OPS = "ops-admin-key-0123456789abcdef"
BODY = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}


def series(text: str) -> dict[str, float]:
    """``name{labels}`` -> value of every sample."""
    return {m[1]: float(m[2]) for m in re.finditer(r"^([^#\s]\S*) (\S+)$", text, re.M)}


def test_admins_see_every_tenant_and_the_others_only_their_own(tmp_path):
    path = tmp_path / "keys"
    path.write_text(f"{KEY_A} alice\n{KEY_B} bob\n{KEY_OPS} ops admin\ntenant alice requests_per_minute=2\n")
    engine, srv = make_server(api_keys_file=str(path))
    with srv:

        def call(key: str, what: str = "/v1/chat/completions") -> httpx.Response:
            headers = {"authorization": f"Bearer {key}"}
            if what == "/metrics":
                return httpx.get(srv.url + what, headers=headers, timeout=30)
            return httpx.post(srv.url + what, json=BODY, headers=headers, timeout=30)

        statuses = [call(KEY_A).status_code for _ in range(3)] + [call(KEY_B).status_code]
        assert statuses == [200, 200, 429, 200]
        admin = series(call(KEY_OPS, "/metrics").text)
        assert admin["turncache_turns_total"] == 3  # the server's own metrics
        assert admin['turncache_tenant_turns_total{tenant="alice"}'] == 2
        assert admin['turncache_tenant_turns_total{tenant="bob"}'] == 1
        assert admin['turncache_tenant_turns_total{tenant="ops"}'] == 0  # every tenant with a key, even idle
        assert admin['turncache_tenant_rate_limited_total{tenant="alice"}'] == 1
        assert admin['turncache_tenant_turns_active{tenant="alice"}'] == 0
        completion = admin['turncache_tenant_completion_tokens_total{tenant="alice"}']
        assert completion == 2 * 3  # two replies of max_tokens 3 (the fake model's replies are longer)
        for key, own, other in ((KEY_A, "alice", "bob"), (KEY_B, "bob", "alice")):
            text = call(key, "/metrics").text
            mine = series(text)
            assert (
                mine[f'turncache_tenant_turns_total{{tenant="{own}"}}']
                == admin[f'turncache_tenant_turns_total{{tenant="{own}"}}']
            )
            assert other not in text and "ops" not in text
            assert all(name.startswith("turncache_tenant_") for name in mine)  # nothing server-wide
    engine.close()


def test_the_auth_token_and_an_open_server_read_everything(server):
    httpx.post(f"{server.url}/v1/chat/completions", json=BODY, timeout=30)
    text = httpx.get(f"{server.url}/metrics", timeout=30).text
    assert "turncache_turns_total" in text and 'turncache_tenant_turns_total{tenant="default"}' in text
    engine, srv = make_server(auth_token=KEY_OPS)
    with srv:
        text = httpx.get(f"{srv.url}/metrics", headers={"authorization": f"Bearer {KEY_OPS}"}, timeout=30).text
        assert "turncache_steps_total" in text
    engine.close()


def test_models_lists_the_served_model(server):
    client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused")
    assert [m.id for m in client.models.list()] == ["fake"]


def test_health_and_metrics(server):
    assert httpx.get(f"{server.url}/health").json()["status"] == "ok"
    httpx.post(f"{server.url}/v1/chat/completions", json={"messages": [{"role": "user", "content": "x"}]}, timeout=30)
    text = httpx.get(f"{server.url}/metrics").text
    assert "turncache_turns_total 1" in text and 'turncache_cache_bytes{tier="device"}' in text
    assert 'turncache_ttft_seconds_bucket{le="+Inf"} 1' in text
