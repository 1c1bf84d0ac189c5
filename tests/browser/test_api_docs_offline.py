"""/api/docs/ (Swagger UI) and /api/redoc/ (ReDoc) work with no internet: Chromium with every
non-loopback request refused loads both from this server alone, and the schema has the bearer
scheme ("Authorize") and the gateway and KubeMQ paths."""

from __future__ import annotations

from urllib.parse import urlsplit

import httpx
import pytest

from tests.browser.test_admin_browser import ARTIFACTS, CHROMIUM, CHROMIUM_ARGS, require_chromium


def test_schema_documents_bearer_auth_gateway_and_kubemq(live_server_url: str):
    schema = httpx.get(f"{live_server_url}/api/schema/?format=json", timeout=30).json()
    assert schema["components"]["securitySchemes"]["bearerAuth"] == {
        "type": "http", "scheme": "bearer",
        "description": "An API client's token (`manage.py create_client NAME --scopes ...`) or "
                       "a JWT from an issuer trusted in `A2A_JWT_ISSUERS`."}
    paths = schema["paths"]
    for path in ("/a2a/{agent_id}", "/a2a/{agent_id}/stream",
                 "/a2a/{agent_id}/.well-known/agent-card.json", "/agents/register",
                 "/agents/deregister", "/agents/heartbeat", "/agents/{agent_id}",
                 "/api/v1/agents/"):
        assert path in paths, path
    gateway = paths["/a2a/{agent_id}"]["post"]
    assert {"bearerAuth": []} in gateway["security"]
    assert "X-A2A-Executed" in gateway["responses"]["200"]["headers"]


@pytest.mark.browser
def test_swagger_ui_and_redoc_load_with_the_network_closed(live_server_url: str):
    require_chromium()
    from playwright.sync_api import expect, sync_playwright

    ARTIFACTS.mkdir(exist_ok=True)
    local = urlsplit(live_server_url).netloc
    refused: list[str] = []

    def only_this_server(route) -> None:
        if urlsplit(route.request.url).netloc == local:
            route.continue_()
        else:
            refused.append(route.request.url)
            route.abort("internetdisconnected")

    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
        try:
            context = browser.new_context(viewport={"width": 1400, "height": 900})
            context.route("**/*", only_this_server)
            page = context.new_page()
            page.set_default_timeout(20_000)
            page.goto(f"{live_server_url}/api/docs/")
            expect(page.locator(".swagger-ui .info .title")).to_contain_text("A2A Agent Registry")
            expect(page.locator("button.authorize")).to_be_visible()
            expect(page.locator(".opblock-summary-path[data-path='/a2a/{agent_id}']")
                   ).to_be_visible()
            expect(page.locator(".opblock-summary-path[data-path='/agents/register']")
                   ).to_be_visible()
            page.locator("button.authorize").click()
            expect(page.locator(".modal-ux-content")).to_contain_text("bearerAuth")
            page.screenshot(path=str(ARTIFACTS / "api-docs-offline.png"), full_page=False)

            page.goto(f"{live_server_url}/api/redoc/")
            expect(page.locator("h1")).to_contain_text("A2A Agent Registry")
            expect(page.get_by_text("Call an agent: one A2A JSON-RPC 2.0 request").first
                   ).to_be_attached()
            page.screenshot(path=str(ARTIFACTS / "api-redoc-offline.png"), full_page=False)
        finally:
            browser.close()
    # Nothing the pages need comes from outside. The one outside request is ReDoc's own
    # "powered by" logo in its sidebar footer, which removes itself when it cannot load.
    assert set(refused) <= {"https://cdn.redoc.ly/redoc/logo-mini.svg"}, refused
