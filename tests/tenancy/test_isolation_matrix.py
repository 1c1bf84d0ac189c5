"""The tenant isolation matrix (docs/tenants.md, "What a refusal says"): callers of tenant
``acme`` (A) try every read, write, call, search, stream resume, push, admin and metrics path
against tenant ``beta``'s (B's) objects, with each kind of credential -- an API key made by the
platform's own service, a JWT whose tenant claim is ``acme`` (the loopback OIDC provider), an
``admin`` API key of acme, a tenant admin's console session (group ``tenant:acme``) and none
at all -- on one live node (module-scoped: one node, a2a-sdk agents for each tenant).

Each row asks about B's real object and about one that does not exist at all, and the two
answers must be one answer: status, headers (but ``Date``) and body, once the ids the caller
typed are set aside; the refusal is the documented one. Each answer is then searched for
everything of B's the caller did not type: its agents' internal URLs, its agent id, task,
stream, relay, push-config, snapshot and session ids, its client id. Lists, searches, catalogs
and console pages must not change while B has one more agent (counts exclude B). The same
probe against A's own object must succeed (a refusal is not a broken probe), and an agent B
shares with A becomes visible and callable -- without handing A B's relay secrets or streams.

Surfaces that do not exist are not probed: ``/api/v1`` has no clients, audit or statistics
endpoints (the console has them: its rows here), and a gRPC stream cannot be resumed
(docs/gateway.md), so gRPC's rows reach B's tasks through ``SubscribeToTask``.
"""

from __future__ import annotations

import os
import re
import uuid
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass, field
from typing import Any

import grpc
import httpx
import orjson
import pytest
from a2a.compat.v0_3 import a2a_v0_3_pb2 as pb03
from a2a.compat.v0_3 import a2a_v0_3_pb2_grpc as grpc03
from a2a.types import a2a_pb2
from a2a.types import a2a_pb2_grpc as grpc10
from django.core.management import call_command
from django.test import Client, override_settings

from tests.a2a_agents import EchoAgent, user_message
from tests.identity_provider import AUDIENCE, IdentityProvider, SigningKey
from tests.mcp_bridge.clients import all_tools, run
from tests.push.webhooks import Webhook
from tests.servers import flush_console_now, free_port, serve_app

#: A's callers: an API key (register, call), a JWT with the tenant claim ``acme``, and an
#: ``admin`` API key of acme (admin of its tenant only: no more of other tenants than a caller).
CREDS = ["apikey", "jwt", "admin"]
V10 = {"A2A-Version": "1.0"}
GHOST = "ghost"  # the agent that does not exist: as long as "vault", so answers keep lengths
#: Headers two answers about different objects may differ in without saying anything.
VOLATILE = {"date", "content-length"}
#: The agents each A credential registers (a JWT manages exactly its allowed-agents claim's).
OWNED = {"apikey": ["echo", "d-api-key", "d-kdr-key", "d-kdl-key"],
         "jwt": ["mine", "d-api-jwt", "d-kdr-jwt", "d-kdl-jwt"],
         "admin": ["echo", "d-api-adm", "d-kdr-adm", "d-kdl-adm"]}
FRESH = {"apikey": "fresh-key", "jwt": "fresh-jwt", "admin": "fresh-adm"}  # registered by a probe


@dataclass
class Answer:
    status: str
    headers: list[tuple[str, str]]
    body: str

    @classmethod
    def of(cls, r: httpx.Response) -> Answer:
        """The answer, with what is random per stream (a new stream's id, its events' ids)
        set aside: two streams' answers differ in those, whatever they are about."""
        headers = [(k, "<new stream>" if k == "x-a2a-stream-id" else v)
                   for k, v in r.headers.items() if k not in VOLATILE]
        body = re.sub(r"(?m)^id: \S+$", "id: <event>", r.text)
        return cls(str(r.status_code), headers, body)

    def text(self) -> str:
        return f"{self.status}\n{self.headers}\n{self.body}"


@dataclass
class World:
    base: str
    grpc: str
    tokens: dict[str, str]  # apikey, jwt (A), beta (B), platform
    own: dict[str, dict[str, str]]  # per credential kind: A's objects
    real: dict[str, str]  # B's objects
    secrets: dict[str, str]  # everything of B's that must never show unless typed
    admin_cookies: dict[str, str] = field(default_factory=dict)
    agents: dict[str, EchoAgent] = field(default_factory=dict)
    http: httpx.Client = field(default_factory=lambda: httpx.Client(timeout=20))


def _auth(token: str | None) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"} if token else {}


def _rpc(method: str, params: dict) -> dict:
    return {"jsonrpc": "2.0", "id": 7, "method": method, "params": params}


def _msg(text: str, **configuration: Any) -> dict:
    params: dict[str, Any] = {"message": {"role": "user", "messageId": "m-1", "kind": "message",
                                          "parts": [{"kind": "text", "text": text}]}}
    if configuration:
        params["configuration"] = configuration
    return params


def _relayed(agent: EchoAgent) -> dict:
    """The push config the agent got in its last ``message/send``: the relay's URL and secret."""
    sent = [r for r in agent.requests if r.rpc_method == "message/send"][-1]
    return orjson.loads(sent.body)["params"]["configuration"]["pushNotificationConfig"]


def _post_ok(http: httpx.Client, url: str, token: str, body: dict) -> httpx.Response:
    r = http.post(url, headers=_auth(token), json=body)
    assert r.status_code in (200, 201), r.text
    return r


# --- the node, the tenants, their agents and objects --------------------------------------------


@pytest.fixture(scope="module")
def world(django_db_setup, django_db_blocker):
    from ard import indexer
    from config.asgi import application
    from core import lifecycle
    from discovery.models import Alert, SessionPin, Snapshot
    from registry import services
    from registry.models import Agent

    with django_db_blocker.unblock(), ExitStack() as stack:
        idp = IdentityProvider(SigningKey("rsa-matrix"))
        stack.callback(idp.stop)
        hook = Webhook().start()
        stack.callback(hook.stop)
        agents = {name: stack.enter_context(EchoAgent(
            push=True, extended=True, steps=1, step_delay=0.05, name=title,
            interfaces=[("JSONRPC", "0.3"), ("JSONRPC", "1.0")]))
            for name, title in (("acme", "Echo Agent"), ("vault", "Vault Keeper"),
                                ("shared", "Shared Helper"))}
        port = free_port()
        base = f"http://127.0.0.1:{port}"
        stack.enter_context(override_settings(
            A2A_GRPC_PORT=0, A2A_SSE_RESUME_SECONDS=30, A2A_PUSH_RELAY=True,
            A2A_PUSH_DELIVERY="inprocess", A2A_PUSH_RELAY_BASE_URL=base,
            A2A_METRICS_REQUIRE_TOKEN=True, ARD_EMBED_DEFERRED=False,
            # Nothing moves by itself while the module runs: agents outlive it (a slow machine
            # included), and the console's statistics and audit rows are written when a test
            # says so (_flush), not every few seconds between two answers it compares.
            A2A_DEFAULT_TTL_SECONDS=3600, A2A_STATS_FLUSH_SECONDS=3600, A2A_AUDIT="all",
            ARD_SEMANTIC_SYNC_SECONDS=0,
            A2A_JWT_ISSUERS=[{"issuer": idp.url, "audience": AUDIENCE, "name": "matrix-idp",
                              "claims": {"tenant": "org", "allowed_agents": "agents"}}]))
        for slug in ("acme", "beta"):
            services.tenant_create(slug=slug)
        a_client, a_key = services.api_client_create(
            name="acme-app", scopes=["register", "call"], tenant="acme")
        b_client, b_key = services.api_client_create(
            name="beta-app", scopes=["register", "call"], tenant="beta")
        a_admin = services.api_client_create(name="acme-admin", scopes=["admin"],
                                             tenant="acme")[1]
        platform = services.api_client_create(name="platform-admin", scopes=["admin"])[1]
        jwt = idp.token(sub="ann", org="acme", scope="a2a.call a2a.register", agents=[
            *OWNED["jwt"], "echo", "fresh-jwt", "fresh-jwt-k", "beta.vault", f"beta.{GHOST}",
            "beta.shared", "beta.vault-two"])
        stack.enter_context(serve_app(application, port=port))
        http = httpx.Client(timeout=20)
        stack.callback(http.close)
        card = agents["acme"].card_document
        for cred, token in (("apikey", a_key), ("jwt", jwt), ("admin", a_admin)):
            for name in OWNED[cred][cred == "admin":]:
                _post_ok(http, f"{base}/api/v1/agents", token,
                         {"agent_id": name, "url": agents["acme"].url, "card": card})
        for name in ("vault", "shared"):
            _post_ok(http, f"{base}/api/v1/agents", b_key, {
                "agent_id": name, "url": agents[name].url, "card": agents[name].card_document})

        # Each tenant's task (with a relayed push config) and resumable stream.
        def task_and_stream(path: str, token: str, agent: EchoAgent, hook_name: str):
            sent = _post_ok(http, f"{base}{path}", token, _rpc("message/send", _msg(
                "task one", pushNotificationConfig={"url": hook.url(hook_name),
                                                    "token": f"{hook_name}-tok",
                                                    "id": f"{hook_name}-cfg"})))
            task = sent.json()["result"]["id"]
            return task, _relayed(agent), stream_of(path, token)

        def stream_of(path: str, token: str) -> str:
            """A finished stream of the caller's, resumable for the window."""
            stream = _post_ok(http, f"{base}{path}", token,
                              _rpc("message/stream", _msg("task two")))
            return stream.headers["x-a2a-stream-id"]

        b_task, b_relay, b_stream = task_and_stream(
            "/a2a/t/beta/vault", b_key, agents["vault"], "beta-hook-7f3a")
        a_task, a_relay, a_stream = task_and_stream(
            "/a2a/t/acme/echo", a_key, agents["acme"], "acme-hook-1c2d")
        own_streams = {"apikey": a_stream, "jwt": stream_of("/a2a/t/acme/echo", jwt),
                       "admin": stream_of("/a2a/t/acme/echo", a_admin)}
        # B's discovery snapshot and session pin (discovery's rows carry a tenant column).
        snapshot = Snapshot.objects.create(
            tenant_id="beta", version=918273645, digest=os.urandom(32).hex(), agent_count=1,
            agents=[{"local_name": "vault_keeper", "description": "beta's", "agent_id": "vault",
                     "card_sha256": "0" * 64}])
        session = SessionPin.objects.create(tenant_id="beta", session_id=f"beta-s-{uuid.uuid4()}",
                                            snapshot=snapshot, client_id=b_client.client_id)
        Alert.objects.create(tenant_id="beta", kind=Alert.Kind.CAP_REACHED, subject="snapshot",
                             message="the cap of 1 agents left out vault_keeper")
        real = {"vault_url": agents["vault"].url, "vault_card": agents["vault"].card_document,
                "task": b_task, "stream": b_stream, "relay": b_relay["url"].rsplit("/", 1)[1],
                "config": "beta-hook-7f3a-cfg", "digest": snapshot.digest,
                "session": session.session_id,
                "agent_pk": str(Agent.objects.get(tenant_id="beta", agent_id="vault").pk),
                "client_pk": str(b_client.pk)}
        own_common = {"task": a_task, "stream": a_stream,
                      "relay": a_relay["url"].rsplit("/", 1)[1], "secret": a_relay["token"],
                      "config": "acme-hook-1c2d-cfg"}
        world = World(
            base=base, grpc=f"127.0.0.1:{lifecycle.grpc_port()}",
            tokens={"apikey": a_key, "jwt": jwt, "admin": a_admin, "beta": b_key,
                    "platform": platform},
            own={cred: {**own_common, "manage": OWNED[cred][0], "stream": own_streams[cred],
                        "fresh": FRESH[cred],
                        "d-api": OWNED[cred][1], "d-kdr": OWNED[cred][2],
                        "d-kdl": OWNED[cred][3]} for cred in CREDS},
            real=real,
            secrets={"vault url": agents["vault"].base_url.split("//")[1],
                     "vault grpc": agents["vault"].grpc_address,
                     "shared url": agents["shared"].base_url.split("//")[1],
                     "vault": "vault", "Vault Keeper": "Vault Keeper",
                     "beta client": b_client.client_id, "beta webhook": "beta-hook-7f3a",
                     "snapshot version": "918273645", **{k: v for k, v in real.items()
                                                         if k not in ("agent_pk", "client_pk",
                                                                      "vault_url", "vault_card")}},
            http=http, agents=agents)
        world.admin_cookies = _tenant_admin_session()
        flush_console_now()  # the registrations' audit rows, the calls' statistics
        try:
            yield world
        finally:
            stack.close()
            indexer.settle_deferred()
            call_command("flush", interactive=False, verbosity=0)


def _tenant_admin_session() -> dict[str, str]:
    """A staff user in the group ``tenant:acme`` with the console's model permissions, logged
    in: its session cookie, for the live node."""
    from django.contrib.auth.models import Group, Permission, User

    group = Group.objects.create(name="tenant:acme")
    group.permissions.set(Permission.objects.filter(
        content_type__app_label__in=["registry", "console", "push", "discovery"]))
    user = User.objects.create_user("ann-admin", password="x", is_staff=True)
    user.groups.add(group)
    client = Client()
    client.force_login(user)
    return {name: morsel.value for name, morsel in client.cookies.items()}


@pytest.fixture(autouse=True)
def db(world):
    """Overrides pytest-django's ``db`` for this module: its tests share the rows ``world``
    committed (flushed once, when the module ends) instead of a transaction per test, which
    would hold SQLite's write lock against the node's own writes. Named ``db`` because that
    name is how pytest-django knows the module needs the test database set up."""
    return world


@pytest.fixture(autouse=True)
def _open_metrics():
    """This module keeps ``/metrics`` behind its token (conftest opens it for other tests)."""


# --- targets: B's real object, one that does not exist, A's own --------------------------------


def _target(w: World, which: str, cred: str) -> dict[str, str]:
    """What a probe names. ``real``: B's objects; ``ghost``: ids nothing has (same lengths);
    ``own``: A's; ``*-via-own``: B's (or ghost) task and stream ids through A's own agent."""
    if which in ("real", "ghost"):
        name = "vault" if which == "real" else GHOST
        t = {"key": f"beta.{name}", "path": f"/a2a/t/beta/{name}", "name": name,
             "manage": f"beta.{name}", "fresh": f"beta.{name}", "d-api": f"beta.{name}",
             "d-kdr": f"beta.{name}", "d-kdl": f"beta.{name}", "mcp": f"beta.{name}"}
        if which == "real":
            return {**t, **w.real, "secret": w.own[cred]["secret"]}
        return {**t, "task": str(uuid.uuid4()), "stream": _like(w.real["stream"]),
                "relay": os.urandom(len(w.real["relay"]) // 2).hex(),
                "config": "beta-hook-0000-cfg", "digest": os.urandom(32).hex(),
                "session": f"beta-s-{uuid.uuid4()}", "secret": w.own[cred]["secret"],
                "agent_pk": str(int(w.real["agent_pk"]) + 9000),
                "client_pk": _scrambled(w.real["client_pk"])}
    own = {**w.own[cred], "key": "acme.echo", "path": "/a2a/t/acme/echo", "name": "echo",
           "mcp": "acme.echo"}
    if which == "own":
        return own
    source = _target(w, which.split("-")[0], cred)
    return {**own, "task": source["task"], "stream": source["stream"],
            "config": source["config"]}


def _like(stream_id: str) -> str:
    """A stream id of the same form and length as ``stream_id`` that no stream has."""
    prefix, _, token = stream_id.rpartition(".")
    fresh = os.urandom(len(token)).hex()[:len(token)]
    return f"{prefix}.{fresh}" if prefix else fresh


def _scrambled(value: str) -> str:
    """A string of ``value``'s form (its punctuation, its length) that names nothing."""
    fresh = iter(os.urandom(len(value)).hex())
    return "".join(next(fresh) if c.isalnum() else c for c in value)


def _typed(t: dict[str, str], uses: tuple[str, ...]) -> list[str]:
    """The strings of ``t`` a probe using ``uses`` put in its request, longest first."""
    out: list[str] = []
    for key in uses:
        out.append(t[key])
        if key in ("path", "key", "manage", "fresh", "d-api", "d-kdr", "d-kdl", "mcp"):
            out += [t["key"], t["path"], t["name"], t["key"].replace(".", "/")]
    return sorted(set(out), key=len, reverse=True)


def _normal(answer: Answer, typed: list[str]) -> str:
    text = answer.text()
    for value in typed:
        text = text.replace(value, "<TYPED>")
    return text


def _no_leak(w: World, text: str, besides: tuple[str, ...] = ()) -> None:
    for what, secret in w.secrets.items():
        if what in besides:
            continue
        assert secret not in text, f"{what} ({secret}) shows in an answer to acme:\n{text}"


# --- the probes -----------------------------------------------------------------------------


@dataclass
class Probe:
    name: str
    run: Callable[[World, dict[str, str], str], Answer]
    uses: tuple[str, ...]
    ok: Callable[[Answer], bool] | None  # A's own object: the probe works (None: no control)
    via_own: bool = False  # also B's task/stream ids through A's own agent


def _http(method: str, path: Callable[[dict], str], *,
          body: Callable[[dict], Any] | None = None, headers: dict[str, str] | None = None):
    def run(w: World, t: dict, cred: str) -> Answer:
        sent = {**(headers or {}), **_auth(w.tokens[cred])}
        r = w.http.request(method, f"{w.base}{path(t)}", headers=sent,
                           json=None if body is None else body(t))
        return Answer.of(r)
    return run


def _status(*codes: int) -> Callable[[Answer], bool]:
    return lambda a: int(a.status) in codes


def _reached(a: Answer) -> bool:
    """The gateway handed the call to the agent (whatever the agent answered)."""
    return ("x-a2a-executed", "true") in a.headers


PUSH_CFG = {"url": "https://hooks.example.com/acme", "id": "probe-cfg"}


def _api_probes() -> list[Probe]:
    api = "/api/v1/agents"
    return [
        Probe("api get", _http("GET", lambda t: f"{api}/{t['manage']}"), ("manage",),
              _status(200)),
        Probe("api card", _http("GET", lambda t: f"{api}/{t['manage']}/card"), ("manage",),
              _status(200)),
        Probe("api patch", _http("PATCH", lambda t: f"{api}/{t['manage']}",
                                 body=lambda t: {"ttl_seconds": 3600}), ("manage",),
              _status(200)),
        Probe("api heartbeat", _http("POST", lambda t: f"{api}/{t['manage']}/heartbeat"),
              ("manage",), _status(200)),
        Probe("api delete", _http("DELETE", lambda t: f"{api}/{t['d-api']}"), ("d-api",),
              _status(204)),
        Probe("api register", _http("POST", lambda t: api, body=lambda t: {
            "agent_id": t["fresh"], "url": "http://127.0.0.1:9/rpc",
            "card": {"name": "x", "url": "http://127.0.0.1:9/rpc"}}), ("fresh",),
            _status(201)),
        Probe("api search", _http("GET", lambda t: f"{api}?q={t['name']}"), ("name",),
              lambda a: a.status == "200" and '"count":0' not in a.body.replace(" ", "")),
        Probe("snapshot by digest", _http("GET", lambda t: f"/api/v1/snapshots/{t['digest']}"),
              ("digest",), None),
        Probe("session get", _http("GET", lambda t: f"/api/v1/sessions/{t['session']}"),
              ("session",), None),
        Probe("session delete", _http("DELETE", lambda t: f"/api/v1/sessions/{t['session']}"),
              ("session",), None),
        Probe("session pin", _http("POST", lambda t: "/api/v1/sessions",
                                   body=lambda t: {"session_id": t["session"]}),
              ("session",), None),
        Probe("api register kubemq", _http("POST", lambda t: "/agents/register", body=lambda t: {
            "agent_id": t["fresh"] + "-k" if t["fresh"].startswith("fresh") else t["fresh"],
            "name": "x", "url": "http://127.0.0.1:9/rpc"}),
            ("fresh",), _status(200, 201)),
        Probe("kubemq get", _http("GET", lambda t: f"/agents/{t['manage']}"), ("manage",),
              _status(200)),
        Probe("kubemq heartbeat", _http("POST", lambda t: "/agents/heartbeat",
                                        body=lambda t: {"agent_id": t["manage"]}),
              ("manage",), _status(200)),
        Probe("kubemq deregister", _http("POST", lambda t: "/agents/deregister",
                                         body=lambda t: {"agent_id": t["d-kdr"]}),
              ("d-kdr",), _status(200, 204)),
        Probe("kubemq delete", _http("DELETE", lambda t: f"/agents/{t['d-kdl']}"), ("d-kdl",),
              _status(200, 204)),
        Probe("kubemq stream", _http("GET", lambda t: f"{t['path']}/stream"), ("path",),
              _reached),
    ]


def _rpc_probes() -> list[Probe]:
    def rpc(method: str, params: Callable[[dict], dict], uses=("path", "task"), via=True):
        return Probe(f"jsonrpc {method}", _http("POST", lambda t: t["path"],
                                                body=lambda t: _rpc(method, params(t))),
                     uses, _reached, via_own=via)
    return [
        rpc("message/send", lambda t: _msg("hi"), ("path",), False),
        rpc("message/stream", lambda t: _msg("hi"), ("path",), False),
        rpc("tasks/get", lambda t: {"id": t["task"]}),
        rpc("tasks/cancel", lambda t: {"id": t["task"]}),
        rpc("tasks/resubscribe", lambda t: {"id": t["task"]}),
        rpc("tasks/pushNotificationConfig/set", lambda t: {
            "taskId": t["task"], "pushNotificationConfig": PUSH_CFG}),
        rpc("tasks/pushNotificationConfig/get", lambda t: {
            "id": t["task"], "pushNotificationConfigId": t["config"]},
            ("path", "task", "config")),
        rpc("tasks/pushNotificationConfig/list", lambda t: {"id": t["task"]}),
        rpc("tasks/pushNotificationConfig/delete", lambda t: {
            "id": t["task"], "pushNotificationConfigId": t["config"]},
            ("path", "task", "config")),
    ]


def _rest_probes() -> list[Probe]:
    def rest(name: str, method: str, route: Callable[[dict], str], body=None,
             uses=("path", "task"), via=True, ok=_reached):
        return Probe(f"http+json {name}", _http(
            method, lambda t: f"{t['path']}/{route(t)}", body=body, headers=V10), uses, ok,
            via_own=via)
    message = {"message": {"role": "ROLE_USER", "messageId": "m-2", "parts": [{"text": "hi"}]}}
    config = {"url": PUSH_CFG["url"], "id": "probe-cfg"}
    return [
        rest("message:send", "POST", lambda t: "message:send", lambda t: message, ("path",),
             False),
        rest("message:stream", "POST", lambda t: "message:stream", lambda t: message,
             ("path",), False),
        rest("tasks get", "GET", lambda t: f"tasks/{t['task']}"),
        rest("tasks list", "GET", lambda t: "tasks", uses=("path",), via=False),
        rest("tasks cancel", "POST", lambda t: f"tasks/{t['task']}:cancel", lambda t: {}),
        rest("tasks subscribe", "GET", lambda t: f"tasks/{t['task']}:subscribe"),
        rest("push create", "POST", lambda t: f"tasks/{t['task']}/pushNotificationConfigs",
             lambda t: {**config, "taskId": t["task"]}),
        rest("push list", "GET", lambda t: f"tasks/{t['task']}/pushNotificationConfigs"),
        rest("push get", "GET",
             lambda t: f"tasks/{t['task']}/pushNotificationConfigs/{t['config']}",
             uses=("path", "task", "config")),
        rest("push delete", "DELETE",
             lambda t: f"tasks/{t['task']}/pushNotificationConfigs/{t['config']}",
             uses=("path", "task", "config")),
        rest("agent card", "GET", lambda t: ".well-known/agent-card.json", uses=("path",),
             via=False, ok=_status(200)),
        rest("extended card", "GET", lambda t: "extendedAgentCard", uses=("path",), via=False),
        rest("0.3 v1/card", "GET", lambda t: "v1/card", uses=("path",), via=False),
        rest("0.3 v1/tasks get", "GET", lambda t: f"v1/tasks/{t['task']}"),
        rest("0.3 v1/message:send", "POST", lambda t: "v1/message:send", lambda t: {
            "message": {"role": "user", "messageId": "m-3", "parts": [{"text": "hi"}]}},
            ("path",), False),
        Probe("stream resume", _http(
            "GET", lambda t: f"{t['path']}/stream/{t['stream']}?last_event_id=1"),
            ("path", "stream"), lambda a: a.status == "200" and "event-stream" in str(a.headers),
            via_own=True),
    ]


def _grpc_run(method: str, request: Callable[[dict], Any], streaming: bool = False,
              version: str = "1.0"):
    """A call of the gateway's gRPC listener: the 1.0 service (the agent in the request's
    ``tenant``) or the 0.3 one (in the ``tenant`` metadata entry)."""
    def run(w: World, t: dict, cred: str) -> Answer:
        with grpc.insecure_channel(w.grpc) as channel:
            stub = grpc03.A2AServiceStub(channel) if version == "0.3" else \
                grpc10.A2AServiceStub(channel)
            call = getattr(stub, method)
            meta: tuple[tuple[str, str], ...] = (
                ("authorization", f"Bearer {w.tokens[cred]}"),)
            if version == "0.3":
                meta += (("tenant", t["key"]),)
            try:
                reply = call(request(t), metadata=meta, timeout=15)
                replies = list(reply) if streaming else [reply]
            except grpc.RpcError as error:
                trailers = sorted((k, v.decode("latin-1") if isinstance(v, bytes) else v)
                                  for k, v in error.trailing_metadata() or ())
                return Answer(error.code().name, trailers, error.details() or "")
            return Answer("OK", [], "\n".join(str(r) for r in replies))
    return run


def _grpc_probes() -> list[Probe]:
    def probe(method: str, request: Callable[[dict], Any], streaming: bool = False,
              uses=("key", "task")):
        return Probe(f"grpc {method}", _grpc_run(method, request, streaming), uses,
                     lambda a: a.status == "OK" or "x-a2a-executed', 'true" in str(a.headers),
                     via_own=uses != ("key",))

    def send(t: dict) -> a2a_pb2.SendMessageRequest:
        request = user_message("hi")
        request.tenant = t["key"]
        return request
    p = a2a_pb2
    return [
        probe("SendMessage", send, uses=("key",)),
        probe("SendStreamingMessage", send, True, uses=("key",)),
        probe("GetTask", lambda t: p.GetTaskRequest(tenant=t["key"], id=t["task"])),
        probe("ListTasks", lambda t: p.ListTasksRequest(tenant=t["key"]), uses=("key",)),
        probe("CancelTask", lambda t: p.CancelTaskRequest(tenant=t["key"], id=t["task"])),
        probe("SubscribeToTask", lambda t: p.SubscribeToTaskRequest(
            tenant=t["key"], id=t["task"]), True),
        probe("CreateTaskPushNotificationConfig", lambda t: p.TaskPushNotificationConfig(
            tenant=t["key"], task_id=t["task"], id="probe-cfg", url=PUSH_CFG["url"])),
        probe("GetTaskPushNotificationConfig", lambda t: p.GetTaskPushNotificationConfigRequest(
            tenant=t["key"], task_id=t["task"], id=t["config"]), uses=("key", "task", "config")),
        probe("ListTaskPushNotificationConfigs", lambda t: (
            p.ListTaskPushNotificationConfigsRequest(tenant=t["key"], task_id=t["task"]))),
        probe("DeleteTaskPushNotificationConfig", lambda t: (
            p.DeleteTaskPushNotificationConfigRequest(
                tenant=t["key"], task_id=t["task"], id=t["config"])),
            uses=("key", "task", "config")),
        probe("GetExtendedAgentCard", lambda t: p.GetExtendedAgentCardRequest(tenant=t["key"]),
              uses=("key",)),
        Probe("grpc 0.3 SendMessage", _grpc_run("SendMessage", lambda t: pb03.SendMessageRequest(
            request=pb03.Message(message_id="m-1", role=pb03.ROLE_USER,
                                 content=[pb03.Part(text="hi")])), version="0.3"),
            ("key",), lambda a: a.status == "OK"),
        Probe("grpc 0.3 GetTask", _grpc_run("GetTask", lambda t: pb03.GetTaskRequest(
            name=f"tasks/{t['task']}"), version="0.3"), ("key", "task"),
            lambda a: a.status == "OK", via_own=True),
    ]


def _mcp_call(w: World, t: dict, cred: str) -> Answer:
    from mcp.shared.exceptions import MCPError

    async def call(client) -> Answer:
        try:
            result = await client.call_tool(t["mcp"], {"message": "hi"})
        except MCPError as error:
            return Answer(f"mcp error {error.code}", [], f"{error}")
        return Answer("error" if result.is_error else "ok", [],
                      str([getattr(c, "text", c) for c in result.content]))
    return run(w.base, w.tokens[cred], call)


#: What the refusal of B's object is (docs/tenants.md), by probe name prefix: every string
#: must be in the answer (the ids typed set aside). Snapshots and sessions are per tenant: B's
#: snapshot is an unknown digest to A, and B's session id names a new session of A's own tenant
#: (which has no snapshot here) -- B's and a nonexistent one's are one answer.
REFUSALS = [("api register", ("403", "tenant", "beta")), ("api search", ("200", '"count":0')),
            ("api ", ("404", "agent not found")), ("kubemq heartbeat", ("400",)),
            ("kubemq stream", ("agent_not_found",)), ("kubemq ", ("404",)),
            ("jsonrpc ", ("agent_not_found", "-32050")),
            ("http+json agent card", ("404", "agent_not_found")),
            ("http+json ", ("404", "NOT_FOUND", "agent_not_found")),
            ("stream resume", ("agent_not_found",)), ("grpc ", ("NOT_FOUND", "agent_not_found")),
            ("mcp tools/list ?snapshot=", ("-32602", "snapshot not found")),
            ("mcp tools/list ?session=", ("-32602", "no discovery snapshot")),
            ("mcp ", ("unknown tool",))]


def _refusal(name: str) -> tuple[str, ...]:
    return next((want for prefix, want in REFUSALS if name.startswith(prefix)), ())


def _mcp_pinned(kind: str) -> Callable[[World, dict, str], Answer]:
    """tools/list at ``/mcp?snapshot=<digest>`` or ``/mcp?session=<id>`` (docs/mcp.md)."""
    def ask(w: World, t: dict, cred: str) -> Answer:
        from mcp.shared.exceptions import MCPError

        async def tools(client) -> Answer:
            try:
                listed = await all_tools(client)
            except MCPError as error:
                return Answer(f"mcp error {error.code}", [], f"{error}")
            return Answer("ok", [], str(sorted(tool.name for tool in listed)))
        value = t["digest" if kind == "snapshot" else "session"]
        return run(w.base, w.tokens[cred], tools, path=f"/mcp?{kind}={value}")
    return ask


PROBES = [*_api_probes(), *_rpc_probes(), *_rest_probes(), *_grpc_probes(),
          Probe("mcp tools/call", _mcp_call, ("mcp",), lambda a: a.status == "ok"),
          Probe("mcp tools/list ?snapshot=", _mcp_pinned("snapshot"), ("digest",), None),
          Probe("mcp tools/list ?session=", _mcp_pinned("session"), ("session",), None)]
PAIRS = [pytest.param(p, cred, "real", id=f"{p.name}-{cred}") for p in PROBES for cred in CREDS]
PAIRS += [pytest.param(p, cred, "via-own", id=f"{p.name}-via-own-agent-{cred}")
          for p in PROBES if p.via_own for cred in CREDS]


@pytest.mark.parametrize("probe,cred,which", PAIRS)
def test_beta_object_is_answered_as_one_that_does_not_exist(world, probe, cred, which):
    """A's question about B's object and about a nonexistent one: one answer, nothing of B's
    in it; the same question about A's own object works."""
    real_t = _target(world, "real" if which == "real" else "real-via-own", cred)
    ghost_t = _target(world, "ghost" if which == "real" else "ghost-via-own", cred)
    answer = probe.run(world, real_t, cred)
    real = _normal(answer, _typed(real_t, probe.uses))
    ghost = _normal(probe.run(world, ghost_t, cred), _typed(ghost_t, probe.uses))
    assert real == ghost
    _no_leak(world, real)
    wanted = _refusal(probe.name) if which == "real" else (
        ("404", "stream_not_found") if probe.name == "stream resume" else ())
    assert all(w in real or w in real.replace(" ", "") for w in wanted), (wanted, real)
    if probe.name.startswith("api register"):  # names the tenant, not the agent
        assert "vault" not in answer.body, answer.body
    if probe.ok is not None and which == "real":
        own = probe.run(world, _target(world, "own", cred), cred)
        assert probe.ok(own), own.text()


# --- lists, searches, catalogs: B's private agents absent, counts A's -------------------------


def _ard_search(w: World, cred: str) -> httpx.Response:
    return w.http.post(f"{w.base}/ard/v1/search", headers=_auth(w.tokens[cred]),
                       json={"query": {"text": "vault keeper echo"}, "pageSize": 50})


def _mcp_tools(w: World, cred: str) -> httpx.Response:
    tools = run(w.base, w.tokens[cred], all_tools)
    return httpx.Response(200, json={"tools": sorted(t.name for t in tools)})


LISTS: dict[str, Callable[[World, str], httpx.Response]] = {
    "api list": lambda w, c: w.http.get(f"{w.base}/api/v1/agents?limit=500",
                                        headers=_auth(w.tokens[c])),
    "api list q": lambda w, c: w.http.get(f"{w.base}/api/v1/agents?q=vault",
                                          headers=_auth(w.tokens[c])),
    "kubemq list": lambda w, c: w.http.get(f"{w.base}/agents?limit=500",
                                           headers=_auth(w.tokens[c])),
    "ard search": _ard_search,
    "ard agents": lambda w, c: w.http.get(f"{w.base}/ard/v1/agents?pageSize=100",
                                          headers=_auth(w.tokens[c])),
    "ard explore": lambda w, c: w.http.post(
        f"{w.base}/ard/v1/explore", headers=_auth(w.tokens[c]), json={
            "query": {"text": "vault keeper echo"},
            "resultType": {"facets": [{"field": "type"}, {"field": "publisher"},
                                      {"field": "tags"}]}}),
    "ai-catalog": lambda w, c: w.http.get(f"{w.base}/.well-known/ai-catalog.json",
                                          headers=_auth(w.tokens[c])),
    "snapshot current": lambda w, c: w.http.get(f"{w.base}/api/v1/snapshots/current",
                                                headers=_auth(w.tokens[c])),
    "mcp tools/list": _mcp_tools,
}


def _count(payload: Any) -> int | None:
    """The count an answer states about its whole result, if it states one."""
    if isinstance(payload, dict):
        for key in ("count", "total", "totalCount", "totalSize"):
            if isinstance(payload.get(key), int):
                return payload[key]
    return None


@pytest.mark.parametrize("cred", CREDS)
@pytest.mark.parametrize("what", list(LISTS))
def test_lists_and_searches_show_nothing_of_beta(world, what, cred):
    """B's private agents are absent, and counted nowhere: A's answer is the same before and
    after B registers one more (which matches every query here)."""
    before = Answer.of(LISTS[what](world, cred))
    r = _with_another_beta_agent(world, lambda: LISTS[what](world, cred))
    assert Answer.of(r) == before
    _no_leak(world, Answer.of(r).text())
    if what == "snapshot current":
        assert r.status_code in (403, 404), r.text  # discovery's own rows; B's never shown
        return
    assert r.status_code == 200, r.text
    text = r.text
    mine = "echo" in text or "mine" in text  # A's own agents are listed (a working probe)
    assert mine or what in ("api list q",), text
    # Every entry is A's or one published to A; a stated total counts only those.
    entries = _entries(r.json())
    if what != "api list q":
        assert entries, text
    assert all("beta" not in orjson.dumps(e).decode() or "beta.shared" in orjson.dumps(e).decode()
               or "/a2a/t/beta/shared/" in orjson.dumps(e).decode() for e in entries), text
    total = _count(r.json())
    if total is not None and what != "ard explore":
        assert total == len(entries), text


def _with_another_beta_agent(world: World, ask: Callable[[], Any], *,
                             traffic: bool = False) -> Any:
    """``ask()`` while B has one more private agent, ``vault-two`` (the vault's card: it
    matches every query of this module); ``traffic``: B has called it too, and the console's
    statistics and audit rows of it all are written."""
    body = {"agent_id": "vault-two", "url": world.real["vault_url"],
            "card": world.real["vault_card"]}
    added = world.http.post(f"{world.base}/api/v1/agents", headers=_auth(world.tokens["beta"]),
                            json=body)
    assert added.status_code == 201, added.text
    try:
        if traffic:
            from console.models import AgentMinute, CallRecord, RegistryChange

            _post_ok(world.http, f"{world.base}/a2a/t/beta/vault-two", world.tokens["beta"],
                     _rpc("message/send", _msg("hi")))
            flush_console_now()
            for model in (AgentMinute, CallRecord, RegistryChange):  # B's rows, to be left out
                assert model.objects.filter(agent_id="beta.vault-two").exists(), model
        return ask()
    finally:
        gone = world.http.delete(f"{world.base}/api/v1/agents/vault-two",
                                 headers=_auth(world.tokens["beta"]))
        assert gone.status_code == 204, gone.text


def _entries(payload: Any) -> list:
    if isinstance(payload, list):
        return payload
    if payload.get("resultType") == "facets":
        return [payload]
    for key in ("results", "items", "agents", "tools", "entries", "records"):
        if isinstance(payload.get(key), list):
            return payload[key]
    raise AssertionError(f"no entries in {payload}")


# --- push ingress: B's relay id with A's secret, or none ---------------------------------------


PUSH_BODY = {"kind": "task", "status": {"state": "working"}}


@pytest.mark.parametrize("secret", [True, False], ids=["acme-secret", "no-secret"])
def test_push_ingress_refuses_beta_relay_as_unknown(world, secret):
    def push(t: dict) -> Answer:
        headers = {"X-A2A-Notification-Token": t["secret"]} if secret else {}
        r = world.http.post(f"{world.base}/push/{t['relay']}", headers=headers,
                            json={**PUSH_BODY, "id": t["task"]})
        return Answer.of(r)
    real_t, ghost_t = _target(world, "real", "apikey"), _target(world, "ghost", "apikey")
    real = _normal(push(real_t), [real_t["relay"], real_t["task"]])
    assert real == _normal(push(ghost_t), [ghost_t["relay"], ghost_t["task"]])
    assert real.startswith("401"), real
    _no_leak(world, real)
    if secret:  # A's own relay takes A's own push
        own = push(_target(world, "own", "apikey"))
        assert own.status == "202", own.text()


# --- /metrics: platform admins only, the same refusal whoever asks ------------------------------


@pytest.mark.parametrize("cred", CREDS)
def test_metrics_refuse_tenant_callers_alike(world, cred):
    r = world.http.get(f"{world.base}/metrics", headers=_auth(world.tokens[cred]))
    anonymous = world.http.get(f"{world.base}/metrics")
    assert r.status_code == 401, r.text
    assert Answer.of(r) == Answer.of(anonymous)
    _no_leak(world, Answer.of(r).text())
    platform = world.http.get(f"{world.base}/metrics", headers=_auth(world.tokens["platform"]))
    assert platform.status_code == 200 and "beta.vault" in platform.text  # control: B exists


# --- the console: a tenant admin of A -----------------------------------------------------------


def _audit_pk(world: World, tenant: str, model: str = "RegistryChange",
              app: str = "console") -> str:
    """The first of ``tenant``'s rows of ``app``'s ``model`` (audit rows, discovery's)."""
    from django.apps import apps

    rows = apps.get_model(app, model).objects.filter(tenant=tenant)
    return str(rows.values_list("pk", flat=True)[0])


def _delivery_pk(world: World, agent_key: str, relay: str) -> str:
    from push.models import PushDelivery, RelayedConfig

    config = RelayedConfig.objects.get(pk=relay)
    delivery, _ = PushDelivery.objects.get_or_create(
        config=config, sequence=1, defaults={"agent_id": agent_key, "task_id": config.task_id,
                                             "body": b"{}", "idempotency_key": f"{relay}.1"})
    return str(delivery.pk)


ADMIN_PAGES = {
    "agent page": lambda w, t: f"/admin/registry/agent/{t['agent_pk']}/change/",
    "agent by id": lambda w, t: f"/admin/registry/agent/id/{t['key']}/",
    "agent card diff": lambda w, t: f"/admin/registry/agent/{t['agent_pk']}/card-diff/",
    "agent history": lambda w, t: f"/admin/registry/agent/{t['agent_pk']}/history/",
    "agent delete": lambda w, t: f"/admin/registry/agent/{t['agent_pk']}/delete/",
    "agent test message": lambda w, t: f"/admin/registry/agent/{t['agent_pk']}/test-message/",
    "agent refresh card": lambda w, t: f"/admin/registry/agent/{t['agent_pk']}/refresh-card/",
    "agent extend ttl": lambda w, t: f"/admin/registry/agent/{t['agent_pk']}/extend-ttl/",
    "client history": lambda w, t: f"/admin/registry/apiclient/{t['client_pk']}/history/",
    "client page": lambda w, t: f"/admin/registry/apiclient/{t['client_pk']}/change/",
    "registry audit row": lambda w, t: f"/admin/console/registrychange/{t['audit_pk']}/change/",
    "call audit row": lambda w, t: f"/admin/console/callrecord/{t['call_pk']}/change/",
    "push delivery page": lambda w, t: f"/admin/push/pushdelivery/{t['delivery_pk']}/change/",
    "relayed config page": lambda w, t: f"/admin/push/relayedconfig/{t['relay']}/change/",
    "snapshot page": lambda w, t: f"/admin/discovery/snapshot/{t['snapshot_pk']}/change/",
    "session pin page": lambda w, t: f"/admin/discovery/sessionpin/{t['pin_pk']}/change/",
    "discovery alert page": lambda w, t: f"/admin/discovery/alert/{t['alert_pk']}/change/",
}
#: Discovery's rows of a tenant the console shows its admins: the target key of each.
DISCOVERY_ROWS = {"snapshot_pk": "Snapshot", "pin_pk": "SessionPin", "alert_pk": "Alert"}


@pytest.fixture
def acme_discovery_rows(world):
    """A's own snapshot, session pin and alert, for the console's control probes; removed
    after the test (a current snapshot of A's would change how A's session probes answer)."""
    from discovery.models import Alert, SessionPin, Snapshot

    snapshot = Snapshot.objects.create(tenant_id="acme", version=1, digest=os.urandom(32).hex())
    SessionPin.objects.create(tenant_id="acme", session_id="acme-s-1", snapshot=snapshot)
    alert = Alert.objects.create(tenant_id="acme", kind=Alert.Kind.CAP_REACHED,
                                 subject="snapshot",
                                 message="the cap of 1 agents left out acme_two")
    yield
    alert.delete()
    snapshot.pins.all().delete()
    snapshot.delete()


def _admin_get(world: World, path: str) -> Answer:
    r = world.http.get(f"{world.base}{path}", cookies=world.admin_cookies)
    answer = Answer.of(r)
    # A page's CSRF token is per request, not per object.
    answer.body = re.sub(r'csrfmiddlewaretoken" value="[^"]+"', "csrf", answer.body)
    # Ages ("8 s ago") move with the clock (their datetime stays); a client's "last gateway
    # call" is A's own traffic, written behind it.
    answer.body = re.sub(r'(<time class="console-ago"[^>]*>)[^<]*', r"\1", answer.body)
    answer.body = re.sub(r'<td class="field-last_used">.*?</td>', "", answer.body)
    answer.headers = [(k, v) for k, v in answer.headers
                      if k not in ("set-cookie", "vary", "expires")]  # the clock, the session
    return answer


@pytest.mark.parametrize("page", list(ADMIN_PAGES))
def test_tenant_admin_gets_beta_pages_as_nonexistent(world, acme_discovery_rows, page):
    real_t, ghost_t = _target(world, "real", "apikey"), _target(world, "ghost", "apikey")
    real_t["audit_pk"] = _audit_pk(world, "beta")
    ghost_t["audit_pk"] = str(int(real_t["audit_pk"]) + 9000)
    real_t["call_pk"] = _audit_pk(world, "beta", "CallRecord")
    ghost_t["call_pk"] = str(int(real_t["call_pk"]) + 9000)
    real_t["delivery_pk"] = _delivery_pk(world, "beta.vault", real_t["relay"])
    ghost_t["delivery_pk"] = str(int(real_t["delivery_pk"]) + 9000)
    for key, model in DISCOVERY_ROWS.items():
        real_t[key] = _audit_pk(world, "beta", model, app="discovery")
        ghost_t[key] = str(int(real_t[key]) + 9000)
    typed = ("agent_pk", "key", "client_pk", "audit_pk", "call_pk", "delivery_pk", "relay",
             *DISCOVERY_ROWS)
    real = _normal(_admin_get(world, ADMIN_PAGES[page](world, real_t)),
                   sorted({real_t[k] for k in typed}, key=len, reverse=True))
    ghost = _normal(_admin_get(world, ADMIN_PAGES[page](world, ghost_t)),
                    sorted({ghost_t[k] for k in typed}, key=len, reverse=True))
    assert real == ghost
    assert real.startswith(("404", "302")), real[:300]
    _no_leak(world, real)
    # Control: A's own row of the same kind opens.
    from registry.models import Agent, ApiClient

    own = {"agent_pk": str(Agent.objects.get(tenant_id="acme", agent_id="echo").pk),
           "key": "acme.echo",
           "client_pk": str(ApiClient.objects.get(name="acme-app").pk),
           "audit_pk": _audit_pk(world, "acme"), "relay": world.own["apikey"]["relay"],
           "call_pk": _audit_pk(world, "acme", "CallRecord"),
           "delivery_pk": _delivery_pk(world, "acme.echo", world.own["apikey"]["relay"]),
           **{key: _audit_pk(world, "acme", model, app="discovery")
              for key, model in DISCOVERY_ROWS.items()}}
    answer = _admin_get(world, ADMIN_PAGES[page](world, own))
    # Some agent pages act and go back to the agent's page.
    assert answer.status == "200" or ("location", f"/admin/registry/agent/{own['agent_pk']}"
                                      "/change/") in answer.headers, answer.text()[:500]


@pytest.mark.parametrize("page", [
    "/admin/", "/admin/registry/agent/", "/admin/registry/agent/?q=Keeper",
    "/admin/registry/apiclient/", "/admin/registry/apiclient/?q=beta-ap",
    "/admin/console/registrychange/", "/admin/console/callrecord/",
    "/admin/push/pushdelivery/", "/admin/push/relayedconfig/", "/admin/discovery/snapshot/",
    "/admin/discovery/sessionpin/", "/admin/discovery/alert/"])
def test_tenant_admin_lists_and_dashboard_show_nothing_of_beta(world, acme_discovery_rows,
                                                                page):
    """Absent, and counted nowhere: the page is the same once B has one more agent, called."""
    flush_console_now()
    before = _admin_get(world, page)
    answer = _with_another_beta_agent(world, lambda: _admin_get(world, page), traffic=True)
    assert answer == before
    assert answer.status == "200", answer.text()[:500]
    searched = page.partition("?q=")[2]
    if searched:  # the search box says what A typed
        for echo in (f'value="{searched}"', f"q={searched}", f"q%3D{searched}"):
            answer.body = answer.body.replace(echo, "")
    # B's task and push-config ids show in A's own rows where A typed them (the probes through
    # A's own agent): what A wrote, not what it learnt. Everything else of B's must not.
    _no_leak(world, answer.text(), besides=("task", "config"))
    assert "beta" not in answer.body.replace("beta.shared", ""), page
    own = {"/admin/discovery/sessionpin/": "acme-s-1", "/admin/discovery/alert/": "acme_two"}
    assert own.get(page, "") in answer.body, page  # A's own rows are listed


# --- publishing: B shares an agent with A --------------------------------------------------------


@pytest.mark.parametrize("cred", CREDS)
def test_an_agent_beta_shares_with_acme_becomes_visible(world, cred):
    base, token = world.base, world.tokens[cred]
    r = world.http.patch(f"{base}/api/v1/agents/shared", headers=_auth(world.tokens["beta"]),
                         json={"visibility": "shared", "shared_with": ["acme"]})
    assert r.status_code == 200, r.text
    seen = world.http.get(f"{base}/api/v1/agents/beta.shared", headers=_auth(token))
    assert seen.status_code == 200 and seen.json()["url"] == f"{base}/a2a/t/beta/shared/"
    called = world.http.post(f"{base}/a2a/t/beta/shared", headers=_auth(token),
                             json=_rpc("message/send", _msg("hi")))
    assert called.json()["result"]["parts"][0]["text"] == "echo: hi", called.text
    listed = world.http.get(f"{base}/api/v1/agents?limit=500", headers=_auth(token)).json()
    keys = {(a["tenant"], a["agent_id"]) for a in listed["results"]}
    assert ("beta", "shared") in keys and ("beta", "vault") not in keys
    assert listed["count"] == len(listed["results"])
    assert "beta.shared" in {t.name for t in run(base, token, all_tools)}
    for answer in (seen, called):
        _no_leak(world, Answer.of(answer).text())


def test_a_default_tenant_caller_pins_no_snapshot_of_beta(world):
    """The default tenant's callers may pin discovery's snapshots (theirs); B's snapshot is
    not found for them, as a digest nobody published."""
    from registry import services

    token = services.api_client_create(name="default-caller", scopes=["call"])[1]
    world.tokens["default"] = token
    probe = _mcp_pinned("snapshot")
    real_t, ghost_t = _target(world, "real", "apikey"), _target(world, "ghost", "apikey")
    real = _normal(probe(world, real_t, "default"), [real_t["digest"]])
    assert real == _normal(probe(world, ghost_t, "default"), [ghost_t["digest"]])
    assert "snapshot not found" in real, real
    _no_leak(world, real)


ANONYMOUS = {
    "agent card": lambda t: ("GET", f"{t['path']}/.well-known/agent-card.json", None),
    "extended card": lambda t: ("GET", f"{t['path']}/extendedAgentCard", None),
    "jsonrpc message/send": lambda t: ("POST", t["path"], _rpc("message/send", _msg("hi"))),
    "stream resume": lambda t: ("GET", f"{t['path']}/stream/{t['stream']}", None),
    "api get": lambda t: ("GET", f"/api/v1/agents/{t['key']}", None),
    "kubemq get": lambda t: ("GET", f"/agents/{t['key']}", None),
    "push ingress": lambda t: ("POST", f"/push/{t['relay']}", {"id": t["task"]}),
}


@pytest.mark.parametrize("what", list(ANONYMOUS))
def test_no_credentials_learn_nothing_of_beta(world, what):
    """Without any credential (anonymous access off): B's objects and nonexistent ones are
    one answer too -- a card of B's that needs a token is refused as an unknown agent's."""
    real_t, ghost_t = _target(world, "real", "apikey"), _target(world, "ghost", "apikey")

    def ask(t: dict) -> str:
        method, path, body = ANONYMOUS[what](t)
        answer = Answer.of(world.http.request(method, f"{world.base}{path}", json=body))
        return _normal(answer, _typed(t, ("path", "stream", "relay", "task")))
    real = ask(real_t)
    assert real == ask(ghost_t)
    _no_leak(world, real)


def test_an_agent_beta_shares_never_hands_acme_beta_relay_secret(world):
    """B's push config on a task of an agent it shares with A: the agent answers A's push-config
    reads with every config of the task, B's among them (A2A agents keep no caller per config).
    The gateway shows a caller its own configs as it set them; another client's keep the
    agent's answer but never the relay's secret, with which A could push into B's webhook."""
    base, beta = world.base, _auth(world.tokens["beta"])
    r = world.http.patch(f"{base}/api/v1/agents/shared", headers=beta,
                         json={"visibility": "shared", "shared_with": ["acme"]})
    assert r.status_code == 200, r.text
    sent = _post_ok(world.http, f"{base}/a2a/t/beta/shared", world.tokens["beta"],
                    _rpc("message/send", _msg("task pushed", pushNotificationConfig={
                        "url": "https://hooks.example.com/beta", "token": "beta-own",
                        "id": "beta-shared-cfg"})))
    task = sent.json()["result"]["id"]
    secret = _relayed(world.agents["shared"])["token"]
    for cred in CREDS:
        token = world.tokens[cred]
        answers = [
            world.http.post(f"{base}/a2a/t/beta/shared", headers=_auth(token), json=_rpc(
                "tasks/pushNotificationConfig/list", {"id": task})),
            world.http.post(f"{base}/a2a/t/beta/shared", headers=_auth(token), json=_rpc(
                "tasks/pushNotificationConfig/get",
                {"id": task, "pushNotificationConfigId": "beta-shared-cfg"})),
            world.http.get(f"{base}/a2a/t/beta/shared/tasks/{task}/pushNotificationConfigs",
                           headers={**_auth(token), **V10})]
        for answer in answers:
            assert answer.status_code == 200 and "beta-shared-cfg" in answer.text, answer.text
            assert secret not in answer.text and "beta-own" not in answer.text, answer.text
        with grpc.insecure_channel(world.grpc) as channel:
            listed = grpc10.A2AServiceStub(channel).ListTaskPushNotificationConfigs(
                a2a_pb2.ListTaskPushNotificationConfigsRequest(tenant="beta.shared",
                                                               task_id=task),
                metadata=(("authorization", f"Bearer {token}"),), timeout=15)
        assert "beta-shared-cfg" in str(listed) and secret not in str(listed), listed
    # B itself reads its config as it set it.
    own = world.http.post(f"{base}/a2a/t/beta/shared", headers=beta, json=_rpc(
        "tasks/pushNotificationConfig/get",
        {"id": task, "pushNotificationConfigId": "beta-shared-cfg"}))
    assert "beta-own" in own.text and "hooks.example.com/beta" in own.text, own.text


def test_acme_cannot_resume_beta_stream_on_an_agent_beta_shares(world):
    """A stream is its client's: B's stream on an agent shared with A is, to A, a stream that
    does not exist (the agent itself in reach)."""
    base, beta = world.base, world.tokens["beta"]
    r = world.http.patch(f"{base}/api/v1/agents/shared", headers=_auth(beta),
                         json={"visibility": "shared", "shared_with": ["acme"]})
    assert r.status_code == 200, r.text
    stream = _post_ok(world.http, f"{base}/a2a/t/beta/shared", beta, _rpc(
        "message/stream", _msg("task streamed"))).headers["x-a2a-stream-id"]
    path = f"{base}/a2a/t/beta/shared/stream"
    for cred in CREDS:
        def resume(stream_id: str, cred: str = cred) -> str:
            answer = world.http.get(f"{path}/{stream_id}", headers=_auth(world.tokens[cred]))
            return _normal(Answer.of(answer), [stream_id])
        assert resume(stream) == resume(_like(stream))
        assert "stream_not_found" in resume(stream)
    assert world.http.get(f"{path}/{stream}", headers=_auth(beta)).status_code == 200


@pytest.mark.parametrize("path", [
    "/api/v1/agents/{id}", "/api/v1/agents/{id}/card", "/agents/{id}"])
def test_tenant_admin_session_on_the_apis_gets_beta_as_nonexistent(world, path):
    """A tenant admin's console session is an actor of its tenant on /api/v1 and KubeMQ too."""
    def ask(key: str) -> str:
        r = world.http.get(f"{world.base}{path.format(id=key)}", cookies=world.admin_cookies)
        return _normal(Answer.of(r), [key])
    real = ask("beta.vault")
    assert real == ask(f"beta.{GHOST}") and real.startswith("404"), real
    _no_leak(world, real)
    assert ask("echo").startswith("200")  # its own tenant's agent


def test_tenant_admin_session_lists_nothing_of_beta(world):
    for path in ("/api/v1/agents?limit=500", "/ard/v1/agents?pageSize=100"):
        before = Answer.of(world.http.get(f"{world.base}{path}", cookies=world.admin_cookies))
        after = _with_another_beta_agent(world, lambda path=path: Answer.of(
            world.http.get(f"{world.base}{path}", cookies=world.admin_cookies)))
        assert after == before and after.status == "200", after.text()
        assert "echo" in after.body
        _no_leak(world, after.text())
