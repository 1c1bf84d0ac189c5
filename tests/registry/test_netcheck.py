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
        "http://[fd00:ec2::254]/",
        # IPv6 forms that embed 169.254.169.254: 6to4, Teredo, NAT64 (well-known and local)
        "http://[2002:a9fe:a9fe::1]/",
        "http://[2001:0:4136:e378:8000:63bf:5601:5601]/",
        "http://[64:ff9b::a9fe:a9fe]/",
        "http://[64:ff9b:1::a9fe:a9fe]/",
        "http://[::169.254.169.254]/",
        "http://0.0.0.0/",
        "http://[::]/",
        "http://[ff02::1]/",
        "http://224.0.0.1/",
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


@pytest.mark.parametrize(
    ("ipv4", "ipv6"),
    [
        ("127.0.0.1", "::1"),  # loopback: allowed on both
        ("10.0.0.5", "fd12:3456::5"),  # private / unique-local: allowed on both
        ("8.8.8.8", "2001:4860:4860::8888"),  # public: allowed on both
        ("127.0.0.1", "::ffff:127.0.0.1"),  # mapped loopback: allowed like loopback
    ],
)
def test_ipv4_and_ipv6_are_consistent_for_allowed_addresses(ipv4, ipv6):
    assert check_agent_url(f"http://{ipv4}:8080/", allowlist=[])
    assert check_agent_url(f"http://[{ipv6}]:8080/", allowlist=[])


@pytest.mark.parametrize(
    ("ipv4", "ipv6"),
    [
        ("169.254.1.1", "fe80::1"),  # link-local
        ("169.254.169.254", "::ffff:169.254.169.254"),  # metadata, mapped
        ("0.0.0.0", "::"),  # unspecified
        ("224.0.0.1", "ff02::1"),  # multicast
    ],
)
def test_ipv4_and_ipv6_are_consistent_for_refused_addresses(ipv4, ipv6):
    with pytest.raises(UnsafeUrl):
        check_agent_url(f"http://{ipv4}/", allowlist=[])
    with pytest.raises(UnsafeUrl):
        check_agent_url(f"http://[{ipv6}]/", allowlist=[])


def test_refusal_names_the_embedded_address():
    with pytest.raises(UnsafeUrl, match="embedded in 2002:a9fe:a9fe::1"):
        check_agent_url("http://[2002:a9fe:a9fe::1]/", allowlist=[])


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
