"""The ``DISCOVERY_CONFIG`` file (JSON or YAML): read at start and at each cycle, synced into the
same models the admin edits. Rows the file created carry ``origin="file"``; a row that leaves
the file is deleted, admin rows are left alone (a file entry with an admin row's key takes it
over: the version-controlled file wins). Its entries are the default tenant's (docs/tenants.md).
"""

from __future__ import annotations

import hashlib
import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from django.conf import settings
from django.db import transaction

from discovery.models import (
    NEED_TEXT_MAX,
    AllowedHost,
    CapabilityTag,
    ConfiguredAgent,
    DiscoveryPolicy,
    Need,
    Origin,
    SourceFeed,
)
from discovery.names import local_name_error
from registry.ids import DEFAULT_TENANT

logger = logging.getLogger(__name__)

TOP_LEVEL_KEYS = frozenset(
    {"allowlist", "static", "probe", "registry", "kubernetes", "needs", "max_agents", "health",
     "catalogs"}
)


class ConfigFileError(ValueError):
    """The discovery configuration file is unreadable or malformed; the message says where."""


@dataclass(frozen=True)
class SyncResult:
    path: str
    sha256: str
    changed: bool


def _read(path: Path) -> tuple[dict[str, Any], str]:
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise ConfigFileError(f"{path}: cannot read: {exc}") from None
    digest = hashlib.sha256(raw).hexdigest()
    try:
        if path.suffix.lower() == ".json":
            data = json.loads(raw)
        else:  # YAML is a superset of JSON
            data = yaml.safe_load(raw)
    except (ValueError, yaml.YAMLError) as exc:
        raise ConfigFileError(f"{path}: not valid JSON/YAML: {exc}") from None
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigFileError(f"{path}: the top level must be an object")
    return data, digest


def _list(data: dict, key: str) -> list[dict]:
    value = data.get(key) or []
    if not isinstance(value, list) or not all(isinstance(v, dict) for v in value):
        raise ConfigFileError(f"{key}: must be a list of objects")
    return value


def _str_list(value: Any, where: str) -> list[str]:
    if value is None:
        return []
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise ConfigFileError(f"{where}: must be a list of strings")
    return value


def _positive(value: Any, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigFileError(f"{where}: must be a positive integer")
    return value


def validate_config(data: dict[str, Any]) -> dict[str, Any]:
    """Check the file's shape (docs/discovery.md) and return it normalised."""
    unknown = sorted(set(data) - TOP_LEVEL_KEYS)
    if unknown:
        raise ConfigFileError(f"unknown keys: {', '.join(unknown)}")
    out: dict[str, Any] = {"allowlist": [], "static": [], "probe": [], "needs": []}
    for i, entry in enumerate(_list(data, "allowlist")):
        host = entry.get("host")
        if not isinstance(host, str) or not host.strip():
            raise ConfigFileError(f"allowlist[{i}].host: required")
        out["allowlist"].append(
            {"host": host.strip().lower(), "allow_http": bool(entry.get("allow_http", False))}
        )
    names: set[str] = set()
    for kind, url_key in (("static", "url"), ("probe", "base_url")):
        for i, entry in enumerate(_list(data, kind)):
            url = entry.get(url_key) or entry.get("url")
            name = entry.get("local_name")
            if not isinstance(url, str) or not url:
                raise ConfigFileError(f"{kind}[{i}].{url_key}: required")
            error = local_name_error(name)
            if error:
                raise ConfigFileError(f"{kind}[{i}].local_name: {error}")
            if name in names:
                raise ConfigFileError(f"{kind}[{i}].local_name: {name!r} is used twice")
            names.add(name)  # type: ignore[arg-type]  # local_name_error refused non-strings
            description = entry.get("description") or ""
            if not isinstance(description, str):
                raise ConfigFileError(f"{kind}[{i}].description: must be a string")
            out[kind].append({
                "local_name": name, "url": url, "description": description,
                "critical": bool(entry.get("critical", False)),
            })
    registry = data.get("registry") or {}
    if not isinstance(registry, dict):
        raise ConfigFileError("registry: must be an object")
    out["registry"] = {
        "local": bool(registry.get("local", False)),
        "remote": _str_list(registry.get("remote"), "registry.remote"),
        "token_env": registry.get("token_env") or "",
    }
    kube = data.get("kubernetes")
    if kube is not None:
        if not isinstance(kube, dict) or not isinstance(kube.get("label_selector"), str):
            raise ConfigFileError("kubernetes: must be an object with a label_selector")
        out["kubernetes"] = kube
    out["catalogs"] = _catalogs(data.get("catalogs"))
    keys: set[tuple[str, str]] = set()
    for i, entry in enumerate(_list(data, "needs")):
        tag, text = entry.get("tag"), entry.get("text")
        if (tag is None) == (text is None):
            raise ConfigFileError(
                f"needs[{i}]: give a tag, or a text describing what is needed (not both)"
            )
        kind, value = ("tag", tag) if tag is not None else ("text", text)
        if not isinstance(value, str) or not value.strip():
            raise ConfigFileError(f"needs[{i}].{kind}: a non-empty string")
        value = value.strip()
        if kind == "text" and len(value) > NEED_TEXT_MAX:
            raise ConfigFileError(f"needs[{i}].text: at most {NEED_TEXT_MAX} characters")
        if (kind, value) in keys:
            raise ConfigFileError(f"needs[{i}].{kind}: {value!r} is used twice")
        keys.add((kind, value))
        description = entry.get("description")
        if not isinstance(description, str) or not description.strip():
            raise ConfigFileError(f"needs[{i}].description: a reviewed description is required")
        require_signed = entry.get("require_signed", False)
        if not isinstance(require_signed, bool):
            raise ConfigFileError(f"needs[{i}].require_signed: must be true or false")
        out["needs"].append({
            "tag": value if kind == "tag" else "", "text": value if kind == "text" else "",
            "require_signed": require_signed,
            "input_modes": _str_list(entry.get("input_modes"), f"needs[{i}].input_modes"),
            "output_modes": _str_list(entry.get("output_modes"), f"needs[{i}].output_modes"),
            "description": description,
        })
    if "max_agents" in data:
        out["max_agents"] = _positive(data["max_agents"], "max_agents")
    health = data.get("health") or {}
    if not isinstance(health, dict):
        raise ConfigFileError("health: must be an object")
    for key in ("degrade_after", "recover_after"):
        if key in health:
            out[key] = _positive(health[key], f"health.{key}")
    return out


def _catalogs(value: Any) -> list[tuple[str, dict[str, Any]]]:
    """``catalogs``: ARD ai-catalog.json sources, each a domain or URL string, or an object
    ``{"domain" | "url", "max_depth", "prefix"}``. Returns (catalog URL, options) pairs."""
    from discovery.catalogs import MAX_DEPTH_LIMIT, catalog_url_for

    if value is None:
        return []
    if not isinstance(value, list):
        raise ConfigFileError("catalogs: must be a list of domains, URLs or objects")
    out: list[tuple[str, dict[str, Any]]] = []
    for i, item in enumerate(value):
        if isinstance(item, str):
            item = {"url": item} if "://" in item else {"domain": item}
        if not isinstance(item, dict):
            raise ConfigFileError(f"catalogs[{i}]: a domain, a URL or an object")
        unknown = sorted(set(item) - {"domain", "url", "max_depth", "prefix"})
        if unknown:
            raise ConfigFileError(f"catalogs[{i}]: unknown keys: {', '.join(unknown)}")
        location = item.get("url") or item.get("domain")
        if not isinstance(location, str) or not location.strip():
            raise ConfigFileError(f"catalogs[{i}]: a domain or a url is required")
        if "domain" in item and "://" in location:
            raise ConfigFileError(f"catalogs[{i}].domain: a host name, not a URL")
        options: dict[str, Any] = {}
        if "max_depth" in item:
            depth = item["max_depth"]
            if isinstance(depth, bool) or not isinstance(depth, int) \
                    or not 0 <= depth <= MAX_DEPTH_LIMIT:
                raise ConfigFileError(f"catalogs[{i}].max_depth: 0 to {MAX_DEPTH_LIMIT}")
            options["max_depth"] = depth
        if "prefix" in item:
            if not isinstance(item["prefix"], str) or not item["prefix"].isidentifier():
                raise ConfigFileError(f"catalogs[{i}].prefix: letters, digits and underscores")
            options["prefix"] = item["prefix"]
        out.append((catalog_url_for(location), options))
    return out


def _sync(config: dict[str, Any], sha256: str) -> None:
    file = Origin.FILE
    hosts = {e["host"]: e for e in config["allowlist"]}
    for host, entry in hosts.items():
        AllowedHost.objects.update_or_create(
            host=host, defaults={"allow_http": entry["allow_http"], "origin": file}
        )
    AllowedHost.objects.filter(origin=file).exclude(host__in=list(hosts)).delete()

    agents = {e["local_name"]: (kind, e) for kind in ("static", "probe") for e in config[kind]}
    for name, (kind, entry) in agents.items():
        ConfiguredAgent.objects.update_or_create(
            tenant_id=DEFAULT_TENANT, local_name=name,
            defaults={
                "kind": kind, "url": entry["url"], "description": entry["description"],
                "critical": entry["critical"], "enabled": True, "origin": file,
            },
        )
    ConfiguredAgent.objects.filter(origin=file, tenant_id=DEFAULT_TENANT).exclude(
        local_name__in=list(agents)).delete()

    feeds: list[tuple[str, str, str, str, dict]] = []
    registry = config["registry"]
    if registry["local"]:
        feeds.append((SourceFeed.Kind.LOCAL_REGISTRY, "", "", "", {}))
    for url in registry["remote"]:
        options = {"token_env": registry["token_env"]} if registry["token_env"] else {}
        feeds.append((SourceFeed.Kind.REMOTE_REGISTRY, url, "", "", options))
    kube = config.get("kubernetes")
    if kube:
        options = {k: v for k, v in kube.items()
                   if k not in ("label_selector", "namespace", "api_url")}
        feeds.append((SourceFeed.Kind.KUBERNETES, kube.get("api_url") or "",
                      kube["label_selector"], kube.get("namespace") or "", options))
    for url, options in config.get("catalogs", []):
        feeds.append((SourceFeed.Kind.CATALOG, url, "", "", options))
    keep: list[int] = []
    for kind, url, selector, namespace, options in feeds:
        feed, _ = SourceFeed.objects.update_or_create(
            tenant_id=DEFAULT_TENANT, kind=kind, url=url, label_selector=selector,
            namespace=namespace,
            defaults={"options": options, "enabled": True, "origin": file},
        )
        keep.append(feed.pk)
    SourceFeed.objects.filter(origin=file, tenant_id=DEFAULT_TENANT).exclude(pk__in=keep).delete()

    tags = {e["tag"]: e for e in config["needs"] if e["tag"]}
    texts = {e["text"]: e for e in config["needs"] if e["text"]}
    for key, entry in [*tags.items(), *texts.items()]:
        defaults = {
            "input_modes": entry["input_modes"], "output_modes": entry["output_modes"],
            "description": entry["description"], "enabled": True, "origin": file,
            "require_signed": entry["require_signed"],
        }
        if entry["tag"]:
            tag, _ = CapabilityTag.objects.get_or_create(
                name=key, defaults={"meaning": entry["description"], "origin": file}
            )
            Need.objects.update_or_create(tenant_id=DEFAULT_TENANT, tag=tag, defaults=defaults)
        else:
            Need.objects.update_or_create(tenant_id=DEFAULT_TENANT, text=key, defaults=defaults)
    stale = [
        n.pk for n in Need.objects.filter(origin=file, tenant_id=DEFAULT_TENANT)
        .select_related("tag")
        if (n.tag.name not in tags if n.tag is not None else n.text not in texts)
    ]
    Need.objects.filter(pk__in=stale).delete()

    policy, _ = DiscoveryPolicy.objects.get_or_create(pk=1)
    policy.max_agents = config.get("max_agents", 20)
    policy.degrade_after = config.get("degrade_after", 3)
    policy.recover_after = config.get("recover_after", 2)
    policy.config_sha256 = sha256
    policy.save()


def config_file_sync(*, path: str | None = None, force: bool = False) -> SyncResult | None:
    """Read the configuration file and sync it into the models when its bytes changed.

    Returns None when no file is configured. Raises :class:`ConfigFileError` on a bad file (the
    models are left as they were).
    """
    path = path or settings.DISCOVERY_CONFIG
    if not path:
        return None
    data, digest = _read(Path(path))
    policy = DiscoveryPolicy.objects.filter(pk=1).first()
    if not force and policy is not None and policy.config_sha256 == digest:
        return SyncResult(path=str(path), sha256=digest, changed=False)
    config = validate_config(data)
    with transaction.atomic():
        _sync(config, digest)
    logger.info("discovery configuration synced from %s (%s)", path, digest[:12])
    return SyncResult(path=str(path), sha256=digest, changed=True)
