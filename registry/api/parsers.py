"""A JSON parser that keeps the request's bytes, so a card registered inside a JSON body is
stored exactly as the client wrote it (``GET /api/v1/agents/{id}/card`` answers those bytes:
whitespace, key order and signatures intact)."""

from __future__ import annotations

import json
from typing import Any

import orjson
from rest_framework.exceptions import ParseError
from rest_framework.parsers import JSONParser

_WHITESPACE = json.decoder.WHITESPACE.match  # type: ignore[attr-defined]  # not in typeshed
_DECODER = json.JSONDecoder()


def parse_json(raw: bytes) -> Any:
    """The JSON document ``raw``; :class:`ParseError` (400) with the API's message if it is not
    one (the DRF parser and the registration fast path alike)."""
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise ParseError(f"JSON parse error - {exc}") from None


class RawJSONParser(JSONParser):
    def parse(self, stream, media_type=None, parser_context=None) -> Any:
        raw = stream.read() if stream is not None else b""
        data = parse_json(raw)
        request = (parser_context or {}).get("request")
        if request is not None:
            request.raw_json_body = raw
        return data


def raw_member(request, name: str) -> bytes | None:
    """The bytes of the top-level member ``name`` of the request's JSON object, as sent (the
    last one if repeated, as the parsed value is), or None."""
    return raw_json_member(getattr(request, "raw_json_body", None), name)


def raw_json_member(raw: bytes | None, name: str) -> bytes | None:
    """:func:`raw_member` of a body given as bytes."""
    if not raw:
        return None
    try:
        return _member(raw.decode("utf-8"), name)
    except (ValueError, IndexError):
        return None


def _member(text: str, name: str) -> bytes | None:
    i = _WHITESPACE(text, 0).end()
    if text[i] != "{":
        return None
    i = _WHITESPACE(text, i + 1).end()
    found = None
    while text[i] != "}":
        if text[i] != '"':
            return None
        key, i = json.decoder.scanstring(text, i + 1)  # type: ignore[attr-defined]  # not in typeshed
        i = _WHITESPACE(text, i).end()
        if text[i] != ":":
            return None
        i = _WHITESPACE(text, i + 1).end()
        _, end = _DECODER.raw_decode(text, i)
        if key == name:
            found = text[i:end].encode("utf-8")
        i = _WHITESPACE(text, end).end()
        if text[i] == ",":
            i = _WHITESPACE(text, i + 1).end()
    return found
