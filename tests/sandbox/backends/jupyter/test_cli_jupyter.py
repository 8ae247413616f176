"""The CLI's jupyter surface: ``sunroom kernelspecs``, ``--backend jupyter --kernel-name``.

Real installed kernelspecs (ipykernel's ``python3`` and bash_kernel's ``bash`` are dev
dependencies) and the real ``sunroom`` command in a subprocess.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from sunroom.sandbox.backends.jupyter import kernelspecs


def run(
    *args: str, stdin: str | None = None, timeout: float = 90
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "sunroom.cli", *args],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def test_kernelspecs_lists_the_installed_kernels() -> None:
    proc = run("kernelspecs")
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0].split() == ["NAME", "LANGUAGE", "HOST", "FUNCTIONS", "DISPLAY", "NAME"]
    rows = {line.split()[0]: line.split() for line in lines[1:]}
    assert rows["python3"][1:3] == ["python", "yes"]
    assert rows["bash"][1:3] == ["bash", "no"]
    assert set(rows) == {s.name for s in kernelspecs()}


def test_kernelspecs_json_is_for_machines() -> None:
    proc = run("kernelspecs", "--json")
    assert proc.returncode == 0, proc.stderr
    specs = {s["name"]: s for s in json.loads(proc.stdout)}
    assert specs["python3"]["language"] == "python" and specs["python3"]["host_functions"]
    assert specs["bash"]["language"] == "bash" and not specs["bash"]["host_functions"]
    assert specs["bash"]["display_name"] == "Bash"
    assert "{connection_file}" in specs["python3"]["argv"]
    assert specs["python3"]["resource_dir"].endswith("python3")


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--kernel-name", "bash"], "--kernel-name is only for --backend jupyter"),
        (["--sandbox", "none"], "--sandbox is only for --backend jupyter"),
        (
            ["--backend", "subprocess", "--kernel-name", "bash", "--sandbox", "none"],
            "--kernel-name and --sandbox are only for --backend jupyter (the backend is "
            "subprocess)",
        ),
        (
            ["--backend", "jupyter", "--kernel-name", "no-such-kernel"],
            "no Jupyter kernel named 'no-such-kernel' is installed (installed: bash, python3",
        ),
        (["--backend", "jupyter", "--sandbox", "chroot"], "unknown sandbox 'chroot'"),
    ],
)
def test_exec_refuses_a_bad_choice_with_one_line(args: list[str], says: str) -> None:
    proc = run("exec", *args, "-", stdin="print('never')")
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.count("\n") == 1 and says in proc.stderr, proc.stderr
    assert "never" not in proc.stdout


@pytest.mark.parametrize("command", ["serve", "mcp", "run"])
def test_every_command_with_backend_checks_kernel_name(command: str) -> None:
    extra = ["a task", "--model", "fake:x"] if command == "run" else []
    proc = run(command, *extra, "--kernel-name", "bash", timeout=60)
    assert proc.returncode == 2, proc.stderr
    assert "--kernel-name is only for --backend jupyter" in proc.stderr, proc.stderr
    proc = run(command, *extra, "--backend", "jupyter", "--kernel-name", "nope", timeout=60)
    assert proc.returncode == 2, proc.stderr
    assert "no Jupyter kernel named 'nope' is installed" in proc.stderr, proc.stderr


IPYTHON_FILE = """\
!echo hi from the shell
%timeit -n1 -r1 pass
import sys
print(sys.version_info[0])
6 * 7
"""


@pytest.mark.parametrize("sandbox", [[], ["--sandbox", "none"]])
def test_exec_runs_ipython_in_the_jupyter_backend(tmp_path: Path, sandbox: list[str]) -> None:
    script = tmp_path / "cell.ipy"
    script.write_text(IPYTHON_FILE)
    proc = run("exec", "--backend", "jupyter", *sandbox, str(script))
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0] == "hi from the shell"
    assert "per loop" in lines[1]
    assert lines[2:] == ["3", "42"]
    proc = run("exec", "--backend", "jupyter", *sandbox, "--json", "-", stdin="1/0")
    assert proc.returncode == 1, proc.stderr
    result = json.loads(proc.stdout)
    assert result["status"] == "error" and result["error"]["type"] == "ZeroDivisionError"


def test_exec_runs_bash_in_the_jupyter_backend() -> None:
    code = 'N=$((6 * 7))\necho "n is $N"\n'
    proc = run("exec", "--backend", "jupyter", "--kernel-name", "bash", "-", stdin=code)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == "n is 42\n"


def test_exec_in_bash_refuses_inputs() -> None:
    data = Path(__file__)  # readable by the kernel's uid: the refusal is bash's, not the file's
    args = ["--backend", "jupyter", "--kernel-name", "bash", "--input", f"data={data}"]
    proc = run("exec", *args, "-", stdin="echo never")
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.count("\n") == 1 and "inputs" in proc.stderr, proc.stderr
    assert "never" not in proc.stdout


def test_serve_with_a_default_jupyter_kernel(tmp_path: Path) -> None:
    token = "serve-token-0123456789abcdef"
    env = {**os.environ, "SUNROOM_TOKEN": token, "SUNROOM_DB": str(tmp_path / "s.db")}
    args = ["serve", "--port", "0", "--backend", "jupyter", "--kernel-name", "bash"]
    with (
        (tmp_path / "stderr").open("w") as errors,
        subprocess.Popen(
            [sys.executable, "-m", "sunroom.cli", *args, "--sandbox", "none"],
            stdout=subprocess.PIPE,
            stderr=errors,
            text=True,
            env=env,
        ) as proc,
    ):
        try:
            assert proc.stdout is not None
            first = proc.stdout.readline()
            assert first.startswith("sunroom service listening on "), (
                tmp_path / "stderr"
            ).read_text()
            url = first.split()[-1]
            headers = {"Authorization": f"Bearer {token}"}
            with httpx.Client(base_url=url, headers=headers, timeout=60) as client:
                kid = client.post("/kernels", json={}).json()["kernel_id"]
                about = client.get(f"/kernels/{kid}").json()
                assert (about["backend"], about["kernel_name"], about["sandbox"]) == (
                    "jupyter",
                    "bash",
                    "none",
                )
                out = client.post(f"/kernels/{kid}/execute", json={"code": "echo hi"}).json()
                assert out["stdout"] == "hi\n", out
                assert client.delete(f"/kernels/{kid}").status_code == 200
        finally:
            proc.terminate()
            proc.wait(30)


async def test_mcp_over_stdio_serves_a_bash_kernel() -> None:
    from tests.service.mcp.test_server import stdio, text_of

    args = ("--backend", "jupyter", "--kernel-name", "bash", "--sandbox", "none")
    async with stdio(*args) as client:
        await client.call_tool("execute_code", {"code": "N=21"})
        r = await client.call_tool("execute_code", {"code": "echo $((N * 2))"})
        assert not r.is_error, text_of(r)
        assert r.structured_content is not None
        assert r.structured_content["stdout"] == "42\n", r.structured_content


def test_run_an_agent_session_on_a_jupyter_kernel(tmp_path: Path) -> None:
    root = Path(__file__).resolve().parents[4]
    model = f"scripted:{root / 'examples' / 'replies.json'}"
    db = str(tmp_path / "s.db")
    args = ["--model", model, "--backend", "jupyter", "--sandbox", "none", "--db", db]
    proc = run("run", "What is the 20th Fibonacci number?", *args, "--json")
    assert proc.returncode == 0, proc.stderr
    summary = json.loads(proc.stdout)
    assert summary["status"] == "success"
    assert summary["output"] == "The 20th Fibonacci number is 6765."
    proc = run("sessions", "show", summary["session_id"], "--db", db, "--json")
    config = json.loads(proc.stdout)["config"]
    assert (config["backend"], config["kernel_name"], config["sandbox"]) == (
        "jupyter",
        "python3",
        "none",
    )
