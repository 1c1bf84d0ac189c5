import httpx

CARD = {
    "name": "Echo Agent",
    "description": "Echoes.",
    "url": "http://127.0.0.1:9/",
    "version": "1.0.0",
    "protocolVersion": "0.3.0",
    "capabilities": {"streaming": True},
    "defaultInputModes": ["text/plain"],
    "defaultOutputModes": ["text/plain"],
    "skills": [{"id": "echo", "name": "Echo", "description": "echo", "tags": ["echo", "test"]}],
}


def test_register_then_list(api: httpx.Client):
    r = api.post("/api/v1/agents", json={"agent_id": "echo-1", "card": CARD})
    assert r.status_code == 201, r.text
    first = r.json()
    r = api.post("/api/v1/agents", json={"agent_id": "echo-1", "card": CARD})
    assert r.status_code == 200
    assert r.json()["registered_at"] == first["registered_at"]
    r = api.get("/api/v1/agents", params={"tag": "echo"})
    assert r.status_code == 200
    assert [a["agent_id"] for a in r.json()["results"]] == ["echo-1"]
