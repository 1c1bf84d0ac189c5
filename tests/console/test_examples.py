"""The example discovery files under examples/ stay valid: each is loaded through the same
code path as DISCOVERY_CONFIG and lands in the models the loop reads."""

from __future__ import annotations

from pathlib import Path

import pytest

from discovery.config_file import config_file_sync
from discovery.models import AllowedHost, ConfiguredAgent, DiscoveryPolicy, Need, SourceFeed

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"

pytestmark = pytest.mark.django_db


@pytest.mark.parametrize("name", ["discovery.json", "discovery.yaml"])
def test_full_example_loads(name):
    result = config_file_sync(path=str(EXAMPLES / name), force=True)
    assert result is not None and result.changed
    assert set(AllowedHost.objects.values_list("host", "allow_http")) == {
        ("billing.example.com", False), ("*.partner.example.com", False),
        ("10.20.0.0/16", False), ("127.0.0.1", True)}
    agents = {a.local_name: a for a in ConfiguredAgent.objects.all()}
    assert agents["billing_agent"].critical and agents["billing_agent"].kind == "static"
    assert agents["partner_support"].kind == "probe"
    assert set(SourceFeed.objects.values_list("kind", flat=True)) == {
        "registry_local", "registry_remote", "kubernetes"}
    remote = SourceFeed.objects.get(kind="registry_remote")
    assert remote.options == {"token_env": "REGISTRY_B_TOKEN"}
    assert set(Need.objects.values_list("tag__name", "text")) == {
        ("warranty", ""), ("returns", ""), (None, "refund a customer in their own currency")}
    policy = DiscoveryPolicy.objects.get()
    assert (policy.max_agents, policy.degrade_after, policy.recover_after) == (20, 3, 2)


def test_json_and_yaml_examples_say_the_same():
    import json

    import yaml

    assert json.loads((EXAMPLES / "discovery.json").read_text()) == yaml.safe_load(
        (EXAMPLES / "discovery.yaml").read_text())


def test_local_example_loads():
    config_file_sync(path=str(EXAMPLES / "discovery-local.yaml"), force=True)
    assert list(ConfiguredAgent.objects.values_list("local_name", "url")) == [
        ("echo_agent", "http://127.0.0.1:9999/")]
