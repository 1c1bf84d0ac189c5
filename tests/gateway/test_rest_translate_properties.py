"""Property tests of the HTTP+JSON binding's translation (gateway/rest_translate.py) over real
a2a-sdk messages: a request the SDK's REST client sends becomes, in the agent's JSON-RPC, what
the SDK's JSON-RPC server parses back as the same request; an agent's answer reaches the REST
caller as what the SDK's REST client parses back as the same reply; the 0.3 routes (``v1/``)
carry what a direct 0.3 mapping carries."""

from __future__ import annotations

from urllib.parse import urlencode

import orjson
from a2a.compat.v0_3 import a2a_v0_3_pb2 as pb03
from a2a.compat.v0_3 import conversions
from a2a.compat.v0_3 import types as t03
from a2a.compat.v0_3.proto_utils import FromProto, ToProto
from a2a.types import a2a_pb2 as pb
from a2a.utils.proto_utils import parse_lenient
from google.protobuf.json_format import MessageToDict, ParseDict
from hypothesis import given
from hypothesis import strategies as st

from gateway import rest_translate
from gateway.translation import CORE, V03, V10, agent_request, agent_result
from tests.gateway.test_grpc_translate import (
    examples,
    ids,
    messages,
    pruned,
    send_requests,
    states,
    stream_events,
    tasks,
    without_tenant,
)


def rest_body(request) -> bytes:
    """The body the SDK's REST client sends: the request message's ProtoJSON."""
    return orjson.dumps(MessageToDict(request))


@examples
@given(send_requests(), st.sampled_from(["message:send", "message:stream"]),
       st.sampled_from(["", "team-a/"]))
def test_a_rest_send_reaches_a_10_agent_as_the_callers_request(request, route, tenant):
    name = "SendMessage" if route == "message:send" else "SendStreamingMessage"
    call = rest_translate.rest_call(tenant + route, name, b"", rest_body(request))
    method, params = agent_request(call.method, call.request, V10, tenant=call.tenant)
    assert method == name
    # The SDK's JSON-RPC server: ParseDict(params, <the method's request message>). The body's
    # own tenant never reaches the agent; the path's does.
    expected = without_tenant(request)
    expected.tenant = tenant.rstrip("/")
    assert ParseDict(params, CORE[name].request()) == expected


@examples
@given(st.builds(pb.ListTasksRequest, context_id=ids, page_size=st.integers(1, 50),
                 status=states, include_artifacts=st.booleans()))
def test_list_tasks_query_reaches_the_agent_as_the_callers_request(request):
    # The SDK's REST client: the request's ProtoJSON as query parameters.
    query = urlencode({k: str(v).lower() if isinstance(v, bool) else v
                       for k, v in MessageToDict(request).items()}).encode()
    call = rest_translate.rest_call("tasks", "ListTasks", query, b"")
    _, params = agent_request(call.method, call.request, V10)
    assert ParseDict(params, pb.ListTasksRequest()) == request


@examples
@given(ids, st.integers(0, 9))
def test_task_routes_carry_the_path_and_query(task_id, history):
    query = f"historyLength={history}".encode() if history else b""
    call = rest_translate.rest_call(f"tasks/{task_id}", "GetTask", query, b"")
    assert call.request == pb.GetTaskRequest(id=task_id, history_length=history or None)
    cancel = rest_translate.rest_call(f"tasks/{task_id}:cancel", "CancelTask", b"", b"{}")
    assert cancel.request == pb.CancelTaskRequest(id=task_id)
    subscribe = rest_translate.rest_call(f"tasks/{task_id}:subscribe", "SubscribeToTask", b"",
                                         b"")
    assert subscribe.request == pb.SubscribeToTaskRequest(id=task_id)
    old = rest_translate.rest_call(f"v1/tasks/{task_id}", "GetTask", query, b"")
    assert old.version == V03 and old.request.id == task_id
    # 0.3 agent: the 0.3 params the SDK's 0.3 server reads.
    _, params = agent_request(old.method, old.request, V03)
    assert t03.TaskQueryParams.model_validate(params).id == task_id


@examples
@given(st.one_of(
    tasks().map(lambda t: ("GetTask", t)),
    tasks().map(lambda t: ("SendMessage", pb.SendMessageResponse(task=t))),
    messages().map(lambda m: ("SendMessage", pb.SendMessageResponse(message=m))),
    stream_events().map(lambda e: ("SendStreamingMessage", e)),
    st.lists(tasks(), max_size=2).map(
        lambda ts: ("ListTasks", pb.ListTasksResponse(tasks=ts, next_page_token="n"))),
))
def test_a_10_agents_answer_reaches_the_rest_caller_whole(case):
    name, reply = case
    call = rest_translate.RestCall(CORE[name], CORE[name].request(), V10, "")
    # What the SDK's JSON-RPC server sends, back to the ProtoJSON the SDK's REST client reads.
    core = agent_result(CORE[name], MessageToDict(reply), V10)
    sent = rest_translate.reply_json(call, core)
    assert parse_lenient(orjson.loads(orjson.dumps(sent)), type(reply)()) == reply


@examples
@given(send_requests())
def test_a_03_rest_caller_to_a_03_agent_sends_what_a_direct_03_mapping_sends(request):
    wire = ToProto.message(conversions.to_compat_message(request.message))
    caller_request = pb03.SendMessageRequest(request=wire)
    call = rest_translate.rest_call("v1/message:send", "SendMessage", b"",
                                    orjson.dumps(MessageToDict(caller_request)))
    assert call.version == V03
    _, params = agent_request(call.method, call.request, V03)
    direct = FromProto.message_send_params(caller_request).model_dump(
        by_alias=True, exclude_none=True, mode="json")
    assert params == pruned(direct)


@examples
@given(tasks())
def test_a_03_agents_task_reaches_a_03_rest_caller_as_a_direct_03_mapping_gives_it(task):
    answer = conversions.to_compat_task(task)
    result = answer.model_dump(by_alias=True, exclude_none=True, mode="json")
    call = rest_translate.rest_call("v1/tasks/x", "GetTask", b"", b"")
    sent = rest_translate.reply_json(call, agent_result(call.method, result, V03))
    direct = MessageToDict(ToProto.task(t03.Task.model_validate(result)))
    assert pruned(sent) == pruned(direct)


def test_routes_the_sdk_server_reads_as_tenant_v1_are_10_routes():
    # v1/tasks and v1/extendedAgentCard: A2A 0.3 has no such route; the SDK's server reads
    # them as tenant "v1".
    listed = rest_translate.rest_call("v1/tasks", "ListTasks", b"", b"")
    assert (listed.version, listed.tenant) == (V10, "v1")
    card = rest_translate.rest_call("v1/extendedAgentCard", "GetExtendedAgentCard", b"", b"")
    assert (card.version, card.tenant) == (V10, "v1")
    old_card = rest_translate.rest_call("v1/card", "GetExtendedAgentCard", b"", b"")
    assert old_card.version == V03
    tenant_old = rest_translate.rest_call("acme/v1/message:send", "SendMessage", b"", b"{}")
    assert (tenant_old.version, tenant_old.tenant) == (V03, "")


def test_agent_errors_take_the_sdk_rest_servers_form():
    status, body = rest_translate.agent_error_json({"code": -32001, "message": "gone"})
    assert status == 404
    assert body["error"]["status"] == "NOT_FOUND" and body["error"]["message"] == "gone"
    assert body["error"]["details"][0]["reason"] == "TASK_NOT_FOUND"
    status, body = rest_translate.agent_error_json({"code": -32099, "message": "odd"})
    assert status == 500 and "-32099" in body["error"]["message"]
