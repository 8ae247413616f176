"""A session's transcript as a Jupyter notebook (``sunroom sessions export ID --ipynb FILE``).

The notebook is built from the transcript the store holds (the ``Transcript`` events), so it
shows what the model saw: the task and user messages as markdown, the model's text as markdown,
each cell it ran (``execute_code`` calls and fenced ```` ```python ```` blocks) as a code cell
whose output is the text the model was shown, and the images that followed a cell as
``display_data`` outputs of that cell. A transcript compacted during the session is exported
as compacted. Needs ``nbformat`` (``pip install nbformat``).
"""

from __future__ import annotations

import base64
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from sunroom.agent.images import IMAGES_INTRO
from sunroom.agent.presets import EXECUTE_TOOL, extract_code
from sunroom.errors import UsageError
from sunroom.providers import (
    AssistantMessage,
    ImagePart,
    Message,
    SystemMessage,
    TextPart,
    ToolResultMessage,
    UserMessage,
)

OUTPUT_PREFIX = "Output of your code:\n"


def transcript_from_events(events: Iterable[Any]) -> list[Message]:
    """The transcript recorded in a session's stored events (``Transcript`` deltas)."""
    from sunroom.service.codec import message_from_json
    from sunroom.service.journal import TRANSCRIPT

    transcript: list[Message] = []
    for e in events:
        if e.kind == TRANSCRIPT:
            start = int(e.payload["start"])
            added = [message_from_json(m) for m in e.payload["messages"]]
            transcript = transcript[:start] + added
    return transcript


def _nbformat() -> Any:
    try:
        import nbformat
    except ImportError:
        raise UsageError(
            "exporting a notebook needs nbformat; install it with: pip install nbformat"
        ) from None
    return nbformat


def _image_outputs(parts: Sequence[Any], v4: Any) -> list[Any]:
    out = []
    for p in parts:
        if isinstance(p, ImagePart) and p.data is not None:
            data = {p.media_type: base64.b64encode(p.data).decode("ascii")}
            out.append(v4.new_output("display_data", data=data, metadata={}))
    return out


def build_notebook(messages: Sequence[Message], *, title: str = "") -> Any:
    """An nbformat v4 notebook of *messages* (see the module docstring)."""
    nbformat = _nbformat()
    v4 = nbformat.v4
    cells: list[Any] = []
    if title:
        cells.append(v4.new_markdown_cell(f"# {title}"))
    by_call: dict[str, Any] = {}
    last_code: Any = None
    count = 0

    def code_cell(source: str) -> Any:
        nonlocal count, last_code
        count += 1
        cell = v4.new_code_cell(source, execution_count=count)
        cells.append(cell)
        last_code = cell
        return cell

    def stream(cell: Any, text: str) -> None:
        cell.outputs.append(v4.new_output("stream", name="stdout", text=text))

    for message in messages:
        if isinstance(message, SystemMessage):
            continue
        if isinstance(message, AssistantMessage):
            if message.text.strip():
                cells.append(v4.new_markdown_cell(message.text))
                fenced = extract_code(message.text) if not message.tool_calls else None
                if fenced is not None:
                    code_cell(fenced)
            for call in message.tool_calls:
                source = call.arguments.get("code")
                if call.name == EXECUTE_TOOL.name and isinstance(source, str):
                    by_call[call.id] = code_cell(source)
        elif isinstance(message, ToolResultMessage):
            cell = by_call.get(message.tool_call_id)
            if cell is not None:
                stream(cell, message.content)
        elif isinstance(message, UserMessage):
            text = "".join(p.text for p in message.content if isinstance(p, TextPart))
            images = _image_outputs(message.content, v4)
            if text.startswith(OUTPUT_PREFIX) and last_code is not None:
                stream(last_code, text[len(OUTPUT_PREFIX) :])
                last_code.outputs.extend(images)
            elif text == IMAGES_INTRO and last_code is not None:
                last_code.outputs.extend(images)
            else:
                cells.append(v4.new_markdown_cell(f"**User:** {text}"))
                cells.extend(_markdown_images(message.content, v4))
    nb = v4.new_notebook(cells=cells)
    nb.metadata["kernelspec"] = {
        "name": "python3",
        "display_name": "Python 3",
        "language": "python",
    }
    nb.metadata["language_info"] = {"name": "python"}
    nbformat.validate(nb)
    return nb


def _markdown_images(parts: Sequence[Any], v4: Any) -> list[Any]:
    return [
        v4.new_markdown_cell(f"![image](data:{p.media_type};base64,{p.base64()})")
        for p in parts
        if isinstance(p, ImagePart) and p.data is not None
    ]


def write_notebook(messages: Sequence[Message], path: Path, *, title: str = "") -> int:
    """Write *messages* as an .ipynb file at *path*; returns the number of cells."""
    nb = build_notebook(messages, title=title)
    _nbformat().write(nb, str(path))
    return len(nb.cells)
