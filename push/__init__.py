"""Push notifications relayed by the gateway (docs/push.md, docs/adr/0013-push-relay.md).

In relay mode the gateway keeps the caller's webhook (:mod:`push.relay`) and hands the agent a
URL of its own; the agent's pushes land on :mod:`push.ingress`, are written durably
(:class:`push.models.PushDelivery`) before they are acknowledged, and are delivered to the
caller at least once, in order per task, signed by the platform (:mod:`push.signing`), by
Celery workers or in the node's own threads (:mod:`push.worker`, :mod:`push.delivery`).
Imports only ``core``, ``outbound`` and ``registry``; ``gateway`` and ``console`` use it.
"""
