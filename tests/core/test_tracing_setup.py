"""Tracing from the environment, as an operator turns it on: the SDK's own configurator builds
the exporter from the standard variables and the stock instrumentations trace the cold paths
(a Django view here), with the node's resource attributes. A real node, console exporter."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import httpx
import pytest

from tests.servers import ROOT, free_port, fresh_env, run_manage

# What this checks does not depend on the pass's database or channel layer.
pytestmark = pytest.mark.one_pass("distributed")


def _spans(text: str) -> list[dict]:
    """The console exporter's spans: pretty-printed JSON objects, one after another."""
    spans, decoder, at = [], json.JSONDecoder(), 0
    while (start := text.find('{\n    "name"', at)) != -1:
        try:
            span, at = decoder.raw_decode(text, start)
        except json.JSONDecodeError:
            at = start + 1
            continue
        spans.append(span)
    return spans


def test_a_node_with_tracing_on_exports_django_view_spans_from_the_standard_variables(tmp_path):
    env = fresh_env(tmp_path, A2A_TRACING="on", OTEL_TRACES_EXPORTER="console",
                    OTEL_BSP_SCHEDULE_DELAY="50", OTEL_SERVICE_NAME="registry-under-test",
                    NODE_ID="traced-node", A2A_EXPIRY_INTERVAL_SECONDS="3600")
    run_manage(env, "migrate", "--no-input")
    port = free_port()
    out = tmp_path / "node.log"
    with out.open("w") as log:
        proc = subprocess.Popen(
            [sys.executable, "manage.py", "serve", "--port", str(port)],
            cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, text=True,
        )
    try:
        base = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                if httpx.get(base + "/healthz", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.1)
        assert httpx.get(base + "/api/v1/agents", timeout=10).status_code == 401
        views: list[dict] = []
        deadline = time.monotonic() + 15
        while not views and time.monotonic() < deadline:
            time.sleep(0.2)
            views = [s for s in _spans(out.read_text())
                     if "api/v1/agents" in str(s.get("attributes", {}).get("http.route", ""))]
        assert views, out.read_text()[-3000:]
        span = views[0]
        status = span["attributes"].get("http.response.status_code",
                                         span["attributes"].get("http.status_code"))
        assert status == 401 and span["kind"] == "SpanKind.SERVER"
        assert span["resource"]["attributes"]["service.name"] == "registry-under-test"
        assert span["resource"]["attributes"]["service.instance.id"] == "traced-node"
    finally:
        proc.terminate()
        proc.wait(20)
