"""A session exported as a notebook: cells, the outputs the model saw, displayed images."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import nbformat

from sunroom.agent.images import IMAGES_INTRO
from sunroom.providers import (
    AssistantMessage,
    ImagePart,
    SystemMessage,
    ToolCall,
    ToolResultMessage,
    UserMessage,
)
from sunroom.service.notebook import build_notebook

PNG = b"\x89PNG\r\n\x1a\nfake"


def test_a_transcript_becomes_cells_with_outputs_and_images() -> None:
    nb = build_notebook(
        [
            SystemMessage("system"),
            UserMessage("Plot it."),
            AssistantMessage(["Plotting.", ToolCall("c1", "execute_code", {"code": "plot()"})]),
            ToolResultMessage("c1", "[display: image 1 (image/png, 12 bytes), attached]"),
            UserMessage([IMAGES_INTRO, ImagePart(PNG)]),
            AssistantMessage("Again, fenced:\n```python\nprint(1)\n```"),
            UserMessage(["Output of your code:\n1", ImagePart(PNG, media_type="image/png")]),
            AssistantMessage("Done."),
        ],
        title="demo",
    )
    kinds = [(c.cell_type, c.source) for c in nb.cells]
    assert kinds == [
        ("markdown", "# demo"),
        ("markdown", "**User:** Plot it."),
        ("markdown", "Plotting."),
        ("code", "plot()"),
        ("markdown", "Again, fenced:\n```python\nprint(1)\n```"),
        ("code", "print(1)"),
        ("markdown", "Done."),
    ]
    tool_cell, fenced_cell = nb.cells[3], nb.cells[5]
    assert [o.output_type for o in tool_cell.outputs] == ["stream", "display_data"]
    assert tool_cell.outputs[1].data["image/png"] == "iVBORw0KGgpmYWtl"
    assert fenced_cell.outputs[0].text == "1"
    assert fenced_cell.outputs[1].output_type == "display_data"
    nbformat.validate(nb)


def test_sessions_export_writes_a_notebook(tmp_path: Path) -> None:
    script = {
        "replies": [
            {
                "text": "Drawing.",
                "code": "from PIL import Image\ndisplay(Image.new('RGB', (4, 4), 'red'))\nprint('ok')",
            },
            "A red square.",
        ]
    }
    (tmp_path / "script.json").write_text(json.dumps(script))
    env = {k: v for k, v in os.environ.items() if not k.startswith("SUNROOM_")}
    env.update(
        SUNROOM_MODEL=f"scripted:{tmp_path / 'script.json'}", SUNROOM_DB=str(tmp_path / "s.db")
    )

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "sunroom.cli", *args],
            capture_output=True,
            text=True,
            env=env,
            timeout=120,
        )

    run = cli("run", "Draw a square.", "--backend", "subprocess", "--json")
    assert run.returncode == 0, run.stderr
    session_id = json.loads(run.stdout)["session_id"]
    out = tmp_path / "s.ipynb"
    proc = cli("sessions", "export", session_id, "--ipynb", str(out))
    assert proc.returncode == 0, proc.stderr
    nb = nbformat.read(str(out), as_version=4)  # type: ignore[no-untyped-call]
    [code] = [c for c in nb.cells if c.cell_type == "code"]
    assert "Image.new" in code.source
    images = [o for o in code.outputs if o.output_type == "display_data"]
    assert len(images) == 1 and images[0].data["image/png"].startswith("iVBOR")
    assert any("ok" in o.get("text", "") for o in code.outputs)
    missing = cli("sessions", "export", "nope", "--ipynb", str(out))
    assert missing.returncode != 0 and "no session" in missing.stderr
