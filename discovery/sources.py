"""Sources: each produces endpoint records (a name, a base URL, which source produced it).

* static configuration and domain probing: :class:`ConfiguredAgent` rows (admin or file), with
  a reviewed local name and description and a critical flag;
* registry query: this platform's own registry, and other instances' ``/api/v1/agents``;
* platform labels: Kubernetes Services matching a label selector. The API is read with httpx
  (no extra dependency); the official ``kubernetes`` client is used instead when it is
  installed and the source's options say ``"client": "official"``.

A source only proposes: the resolver decides what is admitted.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any
from urllib.parse import urljoin

import httpx

from discovery.catalogs import catalog_records
from discovery.http import sync_client
from discovery.models import ConfiguredAgent, SourceFeed
from discovery.names import derive_local_name
from discovery.records import (  # noqa: F401  (re-exported: the sources' record types)
    WELL_KNOWN_CARD_PATH,
    EndpointRecord,
    SourceError,
    card_url_for,
)
from outbound.clients import httpx_client
from registry.ids import DEFAULT_TENANT
from registry.models import Agent

logger = logging.getLogger(__name__)

IN_CLUSTER_API = "https://kubernetes.default.svc"
SA_DIR = Path("/var/run/secrets/kubernetes.io/serviceaccount")
DEFAULT_URL_ANNOTATION = "a2a.dev/base-url"
REMOTE_REGISTRY_MAX_PAGES = 100


def configured_records(tenant: str = DEFAULT_TENANT) -> list[EndpointRecord]:
    """``tenant``'s static and probe rows (enabled), as records with reviewed names and
    descriptions."""
    return [
        EndpointRecord(
            local_name=row.local_name, base_url=row.url, source=row.kind, configured=True,
            description=row.description, critical=row.critical,
        )
        for row in ConfiguredAgent.objects.filter(tenant_id=tenant, enabled=True)
        .order_by("local_name")
    ]


def local_registry_records(tenant: str = DEFAULT_TENANT) -> list[EndpointRecord]:
    """``tenant``'s routable agents of this registry (not those discovery itself put there)."""
    rows = (
        Agent.objects.routable().filter(tenant_id=tenant)
        .exclude(source=Agent.Source.DISCOVERY)
        .only("agent_id", "url", "card_raw", "card_sha256").order_by("agent_id")
    )
    return [
        EndpointRecord(
            local_name=derive_local_name(a.agent_id), base_url=a.url, source="registry",
            agent_id=a.agent_id, inline_card=a.card_raw.encode(), inline_sha256=a.card_sha256,
        )
        for a in rows
    ]


def remote_registry_records(*, base_url: str, token: str | None = None) -> list[EndpointRecord]:
    """Active agents of another instance's ``/api/v1/agents`` (followed page by page)."""
    headers = {"Accept": "application/json"}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    url: str | None = urljoin(base_url.rstrip("/") + "/", "api/v1/agents?status=active&limit=100")
    records: list[EndpointRecord] = []
    for _ in range(REMOTE_REGISTRY_MAX_PAGES):
        if not url:
            break
        try:
            resp = sync_client().get(url, headers=headers)
            resp.raise_for_status()
            page = resp.json()
        except (httpx.HTTPError, ValueError) as exc:
            raise SourceError(f"registry {base_url}: {exc}") from None
        for item in page.get("results") or []:
            if isinstance(item, dict) and item.get("agent_id") and item.get("url"):
                records.append(EndpointRecord(
                    local_name=derive_local_name(str(item["agent_id"])),
                    base_url=str(item["url"]), source="registry",
                ))
        url = page.get("next")
    return records


def _kube_base_url(service: dict[str, Any], annotation: str) -> str | None:
    meta = service.get("metadata") or {}
    annotations = meta.get("annotations") or {}
    if annotations.get(annotation):
        return str(annotations[annotation])
    ports = (service.get("spec") or {}).get("ports") or []
    if not ports or not meta.get("name"):
        return None
    port = ports[0]
    scheme = "http" if str(port.get("appProtocol") or port.get("name") or "").lower() in (
        "http", "kubernetes.io/h2c") else "https"
    return f"{scheme}://{meta['name']}.{meta.get('namespace') or 'default'}.svc:{port['port']}/"


def _kube_services_httpx(
    *, api_url: str, namespace: str, label_selector: str, options: dict[str, Any]
) -> list[dict[str, Any]]:
    path = f"/api/v1/namespaces/{namespace}/services" if namespace else "/api/v1/services"
    headers = {"Accept": "application/json"}
    token_file = Path(options.get("token_file") or SA_DIR / "token")
    if options.get("token"):
        headers["Authorization"] = f"Bearer {options['token']}"
    elif token_file.exists():
        headers["Authorization"] = f"Bearer {token_file.read_text().strip()}"
    ca_file = options.get("ca_file") or (
        str(SA_DIR / "ca.crt") if (SA_DIR / "ca.crt").exists() else None
    )
    items: list[dict[str, Any]] = []
    params: dict[str, str] = {"labelSelector": label_selector, "limit": "500"}
    client = (
        sync_client() if not ca_file
        else httpx_client(timeout=httpx.Timeout(10, connect=3), extra_ca_file=ca_file)
    )
    try:
        for _ in range(100):
            resp = client.get(api_url.rstrip("/") + path, params=params, headers=headers)
            resp.raise_for_status()
            body = resp.json()
            items.extend(body.get("items") or [])
            cont = (body.get("metadata") or {}).get("continue")
            if not cont:
                break
            params["continue"] = cont
    except (httpx.HTTPError, ValueError) as exc:
        raise SourceError(f"kubernetes {api_url}: {exc}") from None
    finally:
        if ca_file:
            client.close()
    return items


def _kube_services_official(
    *, api_url: str, namespace: str, label_selector: str, options: dict[str, Any]
) -> list[dict[str, Any]]:
    try:
        from kubernetes import client as kclient
        from kubernetes import config as kconfig
    except ImportError:  # optional extra
        raise SourceError("the kubernetes package is not installed") from None
    configuration = kclient.Configuration()
    if api_url:
        configuration.host = api_url.rstrip("/")
        if options.get("token"):
            configuration.api_key = {"authorization": f"Bearer {options['token']}"}
    else:
        kconfig.load_incluster_config(client_configuration=configuration)
    api = kclient.CoreV1Api(kclient.ApiClient(configuration))
    try:
        if namespace:
            result = api.list_namespaced_service(
                namespace, label_selector=label_selector, _preload_content=False
            )
        else:
            result = api.list_service_for_all_namespaces(
                label_selector=label_selector, _preload_content=False
            )
        import json

        return json.loads(result.data).get("items") or []  # type: ignore[attr-defined]  # the raw response
    except Exception as exc:  # the client raises its own ApiException and urllib3 errors
        raise SourceError(f"kubernetes {api_url or 'in-cluster'}: {exc}") from None


def kubernetes_records(
    *, label_selector: str, namespace: str = "", api_url: str = "",
    options: dict[str, Any] | None = None,
) -> list[EndpointRecord]:
    """Services carrying ``label_selector``: local name from the service name, base URL from the
    annotation ``options["url_annotation"]`` (default ``a2a.dev/base-url``) or the service's
    cluster DNS name and first port."""
    options = options or {}
    reader = (
        _kube_services_official if options.get("client") == "official" else _kube_services_httpx
    )
    services = reader(
        api_url=api_url or ("" if options.get("client") == "official" else IN_CLUSTER_API),
        namespace=namespace, label_selector=label_selector, options=options,
    )
    annotation = options.get("url_annotation") or DEFAULT_URL_ANNOTATION
    records = []
    for svc in services:
        base = _kube_base_url(svc, annotation)
        name = (svc.get("metadata") or {}).get("name")
        if base and name:
            records.append(EndpointRecord(
                local_name=derive_local_name(str(name)), base_url=base, source="kubernetes"
            ))
    return records


def feed_records(feed: SourceFeed) -> list[EndpointRecord]:
    """The records one source feed proposes (raises :class:`SourceError`)."""
    if feed.kind == SourceFeed.Kind.CATALOG:
        return catalog_records(url=feed.url, options=feed.options or {}).records
    if feed.kind == SourceFeed.Kind.LOCAL_REGISTRY:
        return local_registry_records(str(feed.tenant_id))
    if feed.kind == SourceFeed.Kind.REMOTE_REGISTRY:
        token_env = (feed.options or {}).get("token_env")
        return remote_registry_records(
            base_url=feed.url, token=os.environ.get(token_env) if token_env else None
        )
    return kubernetes_records(
        label_selector=feed.label_selector, namespace=feed.namespace, api_url=feed.url,
        options=feed.options or {},
    )


def collect_records(tenant: str = DEFAULT_TENANT) -> tuple[list[EndpointRecord], list[str]]:
    """Every enabled source's records of ``tenant``, configured ones first; and the errors of
    failed sources."""
    records = configured_records(tenant)
    errors: list[str] = []
    for feed in SourceFeed.objects.filter(tenant_id=tenant, enabled=True).order_by("pk"):
        try:
            records.extend(feed_records(feed))
        except SourceError as exc:
            logger.warning("discovery source failed: %s", exc)
            errors.append(str(exc))
    return records, errors
