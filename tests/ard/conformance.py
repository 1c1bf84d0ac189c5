"""The checks of the ARD specification's conformance tool, as a library for the tests.

The official tool (``conformance/bin/conformance-test`` in ards-project/ard-spec) is not
published on any package registry, so CI cannot install it. This module performs the same
checks, in the same two modes, against the spec's own JSON Schema shipped in
``tests/data/ard/`` (with its licence): *manifest* mode (JSON Schema 2020-12, the URN pattern,
value-or-reference, representativeQueries sizing, trustManifest identity, no ``collections``)
and *registry* mode (``GET /agents`` items, ``POST /search`` with the tool's own probe body,
``POST /explore``), with optional request headers (the tool's ``--header``). Each function
returns the list of errors, empty when conformant; warnings are returned separately.
"""

from __future__ import annotations

import json
import re
from functools import lru_cache
from pathlib import Path
from typing import Any

import httpx
import jsonschema

DATA = Path(__file__).resolve().parent.parent / "data" / "ard"
URN_REGEX = re.compile(r"^urn:air:([a-zA-Z0-9.-]+)(?::([a-zA-Z0-9._:-]+))?:([a-zA-Z0-9._-]+)$")
STANDARD_TYPES = {
    "application/ai-catalog+json",
    "application/agent-card+json",
    "application/a2a-agent-card+json",
    "application/mcp-server-card+json",
    "application/agent-skills+zip",
    "application/agent-skills+gzip",
    'text/markdown; profile="urn:air:agent-skills"',
    "application/ai-registry",
    "application/ai-registry+json",
}


@lru_cache(maxsize=1)
def catalog_schema() -> dict[str, Any]:
    return json.loads((DATA / "ai-catalog.schema.json").read_text())


def entry_schema_errors(entry: dict[str, Any]) -> list[str]:
    """The spec's ``catalogEntry`` definition applied to one entry (search and list items)."""
    schema = catalog_schema()
    sub = {"$schema": schema["$schema"], "$defs": schema["$defs"], "$ref": "#/$defs/catalogEntry"}
    validator = jsonschema.Draft202012Validator(sub)
    return [
        f"{'.'.join(map(str, e.absolute_path))}: {e.message}" for e in validator.iter_errors(entry)
    ]


def check_manifest(raw: str | bytes) -> tuple[list[str], list[str]]:
    """Manifest mode. Returns (errors, warnings)."""
    errors: list[str] = []
    warnings: list[str] = []
    try:
        data = json.loads(raw)
    except ValueError as exc:
        return [f"Malformed JSON in manifest: {exc}"], warnings
    validator = jsonschema.Draft202012Validator(catalog_schema())
    for error in validator.iter_errors(data):
        errors.append(
            f"JSON Schema Validation Failed: {error.message} at path "
            f"'{'.'.join(map(str, error.absolute_path))}'"
        )
    if not data.get("specVersion"):
        errors.append("Missing required 'specVersion' root property.")
    elif data["specVersion"] != "1.0":
        warnings.append(f"Unrecognized 'specVersion': {data['specVersion']}")
    entries = data.get("entries")
    if not isinstance(entries, list):
        return errors + ["'entries' must be a JSON array."], warnings
    for idx, entry in enumerate(entries):
        label = entry.get("displayName") or entry.get("identifier") or f"Entry #{idx}"
        ident = entry.get("identifier")
        if not ident:
            errors.append(f"[{label}] Missing required 'identifier'.")
        elif not URN_REGEX.match(ident):
            errors.append(f"[{label}] Identifier '{ident}' does not match the URN pattern.")
        if not entry.get("displayName"):
            errors.append(f"[{label}] Missing required 'displayName'.")
        media_type = entry.get("type")
        if not media_type:
            errors.append(f"[{label}] Missing required 'type' (mediaType).")
        elif media_type not in STANDARD_TYPES:
            warnings.append(f"[{label}] Media type '{media_type}' is not a standard type.")
        has_url, has_data = "url" in entry, "data" in entry
        if has_url == has_data:
            errors.append(f"[{label}] MUST provide exactly one of 'url' and 'data'.")
        queries = entry.get("representativeQueries")
        if queries is not None:
            if not isinstance(queries, list):
                errors.append(f"[{label}] 'representativeQueries' must be an array.")
            else:
                if not 2 <= len(queries) <= 5:
                    warnings.append(f"[{label}] 'representativeQueries' has {len(queries)}.")
                errors += [
                    f"[{label}] Query {q!r} is not a string."
                    for q in queries
                    if not isinstance(q, str)
                ]
        trust = entry.get("trustManifest")
        if trust is not None and (not isinstance(trust, dict) or not trust.get("identity")):
            errors.append(f"[{label}] 'trustManifest' needs an 'identity'.")
    if "collections" in data:
        errors.append("Deprecated 'collections' array at root.")
    return errors, warnings


def _json(resp: httpx.Response) -> Any:
    return json.loads(resp.content.decode("utf-8"))


def check_registry(
    base_url: str, headers: dict[str, str] | None = None
) -> tuple[list[str], list[str]]:
    """Registry mode against a live registry (the tool's three probes). (errors, warnings)."""
    errors: list[str] = []
    warnings: list[str] = []
    base = base_url.rstrip("/")
    headers = dict(headers or {})
    with httpx.Client(timeout=5, headers=headers) as client:
        resp = client.get(f"{base}/agents")
        if resp.status_code == 200:
            data = _json(resp)
            if not isinstance(data, dict) or "items" not in data:
                errors.append("GET /agents response is missing the 'items' array.")
        elif resp.status_code in (404, 501):
            warnings.append(f"GET /agents answered {resp.status_code} (optional).")
        else:
            errors.append(f"GET /agents returned {resp.status_code}")

        probe = {
            "query": {
                "text": "weather forecast tools",
                "filter": {"type": ["application/mcp-server-card+json"]},
            },
            "federation": "none",
            "pageSize": 2,
        }
        for body in (
            probe,
            {"query": {"text": "weather forecast tools"}, "federation": "none", "pageSize": 2},
        ):
            resp = client.post(f"{base}/search", json=body)
            if resp.status_code != 200:
                errors.append(f"POST /search returned {resp.status_code}")
                continue
            results = _json(resp).get("results")
            if not isinstance(results, list):
                errors.append("POST /search response is missing the 'results' array.")
                continue
            for idx, item in enumerate(results):
                label = f"Result #{idx}"
                score = item.get("score")
                if isinstance(score, bool) or not isinstance(score, int) or not 0 <= score <= 100:
                    errors.append(f"[{label}] 'score' must be an integer from 0 to 100.")
                if not item.get("source"):
                    errors.append(f"[{label}] Missing 'source'.")
                for key in ("identifier", "displayName", "type"):
                    if not item.get(key):
                        errors.append(f"[{label}] Missing '{key}'.")
                if "url" not in item and "data" not in item:
                    errors.append(f"[{label}] Needs 'url' or 'data'.")

        resp = client.post(
            f"{base}/explore",
            json={"query": {"text": "weather"}, "resultType": {"facets": [{"field": "type"}]}},
        )
        if resp.status_code == 200:
            data = _json(resp)
            if data.get("resultType") != "facets":
                errors.append("POST /explore 'resultType' is not 'facets'.")
            if not isinstance(data.get("facets"), dict):
                errors.append("POST /explore 'facets' is not an object.")
        elif resp.status_code in (404, 501):
            warnings.append(f"POST /explore answered {resp.status_code} (optional).")
        else:
            errors.append(f"POST /explore returned {resp.status_code}")
    return errors, warnings


@lru_cache(maxsize=1)
def _openapi_registry():
    import yaml
    from referencing import Registry, Resource
    from referencing.jsonschema import DRAFT202012

    openapi = yaml.safe_load((DATA / "ard.openapi.yaml").read_text())
    return Registry().with_resources(
        [
            (f"{BASE_URI}ard.openapi.yaml", Resource(openapi, specification=DRAFT202012)),
            (
                f"{BASE_URI}ai-catalog.schema.json",
                Resource(catalog_schema(), specification=DRAFT202012),
            ),
        ]
    )


BASE_URI = "https://ard-spec.test/spec/schemas/"


def openapi_errors(component: str, instance: Any) -> list[str]:
    """Validate an API answer against a schema of the spec's OpenAPI document
    (``components/schemas/<component>``, e.g. ``SearchResponse``, ``Error``)."""
    schema = {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "$ref": f"{BASE_URI}ard.openapi.yaml#/components/schemas/{component}",
    }
    validator = jsonschema.Draft202012Validator(schema, registry=_openapi_registry())
    return [
        f"{'.'.join(map(str, e.absolute_path))}: {e.message}"
        for e in validator.iter_errors(instance)
    ]
