"""Agent URL safety: schemes, metadata and link-local addresses, the allowlist."""

import pytest

from registry.netcheck import UnsafeUrl, check_agent_url, host_allowed


@pytest.mark.parametrize(
    "url",
    [
        "file:///etc/passwd",
        "/relative/path",
        "ftp://agent.example/",
        "http://169.254.169.254/latest/meta-data/",
        "http://169.254.10.1/",
        "http://[fe80::1]/",
        "http://[::ffff:169.254.169.254]/",
        "http://metadata.google.internal/",
        "http://100.100.100.200/",
        "http://user:pw@agent.example/",
        "http://",
        "",
        None,
        42,
    ],
)
def test_refused(url):
    with pytest.raises(UnsafeUrl):
        check_agent_url(url, allowlist=[], resolve=False)


def test_accepted():
    assert check_agent_url("http://127.0.0.1:8080/", allowlist=[]) == "http://127.0.0.1:8080/"
    assert check_agent_url("https://agent.example/a2a", allowlist=[], resolve=False)


def test_allowlist_hosts_wildcards_and_cidrs():
    allow = ["billing.example.com", "*.partner.example", "10.1.0.0/16", "127.0.0.1"]
    assert host_allowed("billing.example.com", allow)
    assert host_allowed("a.partner.example", allow)
    assert host_allowed("10.1.2.3", allow)
    assert not host_allowed("10.2.0.1", allow)
    assert not host_allowed("evil.example", allow)
    with pytest.raises(UnsafeUrl, match="not on the agent URL allowlist"):
        check_agent_url("http://evil.example/", allowlist=allow, resolve=False)


def test_allowlist_setting_applies(settings):
    settings.A2A_AGENT_URL_ALLOWLIST = ["127.0.0.1"]
    check_agent_url("http://127.0.0.1:1/")
    with pytest.raises(UnsafeUrl):
        check_agent_url("http://localhost:1/", resolve=False)


def test_control_characters_refused():
    with pytest.raises(UnsafeUrl, match="control characters"):
        check_agent_url("http://a.example/\r\nX-Injected: 1", allowlist=[], resolve=False)
