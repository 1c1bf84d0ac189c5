"""The console's layout in Debian's Chromium at common laptop and desktop widths (1280, 1440
and 1920 px): no page or table is cut off on the right (nothing scrolls sideways), no table
header breaks inside a word or stacks onto many lines, the dashboard's sections use the
width, and the discovery cycle list says what each cycle did (a snapshot kept is not a
failure; a broken configuration file is). Screenshots land in
``test-artifacts/layout-<page>-<width>.png``."""

from __future__ import annotations

import re
from datetime import timedelta

import pytest
from django.contrib.auth import get_user_model
from django.utils import timezone

from console.models import AgentMinute, CallRecord
from discovery.models import Alert, CycleRun
from gateway.histogram import BUCKETS
from registry import services
from registry.permissions import SYSTEM
from tests.browser.test_admin_browser import (
    ARTIFACTS,
    PASSWORD,
    operator_page,
    require_chromium,
)
from tests.registry.cards import card_03

# Layout does not depend on the pass's database: CI runs it in the distributed pass.
pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.one_pass("distributed")]

WIDTHS = (1280, 1440, 1920)
#: Header cells laid out on more lines than this are "wrapped" (a two-word header on two
#: lines is fine; "one letter per line" is what this catches).
MAX_HEADER_LINES = 2

#: Measures the page in the browser: elements wider than the room they are given, and header
#: cells that break inside a word or take more than ``maxLines`` lines.
MEASURE = r"""(maxLines) => {
  const out = {page: null, overflow: [], headers: []};
  const root = document.documentElement;
  if (root.scrollWidth > root.clientWidth + 1) {
    out.page = [root.scrollWidth, root.clientWidth];
  }
  const name = (el) => el.id ? '#' + el.id : el.tagName.toLowerCase() +
      (typeof el.className === 'string' && el.className
        ? '.' + el.className.trim().split(/\s+/).join('.') : '');
  const boxes = document.querySelectorAll(
    '#content, #content-main, #changelist, .results, .module, table');
  for (const el of boxes) {
    if (el.scrollWidth > el.clientWidth + 1) {
      out.overflow.push([name(el), el.scrollWidth, el.clientWidth]);
    }
    const box = el.getBoundingClientRect();
    if (box.width > 0 && box.right > root.clientWidth + 1) {
      out.overflow.push([name(el) + ' (right edge)', Math.round(box.right), root.clientWidth]);
    }
  }
  // Lines a run of text takes: its fragments' rectangles, those whose tops lie within half a
  // line of each other counted once.
  const lineCount = (rects) => {
    const tops = rects.filter(r => r.width > 0 && r.height > 0).map(r => [r.top, r.height])
      .sort((a, b) => a[0] - b[0]);
    let count = 0, last = -1e9;
    for (const [top, height] of tops) {
      if (top - last > height / 2) { count += 1; last = top; }
    }
    return count;
  };
  for (const th of document.querySelectorAll('thead th')) {
    const text = th.innerText.trim();
    if (!text || th.getBoundingClientRect().width === 0) continue;
    const rects = [];
    let broken = false;
    const walker = document.createTreeWalker(th, NodeFilter.SHOW_TEXT);
    for (let node = walker.nextNode(); node; node = walker.nextNode()) {
      const whole = document.createRange();
      whole.selectNodeContents(node);
      rects.push(...whole.getClientRects());
      const re = /\S+/g;
      let m;
      while ((m = re.exec(node.data))) {
        const word = document.createRange();
        word.setStart(node, m.index);
        word.setEnd(node, m.index + m[0].length);
        if (lineCount([...word.getClientRects()]) > 1) broken = true;
      }
    }
    const total = lineCount(rects);
    if (broken || total > maxLines) out.headers.push([text, total, broken]);
  }
  return out;
}"""


def _seed() -> None:
    """What a busy console shows: agents with long ids and many tags, traffic, nodes, alerts,
    audited calls, and discovery cycles of every kind."""
    now = timezone.now()
    minute = (now - timedelta(minutes=1)).replace(second=0, microsecond=0)
    for i in range(8):
        agent_id = f"customer-support-escalation-agent-{i:02d}"
        card = card_03(tags=("billing", "refunds", "warranty-claims", "customer-support",
                             "escalations"))
        card["name"] = f"Customer Support Escalation Agent number {i}"
        services.agent_register(actor=SYSTEM, agent_id=agent_id, card=card, ttl_seconds=600,
                                url=f"https://support-{i}.internal.example.com/a2a/v1/")
        hist = [0] * BUCKETS
        hist[20] = 1200 + i
        AgentMinute.objects.create(
            agent_id=agent_id, node_id="node-a.cluster.internal:8000", minute=minute,
            requests=1200 + i, errors_not_executed=i, errors_agent=3 * i, histogram=hist,
            last_call_at=minute + timedelta(seconds=30), last_outcome="ok")
        CallRecord.objects.create(
            at=now - timedelta(seconds=i), caller="shop-frontend-production", agent_id=agent_id,
            method="message/send", outcome="agent_error", executed=True, http_status=200,
            latency_ms=12.5, node_id="node-a.cluster.internal:8000")
    for name in ("node-a.cluster.internal:8000", "node-b.cluster.internal:8000"):
        services.node_heartbeat(node_id=name)
    Alert.objects.create(kind=Alert.Kind.REFUSED, subject="partner.example.com",
                         message="refused host partner.example.com: not on the allowlist")
    base = now - timedelta(minutes=10)
    CycleRun.objects.create(
        started_at=base, seconds=0.41, fetched=3, selected=3, published=True, version=4,
        digest="a" * 64,
        summary=f"endpoints: 3 proposed\nsnapshot published: v4 {'a' * 64}\ntook 0.41s")
    CycleRun.objects.create(
        started_at=base + timedelta(minutes=1), seconds=0.12, not_modified=3, selected=3,
        published=False, version=4, digest="a" * 64,
        summary=f"endpoints: 3 proposed\nsnapshot unchanged: v4 {'a' * 64}\ntook 0.12s")
    CycleRun.objects.create(
        started_at=base + timedelta(minutes=2), seconds=0.05, selected=3, published=False,
        version=4, digest="a" * 64,
        summary="config file error: /etc/a2a/discovery.yaml: line 3: mapping values are not "
                f"allowed here\nendpoints: 3 proposed\nsnapshot unchanged: v4 {'a' * 64}\n"
                "took 0.05s")


@pytest.mark.browser
def test_console_pages_fit_the_width_and_headers_do_not_wrap(live_server_url):
    require_chromium()
    from playwright.sync_api import expect

    ARTIFACTS.mkdir(exist_ok=True)
    get_user_model().objects.create_superuser("operator", "op@example.com", PASSWORD)
    _seed()
    pages = {
        "dashboard": "/admin/",
        "agents": "/admin/registry/agent/",
        "agent": "/admin/registry/agent/id/customer-support-escalation-agent-03/",
        "calls": "/admin/console/callrecord/",
        "cycles": "/admin/discovery/cyclerun/",
        "nodes": "/admin/registry/node/",
        "clients": "/admin/registry/apiclient/",
        "changes": "/admin/console/registrychange/",
        "snapshots": "/admin/discovery/snapshot/",
        "card-cache": "/admin/discovery/cardcacheentry/",
        "endpoint-health": "/admin/discovery/endpointhealth/",
        "configured-agents": "/admin/discovery/configuredagent/",
        "alerts": "/admin/discovery/alert/",
    }
    problems: dict[str, dict] = {}
    with operator_page(live_server_url, width=1280, timeout_ms=20_000) as page:
        page.wait_for_selector("#console-dashboard")
        for width in WIDTHS:
            page.set_viewport_size({"width": width, "height": 900})
            for name, path in pages.items():
                page.goto(f"{live_server_url}{path}")
                page.wait_for_load_state("load")
                page.screenshot(path=str(ARTIFACTS / f"layout-{name}-{width}.png"),
                                full_page=True)
                found = page.evaluate(MEASURE, MAX_HEADER_LINES)
                if found["page"] or found["overflow"] or found["headers"]:
                    problems[f"{name} at {width}px"] = found
                if name == "dashboard":
                    # The sections use the width: none leaves most of the row empty.
                    used = page.evaluate("""() => {
                      const room = document.querySelector('#content')
                                     .getBoundingClientRect().width;
                      const sections = '#console-dashboard .console-section';
                      return [...document.querySelectorAll(sections)]
                        .map(s => [s.id, s.getBoundingClientRect().width / room]);
                    }""")
                    narrow = [(sid, round(r, 2)) for sid, r in used if r < 0.3]
                    if narrow:
                        problems[f"dashboard sections at {width}px"] = {"narrow": narrow}
        # The dashboard flags the last cycle's broken configuration file.
        page.goto(f"{live_server_url}/admin/")
        expect(page.locator("#cycle-health")).to_have_text("config error")
        expect(page.locator("#console-discovery")).to_contain_text("(kept)")
        # The cycle list says what each cycle did: a kept snapshot is no failure, a broken
        # configuration file is.
        page.set_viewport_size({"width": 1440, "height": 900})
        page.goto(f"{live_server_url}/admin/discovery/cyclerun/")
        rows = page.locator("#result_list tbody tr")
        expect(rows).to_have_count(3)
        assert page.locator("#result_list img[alt=False]").count() == 0  # no red cross
        broken, kept, published = (rows.nth(i) for i in range(3))  # newest first
        expect(broken.locator("td.field-health_display")).to_have_text("config error")
        expect(broken.locator("td.field-health_display .badge")).to_have_attribute(
            "title", re.compile("mapping values are not allowed"))
        expect(kept.locator("td.field-health_display")).to_have_text("ok")
        expect(kept.locator("td.field-snapshot_display")).to_have_text("v4 kept (unchanged)")
        expect(published.locator("td.field-snapshot_display")).to_have_text(
            "v4 published (new)")
        page.screenshot(path=str(ARTIFACTS / "layout-cycles-health.png"), full_page=True)
        kept.locator("a").first.click()
        expect(page.locator(".field-snapshot_display")).to_contain_text("v4 kept (unchanged)")
        expect(page.locator(".field-health_display")).to_contain_text("ok")
        expect(page.locator(".field-summary_text")).to_contain_text("snapshot unchanged")
        assert page.locator("#content img[alt=False]").count() == 0
        expect(page.locator("#content")).not_to_contain_text("A new snapshot was published")
        page.screenshot(path=str(ARTIFACTS / "layout-cycle-detail.png"), full_page=True)
    report = "\n".join(f"{where}: {found}" for where, found in problems.items())
    (ARTIFACTS / "layout-problems.txt").write_text(report)
    assert problems == {}, report
