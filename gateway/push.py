"""Callers' push-notification webhooks, checked before a call reaches the agent.

A caller hands an agent a webhook (a push-notification config) for a long task to report back
on. Forwarded unchecked, that URL makes the agent a request forger: the cloud metadata address,
a node's admin port, a private service the caller cannot reach but the agent can. So every
webhook a request carries is checked by the rules agent URLs get at registration
(``registry.netcheck.check_agent_url``: http(s) only, no credentials, no metadata hosts, the
allowlist when set, names resolved and their addresses checked), and a request carrying a
refused one is answered ``webhook_refused`` (executed false) without reaching the agent.

Where a webhook travels, per protocol version (the same shapes on every binding: the HTTP+JSON
and gRPC requests are the same messages):

========================================  =================================================
A2A 1.0 ``SendMessage``,                  ``params.configuration.taskPushNotificationConfig
``SendStreamingMessage``                  .url``
A2A 1.0 ``CreateTaskPushNotificationConfig``  ``params.url`` (the params are the config)
A2A 0.3 ``message/send``, ``message/stream``  ``params.configuration.pushNotificationConfig.url``
A2A 0.3 ``tasks/pushNotificationConfig/set``  ``params.pushNotificationConfig.url``
========================================  =================================================

The check runs only for these methods, and for bodies the gateway parses lazily (above 16 KiB)
only when the body names a push config at all, so other calls pay one set lookup.
"""

from __future__ import annotations

import asyncio
from typing import Any

from core import threads
from registry.netcheck import UnsafeUrl, check_agent_url

#: Methods whose params may carry a webhook, by where it is.
_IN_SEND_V1 = frozenset({"SendMessage", "SendStreamingMessage"})
_IN_SEND_V03 = frozenset({"message/send", "message/stream", "tasks/send",
                          "tasks/sendSubscribe"})
_CONFIG_V1 = "CreateTaskPushNotificationConfig"
_CONFIG_V03 = "tasks/pushNotificationConfig/set"
METHODS = _IN_SEND_V1 | _IN_SEND_V03 | {_CONFIG_V1, _CONFIG_V03}
#: A body above the lazy-parse threshold is parsed whole for the check only if it has this.
MARKER = b"otificationConfig"
#: Webhook checks (which may resolve a name) run on threads of their own, at most this many.
CHECK_THREADS = 4


def webhook_urls(method: str, params: Any) -> list[Any]:
    """The webhook URLs ``params`` of ``method`` carry (as sent: not necessarily strings)."""
    if not isinstance(params, dict):
        return []
    if method == _CONFIG_V1:
        return [params["url"]] if "url" in params else []
    if method == _CONFIG_V03:
        config = params.get("pushNotificationConfig")
    else:
        configuration = params.get("configuration")
        if not isinstance(configuration, dict):
            return []
        if method in _IN_SEND_V1:
            config = configuration.get("taskPushNotificationConfig")
        else:
            config = configuration.get("pushNotificationConfig")
    if isinstance(config, dict) and "url" in config:
        return [config["url"]]
    return []


def refusal(urls: list[Any]) -> str | None:
    """Why one of ``urls`` is refused (the first), or None when all pass. Blocking (a name may
    be resolved): call it through :func:`check`."""
    for url in urls:
        try:
            check_agent_url(url)
        except UnsafeUrl as exc:
            return f"push notification webhook refused: {exc}"
    return None


#: An HTTP+JSON body forwarded unchanged has the shape of the 1.0 method's params, or (on the
#: 0.3 routes under ``v1/``) of this 0.3 method's.
_V03_OF = {"SendMessage": "message/send", "SendStreamingMessage": "message/stream",
           _CONFIG_V1: _CONFIG_V03}


async def check(method: str, params: Any, *, rest: bool = False) -> str | None:
    """:func:`refusal` of the webhooks ``params`` carry, off the event loop. ``rest``: the
    params are an HTTP+JSON body forwarded as it is (either version's shape)."""
    urls = webhook_urls(method, params)
    if rest and method in _V03_OF:
        urls += webhook_urls(_V03_OF[method], params)
    if not urls:
        return None
    pool = threads.pool("a2a-webhook-check", CHECK_THREADS)
    return await asyncio.get_running_loop().run_in_executor(pool, refusal, urls)
