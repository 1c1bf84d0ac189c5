"""Property tests of the gRPC binding's translation (gateway/grpc_binding/translate.py) over
real a2a-sdk messages: what the gateway sends an agent is what the SDK's own server of that
version reads back as the caller's request, what an agent answers reaches the caller whole, and
a 0.3 caller talking to a 0.3 agent through the gateway's 1.0 messages gets what a direct 0.3
mapping would give."""

from __future__ import annotations

import base64

from a2a.compat.v0_3 import conversions
from a2a.compat.v0_3 import types as t03
from a2a.compat.v0_3.proto_utils import FromProto, ToProto
from a2a.types import a2a_pb2 as pb
from google.protobuf import struct_pb2
from google.protobuf.json_format import MessageToDict, ParseDict
from hypothesis import HealthCheck, given
from hypothesis import settings as hsettings
from hypothesis import strategies as st

from gateway.grpc_binding import translate
from gateway.grpc_binding.translate import CORE, METHODS, V03, V10

examples = hsettings(max_examples=40, deadline=None,
                     suppress_health_check=[HealthCheck.too_slow])

text = st.text(st.characters(exclude_categories=("Cs",)), max_size=12)
ids = st.text("abcdefghijklmnopqrstuvwxyz0123456789-", min_size=1, max_size=10)
keys = st.text("abcdefghijklmnopqrstuvwxyz_", min_size=1, max_size=6)
scalars = st.one_of(st.none(), st.booleans(), st.integers(-10**6, 10**6),
                    st.floats(allow_nan=False, allow_infinity=False), text)
json_values = st.recursive(scalars, lambda inner: st.one_of(
    st.lists(inner, max_size=3), st.dictionaries(keys, inner, max_size=3)), max_leaves=6)
json_objects = st.dictionaries(keys, json_values, max_size=3)


def struct(value: dict) -> struct_pb2.Struct:
    out = struct_pb2.Struct()
    out.update(value)
    return out


@st.composite
def parts(draw) -> pb.Part:
    kind = draw(st.sampled_from(["text", "raw", "url", "data"]))
    part = pb.Part()
    if kind == "text":
        part.text = draw(text)
    elif kind == "data":
        ParseDict(draw(json_objects), part.data.struct_value)
    else:
        if kind == "raw":
            part.raw = draw(st.binary(max_size=24))
        else:
            part.url = "https://files.example/" + draw(ids)
        part.media_type = draw(st.sampled_from(["", "text/plain", "image/png"]))
        part.filename = draw(st.sampled_from(["", "a.txt"]))
    if draw(st.booleans()):
        part.metadata.CopyFrom(struct(draw(json_objects)))
    return part


@st.composite
def messages(draw, role=None) -> pb.Message:
    message = pb.Message(
        message_id=draw(ids), context_id=draw(st.sampled_from(["", "ctx-1"])),
        task_id=draw(st.sampled_from(["", "task-1"])),
        role=role or draw(st.sampled_from([pb.Role.ROLE_USER, pb.Role.ROLE_AGENT])),
        parts=draw(st.lists(parts(), min_size=1, max_size=3)),
        extensions=draw(st.lists(st.just("https://ext.example/v1"), max_size=1)),
        reference_task_ids=draw(st.lists(ids, max_size=2)))
    if draw(st.booleans()):
        message.metadata.CopyFrom(struct(draw(json_objects)))
    return message


states = st.sampled_from([s for s in pb.TaskState.values() if s])


@st.composite
def statuses(draw) -> pb.TaskStatus:
    status = pb.TaskStatus(state=draw(states))
    if draw(st.booleans()):
        status.message.CopyFrom(draw(messages(role=pb.Role.ROLE_AGENT)))
    if draw(st.booleans()):
        status.timestamp.FromJsonString("2026-12-02T10:11:12Z")
    return status


@st.composite
def artifacts(draw) -> pb.Artifact:
    artifact = pb.Artifact(artifact_id=draw(ids), name=draw(text),
                           description=draw(text),
                           parts=draw(st.lists(parts(), min_size=1, max_size=2)))
    if draw(st.booleans()):
        artifact.metadata.CopyFrom(struct(draw(json_objects)))
    return artifact


@st.composite
def tasks(draw) -> pb.Task:
    task = pb.Task(id=draw(ids), context_id=draw(ids), status=draw(statuses()),
                   artifacts=draw(st.lists(artifacts(), max_size=2)),
                   history=draw(st.lists(messages(), max_size=2)))
    if draw(st.booleans()):
        task.metadata.CopyFrom(struct(draw(json_objects)))
    return task


@st.composite
def stream_events(draw) -> pb.StreamResponse:
    kind = draw(st.sampled_from(["task", "message", "status_update", "artifact_update"]))
    if kind == "task":
        return pb.StreamResponse(task=draw(tasks()))
    if kind == "message":
        return pb.StreamResponse(message=draw(messages()))
    if kind == "status_update":
        return pb.StreamResponse(status_update=pb.TaskStatusUpdateEvent(
            task_id=draw(ids), context_id=draw(ids), status=draw(statuses())))
    return pb.StreamResponse(artifact_update=pb.TaskArtifactUpdateEvent(
        task_id=draw(ids), context_id=draw(ids), artifact=draw(artifacts()),
        append=draw(st.booleans()), last_chunk=draw(st.booleans())))


@st.composite
def send_requests(draw) -> pb.SendMessageRequest:
    request = pb.SendMessageRequest(tenant=draw(ids), message=draw(messages(
        role=pb.Role.ROLE_USER)))
    if draw(st.booleans()):
        request.configuration.accepted_output_modes.extend(["text/plain"])
        request.configuration.return_immediately = draw(st.booleans())
        if draw(st.booleans()):
            request.configuration.history_length = draw(st.integers(1, 50))
    if draw(st.booleans()):
        request.metadata.CopyFrom(struct(draw(json_objects)))
    return request


def pruned(value):
    """``value`` without empty ``metadata`` members (the same as absent in A2A); the values
    of ``metadata`` and ``data`` are the caller's and left whole."""
    if isinstance(value, list):
        return [pruned(v) for v in value]
    if isinstance(value, dict):
        return {k: v if k in ("metadata", "data") else pruned(v) for k, v in value.items()
                if not (k == "metadata" and v == {})}
    return value


def without_tenant(message):
    copy = type(message)()
    copy.CopyFrom(message)
    copy.ClearField("tenant")
    return copy


def core_roundtrip_03(message: pb.Message) -> pb.Message:
    """What a message is once it went through A2A 0.3 (the SDK's converters)."""
    return conversions.to_core_message(conversions.to_compat_message(message))


# --- a 1.0 agent: ProtoJSON both ways ------------------------------------------------------------


@examples
@given(st.one_of(
    send_requests().map(lambda r: ("SendMessage", r)),
    send_requests().map(lambda r: ("SendStreamingMessage", r)),
    st.builds(pb.GetTaskRequest, tenant=ids, id=ids,
              history_length=st.integers(0, 9)).map(lambda r: ("GetTask", r)),
    st.builds(pb.CancelTaskRequest, tenant=ids, id=ids).map(lambda r: ("CancelTask", r)),
    st.builds(pb.SubscribeToTaskRequest, tenant=ids, id=ids).map(
        lambda r: ("SubscribeToTask", r)),
    st.builds(pb.ListTasksRequest, tenant=ids, context_id=ids, page_size=st.integers(1, 50),
              status=states).map(lambda r: ("ListTasks", r)),
))
def test_a_10_agent_reads_the_callers_request_as_the_sdk_server_parses_it(case):
    name, request = case
    method, params = translate.agent_request(CORE[name], request, V10)
    assert method == name and "tenant" not in params
    # The SDK's JSON-RPC server: ParseDict(params, <the method's request message>).
    assert ParseDict(params, CORE[name].request()) == without_tenant(request)


@examples
@given(st.one_of(
    tasks().map(lambda t: ("GetTask", t)),
    tasks().map(lambda t: ("SendMessage", pb.SendMessageResponse(task=t))),
    messages().map(lambda m: ("SendMessage", pb.SendMessageResponse(message=m))),
    stream_events().map(lambda e: ("SendStreamingMessage", e)),
    st.lists(tasks(), max_size=2).map(
        lambda ts: ("ListTasks", pb.ListTasksResponse(tasks=ts, next_page_token="n"))),
))
def test_a_10_agents_answer_reaches_the_caller_whole(case):
    name, reply = case
    method = CORE[name]
    # What the SDK's JSON-RPC server sends: MessageToDict of the reply.
    assert translate.agent_result(method, MessageToDict(reply), V10) == reply
    caller = METHODS[f"/{translate.SERVICE_V10}/{name}"]
    assert type(reply).FromString(caller.encode(reply).SerializeToString()) == reply


# --- a 0.3 agent: the SDK's compat converters ---------------------------------------------------


@examples
@given(send_requests())
def test_a_03_agent_reads_a_send_as_the_sdk_03_server_does(request):
    method, params = translate.agent_request(CORE["SendMessage"], request, V03)
    assert method == "message/send"
    # The SDK's 0.3 JSON-RPC server: the 0.3 params model, then to the core request.
    read = conversions.to_core_send_message_request(t03.SendMessageRequest(
        id=1, params=t03.MessageSendParams.model_validate(params)))
    expected = without_tenant(request)
    expected.message.CopyFrom(core_roundtrip_03(request.message))
    assert read.message == expected.message
    assert read.metadata == expected.metadata
    assert list(read.configuration.accepted_output_modes) == \
        list(expected.configuration.accepted_output_modes)


@examples
@given(st.one_of(
    tasks().map(lambda t: ("GetTask", conversions.to_compat_task(t))),
    tasks().map(lambda t: ("SendMessage", conversions.to_compat_task(t))),
    messages().map(lambda m: ("SendMessage", conversions.to_compat_message(m))),
    stream_events().map(lambda e: ("SendStreamingMessage",
                                   conversions.to_compat_stream_response(e).result)),
))
def test_a_03_agents_answer_becomes_the_core_reply_the_sdk_03_client_makes(case):
    name, answer = case
    result = answer.model_dump(by_alias=True, exclude_none=True, mode="json")
    core = translate.agent_result(CORE[name], result, V03)
    if name == "GetTask":
        assert core == conversions.to_core_task(answer)
    elif name == "SendStreamingMessage":
        assert core == conversions.to_core_stream_response(
            t03.SendStreamingMessageSuccessResponse(result=answer))
    elif isinstance(answer, t03.Task):
        assert core == pb.SendMessageResponse(task=conversions.to_core_task(answer))
    else:
        assert core == pb.SendMessageResponse(message=conversions.to_core_message(answer))


# --- a 0.3 caller: nothing is lost going through the 1.0 messages ------------------------------


@examples
@given(send_requests())
def test_a_03_caller_to_a_03_agent_sends_what_a_direct_03_mapping_sends(request):
    wire = ToProto.message(conversions.to_compat_message(request.message))
    caller_request = translate.pb03.SendMessageRequest(request=wire)
    caller = METHODS[f"/{translate.SERVICE_V03}/SendMessage"]
    core = caller.decode(caller_request.SerializeToString())
    _, params = translate.agent_request(caller.core, core, V03)
    direct = FromProto.message_send_params(caller_request).model_dump(
        by_alias=True, exclude_none=True, mode="json")
    assert params == pruned(direct)


@examples
@given(tasks())
def test_a_03_agents_task_reaches_a_03_caller_as_a_direct_03_mapping_gives_it(task):
    answer = conversions.to_compat_task(task)
    result = answer.model_dump(by_alias=True, exclude_none=True, mode="json")
    caller = METHODS[f"/{translate.SERVICE_V03}/GetTask"]
    sent = caller.encode(translate.agent_result(caller.core, result, V03))
    direct = ToProto.task(t03.Task.model_validate(result))
    assert pruned(MessageToDict(sent)) == pruned(MessageToDict(direct))


def test_a_method_03_has_not_is_unsupported_and_bad_bytes_are_refused():
    request = pb.ListTasksRequest(tenant="a")
    try:
        translate.agent_request(CORE["ListTasks"], request, V03)
    except translate.Unsupported:
        pass
    else:
        raise AssertionError("ListTasks reached a 0.3 agent")
    for path in (f"/{translate.SERVICE_V10}/SendMessage", f"/{translate.SERVICE_V03}/GetTask"):
        try:
            METHODS[path].decode(b"\xff\xff\xff")
        except translate.TranslationError:
            continue
        raise AssertionError(f"{path} decoded garbage")
    # A 0.3 task name that is not tasks/{id}.
    bad = translate.pb03.GetTaskRequest(name="nope").SerializeToString()
    try:
        METHODS[f"/{translate.SERVICE_V03}/GetTask"].decode(bad)
    except translate.TranslationError:
        pass
    else:
        raise AssertionError("a bad task name decoded")


def test_agent_errors_become_the_statuses_the_sdk_grpc_servers_answer():
    not_found = {"code": -32001, "message": "Task not found", "data": [
        {"@type": "type.googleapis.com/google.rpc.ErrorInfo", "reason": "TASK_NOT_FOUND",
         "domain": "a2a-protocol.org", "metadata": {"taskId": "t-1"}}]}
    status = translate.agent_error_status(not_found, V10)
    assert (status.code, status.message) == (5, "Task not found")  # NOT_FOUND
    assert translate.agent_error_status(not_found, V03).message == \
        "TaskNotFoundError: Task not found"
    assert translate.agent_error_status({"code": -32099, "message": "odd"}, V10).code == 2
    assert base64.b64encode(status.SerializeToString())  # serializes (grpc-status-details-bin)
