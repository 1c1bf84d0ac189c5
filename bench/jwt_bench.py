"""JWT benchmark: the gateway's hot path with JWT callers against API-key callers, same run.

One node (``manage.py serve --server uvicorn``, core 0) trusts a loopback OpenID Connect
provider (``tests/identity_provider.py``, in this process: discovery and a JWKS with an RS256
key made here) and proxies to the fast local agent (``bench/apps.py:upstream``, core 0 too);
``wrk`` on core 1 POSTs a 1 KiB JSON-RPC ``message/send`` to ``/a2a/{id}`` with either an API
key or an RS256 JWT (scope ``a2a.call``) in ``Authorization``. The arms alternate in
interleaved rounds (order rotating); the figure per arm is the median over rounds, and each
ratio the median of the per-round ratios (the two runs of a round are back to back):

* ``api-key`` / ``jwt``: the production setting (``A2A_AUTH_CACHE_SECONDS`` 10): a verified
  credential is answered from the token cache -- the claim to check is that a JWT caller costs
  what an API-key caller costs (goal: within 5 %).
* ``--tenant`` adds ``api-key-tenant`` / ``jwt-tenant``: the same agent registered in a second
  tenant (``acme``) on the same node, called at ``/a2a/t/acme/{id}`` by an ``acme`` API client
  and by a JWT whose ``org`` claim names ``acme`` -- tenancy's cost, and JWT against API key
  outside the default tenant.
* ``--uncached`` adds a second node with ``A2A_AUTH_CACHE_SECONDS=0`` (every call resolves its
  credential again): ``api-key-uncached`` looks the key up in the database each call,
  ``jwt-uncached`` verifies the signature each call (keys in memory, no provider wait). The
  worst case, not a setting anyone runs.

Reported per arm: req/s, wrk's p50/p99, the node's CPU µs per request (utime+stime from
``/proc``, node process only) and, at the end, how many times the node fetched the provider's
discovery document and JWKS (once each: verified tokens never wait on the provider).

    .venv/bin/python bench/jwt_bench.py --quick        # ~1 minute
    .venv/bin/python bench/jwt_bench.py [--uncached]   # 20 rounds x 2 s per arm and scenario
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.apps import CARD  # noqa: E402
from bench.common import (  # noqa: E402
    BENCH,
    LOAD_CORE,
    PlatformNode,
    Proc,
    cpu_seconds,
    free_port,
    keep_logs,
    median,
    pin_self_to_load_core,
    temp_dir,
    uvicorn_argv,
    write_results,
)
from tests.identity_provider import AUDIENCE, IdentityProvider, SigningKey  # noqa: E402

AGENT_ID = "bench-agent"
TENANT = "acme"
LUA = BENCH / "wrk_post.lua"
SCENARIOS = [("1KiB", 1024, 64), ("1KiB", 1024, 1)]


def rpc_body(size: int) -> bytes:
    def render(pad: str) -> bytes:
        return json.dumps({
            "jsonrpc": "2.0", "id": 1, "method": "message/send",
            "params": {"message": {"kind": "message", "role": "user", "messageId": "m-1",
                                   "parts": [{"kind": "text", "text": pad}]}},
        }, separators=(",", ":")).encode()

    return render("x" * max(0, size - len(render(""))))


def run_wrk(url: str, token: str, body_file: Path, conns: int, duration: int) -> dict:
    argv = ["taskset", "-c", str(LOAD_CORE), "wrk", "-t1", f"-c{conns}", f"-d{duration}s",
            "--latency", "--timeout", "10s", "-s", str(LUA),
            "-H", "Content-Type: application/json", "-H", f"Authorization: Bearer {token}", url]
    env = {**os.environ, "BENCH_BODY_FILE": str(body_file)}
    done = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=duration + 60)
    for line in done.stdout.splitlines():
        if line.startswith("BENCH_JSON "):
            return json.loads(line[len("BENCH_JSON "):])
    raise RuntimeError(f"wrk gave no result: {done.stdout}\n{done.stderr}")


def start_node(name: str, tmp: Path, upstream_url: str, issuers: list[dict],
               extra: dict[str, str], procs: list[Proc]) -> tuple[PlatformNode, Proc, str, str]:
    node = PlatformNode(name, tmp, extra_env={"A2A_JWT_ISSUERS": json.dumps(issuers), **extra})
    admin, _registrar, caller = node.prepare()
    proc = node.serve("uvicorn")
    procs.append(proc)
    card = {**json.loads(CARD), "url": f"{upstream_url}/"}
    response = httpx.post(f"{node.url}/api/v1/agents", timeout=30,
                          headers={"Authorization": f"Bearer {admin}"},
                          json={"agent_id": AGENT_ID, "url": f"{upstream_url}/", "card": card,
                                "max_concurrency": 100_000, "ttl_seconds": 86_400})
    if response.status_code not in (200, 201):
        raise RuntimeError(f"registration failed: {response.status_code} {response.text}")
    return node, proc, caller, admin


def add_tenant(node: PlatformNode, admin: str, upstream_url: str) -> str:
    """Create tenant ``acme``, an ``acme`` caller and the agent in ``acme``; its caller's key."""
    node.manage("tenants", "create", TENANT, "--name", "Bench tenant")
    out = node.manage("create_client", f"bench-acme-{os.urandom(3).hex()}", "--scopes", "call",
                      "--tenant", TENANT)
    card = {**json.loads(CARD), "url": f"{upstream_url}/"}
    response = httpx.post(f"{node.url}/api/v1/agents", timeout=30,
                          headers={"Authorization": f"Bearer {admin}"},
                          json={"agent_id": f"{TENANT}.{AGENT_ID}", "url": f"{upstream_url}/",
                                "card": card, "max_concurrency": 100_000,
                                "ttl_seconds": 86_400})
    if response.status_code not in (200, 201):
        raise RuntimeError(f"tenant registration failed: {response.status_code} "
                           f"{response.text}")
    return out.strip().splitlines()[-1].strip()


def paired(runs: dict[str, list[dict]], arm: str, reference: str, figure: str) -> float:
    """The median over rounds of ``arm``'s figure divided by ``reference``'s in that round."""
    pairs = zip(runs[arm], runs[reference], strict=True)
    return round(median([a[figure] / r[figure] for a, r in pairs]), 3)


def probe(url: str, token: str) -> None:
    response = httpx.post(url, content=rpc_body(1024), timeout=10,
                          headers={"Authorization": f"Bearer {token}",
                                   "Content-Type": "application/json"})
    if response.status_code != 200 or "result" not in response.json():
        raise RuntimeError(f"probe failed: {response.status_code} {response.text[:300]}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="3 rounds x 3 s")
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--duration", type=int, default=2, help="seconds per wrk run")
    parser.add_argument("--tenant", action="store_true",
                        help="also API-key and JWT callers of a second tenant's agent")
    parser.add_argument("--uncached", action="store_true",
                        help="also a node re-resolving every credential on every call")
    args = parser.parse_args()
    if args.quick:
        args.rounds, args.duration = 3, 3
    pin_self_to_load_core()
    provider = IdentityProvider(SigningKey("bench-rs256"))
    issuers = [{"issuer": provider.url, "audience": AUDIENCE, "name": "bench-idp",
                "claims": {"tenant": "org"}}]
    jwt_token = provider.token(scope="a2a.call", exp=int(time.time()) + 86_400)
    jwt_tenant = provider.token(scope="a2a.call", org=TENANT, exp=int(time.time()) + 86_400)
    procs: list[Proc] = []
    report: dict = {"args": vars(args), "jwt_bytes": len(jwt_token), "scenarios": {}}
    with temp_dir("jwt-bench") as tmp_name:
        tmp = Path(tmp_name)
        try:
            up_port = free_port()
            upstream_url = f"http://127.0.0.1:{up_port}"
            upstream = Proc("upstream", uvicorn_argv("bench.apps:upstream", up_port,
                                                     lifespan="off"), os.environ.copy(), tmp)
            upstream.start()
            procs.append(upstream)
            upstream.wait_ready(f"{upstream_url}/stats")
            arms: dict[str, tuple[str, str, int]] = {}  # name -> (url, token, node pid)
            node, proc, key, admin = start_node("jwt-node", tmp, upstream_url, issuers, {},
                                                procs)
            url = f"{node.url}/a2a/{AGENT_ID}"
            arms["api-key"] = (url, key, proc.pid)
            arms["jwt"] = (url, jwt_token, proc.pid)
            if args.tenant:
                tenant_key = add_tenant(node, admin, upstream_url)
                tenant_url = f"{node.url}/a2a/t/{TENANT}/{AGENT_ID}"
                arms["api-key-tenant"] = (tenant_url, tenant_key, proc.pid)
                arms["jwt-tenant"] = (tenant_url, jwt_tenant, proc.pid)
            if args.uncached:
                node2, proc2, key2, _ = start_node("jwt-node-uncached", tmp, upstream_url, issuers,
                                                {"A2A_AUTH_CACHE_SECONDS": "0"}, procs)
                url2 = f"{node2.url}/a2a/{AGENT_ID}"
                arms["api-key-uncached"] = (url2, key2, proc2.pid)
                arms["jwt-uncached"] = (url2, jwt_token, proc2.pid)
            for url, token, _ in arms.values():
                probe(url, token)
            names = list(arms)
            for label, size, conns in SCENARIOS:
                body_file = tmp / f"body-{size}.json"
                body_file.write_bytes(rpc_body(size))
                runs: dict[str, list[dict]] = {name: [] for name in names}
                for round_no in range(args.rounds):
                    order = names[round_no % len(names):] + names[:round_no % len(names)]
                    for name in order:
                        url, token, pid = arms[name]
                        cpu0 = cpu_seconds([pid])
                        result = run_wrk(url, token, body_file, conns, args.duration)
                        cpu = cpu_seconds([pid]) - cpu0
                        requests = result["requests"]
                        errors = sum(result["errors"].values())
                        runs[name].append({
                            "rps": requests / (result["duration_us"] / 1e6),
                            "p50_us": result["latency_us"]["p50"],
                            "p99_us": result["latency_us"]["p99"],
                            "cpu_us_per_request": cpu * 1e6 / requests if requests else None,
                            "errors": errors,
                        })
                summary = {}
                for name, samples in runs.items():
                    summary[name] = {
                        "rps": round(median([s["rps"] for s in samples])),
                        "p50_us": median([s["p50_us"] for s in samples]),
                        "p99_us": median([s["p99_us"] for s in samples]),
                        "cpu_us_per_request": round(median(
                            [s["cpu_us_per_request"] for s in samples
                             if s["cpu_us_per_request"] is not None]), 1),
                        "errors": sum(s["errors"] for s in samples),
                        "rounds": samples,
                    }
                ratios = {
                    # Paired: each round's JWT run against the same round's API-key run (run
                    # back to back), median over rounds -- the machine's load drifts between
                    # rounds far more than the two arms differ.
                    "jwt_over_api_key_rps": paired(runs, "jwt", "api-key", "rps"),
                    "jwt_over_api_key_cpu": paired(runs, "jwt", "api-key", "cpu_us_per_request"),
                    "jwt_over_api_key_rps_of_medians": round(
                        summary["jwt"]["rps"] / summary["api-key"]["rps"], 3),
                }
                if args.tenant:
                    ratios["jwt_tenant_over_api_key_tenant_rps"] = paired(
                        runs, "jwt-tenant", "api-key-tenant", "rps")
                    ratios["jwt_tenant_over_api_key_tenant_cpu"] = paired(
                        runs, "jwt-tenant", "api-key-tenant", "cpu_us_per_request")
                    ratios["api_key_tenant_over_api_key_rps"] = paired(
                        runs, "api-key-tenant", "api-key", "rps")
                if args.uncached:
                    ratios["jwt_uncached_over_api_key_rps"] = paired(
                        runs, "jwt-uncached", "api-key", "rps")
                    ratios["api_key_uncached_over_api_key_rps"] = paired(
                        runs, "api-key-uncached", "api-key", "rps")
                report["scenarios"][f"{label} c={conns}"] = {"arms": summary, "ratios": ratios}
        finally:
            for p in reversed(procs):
                p.stop()
            keep_logs(tmp, "jwt")
    report["identity_provider_requests"] = dict(provider.requests)
    provider.stop()
    print(f"{'scenario':<12} {'arm':<18} {'req/s':>8} {'p50 µs':>8} {'p99 µs':>8} "
          f"{'cpu µs/req':>10} {'errors':>6}")
    for scenario, data in report["scenarios"].items():
        for name, arm in data["arms"].items():
            print(f"{scenario:<12} {name:<18} {arm['rps']:>8} {arm['p50_us']:>8} "
                  f"{arm['p99_us']:>8} {arm['cpu_us_per_request']:>10} {arm['errors']:>6}")
        print(f"{scenario:<12} ratios: {data['ratios']}")
    print(f"identity provider requests: {report['identity_provider_requests']}")
    print(write_results("jwt", report))


if __name__ == "__main__":
    main()
