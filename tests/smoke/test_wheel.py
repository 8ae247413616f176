"""The front door, from the built wheel in fresh venvs outside the checkout (see conftest.py).

Each test does what a user's first minutes do: the README's snippets, ``sunroom exec`` on
every backend, ``sunroom run`` with a scripted and a local OpenAI-compatible model, the
service, and the one-sentence errors of a core install that lacks an extra.
"""

from __future__ import annotations

import json
import re
import shutil
import signal
import socket
import subprocess
import tarfile
import time
import zipfile
from pathlib import Path

import httpx
import pytest

from tests.conftest import _unavailable_reason
from tests.providers.replay import ReplayServer, reply_from
from tests.smoke.conftest import CHECKOUT, TIMINGS, Venv

pytestmark = [pytest.mark.smoke, pytest.mark.kernel]

HELLO = 'import sys\nprint("hello from", sys.prefix)\n'
NOT_IN_A_KERNEL = ("zmq", "tornado", "docker", "mcp", "onnxruntime", "starlette", "uvicorn")


def readme_blocks(language: str) -> list[str]:
    """The README's fenced code blocks in *language*, in order."""
    text = (CHECKOUT / "README.md").read_text()
    return re.findall(rf"^```{language}\n(.*?)^```", text, flags=re.S | re.M)


def one_line_error(proc: subprocess.CompletedProcess[str]) -> str:
    """The usage error *proc* printed: exit 2 and one ``sunroom: ...`` line, no traceback."""
    assert proc.returncode == 2, (proc.returncode, proc.stdout, proc.stderr)
    assert proc.stderr.startswith("sunroom: ") and proc.stderr.count("\n") == 1, proc.stderr
    return proc.stderr


def test_the_dists_hold_the_package_its_kernel_side_and_its_metadata(dist: Path) -> None:
    (wheel,) = dist.glob("sunroom-*.whl")
    (sdist,) = dist.glob("sunroom-*.tar.gz")
    names = set(zipfile.ZipFile(wheel).namelist())
    for needed in ("sunroom/py.typed", "sunroom/prelude/supervisor.py", "sunroom/rpc/wire.py"):
        assert needed in names, needed
    assert not any(n.startswith(("tests/", "benchmarks/")) for n in names)
    metadata = next(n for n in names if n.endswith(".dist-info/METADATA"))
    text = zipfile.ZipFile(wheel).read(metadata).decode()
    for extra in ("docker", "service", "jupyter", "mcp", "embeddings", "providers", "all"):
        assert f"Provides-Extra: {extra}" in text, extra
    assert "Requires-Dist: docker" in text and 'extra == "docker"' in text
    assert sdist.stat().st_size > 0
    # the compiled watcher and launcher: built into the wheel (executable), their sources in
    # both dists
    with tarfile.open(sdist) as tar:
        held = {m.name.split("/", 1)[1] for m in tar.getmembers() if "/" in m.name}
    assert "setup.py" in held
    for program, source in (("sunroom-watch", "watch.c"), ("sunroom-launch", "launch.c")):
        built = zipfile.ZipFile(wheel).getinfo(f"sunroom/prelude/{program}")
        assert (built.external_attr >> 16) & 0o777 == 0o755
        assert f"sunroom/prelude/{source}" in names
        assert f"sunroom/prelude/{source}" in held
        assert f"sunroom/prelude/{program}" not in held


def test_a_core_install_runs_the_first_bwrap_kernel(core: Venv, workdir: Path) -> None:
    """``sunroom exec`` with the default backend (bwrap) from site-packages: the kernel finds
    msgpack beside sunroom (it died with "No module named 'msgpack'" when only
    site-packages/sunroom was bound into the sandbox)."""
    (workdir / "hello.py").write_text(HELLO)
    started = time.monotonic()
    proc = core.run(core.sunroom, "exec", "hello.py", cwd=workdir)
    TIMINGS["first bwrap kernel result (sunroom exec, cold)"] = time.monotonic() - started
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("hello from "), proc.stdout
    proc = core.run(core.sunroom, "exec", "--backend", "subprocess", "--json", "-", cwd=workdir,
                    stdin="print(1 + 1)\n")  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["stdout"] == "2\n"


def test_a_core_kernel_imports_no_extra(core: Venv, workdir: Path) -> None:
    """``import sunroom; sunroom.Kernel`` and a bwrap kernel's first cell on a core install;
    tests/test_extras.py proves the same import list where every extra is installed."""
    script = workdir / "first.py"
    script.write_text(
        "import json, os, sys, time\n"
        "os.environ.pop('SUNROOM_WATCHER', None)  # the default: the wheel's compiled watcher\n"
        "started = time.monotonic()\n"
        "import sunroom\n"
        "with sunroom.Kernel() as k:\n"
        "    r = k.execute('sum(range(10))')\n"
        "    s = time.monotonic() - started\n"
        "    w = k.execute('import os; open(f\"/proc/{os.getppid()}/cmdline\").read()')\n"
        "print(json.dumps({'value': r.value, 's': s, 'watcher': w.value,\n"
        "    'file': sunroom.__file__,\n"
        "    'modules': sorted({m.split('.')[0] for m in sys.modules})}))\n"
    )
    proc = core.run(core.python, str(script), cwd=workdir)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    TIMINGS["import sunroom + first bwrap cell (python)"] = out["s"]
    assert out["value"] == "45"
    assert "/sunroom/prelude/sunroom-watch\\x00" in out["watcher"], out["watcher"]  # the wheel's
    assert out["file"].startswith(str(core.root)), out["file"]
    assert not set(NOT_IN_A_KERNEL) & set(out["modules"])


def test_the_readme_snippets_run_as_written(core: Venv, workdir: Path) -> None:
    """Every Python block of the README, on a core install, from the repository root where
    the README says to run them (the checkout stays off sys.path: scripts run from workdir)."""
    blocks = readme_blocks("python")
    assert len(blocks) >= 2
    for i, block in enumerate(blocks):
        script = workdir / f"readme_{i}.py"
        script.write_text(block)
        proc = core.run(core.python, str(script), cwd=CHECKOUT)
        assert proc.returncode == 0, (i, block, proc.stderr)
        printed = re.findall(r"print\(.*\)\s+#\s*(.+)$", block, flags=re.M)
        for expected in printed:  # the README's "# 1389.0" comments are what it prints
            assert expected.strip() in proc.stdout, (i, expected, proc.stdout)


def test_run_with_a_scripted_model_on_a_core_install(core: Venv, workdir: Path) -> None:
    shutil.copy(CHECKOUT / "examples" / "replies.json", workdir / "replies.json")
    proc = core.run(
        core.sunroom, "run", "What is the 20th Fibonacci number? Compute it in Python.",
        "--model", "scripted:replies.json", "--db", str(workdir / "runs.db"), cwd=workdir,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert "6765" in proc.stdout and "success" in proc.stdout


@pytest.mark.parametrize(
    ("args", "extra"),
    [
        (("exec", "--backend", "docker", "hello.py"), "docker"),
        (("exec", "--backend", "jupyter", "hello.py"), "jupyter"),
        (("serve", "--port", "0"), "service"),
        (("kernelspecs",), "jupyter"),
        (("run", "x", "--model", "openai:gpt-5-mini"), "providers"),
    ],
)
def test_a_missing_extra_is_one_sentence_naming_it(
    core: Venv, workdir: Path, args: tuple[str, ...], extra: str
) -> None:
    (workdir / "hello.py").write_text(HELLO)
    proc = core.run(core.sunroom, *args, cwd=workdir)
    assert f"pip install 'sunroom[{extra}]'" in one_line_error(proc)


def test_exec_on_docker_with_the_docker_extra(extras: Venv, workdir: Path) -> None:
    reason = _unavailable_reason("docker")
    if reason is not None:
        pytest.skip(f"docker unavailable here: {reason}")
    (workdir / "hello.py").write_text(HELLO)
    image = extras.run(extras.sunroom, "docker-image", cwd=workdir)  # up to date: a no-op
    assert image.returncode == 0 and "sunroom-kernel:offline" in image.stdout, image.stderr
    proc = extras.run(extras.sunroom, "exec", "--backend", "docker", "hello.py", cwd=workdir)
    assert proc.returncode == 0, proc.stderr
    assert "hello from" in proc.stdout


def test_run_against_a_local_openai_compatible_server(extras: Venv, workdir: Path) -> None:
    """The no-key, local-model user's command (llama.cpp, Ollama, vLLM), against recorded
    replies served on 127.0.0.1 through the installed OpenAI SDK."""
    with ReplayServer() as server:  # a recorded OpenAI chat reply (tests/providers/data)
        server.add("/v1/chat/completions", reply_from("openai/chat_text"), times=None)
        proc = extras.run(
            extras.sunroom, "run", "What is the weather in SF?",
            "--model", "openai-compatible:gpt-4o-2024-08-06", "--base-url", f"{server.url}/v1",
            "--json", "--db", str(workdir / "runs.db"), cwd=workdir,
        )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["status"] == "success"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def test_serve_answers_raw_kernels(extras: Venv, workdir: Path) -> None:
    """``sunroom serve`` from the service extra: a raw bwrap kernel over HTTP, and the web view."""
    port = _free_port()
    env = {**extras.env, "SUNROOM_TOKEN": "t" * 40}
    server = subprocess.Popen(
        [extras.sunroom, "serve", "--port", str(port), "--db", str(workdir / "svc.db")],
        cwd=workdir, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        headers = {"Authorization": f"Bearer {'t' * 40}"}
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=60) as client:
            deadline = time.monotonic() + 60
            while True:
                try:
                    if client.get("/healthz").status_code == 200:
                        break
                except httpx.TransportError:
                    pass
                assert server.poll() is None and time.monotonic() < deadline, "no server"
                time.sleep(0.1)
            created = client.post("/kernels", json={}, headers=headers)
            assert created.status_code == 201, created.text
            kid = created.json()["kernel_id"]
            r = client.post(f"/kernels/{kid}/execute", json={"code": "6 * 7"}, headers=headers)
            assert r.status_code == 200 and r.json()["value"] == "42", r.text
            assert client.delete(f"/kernels/{kid}", headers=headers).status_code in (200, 204)
            # the web view's files came with the wheel: the page and every script it loads
            page = client.get("/")
            assert page.status_code == 200 and "/ui/static/app.js" in page.text, page.text
            for name in ("app.js", "session.js", "tree.js", "style.css"):
                assert client.get(f"/ui/static/{name}").status_code == 200, name
    finally:
        server.send_signal(signal.SIGTERM)
        server.wait(30)
        assert server.stderr is not None
        server.stderr.close()
