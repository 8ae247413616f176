"""The service's jupyter surface: ``POST /kernels`` and ``POST /sessions`` with ``kernel_name``.

A real uvicorn on loopback (tests/service/conftest.py's Server), the real installed
kernelspecs. A bad choice is refused 422 (the service's status for a usage error) with one
sentence, before anything starts or is recorded.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from sunroom.providers import AssistantMessage, Model
from sunroom.providers.fakes import ScriptedModel
from sunroom.service import ServiceConfig
from tests.service.conftest import TOKEN, Server, code


@pytest.fixture
def make_server(tmp_path: Path) -> Iterator[Callable[..., Server]]:
    servers: list[Server] = []

    def make(
        model: Model | None = None, *, functions: list[Any] | None = None, **overrides: Any
    ) -> Server:
        options: dict[str, Any] = {
            "port": 0,
            "token": TOKEN,
            "db_path": tmp_path / "sunroom.db",
            "backend": "subprocess",
            "model": "fake:test",
            "lease_s": 2.0,
        }
        options.update(overrides)

        def resolve(spec: str, base_url: str | None) -> Model:
            return model or ScriptedModel([AssistantMessage("done")])

        server = Server(ServiceConfig(**options), resolve, functions or [])
        servers.append(server)
        return server

    yield make
    for s in servers:
        s.stop()


def _error(r: Any) -> str:
    assert r.status_code == 422, r.text
    message: str = r.json()["error"]["message"]
    assert "\n" not in message
    return message


def test_an_unknown_kernel_name_is_refused_naming_the_installed(
    make_server: Callable[..., Server],
) -> None:
    server = make_server()
    for route in ("/kernels", "/sessions"):
        r = server.client.post(route, json={"backend": "jupyter", "kernel_name": "no-such"})
        message = _error(r)
        assert "no Jupyter kernel named 'no-such' is installed" in message
        assert "installed: bash, python3" in message
    assert server.client.get("/sessions").json()["sessions"] == []  # nothing recorded
    assert server.client.get("/healthz").json()["kernels"] == 0


def test_kernel_name_and_sandbox_need_the_jupyter_backend(
    make_server: Callable[..., Server],
) -> None:
    server = make_server()
    for route in ("/kernels", "/sessions"):
        message = _error(server.client.post(route, json={"kernel_name": "bash"}))
        assert message == "kernel_name is only for backend jupyter (the backend is subprocess)"
        body = {"backend": "bwrap", "kernel_name": "bash", "sandbox": "none"}
        message = _error(server.client.post(route, json=body))
        assert "kernel_name and sandbox are only for backend jupyter" in message


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"backend": "jupyter", "sandbox": "chroot"}, "sandbox"),
        ({"backend": "jupyter", "kernel_name": ""}, "kernel_name"),
        ({"backend": "jupyter", "kernel_name": "../python3"}, "kernel_name"),
        ({"backend": "jupyter", "kernel_name": 3}, "kernel_name"),
        ({"backend": "jupyter", "kernel_name": "k" * 201}, "kernel_name"),  # 200 at most
    ],
)
def test_a_malformed_choice_is_a_validation_error(
    make_server: Callable[..., Server], body: dict[str, Any], field: str
) -> None:
    server = make_server()
    for route in ("/kernels", "/sessions"):
        r = server.client.post(route, json=body)
        assert r.json()["error"]["type"] == "ValidationError"
        assert _error(r).startswith(f"{field}: ")


def test_a_raw_kernel_reports_its_backend(make_server: Callable[..., Server]) -> None:
    server = make_server()
    kid = server.client.post("/kernels", json={}).json()["kernel_id"]
    about = server.client.get(f"/kernels/{kid}").json()
    assert about["kernel_id"] == kid and about["backend"] == "subprocess"
    assert about["kernel_name"] is None and about["sandbox"] is None
    assert about["template"] is None and about["created_at"] > 0
    assert server.client.delete(f"/kernels/{kid}").status_code == 200
    assert server.client.get(f"/kernels/{kid}").status_code == 404


def test_the_config_checks_its_default_kernel() -> None:
    config = ServiceConfig(backend="jupyter", kernel_name="bash", sandbox="none", token=TOKEN)
    backend = config.kernel_backend()
    assert not isinstance(backend, str)
    assert (backend.name, getattr(backend, "kernel_name", None)) == ("jupyter", "bash")
    assert getattr(config.kernel_backend(kernel_name="python3"), "kernel_name", None) == "python3"
    assert config.kernel_backend("subprocess") == "subprocess"


def double(x: int) -> int:
    """A host function: twice *x*."""
    return 2 * x


@pytest.mark.parametrize("sandbox", ["bwrap", "none"])
def test_a_raw_ipython_kernel_runs_executes_and_is_deleted(
    make_server: Callable[..., Server], sandbox: str
) -> None:
    server = make_server(functions=[double])
    body = {"backend": "jupyter", "kernel_name": "python3", "sandbox": sandbox}
    r = server.client.post("/kernels", json=body)
    assert r.status_code == 201, r.text
    kid = r.json()["kernel_id"]
    about = server.client.get(f"/kernels/{kid}").json()
    assert (about["backend"], about["kernel_name"], about["sandbox"]) == (
        "jupyter",
        "python3",
        sandbox,
    )
    cell = "!echo hi\n%timeit -n1 -r1 pass\nx = double(21)\nx"
    out = server.client.post(f"/kernels/{kid}/execute", json={"code": cell}).json()
    assert out["status"] == "ok", out
    lines = out["stdout"].splitlines()  # "hi\r\n": IPython runs ! lines in a pty, as in Jupyter
    assert lines[0] == "hi" and "per loop" in lines[1]
    assert out["value"] == "42"
    out = server.client.post(f"/kernels/{kid}/execute", json={"code": "1/0"}).json()
    assert out["status"] == "error" and out["error"]["type"] == "ZeroDivisionError"
    out = server.client.post(f"/kernels/{kid}/execute", json={"code": "x + 1"}).json()
    assert out["value"] == "43"  # the state is kept from cell to cell
    assert server.client.delete(f"/kernels/{kid}").status_code == 200
    assert server.client.get(f"/kernels/{kid}").status_code == 404
    assert server.client.get("/healthz").json()["kernels"] == 0


def test_a_raw_bash_kernel_and_the_server_default(make_server: Callable[..., Server]) -> None:
    server = make_server(backend="jupyter", kernel_name="bash", sandbox="bwrap")
    kid = server.client.post("/kernels", json={}).json()["kernel_id"]
    about = server.client.get(f"/kernels/{kid}").json()
    assert (about["backend"], about["kernel_name"], about["sandbox"]) == (
        "jupyter",
        "bash",
        "bwrap",
    )
    cell = 'N=$((6 * 7))\necho "n is $N"'
    out = server.client.post(f"/kernels/{kid}/execute", json={"code": cell}).json()
    assert out["status"] == "ok", out
    assert "n is 42" in out["stdout"]
    out = server.client.post(f"/kernels/{kid}/execute", json={"code": "echo $N"}).json()
    assert out["stdout"].strip() == "42"
    assert server.client.delete(f"/kernels/{kid}").status_code == 200
    # a request may still name another kernel of the same backend
    kid = server.client.post("/kernels", json={"kernel_name": "python3"}).json()["kernel_id"]
    assert server.client.get(f"/kernels/{kid}").json()["kernel_name"] == "python3"
    assert server.client.delete(f"/kernels/{kid}").status_code == 200


def test_a_bash_kernel_refuses_host_functions_and_inputs(
    make_server: Callable[..., Server],
) -> None:
    server = make_server(functions=[double])
    body: dict[str, Any] = {"backend": "jupyter", "kernel_name": "bash", "sandbox": "none"}
    message = _error(server.client.post("/kernels", json=body))
    assert "host functions" in message, message
    server = make_server()
    body["inputs"] = {"n": 1}
    message = _error(server.client.post("/kernels", json=body))
    assert "inputs" in message, message
    assert server.client.get("/healthz").json()["kernels"] == 0


def test_a_session_runs_on_jupyter_and_records_its_kernel(
    make_server: Callable[..., Server],
) -> None:
    model = ScriptedModel([code("!echo hi\nx = 6 * 7\nprint(x)"), "forty-two"])
    server = make_server(model)
    body = {"task": "compute", "backend": "jupyter", "sandbox": "none"}
    r = server.client.post("/sessions", json=body)
    assert r.status_code == 201, r.text
    sid = r.json()["session_id"]
    result = server.client.get(f"/sessions/{sid}/result", params={"timeout": 60}).json()
    assert result["result"]["status"] == "success", result
    assert result["result"]["output"] == "forty-two"
    config = server.client.get(f"/sessions/{sid}").json()["config"]
    assert (config["backend"], config["kernel_name"], config["sandbox"]) == (
        "jupyter",
        "python3",
        "none",
    )
    assert server.client.delete(f"/sessions/{sid}").status_code == 200
