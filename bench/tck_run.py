"""The A2A TCK (github.com/a2aproject/a2a-tck) against an a2a-sdk agent, directly and through a
node, per binding: ``scripts/tck.sh`` prepares the TCK and its virtualenv and runs this.

One SDK agent (``bench/tck_agent.py``: JSON-RPC, HTTP+JSON and gRPC, all A2A 1.0) and one
embedded node (``manage.py serve --grpc-port G``), each its own process; the agent is
registered on the node with its card, so through the gateway JSON-RPC is forwarded, HTTP+JSON
forwarded to the agent's own HTTP+JSON interface and gRPC passed through to its gRPC server.
For each binding (``jsonrpc``, ``rest``, ``grpc``) the TCK's categories run twice: with the
agent's own base URL as the SUT (direct) and with the gateway's ``/a2a/{agent_id}`` (the
caller's token, and the agent id as the ``tenant`` metadata entry the TCK's gRPC client does
not set from the card, through ``A2A_AUTH_HEADERS``). The TCK reads the card at its SUT's host
root, where a node answers its own card, so the gateway run's SUT URL is a loopback server
answering that path with the gateway's card of the agent and forwarding anything else to the
gateway's agent base (:class:`SutHost`): the TCK calls the interfaces the card lists, all of
them at the node. The agent is restarted before
each run (a fresh task store), on the same ports.

Figures: passed / failed / errors / skipped per binding, category and target, and the tests
that pass directly and fail through the gateway (what the gateway changes) -- written to
``bench/results/tck-<time>.json``.

    scripts/tck.sh                              # mandatory + capabilities, every binding
    scripts/tck.sh --bindings grpc --categories mandatory
"""

from __future__ import annotations

import argparse
import http.server
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import (  # noqa: E402
    PYTHON,
    PlatformNode,
    Proc,
    clean_env,
    free_port,
    temp_dir,
    write_results,
)

AGENT_ID = "tck-agent"
BINDINGS = ("jsonrpc", "rest", "grpc")
#: The TCK's categories: its test folder and marker expression (as its run_tck.py has them).
CATEGORIES = {
    "mandatory": ("tests/mandatory/", "mandatory or mandatory_protocol"),
    "capabilities": ("tests/optional/capabilities/", None),
}
RUN_TIMEOUT_SECONDS = 600


class SutHost:
    """The TCK reads the agent card at its SUT's host root (``/.well-known/agent-card.json``,
    whatever the SUT URL's path), where a node answers its own card, and a few of its tests
    POST JSON-RPC to the SUT URL itself: this loopback server stands for the agent at a host
    root, answering the card paths with the gateway's card of the agent (fetched once; it lists
    the gateway's interfaces, so the TCK's calls go to the node) and forwarding every other
    request to the gateway's ``/a2a/{agent_id}`` base, each answer read whole and relayed."""

    def __init__(self, card: bytes, base: str) -> None:
        body = card

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def _answer(self, status: int, content: bytes, content_type: str) -> None:
                self.send_response(status)
                self.send_header("Content-Type", content_type)
                self.send_header("Content-Length", str(len(content)))
                self.end_headers()
                self.wfile.write(content)

            def _forward(self) -> None:
                if self.path.split("?", 1)[0] in ("/.well-known/agent-card.json",
                                                  "/.well-known/agent.json"):
                    self._answer(200, body, "application/json")
                    return
                size = int(self.headers.get("Content-Length") or 0)
                payload = self.rfile.read(size) if size else None
                headers = {k: v for k, v in self.headers.items()
                           if k.lower() not in ("host", "content-length", "connection")}
                try:
                    answer = httpx.request(self.command, base + self.path, content=payload,
                                           headers=headers, timeout=RUN_TIMEOUT_SECONDS)
                except httpx.HTTPError as exc:
                    self._answer(502, str(exc).encode(), "text/plain")
                    return
                self._answer(answer.status_code, answer.content,
                             answer.headers.get("content-type", "application/octet-stream"))

            do_GET = do_POST = do_PUT = do_DELETE = do_PATCH = _forward

            def log_message(self, *args: object) -> None:
                return None

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def run_tck(tck_dir: Path, tck_python: str, sut_url: str, binding: str, category: str,
            report: Path, auth_headers: dict[str, str] | None, streaming_timeout: str) -> dict:
    path, markers = CATEGORIES[category]
    if category == "mandatory" and binding == "jsonrpc":
        markers = f"{markers} or mandatory_jsonrpc"
    argv = [tck_python, "-m", "pytest", path, f"--sut-url={sut_url}", "--test-scope=all",
            "--tb=line", "-q", "-p", "no:cacheprovider", f"--transports={binding}",
            "--json-report", f"--json-report-file={report}"]
    if markers:
        argv += ["-m", markers]
    env = {k: v for k, v in os.environ.items() if not k.startswith("A2A_AUTH")}
    env["TCK_STREAMING_TIMEOUT"] = streaming_timeout
    if auth_headers:
        env["A2A_AUTH_HEADERS"] = json.dumps(auth_headers)
    started = time.monotonic()
    done = subprocess.run(argv, cwd=tck_dir, env=env, capture_output=True, text=True,
                          timeout=RUN_TIMEOUT_SECONDS)
    seconds = round(time.monotonic() - started, 1)
    if not report.exists():
        raise RuntimeError(f"the TCK wrote no report ({binding}, {category}):\n"
                           f"{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
    data = json.loads(report.read_text())
    outcomes: dict[str, str] = {}
    messages: dict[str, str] = {}
    for test in data.get("tests", []):
        outcomes[test["nodeid"]] = test["outcome"]
        for stage in ("setup", "call", "teardown"):
            crash = (test.get(stage) or {}).get("crash")
            if crash and test["outcome"] in ("failed", "error"):
                messages[test["nodeid"]] = str(crash.get("message", ""))[:300]
                break
    summary = data.get("summary", {})
    return {
        "passed": summary.get("passed", 0), "failed": summary.get("failed", 0),
        "errors": summary.get("error", 0), "skipped": summary.get("skipped", 0),
        "xfailed": summary.get("xfailed", 0), "xpassed": summary.get("xpassed", 0),
        "seconds": seconds, "outcomes": outcomes, "messages": messages,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tck-dir", required=True, help="a checkout of the A2A TCK")
    parser.add_argument("--tck-python", required=True,
                        help="the python of a virtualenv with the TCK's requirements")
    parser.add_argument("--bindings", default=",".join(BINDINGS))
    parser.add_argument("--categories", default=",".join(CATEGORIES))
    parser.add_argument("--streaming-timeout", default="2.0",
                        help="TCK_STREAMING_TIMEOUT (seconds)")
    args = parser.parse_args()
    tck_dir = Path(args.tck_dir).resolve()
    bindings = [b for b in args.bindings.split(",") if b]
    categories = [c for c in args.categories.split(",") if c]
    for name in bindings:
        if name not in BINDINGS:
            parser.error(f"unknown binding {name!r} (one of {', '.join(BINDINGS)})")
    for name in categories:
        if name not in CATEGORIES:
            parser.error(f"unknown category {name!r} (one of {', '.join(CATEGORIES)})")
    tck_commit = subprocess.run(["git", "-C", str(tck_dir), "rev-parse", "HEAD"],
                                capture_output=True, text=True).stdout.strip()

    results: dict[str, dict] = {}
    with temp_dir("a2a-tck-") as tmp_name:
        tmp = Path(tmp_name)
        node = PlatformNode("node", tmp)
        admin, _registrar, caller = node.prepare()
        http_port, agent_grpc_port, node_grpc_port = free_port(), free_port(), free_port()
        agent_url = f"http://127.0.0.1:{http_port}"
        agent: Proc | None = None
        sut_host: SutHost | None = None

        def start_agent() -> Proc:
            env = clean_env(TCK_STREAMING_TIMEOUT=args.streaming_timeout)
            proc = Proc("agent", [PYTHON, "-m", "bench.tck_agent", "--http-port",
                                  str(http_port), "--grpc-port", str(agent_grpc_port)],
                        env, tmp).start()
            proc.wait_ready(f"{agent_url}/.well-known/agent-card.json")
            return proc

        try:
            agent = start_agent()
            node.serve("uvicorn", "--no-periodic", "--grpc-port", str(node_grpc_port))
            card = httpx.get(f"{agent_url}/.well-known/agent-card.json", timeout=10).json()
            registered = httpx.post(
                f"{node.url}/api/v1/agents", headers={"Authorization": f"Bearer {admin}"},
                json={"agent_id": AGENT_ID, "url": f"{agent_url}/", "card": card,
                      "max_concurrency": 1000, "ttl_seconds": 86_400}, timeout=30)
            registered.raise_for_status()
            gateway_auth = {"Authorization": f"Bearer {caller}", "tenant": AGENT_ID}
            served = httpx.get(f"{node.url}/a2a/{AGENT_ID}/.well-known/agent-card.json",
                               headers={"Authorization": f"Bearer {caller}"}, timeout=10)
            served.raise_for_status()
            sut_host = SutHost(served.content, f"{node.url}/a2a/{AGENT_ID}")
            for binding in bindings:
                for category in categories:
                    for target, url, auth in (
                            ("direct", agent_url, None),
                            ("gateway", sut_host.url, gateway_auth)):
                        agent.stop()
                        agent = start_agent()
                        report = tmp / f"{binding}-{category}-{target}.json"
                        figures = run_tck(tck_dir, args.tck_python, url, binding, category,
                                          report, auth, args.streaming_timeout)
                        results.setdefault(binding, {}).setdefault(category, {})[target] = \
                            figures
                        print(f"{binding:<8} {category:<13} {target:<8} "
                              f"passed {figures['passed']:>3}  failed {figures['failed']:>3}  "
                              f"errors {figures['errors']:>3}  skipped {figures['skipped']:>3}"
                              f"  ({figures['seconds']} s)", flush=True)
        finally:
            if sut_host is not None:
                sut_host.close()
            if node.proc is not None:
                node.proc.stop()
            if agent is not None:
                agent.stop()

    summary: dict[str, dict] = {}
    for binding, per_category in results.items():
        for category, runs in per_category.items():
            direct, gateway = runs["direct"]["outcomes"], runs["gateway"]["outcomes"]
            worse = sorted(test for test, outcome in gateway.items()
                           if outcome in ("failed", "error") and direct.get(test) == "passed")
            better = sorted(test for test, outcome in gateway.items()
                            if outcome == "passed" and direct.get(test) in ("failed", "error"))
            messages = runs["gateway"]["messages"]
            summary.setdefault(binding, {})[category] = {
                target: {k: v for k, v in runs[target].items()
                         if k not in ("outcomes", "messages")}
                for target in ("direct", "gateway")} | {
                "fail_through_gateway_only": {test: messages.get(test, "") for test in worse},
                "pass_through_gateway_only": better}
            for runs_target in runs.values():
                runs_target["failed_tests"] = sorted(
                    t for t, o in runs_target.pop("outcomes").items() if o in ("failed", "error"))
            summary[binding][category]["failed_direct"] = runs["direct"]["failed_tests"]
            summary[binding][category]["failed_gateway"] = runs["gateway"]["failed_tests"]
    path = write_results("tck", {"tck_commit": tck_commit, "categories": categories,
                                 "streaming_timeout": args.streaming_timeout,
                                 "results": summary})
    print(f"\nresults: {path}")
    for binding, per_category in summary.items():
        for category, figures in per_category.items():
            only = figures["fail_through_gateway_only"]
            print(f"{binding} {category}: {len(only)} test(s) fail through the gateway only")
            for test, why in only.items():
                print(f"    {test}: {why[:160]}")


if __name__ == "__main__":
    main()
