"""The caller of a call whose answer the gateway writes itself in a binding's own form (the
gRPC listener; the HTTP+JSON binding translated to an agent's JSON-RPC)."""

from __future__ import annotations


class BindingCaller:
    """It stands where a JSON-RPC call's id goes (admission, :class:`gateway.exchange.Exchange`
    and :func:`gateway.exchange.send_error`): the gateway's own errors are handed to it
    (:meth:`gateway_error`) instead of being written as a JSON-RPC answer; the agent's answer
    still reaches the ``send`` it gave, as ASGI messages."""

    __slots__ = ()

    async def gateway_error(self, kind: str, agent_id: str | None, detail: str, *,
                            status: int | None, executed: bool,
                            extra: list[tuple[bytes, bytes]] | None) -> None:
        raise NotImplementedError
