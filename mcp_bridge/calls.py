"""A tool call as an A2A request, and the gateway's reply as an MCP tool result.

The request is the blocking send of the agent's protocol: ``message/send`` for A2A 0.3 cards,
``SendMessage`` with ``A2A-Version: 1.0`` for 1.0 cards (no 0.3 interface). The ``message``
argument is its text part; ``data`` a data part and ``files`` file parts (bytes or URLs, of the
media types the card takes, counted and size-capped: :class:`FileLimits`). The reply's parts
become MCP content: text as text, data parts as JSON text, file bytes as an image, audio or
embedded blob, file URLs as resource links. A task that is still running answers its id (poll
it with the ``get_task`` tool); a failed, rejected or cancelled task, an agent's JSON-RPC error
and every gateway error (timeout, unreachable, busy, too large, ...) answer ``isError: true``
with a message naming what happened and, for a gateway error, whether the agent received the
request.
"""

from __future__ import annotations

import binascii
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import mcp_types as types
import orjson

from gateway.inprocess import Collector, Reply

TERMINAL_ERRORS = {"failed", "rejected", "canceled", "cancelled"}
WAITING = {"input-required", "auth-required"}


class InvalidArguments(ValueError):
    """The tool's arguments do not fit its input schema (said to the caller as a tool error)."""


def _as_dict(value: Any) -> dict[str, Any]:
    """``value`` when it is a JSON object, else an empty one (agents' replies are untrusted)."""
    return value if isinstance(value, dict) else {}


def _optional_str(arguments: dict[str, Any], name: str) -> str | None:
    value = arguments.get(name)
    if value is None:
        return None
    if not isinstance(value, str) or not value:
        raise InvalidArguments(f"{name} must be a non-empty string")
    return value


@dataclass(frozen=True)
class FileArgument:
    """One checked entry of a tool call's ``files``: bytes (base64) or a URL."""

    mime_type: str
    name: str | None
    data: str | None  # base64, checked
    uri: str | None

    def part(self, protocol: str) -> dict[str, Any]:
        """The A2A file part: 1.0 ``{raw|url, mediaType, filename}``, 0.3 ``{"kind": "file",
        "file": {bytes|uri, mimeType, name}}``."""
        if protocol == "1.0":
            part: dict[str, Any] = ({"raw": self.data} if self.data is not None
                                    else {"url": self.uri})
            part["mediaType"] = self.mime_type
            if self.name:
                part["filename"] = self.name
            return part
        file: dict[str, Any] = ({"bytes": self.data} if self.data is not None
                                else {"uri": self.uri})
        file["mimeType"] = self.mime_type
        if self.name:
            file["name"] = self.name
        return {"kind": "file", "file": file}


def accepted(mime_type: str, modes: tuple[str, ...]) -> bool:
    """Whether a card's input ``modes`` take ``mime_type`` (``*/*``, ``image/*``, exact)."""
    mime = mime_type.split(";", 1)[0].strip().lower()
    kind = mime.split("/", 1)[0]
    for mode in modes:
        if mode in ("*", "*/*", "file", "files", "binary") or mode == mime or mode == kind \
                or (mode.endswith("/*") and mode[:-2] == kind):
            return True
    return False


@dataclass(frozen=True)
class FileLimits:
    """What a call may send as files: the agent's file input modes, how many, how large."""

    modes: tuple[str, ...] = ()
    max_files: int = 0
    max_bytes: int = 0


def _files(value: Any, limits: FileLimits) -> list[FileArgument]:
    if value is None:
        return []
    if not limits.modes:
        raise InvalidArguments("this agent takes no files (its card lists no file input modes)")
    if not isinstance(value, list):
        raise InvalidArguments("files must be an array")
    if len(value) > limits.max_files:
        raise InvalidArguments(f"at most {limits.max_files} files per call (A2A_MCP_MAX_FILES)")
    files, total = [], 0
    for index, entry in enumerate(value):
        where = f"files[{index}]"
        if not isinstance(entry, dict):
            raise InvalidArguments(f"{where} must be an object")
        unknown = set(entry) - {"name", "mimeType", "data", "uri"}
        if unknown:
            raise InvalidArguments(f"{where}: unknown field(s): {', '.join(sorted(unknown))}")
        mime = entry.get("mimeType")
        if not isinstance(mime, str) or not mime.strip():
            raise InvalidArguments(f"{where}.mimeType is required (a media type)")
        if not accepted(mime, limits.modes):
            raise InvalidArguments(f"{where}.mimeType {mime} is not among the media types the "
                                   f"agent takes ({', '.join(limits.modes)})")
        name = entry.get("name")
        if name is not None and not isinstance(name, str):
            raise InvalidArguments(f"{where}.name must be a string")
        data, uri = entry.get("data"), entry.get("uri")
        if (data is None) == (uri is None):
            raise InvalidArguments(f"{where} needs either data (base64) or uri")
        if data is not None:
            if not isinstance(data, str):
                raise InvalidArguments(f"{where}.data must be a base64 string")
            if (total + len(data) * 3 // 4 - 2) > limits.max_bytes:  # before decoding it
                raise InvalidArguments(f"files larger than {limits.max_bytes} bytes in all "
                                       "(A2A_MCP_MAX_FILE_BYTES)")
            try:
                total += len(binascii.a2b_base64(data, strict_mode=True))
            except binascii.Error as exc:
                raise InvalidArguments(f"{where}.data is not valid base64 ({exc})") from None
            if total > limits.max_bytes:
                raise InvalidArguments(f"files larger than {limits.max_bytes} bytes in all "
                                       "(A2A_MCP_MAX_FILE_BYTES)")
        else:
            parts = urlsplit(uri) if isinstance(uri, str) else None
            if parts is None or parts.scheme not in ("http", "https") or not parts.netloc:
                raise InvalidArguments(f"{where}.uri must be an http(s) URL")
        files.append(FileArgument(mime_type=mime.strip(), name=name or None, data=data,
                                  uri=uri))
    return files


def send_request(protocol: str, arguments: dict[str, Any] | None, *,
                 streaming: bool = False, files: FileLimits | None = None
                 ) -> tuple[bytes, list]:
    """The JSON-RPC body and extra headers of a message send with these tool arguments: the
    streaming send when ``streaming`` (the agent's card says it streams); ``files``: what the
    agent takes as file parts (none: no files)."""
    arguments = arguments or {}
    unknown = set(arguments) - {"message", "context_id", "task_id", "data", "files"}
    if unknown:
        raise InvalidArguments(f"unknown argument(s): {', '.join(sorted(unknown))}")
    text = arguments.get("message")
    if not isinstance(text, str):
        raise InvalidArguments("message is required and must be a string")
    context_id = _optional_str(arguments, "context_id")
    task_id = _optional_str(arguments, "task_id")
    data = arguments.get("data")
    if data is not None and not isinstance(data, dict):
        raise InvalidArguments("data must be an object")
    attached = _files(arguments.get("files"), files or FileLimits())
    rpc_id = f"mcp-{uuid.uuid4().hex[:12]}"
    if protocol == "1.0":
        parts: list[dict[str, Any]] = [{"text": text}]
        if data is not None:
            parts.append({"data": data})
        parts.extend(file.part(protocol) for file in attached)
        message: dict[str, Any] = {"role": "ROLE_USER", "messageId": uuid.uuid4().hex,
                                   "parts": parts}
        method = "SendStreamingMessage" if streaming else "SendMessage"
        headers = [(b"a2a-version", b"1.0")]
        params: dict[str, Any] = {"message": message}
    else:
        parts = [{"kind": "text", "text": text}]
        if data is not None:
            parts.append({"kind": "data", "data": data})
        parts.extend(file.part(protocol) for file in attached)
        message = {"kind": "message", "role": "user", "messageId": uuid.uuid4().hex,
                   "parts": parts}
        method, headers = ("message/stream" if streaming else "message/send"), []
        params = {"message": message} if streaming else \
            {"message": message, "configuration": {"blocking": True}}
    if context_id:
        message["contextId"] = context_id
    if task_id:
        message["taskId"] = task_id
    body = orjson.dumps({"jsonrpc": "2.0", "id": rpc_id, "method": method, "params": params})
    return body, headers


def cancel_request(protocol: str, task_id: str) -> tuple[bytes, list]:
    rpc_id = f"mcp-{uuid.uuid4().hex[:12]}"
    if protocol == "1.0":
        body = {"jsonrpc": "2.0", "id": rpc_id, "method": "CancelTask", "params": {"id": task_id}}
        return orjson.dumps(body), [(b"a2a-version", b"1.0")]
    body = {"jsonrpc": "2.0", "id": rpc_id, "method": "tasks/cancel", "params": {"id": task_id}}
    return orjson.dumps(body), []


def get_task_request(protocol: str, task_id: str) -> tuple[bytes, list]:
    rpc_id = f"mcp-{uuid.uuid4().hex[:12]}"
    if protocol == "1.0":
        body = {"jsonrpc": "2.0", "id": rpc_id, "method": "GetTask", "params": {"id": task_id}}
        return orjson.dumps(body), [(b"a2a-version", b"1.0")]
    body = {"jsonrpc": "2.0", "id": rpc_id, "method": "tasks/get", "params": {"id": task_id}}
    return orjson.dumps(body), []


def error_result(text: str, **structured: Any) -> types.CallToolResult:
    return types.CallToolResult(content=[types.TextContent(text=text)], is_error=True,
                                structured_content=structured or None)


def tool_result(agent_id: str, reply: Reply, max_bytes: int) -> types.CallToolResult:
    """The MCP result of the gateway's ``reply`` to a send or get-task request."""
    if reply.truncated:
        return error_result(f"gateway error (response_too_large): the reply of {agent_id} is "
                            f"larger than {max_bytes} bytes", agent_id=agent_id,
                            kind="response_too_large")
    try:
        answer = orjson.loads(reply.body)
    except orjson.JSONDecodeError:
        answer = None
    if not isinstance(answer, dict) or ("result" not in answer and "error" not in answer):
        return error_result(f"agent error: {agent_id} answered HTTP {reply.status} without a "
                            "JSON-RPC response", agent_id=agent_id, kind="agent_error")
    error = answer.get("error")
    if error is not None:
        return _error(agent_id, error)
    return _success(agent_id, answer["result"])


def _error(agent_id: str, error: Any) -> types.CallToolResult:
    if not isinstance(error, dict):
        return error_result(f"agent error: {agent_id} answered an invalid JSON-RPC error",
                            agent_id=agent_id, kind="agent_error")
    message = str(error.get("message") or "")
    data = error.get("data")
    if isinstance(data, dict) and isinstance(data.get("kind"), str) and "executed" in data:
        kind = data["kind"]
        executed = bool(data.get("executed"))
        note = ("the agent received the request" if executed else
                "the agent never received the request: retrying is safe")
        return error_result(f"gateway error ({kind}): {message} ({note})", agent_id=agent_id,
                            kind=kind, executed=executed,
                            retryable=bool(data.get("retryable")))
    return error_result(f"agent error {error.get('code')}: {message}", agent_id=agent_id,
                        kind="agent_error", code=error.get("code"))


def _state(task: dict[str, Any]) -> str:
    status = _as_dict(task.get("status"))
    state = str(status.get("state") or "unknown").lower().removeprefix("task_state_")
    return state.replace("_", "-")


def _success(agent_id: str, result: Any) -> types.CallToolResult:
    if not isinstance(result, dict):
        return error_result(f"agent error: {agent_id} answered a result that is neither a "
                            "message nor a task", agent_id=agent_id, kind="agent_error")
    kind = result.get("kind")
    if kind is None and isinstance(result.get("task"), dict):
        result, kind = result["task"], "task"
    elif kind is None and isinstance(result.get("message"), dict):
        result, kind = result["message"], "message"
    elif kind is None:
        kind = "task" if "status" in result else "message"
    if kind == "message":
        content = _content(agent_id, result.get("parts"))
        structured = _ids(agent_id, result)
        return types.CallToolResult(content=content or [types.TextContent(text="")],
                                    structured_content=structured)
    state = _state(result)
    content = []
    for artifact in result.get("artifacts") or []:
        if isinstance(artifact, dict):
            content.extend(_content(agent_id, artifact.get("parts")))
    status = _as_dict(result.get("status"))
    status_message = _as_dict(status.get("message"))
    content.extend(_content(agent_id, status_message.get("parts")))
    task_id = result.get("id")
    structured = {**_ids(agent_id, result, task_id=task_id), "state": state}
    if state in TERMINAL_ERRORS:
        text = f"task {task_id} of {agent_id} {state}"
        return types.CallToolResult(content=[types.TextContent(text=text), *content],
                                    is_error=True, structured_content=structured)
    if state != "completed":
        if state in WAITING:
            hint = (f"the agent waits for more input: call {agent_id} again with "
                    f"task_id={task_id} and context_id={result.get('contextId')}")
        else:
            hint = (f"task {task_id} is {state}: call get_task with agent_id={agent_id} and "
                    f"task_id={task_id} for its progress and results")
        content.append(types.TextContent(text=hint))
    return types.CallToolResult(content=content or [types.TextContent(text="")],
                                structured_content=structured)


def _ids(agent_id: str, obj: dict[str, Any], task_id: Any = None) -> dict[str, Any]:
    ids: dict[str, Any] = {"agent_id": agent_id}
    if obj.get("contextId"):
        ids["context_id"] = obj["contextId"]
    task_id = task_id or obj.get("taskId")
    if task_id:
        ids["task_id"] = task_id
    return ids


def _content(agent_id: str, parts: Any) -> list[Any]:
    content: list[Any] = []
    for index, part in enumerate(parts if isinstance(parts, list) else []):
        if not isinstance(part, dict):
            continue
        if isinstance(part.get("text"), str):
            content.append(types.TextContent(text=part["text"]))
        elif "data" in part:
            content.append(types.TextContent(text=orjson.dumps(part["data"]).decode()))
        elif isinstance(part.get("file"), dict) or "raw" in part or "url" in part:
            block = _file(agent_id, index, part)
            if block is not None:
                content.append(block)
    return content


def _file(agent_id: str, index: int, part: dict[str, Any]) -> Any:
    """A file part (0.3 ``{"file": {bytes|uri, mimeType, name}}``, 1.0 ``{raw|url,
    mediaType, filename}``) as MCP content."""
    file = part["file"] if isinstance(part.get("file"), dict) else part
    blob = file.get("bytes") if "file" in part else file.get("raw")
    url = file.get("uri") if "file" in part else file.get("url")
    mime = str(file.get("mimeType") or file.get("mediaType") or "application/octet-stream")
    name = str(file.get("name") or file.get("filename") or f"file-{index}")
    if isinstance(blob, str):
        if mime.startswith("image/"):
            return types.ImageContent(data=blob, mime_type=mime)
        if mime.startswith("audio/"):
            return types.AudioContent(data=blob, mime_type=mime)
        return types.EmbeddedResource(resource=types.BlobResourceContents(
            uri=f"a2a://{agent_id}/files/{name}", blob=blob, mime_type=mime))
    if isinstance(url, str) and url:
        return types.ResourceLink(name=name, uri=url, mime_type=mime)
    return None


Progress = Callable[[float, str], Awaitable[None]]


class EventStream(Collector):
    """The gateway's reply to a streaming send, read event by event as it is relayed: each
    status or artifact update is reported (``progress``: MCP progress notifications), and the
    events add up to the final Task or Message, mapped like a blocking send's result. A reply
    that is not an event stream (an up-front error, an agent answering JSON) is collected as
    usual. The stream's events may add up to ``max_bytes`` (the response cap: the result is
    one response); beyond, ``on_too_large`` ends the call and the result says so."""

    def __init__(self, max_bytes: int, progress: Progress) -> None:
        super().__init__(max_bytes)
        self.progress = progress
        self.sse = False
        self.pending = b""
        self.events = 0
        self.task: dict[str, Any] | None = None
        self.message: dict[str, Any] | None = None
        self.error: Any = None
        self.task_id: str | None = None
        self.too_large = False
        self.kept = 0  # bytes of the events received (what the result is built from)
        self.on_too_large: Callable[[], Any] = lambda: None

    async def start(self, status: int, headers: dict[str, str]) -> None:
        await super().start(status, headers)
        self.sse = headers.get("content-type", "").startswith("text/event-stream")

    async def body(self, chunk: bytes) -> None:
        if not self.sse:
            await super().body(chunk)
            return
        data = (self.pending + chunk).replace(b"\r\n", b"\n")
        *events, self.pending = data.split(b"\n\n")
        if len(self.pending) > self.max_bytes:
            self._overflow()
            return
        for event in events:
            lines = [line[5:].removeprefix(b" ") for line in event.split(b"\n")
                     if line.startswith(b"data:")]
            if lines:
                await self._event(b"\n".join(lines))

    def _overflow(self) -> None:
        """The stream outgrew the cap: the call ends (the gateway closes the agent's stream)
        and answers ``response_too_large``."""
        if not self.too_large:
            self.too_large, self.pending = True, b""
            self.on_too_large()

    async def _event(self, data: bytes) -> None:
        if self.too_large:
            return
        try:
            answer = orjson.loads(data)
        except orjson.JSONDecodeError:
            return
        if not isinstance(answer, dict):
            return
        if "error" in answer:
            self.error = answer["error"]
            return
        event = answer.get("result")
        if not isinstance(event, dict):
            return
        self.events += 1
        self.kept += len(data)
        if self.kept > self.max_bytes:
            self._overflow()
            return
        kind = event.get("kind")
        for key, name in (("task", "task"), ("message", "message"),
                          ("statusUpdate", "status-update"),
                          ("artifactUpdate", "artifact-update")):
            if kind is None and isinstance(event.get(key), dict):
                event, kind = event[key], name
        if kind == "message":
            self.message = event
        elif kind == "task" or (kind is None and "status" in event and "id" in event):
            self.task = {**event, "artifacts": list(event.get("artifacts") or [])}
            self.task_id = event.get("id")
            await self.progress(self.events, f"task {self.task_id}: {_state(event)}")
        elif kind == "status-update":
            task = self._task(event)
            if isinstance(event.get("status"), dict):
                task["status"] = event["status"]
            text = " ".join(block.text for block in _content("", (
                task.get("status", {}).get("message") or {}).get("parts"))
                if isinstance(block, types.TextContent))
            await self.progress(self.events, f"{_state(task)}{': ' + text if text else ''}")
        elif kind == "artifact-update":
            task = self._task(event)
            artifact = _as_dict(event.get("artifact"))
            _add_artifact(task["artifacts"], artifact, bool(event.get("append")))
            await self.progress(self.events, f"artifact {artifact.get('name') or ''}".strip())

    def _task(self, event: dict[str, Any]) -> dict[str, Any]:
        if self.task is None:
            self.task = {"id": event.get("taskId"), "contextId": event.get("contextId"),
                         "status": {"state": "working"}, "artifacts": []}
            self.task_id = event.get("taskId")
        return self.task

    def result(self, agent_id: str, reply: Reply) -> types.CallToolResult:
        if not self.sse:
            return tool_result(agent_id, reply, self.max_bytes)
        if self.too_large:
            return error_result(f"gateway error (response_too_large): the stream of {agent_id} "
                                f"outgrew {self.max_bytes} bytes; its task was cancelled",
                                agent_id=agent_id, kind="response_too_large", executed=True,
                                task_id=self.task_id)
        if self.error is not None:
            return _error(agent_id, self.error)
        if self.message is not None:
            return _success(agent_id, {"kind": "message", **self.message})
        if self.task is not None:
            return _success(agent_id, {**self.task, "kind": "task"})
        return error_result(f"agent error: the stream of {agent_id} ended without a task or "
                            "message", agent_id=agent_id, kind="agent_error")


def _add_artifact(artifacts: list[Any], artifact: dict[str, Any], append: bool) -> None:
    """An artifact update: appended to the artifact with its id when ``append``, else it
    replaces it (or is added)."""
    artifact_id = artifact.get("artifactId")
    for index, existing in enumerate(artifacts):
        if isinstance(existing, dict) and artifact_id and existing.get("artifactId") == artifact_id:
            if append:
                artifacts[index] = {**existing, "parts": [*(existing.get("parts") or []),
                                                          *(artifact.get("parts") or [])]}
            else:
                artifacts[index] = artifact
            return
    artifacts.append(artifact)
