"""System prompts: what the model is told about its kernel, functions, variables and answer.

The prompt lists the host functions as the kernel sees them (signatures with real types,
docstrings and the dataclass mirrors they use, taken from the generated wrapper source) and the
names and types of bound variables, with sizes, but never their values.
"""

from __future__ import annotations

import ast
import copy
import os
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Final

from sunroom.agent.submit import type_name
from sunroom.sandbox.codegen import generate
from sunroom.sandbox.functions import HostFunction
from sunroom.sandbox.inputs import Directory, File

if TYPE_CHECKING:
    from sunroom.network.policy import Network

__all__ = ["describe_functions", "describe_variables", "system_prompt", "system_prompt_for"]

_ACT_TOOL: Final = (
    "You act by writing Python. Call the `execute_code` tool with a cell of code; it runs in a "
    "persistent Python kernel (variables, imports and definitions survive between cells) and "
    "you get back its stdout, stderr, the value of a trailing expression, and any traceback."
)
_ACT_FENCED: Final = (
    "You act by writing Python. Put a cell of code in one ```python fenced block; it runs in a "
    "persistent Python kernel (variables, imports and definitions survive between cells) and "
    "the next message shows its stdout, stderr, the value of a trailing expression, and any "
    "traceback."
)
_INTRO: Final = {
    "codeact": "You are an agent that solves the user's task by running Python code.",
    "rlm": (
        "You are an agent that solves the user's task over inputs that are too large to read "
        "at once. The inputs are bound as Python variables in your kernel and are NOT in this "
        "prompt: inspect them with code (len, slicing, regex, splitting into chunks), and use "
        "predict/predict_many to ask a sub-model about pieces of them. Print only small "
        "excerpts and summaries."
    ),
    "typed": (
        "You are an agent that turns a typed input into a typed output by running Python code. "
        "The input's fields are bound as variables in your kernel."
    ),
}
_RLM_SEARCH: Final = (
    "To find the parts of a large input that matter, split it into chunks and rank them with "
    "search(query, chunks, k) (embedding similarity, computed on the host, no sub-model "
    "calls), then read or predict over the best few rather than every chunk."
)
_PREDICT_DOC: Final = """\
def predict(instructions: str, input: Any = None, *, output: type | None = None,
            recursive: bool = False) -> Any:
    \"\"\"Ask a sub-model (fresh context) to follow `instructions` on `input` (text or data).
    Returns its reply as str, or, with output= a dataclass or type (int, list[str], Literal[...]),
    a validated value of that type.\"\"\"

def predict_many(instructions: str, inputs: list, *, output: type | None = None,
                 recursive: bool = False) -> list:
    \"\"\"predict() over every input, concurrently. Results are in input order; a failed item is a
    PredictError instance in its slot (check with isinstance(r, PredictError)).\"\"\""""


def _signature_only(node: ast.FunctionDef) -> str:
    doc = ast.get_docstring(node)
    body: list[ast.stmt] = [ast.Expr(ast.Constant(doc))] if doc else [ast.Expr(ast.Constant(...))]
    stub = copy.copy(node)
    stub.body = body
    stub.decorator_list = []
    text = ast.unparse(stub)
    text = text.replace("_t.", "").replace("_datetime.", "datetime.").replace("_DEFAULT", "...")
    text = text.replace("_vectors.Vectors", "list[list[float]]")
    return text.replace(" | Any)", ")") if node.name == "submit" else text


def describe_functions(functions: Iterable[HostFunction]) -> str:
    """The kernel-side source of *functions*: dataclass mirrors, then signatures + docstrings."""
    hfs = list(functions)
    if not hfs:
        return ""
    tree = ast.parse(generate(hfs).source)
    names = {hf.name for hf in hfs}
    parts: list[str] = []
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and not node.name.startswith("_"):
            text = ast.unparse(node).replace("@_dc.dataclass", "@dataclass")
            parts.append(text.replace("_dc.field", "field").replace("_t.", ""))
        elif isinstance(node, ast.FunctionDef) and node.name in names:
            parts.append(_signature_only(node))
    return "\n\n".join(parts)


def _size(value: object) -> str:
    if isinstance(value, str | bytes):
        return (
            f", {len(value):,} characters" if isinstance(value, str) else f", {len(value):,} bytes"
        )
    if isinstance(value, list | tuple | dict | set):
        return f", {len(value):,} items"
    return ""


_LOADED: Final = {
    None: "pathlib.Path",
    "text": "str",
    "bytes": "bytes",
    "json": "JSON value",
    "csv": "pandas.DataFrame",
    "parquet": "pandas.DataFrame",
}


def _file(value: File | Directory) -> str:
    """How a file input looks in the kernel: its type, and what it was read from."""
    if isinstance(value, Directory):
        return "pathlib.Path, a read-only directory"
    try:
        size = f" of {os.stat(value.path).st_size:,} bytes"
    except OSError:
        size = ""
    return f"{_LOADED[value.load]}, from a read-only file{size}"


def describe_variables(values: Mapping[str, object], types: Mapping[str, str] | None = None) -> str:
    """One line per variable: name, type and size; never the value."""
    lines = []
    for name, value in values.items():
        if isinstance(value, File | Directory):
            lines.append(f"- {name}: {_file(value)}")
            continue
        shown = (types or {}).get(name) or type(value).__name__
        lines.append(f"- {name}: {shown}{_size(value)}")
    return "\n".join(lines)


MAX_PROMPT_HOSTS = 20
"""Allowlist entries a prompt names; the rest are counted."""


def describe_network(hosts: Sequence[str]) -> str:
    """The prompt's line about the kernel's network (an allowlist behind a proxy)."""
    if not hosts:
        return "The kernel has no network: every connection is refused."
    shown = ", ".join(hosts[:MAX_PROMPT_HOSTS])
    more = len(hosts) - MAX_PROMPT_HOSTS
    if more > 0:
        shown += f" and {more:,} more"
    return (
        "The kernel reaches only these hosts, through a proxy that HTTP_PROXY and HTTPS_PROXY "
        f"name (urllib, requests and pip use it): {shown}. Any other host, raw IP address or "
        "direct socket is refused."
    )


def system_prompt(
    *,
    preset: str,
    tool: bool,
    functions: Iterable[HostFunction],
    variables: Mapping[str, object],
    variable_types: Mapping[str, str] | None,
    submit_source: str,
    output_name: str | None,
    max_output_chars: int,
    extra: str | None,
    semantic_search: bool = False,
    network_hosts: Sequence[str] | None = None,
) -> str:
    """The whole system prompt of a session.

    *semantic_search*: the session bound an embedder (``embed``/``search`` are host functions);
    the ``rlm`` preset then says to rank chunks with ``search`` before reading them.
    *network_hosts*: the kernel's network allowlist (a session with ``network=``), named in
    one line (at most :data:`MAX_PROMPT_HOSTS` entries, then a count).
    """
    intro = _INTRO[preset]
    if semantic_search and preset == "rlm":
        intro += " " + _RLM_SEARCH
    parts = [intro, _ACT_TOOL if tool else _ACT_FENCED]
    parts.append(
        f"Output longer than {max_output_chars:,} characters is shown to you cut in the middle; "
        "print summaries and slices rather than whole large values."
    )
    user_functions = describe_functions(functions)
    helpers = f"{_PREDICT_DOC}\n\n{submit_source}"
    parts.append(
        "These functions are defined in the kernel (call them from your code):\n"
        f"```python\n{helpers}\n```"
    )
    if user_functions:
        parts.append(f"Host functions available in the kernel:\n```python\n{user_functions}\n```")
    if variables:
        parts.append(
            "Variables bound in the kernel (values not shown; inspect them with code):\n"
            + describe_variables(variables, variable_types)
        )
    if network_hosts is not None:
        parts.append(describe_network(network_hosts))
    if output_name is not None:
        parts.append(
            f"When you have the answer, call submit(...) with a value of type {output_name} from "
            "your code; if "
            "it does not match, submit raises ValueError listing each wrong field: fix it and "
            "call again. The run ends when a cell with an accepted submit finishes."
        )
    else:
        parts.append(
            "When you are done, reply with your final answer as plain text (no code), or call "
            "submit(value) from your code to hand back a value."
        )
    if extra:
        parts.append(extra)
    return "\n\n".join(parts)


def system_prompt_for(
    *,
    preset: str,
    tool: bool,
    functions: list[HostFunction],
    variables: Mapping[str, object],
    variable_types: Mapping[str, str],
    submit_source: str,
    output: object,
    max_output_chars: int,
    extra: str | None,
    semantic_search: bool = False,
    network: Network | None = None,
) -> str:
    """The generated system prompt of a session (see :mod:`sunroom.agent.prompts`)."""
    return system_prompt(
        preset=preset,
        tool=tool,
        functions=functions,
        variables=variables,
        variable_types=variable_types,
        submit_source=submit_source,
        output_name=None if output is None else type_name(output),
        max_output_chars=max_output_chars,
        extra=extra,
        semantic_search=semantic_search,
        network_hosts=None if network is None else list(network.allow),
    )
