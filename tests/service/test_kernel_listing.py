"""``GET /kernels`` lists the caller's raw kernels (before: 405, issue 28, item 9).

A server has one token: its kernels are that token's. Two real servers on loopback, two tokens,
one store: each token lists its own server's kernels and nothing else, and is refused (401) by
the other server.
"""

from __future__ import annotations

from collections.abc import Callable

import httpx

from tests.service.conftest import Server

OTHER = "other-token-0123456789abcdef"


def _create(client: httpx.Client) -> str:
    r = client.post("/kernels", json={})
    assert r.status_code == 201, r.text
    kid: str = r.json()["kernel_id"]
    return kid


def _listed(client: httpx.Client) -> list[str]:
    r = client.get("/kernels")
    assert r.status_code == 200, r.text
    return [k["kernel_id"] for k in r.json()["kernels"]]


def test_each_token_lists_its_own_kernels_only(make_server: Callable[..., Server]) -> None:
    mine = make_server()
    theirs = make_server(token=OTHER)
    auth = {"Authorization": f"Bearer {OTHER}"}
    with (
        httpx.Client(base_url=theirs.url, headers=auth, timeout=30) as other,
        httpx.Client(base_url=mine.url, headers=auth, timeout=30) as other_at_mine,
    ):
        assert _listed(mine.client) == [] and _listed(other) == []
        first, second = _create(mine.client), _create(mine.client)
        foreign = _create(other)
        assert _listed(mine.client) == [first, second]
        assert _listed(other) == [foreign]
        described = mine.client.get("/kernels").json()["kernels"][0]
        assert described == mine.client.get(f"/kernels/{first}").json()
        assert other_at_mine.get("/kernels").status_code == 401  # another tenant's token
        assert theirs.anon.get("/kernels").status_code == 401
        assert mine.client.delete(f"/kernels/{first}").status_code == 200
        assert _listed(mine.client) == [second]
        assert _listed(other) == [foreign]
