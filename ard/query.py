"""The ARD query model (§7.1) and request shapes of search, explore and list, validated.

Bad input raises :class:`ArdError` with the HTTP status and error code of Appendix B
(``INVALID_ARGUMENT`` 400, ``UNAUTHENTICATED`` 401, ``NOT_FOUND`` 404, ...) and a message that
says what to fix. Every count and length is bounded.
"""

from __future__ import annotations

import base64
import hashlib
import re
from dataclasses import dataclass, field
from datetime import UTC, datetime, time
from typing import Any

import orjson
from django.utils import timezone
from django.utils.dateparse import parse_date, parse_datetime

MAX_TEXT = 2000
MAX_FILTER_KEYS = 16
MAX_FILTER_VALUES = 100
MAX_VALUE_CHARS = 512
MAX_PATH_CHARS = 200
MAX_PATH_SEGMENTS = 8
MAX_PAGE_SIZE = 100
MAX_OFFSET = 100_000
MAX_FACETS = 16
MAX_FACET_LIMIT = 1000
MAX_TOKEN_CHARS = 512
MAX_LIST_FILTER_CHARS = 2000

#: Top-level fields of a catalog entry (ARD §4.2), plus ``publisher`` (§7.1) and ``host``.
FILTER_ROOTS = frozenset(
    {
        "identifier",
        "displayName",
        "type",
        "url",
        "description",
        "tags",
        "capabilities",
        "representativeQueries",
        "version",
        "updatedAt",
        "metadata",
        "trustManifest",
        "host",
        "publisher",
    }
)
_SEGMENT = re.compile(r"^[A-Za-z0-9_@$-]{1,64}$")


class ArdError(Exception):
    """A client-facing ARD error (Appendix B)."""

    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message

    def body(self) -> dict[str, str]:
        return {"errorCode": self.code, "message": self.message}


def invalid(message: str) -> ArdError:
    return ArdError(400, "INVALID_ARGUMENT", message)


@dataclass(frozen=True)
class Query:
    text: str | None = None
    filter: dict[str, tuple[str, ...]] = field(default_factory=dict)

    def fingerprint(self) -> str:
        raw = orjson.dumps([self.text, sorted(self.filter.items())])
        return hashlib.sha256(raw).hexdigest()[:16]


@dataclass(frozen=True)
class SearchRequest:
    query: Query
    federation: str
    page_size: int
    offset: int


@dataclass(frozen=True)
class Facet:
    field: str
    limit: int
    min_count: int


@dataclass(frozen=True)
class ExploreRequest:
    query: Query
    facets: list[Facet]


@dataclass(frozen=True)
class Clause:
    field: str
    op: str
    values: tuple[str, ...]


@dataclass(frozen=True)
class ListRequest:
    clauses: list[Clause]
    order_by: list[tuple[str, bool]]  # (field, descending)
    page_size: int
    offset: int
    fingerprint: str


def _object(value: Any, where: str, allowed: frozenset[str]) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise invalid(f"{where} must be a JSON object")
    unknown = sorted(set(value) - allowed)
    if unknown:
        raise invalid(f"{where}: unknown field(s): {', '.join(unknown)[:200]}")
    return value


def _int(value: Any, where: str, low: int, high: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise invalid(f"{where} must be an integer from {low} to {high}")
    return value


def check_path(path: Any, where: str) -> str:
    """A field path: dot-separated segments under a catalog entry field."""
    if not isinstance(path, str) or not path or len(path) > MAX_PATH_CHARS:
        raise invalid(
            f"{where}: a field path is a non-empty string of at most {MAX_PATH_CHARS} characters"
        )
    segments = path.split(".")
    if len(segments) > MAX_PATH_SEGMENTS or not all(_SEGMENT.match(s) for s in segments):
        raise invalid(f"{where}: {path[:80]!r} is not a dot-separated field path")
    if segments[0] not in FILTER_ROOTS:
        raise invalid(
            f"{where}: unsupported field {segments[0][:64]!r}; supported: "
            + ", ".join(sorted(FILTER_ROOTS))
        )
    return path


def parse_query(value: Any, *, text_required: bool) -> Query:
    """The shared query object: ``text`` and ``filter`` (ARD §7.1)."""
    if value is None:
        if text_required:
            raise invalid("query is required")
        return Query()
    data = _object(value, "query", frozenset({"text", "filter"}))
    text = data.get("text")
    if text is None:
        if text_required:
            raise invalid("query.text is required")
    elif not isinstance(text, str) or not text.strip():
        raise invalid("query.text must be a non-empty string")
    elif len(text) > MAX_TEXT:
        raise invalid(f"query.text is longer than {MAX_TEXT} characters")
    raw_filter = data.get("filter")
    filters: dict[str, tuple[str, ...]] = {}
    if raw_filter is not None:
        if not isinstance(raw_filter, dict):
            raise invalid("query.filter must be an object of field path -> values")
        if len(raw_filter) > MAX_FILTER_KEYS:
            raise invalid(f"query.filter has more than {MAX_FILTER_KEYS} keys")
        for key, values in raw_filter.items():
            path = check_path(key, "query.filter")
            if isinstance(values, str):
                values = [values]  # a bare scalar is a one-element array (§7.1)
            if not isinstance(values, list) or not values:
                raise invalid(f"query.filter.{path}: a string or a non-empty array of strings")
            if len(values) > MAX_FILTER_VALUES:
                raise invalid(f"query.filter.{path}: more than {MAX_FILTER_VALUES} values")
            if not all(isinstance(v, str) and len(v) <= MAX_VALUE_CHARS for v in values):
                raise invalid(
                    f"query.filter.{path}: values must be strings of at most "
                    f"{MAX_VALUE_CHARS} characters"
                )
            filters[path] = tuple(dict.fromkeys(values))
    return Query(text=text.strip() if isinstance(text, str) else None, filter=filters)


def encode_token(offset: int, fingerprint: str) -> str:
    raw = orjson.dumps({"o": offset, "q": fingerprint})
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def decode_token(token: Any, fingerprint: str) -> int:
    """The offset a page token stands for; it must come from the same query."""
    if not isinstance(token, str) or not token or len(token) > MAX_TOKEN_CHARS:
        raise invalid("pageToken must be a token from a previous response")
    try:
        data = orjson.loads(base64.urlsafe_b64decode(token + "=" * (-len(token) % 4)))
        offset, owner = data["o"], data["q"]
    except (ValueError, TypeError, KeyError, orjson.JSONDecodeError):
        raise invalid("pageToken is not a token from a previous response") from None
    if owner != fingerprint:
        raise invalid("pageToken belongs to another query")
    if isinstance(offset, bool) or not isinstance(offset, int) or not 0 <= offset <= MAX_OFFSET:
        raise invalid("pageToken is out of range")
    return offset


def parse_search(body: Any, *, actor_key: str) -> SearchRequest:
    data = _object(
        body, "request body", frozenset({"query", "federation", "pageSize", "pageToken"})
    )
    query = parse_query(data.get("query"), text_required=True)
    federation = data.get("federation", "auto")
    if federation not in ("auto", "referrals", "none"):
        raise invalid("federation must be one of auto, referrals, none")
    page_size = _int(data.get("pageSize", 10), "pageSize", 1, MAX_PAGE_SIZE)
    offset = 0
    if data.get("pageToken") not in (None, ""):
        offset = decode_token(data["pageToken"], query.fingerprint() + actor_key)
    return SearchRequest(query=query, federation=federation, page_size=page_size, offset=offset)


def parse_explore(body: Any) -> ExploreRequest:
    data = _object(body, "request body", frozenset({"query", "resultType"}))
    query = parse_query(data.get("query"), text_required=False)
    result_type = data.get("resultType")
    if result_type is None:
        raise invalid("resultType is required (the one defined shape is facets)")
    result_type = _object(result_type, "resultType", frozenset({"facets"}))
    facets_raw = result_type.get("facets")
    if not isinstance(facets_raw, list) or not 1 <= len(facets_raw) <= MAX_FACETS:
        raise invalid(f"resultType.facets must be an array of 1 to {MAX_FACETS} facets")
    facets = []
    for i, raw in enumerate(facets_raw):
        item = _object(raw, f"resultType.facets[{i}]", frozenset({"field", "limit", "minCount"}))
        facets.append(
            Facet(
                field=check_path(item.get("field"), f"resultType.facets[{i}].field"),
                limit=_int(
                    item.get("limit", 20), f"resultType.facets[{i}].limit", 1, MAX_FACET_LIMIT
                ),
                min_count=_int(
                    item.get("minCount", 1), f"resultType.facets[{i}].minCount", 0, 1_000_000_000
                ),
            )
        )
    return ExploreRequest(query=query, facets=facets)


# --- GET /agents: the Appendix A filter expression ----------------------------------------------

LIST_FIELDS = {
    "displayName": "contains",
    "type": "eq",
    "publisherId": "eq",
    "publisher": "eq",
    "tags": "eq",
    "capabilities": "eq",
    "identifier": "eq",
    "createdAfter": "time",
    "updatedAfter": "time",
}
ORDER_FIELDS = {
    "displayName": "name",
    "identifier": "agent_id",
    "updatedAt": "updated_at",
    "createdAt": "registry_agent__registered_at",
    "name": "name",
    "created_at": "registry_agent__registered_at",
    "updated_at": "updated_at",
}
_CLAUSE = re.compile(
    r"\s*(?P<field>[A-Za-z][A-Za-z0-9_]*)\s*(?P<op>>=|<=|!=|=|>|<|:)\s*"
    r"(?P<value>'[^']*'|\"[^\"]*\"|[^\s'\"]+)\s*"
)
_AND = re.compile(r"AND\b\s*", re.IGNORECASE)


def parse_list_filter(expr: str) -> list[Clause]:
    """``field = 'v1,v2' AND createdAfter > '2026-01-01'`` (ARD Appendix A): OR within a
    field's comma-separated values, AND across clauses."""
    if len(expr) > MAX_LIST_FILTER_CHARS:
        raise invalid(f"filter is longer than {MAX_LIST_FILTER_CHARS} characters")
    clauses: list[Clause] = []
    pos = 0
    expr = expr.strip()
    while pos < len(expr):
        match = _CLAUSE.match(expr, pos)
        if not match:
            raise invalid(
                f"filter: expected `field = 'value'` at character {pos + 1}: "
                f"{expr[pos : pos + 40]!r}"
            )
        name, op, value = match["field"], match["op"], match["value"]
        kind = LIST_FIELDS.get(name)
        if kind is None:
            raise invalid(
                f"filter: unsupported field {name!r}; supported: " + ", ".join(sorted(LIST_FIELDS))
            )
        if value[:1] in ("'", '"'):
            value = value[1:-1]
        if kind == "time":
            if op not in (">", ">=", "=", ":"):
                raise invalid(f"filter: {name} takes > (after) a timestamp")
            values: tuple[str, ...] = (value,)
            parse_time(value, name)
        else:
            if op not in ("=", ":"):
                raise invalid(f"filter: {name} takes = (comma-separated values are OR)")
            values = tuple(v.strip() for v in value.split(",") if v.strip())
            if not values or len(values) > MAX_FILTER_VALUES:
                raise invalid(f"filter: {name} needs 1 to {MAX_FILTER_VALUES} values")
        clauses.append(Clause(name, op, values))
        if len(clauses) > MAX_FILTER_KEYS:
            raise invalid(f"filter has more than {MAX_FILTER_KEYS} clauses")
        pos = match.end()
        if pos < len(expr):
            joined = _AND.match(expr, pos)
            if not joined:
                raise invalid(f"filter: expected AND at character {pos + 1}")
            pos = joined.end()
            if pos >= len(expr):
                raise invalid("filter: a clause must follow AND")
    return clauses


def parse_time(value: str, where: str) -> datetime:
    moment = parse_datetime(value)
    if moment is None:
        day = parse_date(value) if re.fullmatch(r"\d{4}-\d{2}-\d{2}", value) else None
        if day is None:
            raise invalid(f"filter: {where} needs an ISO 8601 timestamp, not {value[:40]!r}")
        moment = datetime.combine(day, time.min)
    if timezone.is_naive(moment):
        moment = timezone.make_aware(moment, UTC)
    return moment


def parse_order(expr: str) -> list[tuple[str, bool]]:
    out = []
    for part in [p.strip() for p in expr.split(",") if p.strip()][:4]:
        words = part.split()
        if (
            len(words) > 2
            or words[0] not in ORDER_FIELDS
            or (len(words) == 2 and words[1].upper() not in ("ASC", "DESC"))
        ):
            raise invalid(
                f"orderBy: {part[:60]!r}; use a field of "
                + ", ".join(sorted(ORDER_FIELDS))
                + " with optional ASC or DESC"
            )
        out.append((ORDER_FIELDS[words[0]], len(words) == 2 and words[1].upper() == "DESC"))
    return out


def parse_list(params: dict[str, str], *, actor_key: str) -> ListRequest:
    unknown = sorted(set(params) - {"filter", "orderBy", "pageSize", "pageToken"})
    if unknown:
        raise invalid(f"unknown parameter(s): {', '.join(unknown)[:200]}")
    clauses = parse_list_filter(params.get("filter") or "")
    order = parse_order(params.get("orderBy") or "")
    size_raw = params.get("pageSize")
    page_size = 20
    if size_raw not in (None, ""):
        if not re.fullmatch(r"\d{1,4}", size_raw):
            raise invalid(f"pageSize must be an integer from 1 to {MAX_PAGE_SIZE}")
        page_size = _int(int(size_raw), "pageSize", 1, MAX_PAGE_SIZE)
    fingerprint = (
        hashlib.sha256(
            orjson.dumps([params.get("filter") or "", params.get("orderBy") or ""])
        ).hexdigest()[:16]
        + actor_key
    )
    offset = 0
    if params.get("pageToken"):
        offset = decode_token(params["pageToken"], fingerprint)
    return ListRequest(
        clauses=clauses, order_by=order, page_size=page_size, offset=offset, fingerprint=fingerprint
    )
