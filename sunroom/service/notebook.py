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
from sunroom.extras import require
from sunroom.providers import (
    AssistantMessage,
    ImagePart,
    Message,
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
    require("notebook", "exporting a notebook")
    import nbformat

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
    cells = _Cells(v4)
    if title:
        cells.cells.append(v4.new_markdown_cell(f"# {title}"))
    for message in messages:  # the system prompt is not shown
        if isinstance(message, AssistantMessage):
            cells.assistant(message)
        elif isinstance(message, ToolResultMessage):
            cells.tool_result(message)
        elif isinstance(message, UserMessage):
            cells.user(message)
    nb = v4.new_notebook(cells=cells.cells)
    nb.metadata["kernelspec"] = {
        "name": "python3",
        "display_name": "Python 3",
        "language": "python",
    }
    nb.metadata["language_info"] = {"name": "python"}
    nbformat.validate(nb)
    return nb


class _Cells:
    """The cells of a notebook being built, one transcript message at a time."""

    def __init__(self, v4: Any) -> None:
        self.v4 = v4
        self.cells: list[Any] = []
        self.by_call: dict[str, Any] = {}  # execute_code call id → its code cell
        self.last_code: Any = None
        self.count = 0

    def code_cell(self, source: str) -> Any:
        """A new code cell running *source* (numbered in order)."""
        self.count += 1
        cell = self.v4.new_code_cell(source, execution_count=self.count)
        self.cells.append(cell)
        self.last_code = cell
        return cell

    def stream(self, cell: Any, text: str) -> None:
        """Add *text* to *cell*'s outputs as its stdout."""
        cell.outputs.append(self.v4.new_output("stream", name="stdout", text=text))

    def assistant(self, message: AssistantMessage) -> None:
        """The model's text as markdown, and each cell it ran (tool call or fenced block)."""
        if message.text.strip():
            self.cells.append(self.v4.new_markdown_cell(message.text))
            fenced = extract_code(message.text) if not message.tool_calls else None
            if fenced is not None:
                self.code_cell(fenced)
        for call in message.tool_calls:
            source = call.arguments.get("code")
            if call.name == EXECUTE_TOOL.name and isinstance(source, str):
                self.by_call[call.id] = self.code_cell(source)

    def tool_result(self, message: ToolResultMessage) -> None:
        """A cell's output, as the model was shown it."""
        cell = self.by_call.get(message.tool_call_id)
        if cell is not None:
            self.stream(cell, message.content)

    def user(self, message: UserMessage) -> None:
        """A fenced cell's output and images, or the user's own text and images as markdown."""
        v4 = self.v4
        text = "".join(p.text for p in message.content if isinstance(p, TextPart))
        images = _image_outputs(message.content, v4)
        if text.startswith(OUTPUT_PREFIX) and self.last_code is not None:
            self.stream(self.last_code, text[len(OUTPUT_PREFIX) :])
            self.last_code.outputs.extend(images)
        elif text == IMAGES_INTRO and self.last_code is not None:
            self.last_code.outputs.extend(images)
        else:
            self.cells.append(v4.new_markdown_cell(f"**User:** {text}"))
            self.cells.extend(_markdown_images(message.content, v4))


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
