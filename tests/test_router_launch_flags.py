"""The router's side of vLLM's launch flags, against the `nitsum-router` binary with in-process
mock workers: HTTPS (`--ssl-certfile`/`--ssl-keyfile`: a client trusting the certificate gets
answers, plain HTTP gets none), `--root-path` (the prefix is stripped), `--tokenizer` (its
chat template is the one used) and `--disable-log-requests` (no per-request log line).

A throwaway self-signed certificate is made per test with the `openssl` CLI (never committed).
"""

from __future__ import annotations

import contextlib
import shutil
import socket
import ssl
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from nitsum.ports import free_port
from test_router_protocol import BIN, write_tiny_model

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.skipif(not BIN.exists(), reason=f"{BIN} not built"),
    pytest.mark.skipif(shutil.which("openssl") is None, reason="no openssl CLI"),
]


def self_signed(d: Path) -> tuple[Path, Path]:
    """A fresh key and a certificate for 127.0.0.1 and localhost (valid one day)."""
    cert, key = d / "cert.pem", d / "key.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256"]
        + ["-nodes", "-days", "1", "-subj", "/CN=127.0.0.1", "-keyout", str(key)]
        + ["-out", str(cert), "-addext", "subjectAltName=IP:127.0.0.1,DNS:localhost"],
        check=True,
        capture_output=True,
    )
    return cert, key


@contextlib.contextmanager
def router(work: Path, *flags: str) -> Iterator[tuple[int, Path]]:
    """The router with one mock worker and the tiny model; yields (HTTP port, log path) once
    the port accepts connections."""
    port, log_path = free_port(), work / f"router-{time.monotonic_ns()}.log"
    cmd = [str(BIN), "--listen", f"127.0.0.1:{port}", "--mock-workers", "1"]
    cmd += ["--worker-addr", f"tcp://127.0.0.1:{free_port()}", "--model-dir", str(work / "m")]
    with open(log_path, "wb") as log:
        proc = subprocess.Popen([*cmd, *flags], stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 30
        while True:
            assert proc.poll() is None, log_path.read_text()
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 1):
                break
            assert time.monotonic() < deadline, log_path.read_text()
            time.sleep(0.1)
        yield port, log_path
    finally:
        proc.terminate()
        proc.wait(timeout=30)


@pytest.fixture
def work(tmp_path: Path) -> Path:
    (tmp_path / "m").mkdir()
    write_tiny_model(tmp_path / "m")
    return tmp_path


def chat(client: httpx.Client, path: str, rid: str) -> httpx.Response:
    body = {"model": "m", "max_tokens": 2, "request_id": rid}
    body["messages"] = [{"role": "user", "content": "hi"}]
    return client.post(path, json=body)


def until_ready(client: httpx.Client, path: str) -> None:
    deadline = time.monotonic() + 30
    while client.get(path).status_code != 200:
        assert time.monotonic() < deadline
        time.sleep(0.1)


def test_https_with_root_path_and_no_request_log(work: Path) -> None:
    cert, key = self_signed(work)
    flags = ["--ssl-certfile", str(cert), "--ssl-keyfile", str(key), "--root-path", "/api/"]
    with router(work, *flags, "--disable-log-requests") as (port, log):
        trusting = ssl.create_default_context(cafile=str(cert))
        tls = httpx.Client(base_url=f"https://127.0.0.1:{port}", verify=trusting, timeout=30)
        until_ready(tls, "/health")
        r = tls.get("/api/v1/models")
        assert r.status_code == 200, r.text
        assert [m["id"] for m in r.json()["data"]] == ["m"]
        assert tls.get("/v1/models").status_code == 200  # unprefixed paths are served too
        assert tls.get("/apix/v1/models").status_code == 404
        r = chat(tls, "/api/v1/chat/completions", "rid-quiet")
        assert r.status_code == 200, r.text
        assert r.json()["id"] == "chatcmpl-rid-quiet"
        # Plain HTTP on the HTTPS port: no HTTP answer at all.
        plain = httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=5)
        with pytest.raises(httpx.HTTPError):
            plain.get("/health")
        # An untrusting client refuses the self-signed certificate.
        with pytest.raises(httpx.ConnectError):
            httpx.get(f"https://127.0.0.1:{port}/health", timeout=5)
        assert "rid-quiet" not in log.read_text()


def test_requests_are_logged_by_default(work: Path) -> None:
    with router(work) as (port, log):
        http = httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=30)
        until_ready(http, "/health")
        assert chat(http, "/v1/chat/completions", "rid-loud").status_code == 200
        assert "rid-loud" in log.read_text()


def test_tokenizer_directory_brings_its_chat_template(work: Path) -> None:
    tok = work / "tok"
    tok.mkdir()
    write_tiny_model(tok)
    # NOTE: this template renders the last message alone: 2 tokens for "hi" (the model's
    # ChatML template adds role markers around it).
    (tok / "chat_template.jinja").write_text("{{ messages[-1]['content'] }}")
    for flags, expected in (([], None), (["--tokenizer", str(tok)], 2)):
        with router(work, *flags) as (port, _log):
            http = httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=30)
            until_ready(http, "/health")
            r = chat(http, "/v1/chat/completions", "t")
            assert r.status_code == 200, r.text
            prompt = r.json()["usage"]["prompt_tokens"]
            assert prompt == expected if expected else prompt > 2
