"""What the transport tests share: a local HTTPS image host (a self-signed certificate for 'localhost') and the
media URL policy that trusts it."""

from __future__ import annotations

import asyncio
import http.server
import shutil
import ssl
import subprocess
import threading
import time

import pytest

from chat.server.transport.url_fetch import MediaURLError, MediaURLPolicy, fetch_image
from tests.chat.models.mm_helpers import png

LIMIT = 64 * 1024


PNG = png(5)


class Images(http.server.BaseHTTPRequestHandler):
    """Routes of the test image host; ``hits`` counts requests."""

    hits = 0

    def log_message(self, *args) -> None:  # quiet
        pass

    def _send(self, status: int, body: bytes, ctype: str | None, length: bool = True, **headers) -> None:
        self.send_response(status)
        if ctype:
            self.send_header("Content-Type", ctype)
        if length:
            self.send_header("Content-Length", str(len(body)))
        for name, value in headers.items():
            self.send_header(name.replace("_", "-"), value)
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self) -> None:
        type(self).hits += 1
        port = self.server.server_address[1]
        routes = {
            "/cat.png": lambda: self._send(200, PNG, "image/png"),
            "/untyped": lambda: self._send(200, PNG, "application/octet-stream"),
            "/page": lambda: self._send(200, b"<html>hi</html>", "text/html"),
            "/text-bytes": lambda: self._send(200, b"just text", None),
            "/big": lambda: self._send(200, b"\x89PNG" + bytes(2 * LIMIT), "image/png"),
            "/big-unsized": lambda: self._send(200, b"\x89PNG" + bytes(2 * LIMIT), "image/png", length=False),
            "/same-host": lambda: self._send(302, b"", None, Location="/cat.png"),
            "/other-host": lambda: self._send(302, b"", None, Location=f"https://127.0.0.1:{port}/cat.png"),
            "/loop": lambda: self._send(302, b"", None, Location="/loop"),
            "/missing": lambda: self._send(404, b"no", "text/plain"),
        }
        if self.path == "/slow":
            time.sleep(3)
            return self._send(200, PNG, "image/png")
        routes.get(self.path, routes["/missing"])()
        if self.path == "/big-unsized":
            self.close_connection = True


@pytest.fixture(scope="session")
def image_host(tmp_path_factory):
    """(port, CA file) of an HTTPS server on 127.0.0.1 with a self-signed certificate for 'localhost'. One per test
    process (session scope): under xdist a module or package fixture is set up and torn down again each time a worker
    comes back to its tests."""
    if shutil.which("openssl") is None:
        pytest.fail("these tests need the openssl command to make a test certificate")
    folder = tmp_path_factory.mktemp("tls")
    cert, key = folder / "cert.pem", folder / "key.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=localhost",
         "-addext", "subjectAltName=DNS:localhost", "-keyout", str(key), "-out", str(cert)],
        check=True, capture_output=True,
    )  # fmt: skip
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(cert, key)
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Images)
    server.socket = context.wrap_socket(server.socket, server_side=True)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server.server_address[1], str(cert)
    server.shutdown()


def policy_for(image_host, **overrides) -> MediaURLPolicy:
    port, ca = image_host
    values = dict(hosts=(f"localhost:{port}",), max_bytes=LIMIT, timeout_s=1.5, allow_private=True, ca_file=ca)
    return MediaURLPolicy(**{**values, **overrides})


def fetch(image_host, path: str, **overrides):
    return asyncio.run(fetch_image(f"https://localhost:{image_host[0]}{path}", policy_for(image_host, **overrides)))


def refusal(image_host, path: str, **overrides) -> str:
    with pytest.raises(MediaURLError) as info:
        fetch(image_host, path, **overrides)
    return str(info.value)
