"""Callers' push-notification configs, kept by the gateway in relay mode.

Where a config travels in a request, per protocol version (every binding: the HTTP+JSON and
gRPC requests are the same messages; a HTTP+JSON body forwarded as it is has the shape of the
1.0 method's params, or of the 0.3 method's on the 0.3 routes):

========================================  =================================================
A2A 1.0 ``SendMessage``,                  ``params.configuration.taskPushNotificationConfig``
``SendStreamingMessage``
A2A 1.0 ``CreateTaskPushNotificationConfig``  ``params`` (the params are the config)
A2A 0.3 ``message/send``, ``message/stream``  ``params.configuration.pushNotificationConfig``
A2A 0.3 ``tasks/pushNotificationConfig/set``  ``params.pushNotificationConfig``
========================================  =================================================

:func:`configs` finds them (the gateway's webhook check reads their ``url``); :func:`relay`
stores each (URL, token, ``authentication``, config id, task id, agent, its tenant and its
registration, calling client) and rewrites it in place: the agent gets
``<base>/push/<relay id>`` and a fresh secret as the config's ``token`` (A2A senders present
it in ``X-A2A-Notification-Token``), and no ``authentication`` (the caller's credentials never
reach the agent). The secret is stored only as its SHA-256 (it is 256 random bits: a fast hash
is enough).
"""

from __future__ import annotations

import hashlib
import re
import secrets
import uuid
from collections.abc import Collection
from typing import Any

from push.models import RelayedConfig
from registry import selectors
from registry.ids import split_agent_key

IN_SEND_V1 = frozenset({"SendMessage", "SendStreamingMessage"})
IN_SEND_V03 = frozenset({"message/send", "message/stream", "tasks/send", "tasks/sendSubscribe"})
CONFIG_V1 = "CreateTaskPushNotificationConfig"
CONFIG_V03 = "tasks/pushNotificationConfig/set"
METHODS = IN_SEND_V1 | IN_SEND_V03 | {CONFIG_V1, CONFIG_V03}
#: An HTTP+JSON body forwarded unchanged has the shape of the 1.0 method's params, or (on the
#: 0.3 routes under ``v1/``) of this 0.3 method's.
V03_OF = {"SendMessage": "message/send", "SendStreamingMessage": "message/stream",
          CONFIG_V1: CONFIG_V03}
#: The path of the ingress, under the relay base.
PATH = "/push/"
RELAY_ID_LENGTH = 32


#: A config's key, as JSON names it and as its proto or pydantic field (the SDKs parse both:
#: protobuf's ``ParseDict``/``Parse`` and pydantic's ``populate_by_name``), so a caller cannot
#: slip a webhook past the check by spelling the key the other way.
_V1_KEYS = ("taskPushNotificationConfig", "task_push_notification_config")
_V03_KEYS = ("pushNotificationConfig", "push_notification_config")


def _configs_of(method: str, params: Any) -> list[dict[str, Any]]:
    if not isinstance(params, dict):
        return []
    if method == CONFIG_V1:
        return [params] if "url" in params else []
    if method == CONFIG_V03:
        holder: Any = params
        keys = _V03_KEYS
    elif method in IN_SEND_V1 or method in IN_SEND_V03:
        holder = params.get("configuration")
        keys = _V1_KEYS if method in IN_SEND_V1 else _V03_KEYS
    else:
        return []
    if not isinstance(holder, dict):
        return []
    return [config for key in keys
            if isinstance(config := holder.get(key), dict) and "url" in config]


def configs(method: str, params: Any, *, rest: bool = False) -> list[dict[str, Any]]:
    """The push-notification configs ``params`` of ``method`` carry (the dicts themselves,
    each with a ``url``). ``rest``: the params are an HTTP+JSON body forwarded as it is (either
    version's shape)."""
    found = _configs_of(method, params)
    if rest and method in V03_OF:
        found += [c for c in _configs_of(V03_OF[method], params)
                  if all(c is not f for f in found)]
    return found


def _task_of(method: str, params: Any, config: dict[str, Any]) -> str:
    message = params.get("message") if isinstance(params, dict) else None
    for holder in (config, params, message):
        if isinstance(holder, dict):
            value = holder.get("taskId")
            if isinstance(value, str) and value:
                return value[:200]
    return ""


def secret_digest(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


def relay(method: str, params: Any, *, agent_id: str, client_id: str, base_url: str,
          rest: bool = False) -> int:
    """Store every config of ``params`` and point it at the gateway (in place). Blocking (a
    database write): the gateway calls it off its event loop. How many were relayed."""
    found = configs(method, params, rest=rest)
    if found:
        agent_pk = selectors.agent_pk_by_key(key=agent_id) or 0
        for config in found:
            keep(config, task_id=_task_of(method, params, config), agent_id=agent_id,
                 agent_pk=agent_pk, client_id=client_id, base_url=base_url)
    return len(found)


def keep(config: dict[str, Any], *, task_id: str, agent_id: str, agent_pk: int,
         client_id: str, base_url: str) -> str:
    """Store one config (a dict of either version's shape, JSON names) and rewrite it in
    place to point at the gateway; its relay id. ``agent_pk``: the agent's row (its
    registration), 0 when it is gone."""
    relay_id = uuid.uuid4().hex
    secret = secrets.token_urlsafe(32)
    authentication = config.get("authentication")
    config_id = config.get("id")
    token = config.get("token")
    RelayedConfig.objects.create(
        id=relay_id, tenant_id=split_agent_key(agent_id)[0], agent_id=agent_id,
        agent_pk=agent_pk, client_id=client_id,
        config_id=config_id[:200] if isinstance(config_id, str) else "",
        task_id=task_id[:200], url=str(config["url"]),
        token=token if isinstance(token, str) else "",
        authentication=authentication if isinstance(authentication, dict) else None,
        secret_sha256=secret_digest(secret))
    config["url"] = f"{base_url}{PATH}{relay_id}"
    config["token"] = secret
    config.pop("authentication", None)
    return relay_id


#: A relay URL's id, at the end of a config's ``url``.
RELAY_URL = re.compile(r"/push/([0-9a-f]{32})$")
#: Methods whose answer shows configs (their relay URLs shown back as the caller's own).
CONFIG_ANSWERS = frozenset({
    "CreateTaskPushNotificationConfig", "GetTaskPushNotificationConfig",
    "ListTaskPushNotificationConfigs", "tasks/pushNotificationConfig/set",
    "tasks/pushNotificationConfig/get", "tasks/pushNotificationConfig/list",
})


def relayed_in(answer: Any) -> dict[str, list[dict[str, Any]]]:
    """The configs anywhere in ``answer`` whose ``url`` is a relay URL, by relay id."""
    found: dict[str, list[dict[str, Any]]] = {}
    stack = [answer]
    while stack:
        item = stack.pop()
        if isinstance(item, list):
            stack.extend(item)
        elif isinstance(item, dict):
            url = item.get("url")
            match = RELAY_URL.search(url) if isinstance(url, str) else None
            if match:
                found.setdefault(match.group(1), []).append(item)
            else:
                stack.extend(item.values())
    return found


def hide_secrets(found: dict[str, list[dict[str, Any]]], keep: Collection[str] = ()) -> int:
    """Drop the relay's secret (``token``) from every config :func:`relayed_in` found but
    those of ``keep``; how many lost one. Also what an answer gets when the callers' own
    configs cannot be read (the database down): no secret leaves, the caller sees the relay's
    URL until it can be read again."""
    hidden = 0
    for relay_id in set(found) - set(keep):
        for config in found[relay_id]:
            hidden += config.pop("token", None) is not None
    return hidden


def show_callers_own(found: dict[str, list[dict[str, Any]]], *, agent_id: str,
                     client_id: str) -> int:
    """Rewrite the configs :func:`relayed_in` found back to what ``client_id`` set (its URL,
    token and ``authentication``): only configs of this agent set by this client. Every other
    relayed config keeps the agent's answer but loses its ``token``: that is the relay's secret,
    for the agent alone -- another client reading it (an agent answers every config of a task,
    whoever set it; through an agent shared across tenants, another tenant's) could push into
    that client's webhook as the agent. Blocking (a database read). How many were rewritten."""
    rows = list(RelayedConfig.objects.filter(pk__in=list(found), agent_id=agent_id,
                                             client_id=client_id))
    done = hide_secrets(found, keep={row.pk for row in rows})
    for row in rows:
        for config in found[row.pk]:
            config["url"] = row.url
            if row.token:
                config["token"] = row.token
            else:
                config.pop("token", None)
            if row.authentication is not None:
                config["authentication"] = row.authentication
            done += 1
    return done
