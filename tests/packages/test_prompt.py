"""The session's system prompt names the kernel's notable packages and how to install more."""

from __future__ import annotations

import importlib.metadata
from pathlib import Path

from sunroom import AsyncSession, Packages, ScriptedModel, SystemMessage, Template
from tests.agent.conftest import code, last_output


def _system(model: ScriptedModel) -> str:
    system = model.requests[0].messages[0]
    assert isinstance(system, SystemMessage)
    return system.text


async def test_the_prompt_lists_notable_packages_and_what_install_reaches(
    wheelhouse: Path,
) -> None:
    packages = Packages(find_links=[wheelhouse])
    setup = "install('tabulate==0.9.0')"
    async with Template(setup=setup, backend="subprocess", packages=packages) as t:
        model = ScriptedModel(["done"])
        async with AsyncSession(model=model, template=t) as s:
            result = await s.run("hi")
        assert result.ok
    text = _system(model)
    lines = [ln for ln in text.splitlines() if ln.startswith("Notable packages in the kernel: ")]
    assert len(lines) == 1
    line = lines[0]
    numpy = importlib.metadata.version("numpy")
    assert f"numpy {numpy}" in line and "tabulate 0.9.0" in line  # the venv's, and installed
    assert "pillow " in line and "(import PIL)" in line
    assert "pytest" not in line  # not a notable package
    assert 'install("name==version", ...) installs more into the kernel from its wheelhouse' in (
        line
    )
    assert len(line) < 600


async def test_without_a_source_the_prompt_says_install_cannot_reach_an_index() -> None:
    model = ScriptedModel(["done"])
    async with AsyncSession(model=model, backend="subprocess") as s:
        await s.run("hi")
    assert "install() cannot reach a package index here" in _system(model)


async def test_a_session_takes_packages_and_its_model_installs_with_them(wheelhouse: Path) -> None:
    model = ScriptedModel(
        [
            code("install('tabulate==0.9.0')\nfrom tabulate import tabulate\nprint('ok')"),
            "done",
        ]
    )
    packages = Packages(find_links=[wheelhouse])
    async with AsyncSession(model=model, backend="bwrap", packages=packages) as s:
        result = await s.run("install tabulate")
    assert result.ok, result
    assert "from its wheelhouse" in _system(model)
    assert last_output(model.requests[1]).strip() == "ok"
