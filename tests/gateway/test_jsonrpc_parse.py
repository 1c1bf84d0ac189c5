"""gateway.jsonrpc.parse_request: the lazy parse of large request bodies gives the gateway the
answers a whole orjson parse gives (validity, top-level shape, id, method, the caller's
timeout), on a corpus of hand-picked edge cases and of seeded random mutations."""

from __future__ import annotations

import random

import orjson
import pytest

from gateway import jsonrpc
from gateway.jsonrpc import LAZY_ABOVE_BYTES, REUSE_PARSER_UP_TO_BYTES, parse_request

PAD = "p" * (LAZY_ABOVE_BYTES + 100)


def big(head: bytes, tail: bytes = b"}") -> bytes:
    """``head`` + a string member long enough for the lazy parse + ``tail``."""
    return head + b',"pad":"' + PAD.encode() + b'"' + tail


def request(**fields) -> bytes:
    return orjson.dumps({"jsonrpc": "2.0", "id": 1, "method": "message/send",
                         "params": {"configuration": {"timeout": 7},
                                    "message": {"parts": [{"kind": "text", "text": PAD}]}},
                         **fields})


def answers(body: bytes, parse) -> tuple:
    """What the gateway reads of a body, through ``parse``: ("invalid",), or the top-level
    value's shape and the fields the handler uses."""
    try:
        value = parse(body)
    except orjson.JSONDecodeError:
        return ("invalid",)
    if not isinstance(value, dict):
        return ("not an object", value)
    params = value.get("params")
    configuration = params.get("configuration") if isinstance(params, dict) else None
    timeout = configuration.get("timeout", "absent") if isinstance(configuration, dict) \
        else "absent"
    return ("object", value.get("jsonrpc", "absent"), value.get("id", "absent"),
            value.get("method", "absent"), timeout)


def assert_same(body: bytes) -> None:
    assert len(body) > LAZY_ABOVE_BYTES
    assert answers(body, parse_request) == answers(body, orjson.loads), body[:200]


EDGE_CASES = [
    request(),
    request(id={"nested": [1, {"x": None}]}),
    request(id="s", method=5),
    request(id=None, method=""),
    request(id=1.5e300),
    big(b'{"jsonrpc":"2.0","id":1,"method":"m","params":[1,2,3]'),
    big(b'{"jsonrpc":"2.0","id":1,"method":"m","params":{"configuration":5}'),
    big(b'{"jsonrpc":"2.0","id":1,"method":"m","params":{"configuration":{"timeout":"9"}}'),
    big(b'{"jsonrpc":"2.0","id":1,"method":"m","params":{"configuration":{"timeout":{"a":1}}}'),
    # duplicate keys at a level the gateway reads: the last one counts (orjson, most agents)
    big(b'{"method":"","id":1,"method":"message/send"'),
    big(b'{"method":"message/send","id":1,"method":""'),
    big(b'{"id":1,"method":"m","params":{"configuration":{"timeout":1,"timeout":2}}'),
    big(b'{"id":1,"method":"m","params":{"configuration":{},"configuration":{"timeout":3}}'),
    big(b'{"id":1,"method":"m","params":{"a":1},"params":{"configuration":{"timeout":4}}'),
    big(b'{"id":{"k":1,"k":2},"method":"m"'),
    # not one object
    b"[" + request() + b"]",
    b'"' + PAD.encode() + b'"',
    b"  \n" + request() + b"\t ",
    # invalid: each refused by both
    b"\xef\xbb\xbf" + request(),  # a UTF-8 byte order mark
    big(b'{"id":1,"method":"m","x":"\xff\xfe"'),  # invalid UTF-8
    big(b'{"id":1,"method":"m","x":"\xed\xa0\x80"'),  # an encoded surrogate
    big(b'{"id":1,"method":"m","x":"\\ud800"'),  # a lone surrogate escape
    big(b'{"id":1,"method":"m","x":"\\q"'),
    big(b'{"id":1,"method":"m","x":"a\x01b"'),
    big(b'{"id":1,"method":"m","x":NaN'),
    big(b'{"id":1,"method":"m","x":1e400'),
    big(b'{"id":1,"method":"m","x":1,'),
    big(b'{"id":1,"method":"m"', b"} x"),
    big(b'{"id":1,"method":"m"', b""),
    # big integers: simdjson refuses them, orjson decides
    big(b'{"id":123456789012345678901234567890,"method":"m"'),
    big(b'{"id":1,"method":"m","n":-123456789012345678901234567890'),
    # depth: 1024 levels are taken, 1025 are not
    big(b'{"id":1,"method":"m","deep":' + b"[" * 1022 + b"]" * 1022),
    big(b'{"id":1,"method":"m","deep":' + b"[" * 1024 + b"]" * 1024),
]


@pytest.mark.parametrize("body", EDGE_CASES, ids=range(len(EDGE_CASES)))
def test_edge_cases_answer_as_the_whole_parse(body):
    assert_same(body)


def test_the_lazy_parse_is_the_one_taken_and_builds_only_what_is_read():
    body = request(id="r-1")
    skeleton = parse_request(body)
    assert skeleton == {"jsonrpc": "2.0", "id": "r-1", "method": "message/send",
                        "params": {"configuration": {"timeout": 7}}}
    assert parse_request(body, whole=True) == orjson.loads(body)  # tracing's whole parse
    small = orjson.dumps({"jsonrpc": "2.0", "id": 1, "method": "m", "params": {"a": [1]}})
    assert parse_request(small) == orjson.loads(small)


def test_random_mutations_answer_as_the_whole_parse():
    """Seeded mutations (bytes replaced, inserted, deleted) of structured requests, across
    the lazy threshold's both sides of the parser reuse: any difference fails."""
    rng = random.Random(20261202)
    seeds = [
        request(),
        big(b'{"jsonrpc":"2.0","id":"x","method":"message/stream","params":{"configuration":'
            b'{"timeout":2.5},"message":{"parts":[{"kind":"data","data":{"a":[1,-2.5e3,true,'
            b'false,null,0,-0,1E2],"s":"h\\u00e9llo \\ud83d\\ude00 \xc3\xa9"}}]}}'),
    ]
    alphabet = b'{}[]",:\\ 0123456789.eE+-truefalsnul\x00\x01\x7f\xff\xc3\xa9\xed\xa0\x80\t\nuU'
    for _ in range(3000):
        body = bytearray(rng.choice(seeds))
        for _ in range(rng.randint(1, 3)):
            # mutate near the start, where the fields the gateway reads are
            where = rng.randrange(min(len(body), 260))
            roll = rng.random()
            if roll < 0.4:
                body[where] = rng.choice(alphabet)
            elif roll < 0.7:
                body.insert(where, rng.choice(alphabet))
            else:
                del body[where]
        if len(body) > LAZY_ABOVE_BYTES:
            assert_same(bytes(body))


def test_bodies_above_the_reuse_bound_get_a_parser_of_their_own(monkeypatch):
    """A huge body never leaves its buffers in the reused parser, and a parse after it
    reads the right document."""
    made = []
    real = jsonrpc.simdjson.Parser

    def counting_parser(*args, **kwargs):
        made.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(jsonrpc.simdjson, "Parser", counting_parser)
    parse_request(request(id="warm"))  # the thread's reused parser exists from here on
    made.clear()
    huge = big(b'{"id":"huge","method":"m"', b',"more":"' + b"q" * REUSE_PARSER_UP_TO_BYTES
               + b'"}')
    assert parse_request(huge)["id"] == "huge" and made == [1]
    assert parse_request(request(id="after"))["id"] == "after" and made == [1]


def rest_answers(body: bytes, parse) -> tuple:
    """What the gateway reads of an HTTP+JSON binding's body: validity, shape, its timeout."""
    try:
        value = parse(body)
    except orjson.JSONDecodeError:
        return ("invalid",)
    if not isinstance(value, dict):
        return ("not an object", value)
    configuration = value.get("configuration")
    return ("object", configuration.get("timeout", "absent")
            if isinstance(configuration, dict) else "absent")


def test_rest_bodies_answer_as_the_whole_parse():
    """The HTTP+JSON binding's bodies (the params themselves): the lazy parse builds only
    ``configuration.timeout`` and answers as orjson does, mutations included."""
    body = orjson.dumps({"message": {"parts": [{"text": PAD}]}, "configuration": {"timeout": 3}})
    assert parse_request(body, rest=True) == {"configuration": {"timeout": 3}}
    assert parse_request(body, rest=True, whole=True) == orjson.loads(body)
    rng = random.Random(20261203)
    seeds = [body, big(b'{"configuration":{"timeout":"x","blocking":true}'),
             big(b'{"configuration":7'), big(b'{"configuration":{"timeout":1},'
                                            b'"configuration":{"timeout":2}')]
    alphabet = b'{}[]",:\\ 0123456789.eE+-truefalsnul\x00\xff\xc3\xa9'
    for seed in seeds:
        assert rest_answers(seed, lambda b: parse_request(b, rest=True)) == \
            rest_answers(seed, orjson.loads)
    for _ in range(2000):
        mutated = bytearray(rng.choice(seeds))
        for _ in range(rng.randint(1, 3)):
            where = rng.randrange(min(len(mutated), 120))
            roll = rng.random()
            if roll < 0.4:
                mutated[where] = rng.choice(alphabet)
            elif roll < 0.7:
                mutated.insert(where, rng.choice(alphabet))
            else:
                del mutated[where]
        if len(mutated) > LAZY_ABOVE_BYTES:
            data = bytes(mutated)
            assert rest_answers(data, lambda b: parse_request(b, rest=True)) == \
                rest_answers(data, orjson.loads), data[:200]
