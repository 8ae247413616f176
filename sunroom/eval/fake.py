"""Deterministic fake models that really solve the generated tasks (``sunroom eval --fake``).

:func:`fake_root` is the root model: given a long prompt it reads the answer off the prompt;
in a session (the ``execute_code`` tool is offered) it writes Python that reads ``context``,
fans out with ``predict``/``predict_many`` and calls ``submit``; when the session says the
sub-model is off (:data:`~sunroom.eval.arms.NO_SUB_NOTE`) it solves the task in the kernel
alone; for DSPy's ``dspy.RLM`` (a prompt with DSPy's ``[[ ## code ## ]]`` field) it writes the
same programs with ``llm_query_batched`` and ``SUBMIT``. :func:`fake_sub` answers a sub-call by
reading the piece of input it was given. :func:`fake_models` builds the pair, optionally with
a seeded chance that the root's first program has a plausible bug (so best-of-k has errors to
vote away).

They exercise the harness, the session, the kernel and the statistics end to end with no
network; they measure nothing about any real model.
"""

from __future__ import annotations

import json
import random
import re
from collections import Counter
from typing import Final

from sunroom.eval.tasks import PAIRS_LABEL, callers
from sunroom.providers import (
    AssistantMessage,
    FunctionModel,
    Request,
    SystemMessage,
    ToolCall,
    UserMessage,
)

__all__ = ["DSPY_SPLIT", "fake_models", "fake_root", "fake_sub"]

DSPY_SPLIT: Final = "\n\nTEXT:\n"
"""What separates the instructions from the text in the fake's DSPy ``llm_query`` prompts."""

_NO_SUB: Final = "predict and predict_many are disabled"

_NIAH_KEY = re.compile(r"special magic number for ([a-z]+-[a-z]+) mentioned")
_MULTI_KEY = re.compile(r"special magic numbers for ([a-z]+-[a-z]+)")
_SEMANTIC_KEY = re.compile(r"passcode of the ([a-z]+) archive")
_COUNT_LABEL = re.compile(r"have the label '([a-z]+)'")
_PAIRS = re.compile(r"pairs of users both have")
_CALLEE = re.compile(r"calls `([A-Za-z_][A-Za-z0-9_]*)`")
_COMMON = re.compile(r"Which label appears on the most records")
_RECORD_LABEL = re.compile(r"\| label: ([a-z]+) \|")

# --- the programs a session's root writes ------------------------------------------------------

_CODE = {
    "niah": """\
import re
key = __KEY__
step = 4000
chunks = [context[i:i + step + 200] for i in range(0, len(context), step)]
hits = [chunk for chunk in chunks if "magic number for " + key in chunk]
print(len(context), "characters,", len(chunks), "chunks,", len(hits), "with the needle")
reply = predict("What is the special magic number for " + key + "? Reply with the number only.",
                hits[0])
submit(int(re.search(r"[0-9]+", reply).group()))
""",
    "niah-multi": """\
paragraphs = [p for p in context.split("\\n\\n") if "magic number" in p]
print(len(paragraphs), "paragraphs mention a magic number")
replies = predict_many("List the special magic numbers for " + __KEY__ + " in this text, "
                       "exactly that key. Reply with a JSON list of integers.", paragraphs,
                       output=list[int])
numbers = sorted({n for reply in replies for n in reply})
submit(",".join(str(n) for n in numbers))
""",
    "niah-semantic": """\
import re
key = __KEY__
question = "What is the passcode of the " + key + " archive?"
paragraphs = [p for p in context.split("\\n\\n") if p.strip()]
hits = search(question, paragraphs, k=3)
print(len(paragraphs), "paragraphs; best:", [(h.index, round(h.score, 3)) for h in hits])
reply = predict(question + " Reply with the number only, or none.", hits[0].text)
submit(int(re.search(r"[0-9]+", reply).group()))
""",
    "oolong-count": """\
label = __LABEL__
lines = context.splitlines()
chunks = ["\\n".join(lines[i:i + 200]) for i in range(0, len(lines), 200)]
counts = predict_many("Count the records in this text whose label is " + repr(label)
                      + ". Reply with the count.", chunks, output=int)
print(len(lines), "records in", len(chunks), "chunks; counts per chunk:", counts[:10])
submit(sum(counts))
""",
    "oolong-common": """\
lines = context.splitlines()
chunks = ["\\n".join(lines[i:i + 200]) for i in range(0, len(lines), 200)]
parts = predict_many("Count the records in this text by label. Reply with a JSON object that "
                     "maps each label to its count.", chunks, output=dict[str, int])
totals = {}
for part in parts:
    for name, n in part.items():
        totals[name] = totals.get(name, 0) + n
print(totals)
submit(max(totals, key=totals.get))
""",
    "oolong-pairs": """\
import itertools
lines = context.splitlines()
chunks = ["\\n".join(lines[i:i + 200]) for i in range(0, len(lines), 200)]
found = predict_many("List the users of the records in this text whose label is 'urgent'. "
                     "Reply with a JSON list of user ids.", chunks, output=list[str])
users = sorted({u for part in found for u in part})
print(len(users), "users with an urgent record")
submit("\\n".join(a + "," + b for a, b in itertools.combinations(users, 2)))
""",
    "code-qa": """\
import ast
callee = __CALLEE__
tree = ast.parse(context)
parts = [ast.get_source_segment(context, node) for node in tree.body]
hits = [p for p in parts if p and callee + "(" in p]
print(len(parts), "definitions,", len(hits), "mention", callee)
names = predict_many("Which function or method in this source calls " + repr(callee)
                     + "? Reply with its qualified name only, or none.", hits)
names = [n.strip() for n in names if n.strip() != "none"]
submit(names[0])
""",
}

# The same tasks solved in the kernel alone (a second attempt, or no sub-model).
_FALLBACK = {
    "niah": (
        "import re\n"
        "found = re.search('magic number for ' + re.escape(__KEY__) + ' is ([0-9]+)', context)\n"
        "submit(int(found.group(1)))"
    ),
    "niah-multi": (
        "import re\n"
        "found = re.findall('special magic number for ' + re.escape(__KEY__) + ' is ([0-9]+)',"
        " context)\n"
        "submit(','.join(sorted(found)))"
    ),
    "niah-semantic": (
        "import re\n"
        "found = re.search('the ' + re.escape(__KEY__) + ' document store opens with the secret"
        " PIN ([0-9]+)', context)\n"
        "submit(int(found.group(1)))"
    ),
    "oolong-count": "submit(context.count('| label: ' + __LABEL__ + ' |'))",
    "oolong-common": (
        "import collections, re\n"
        "labels = re.findall(r'\\| label: ([a-z]+) \\|', context)\n"
        "submit(collections.Counter(labels).most_common(1)[0][0])"
    ),
    "oolong-pairs": (
        "import itertools, re\n"
        "users = sorted(set(re.findall(r'\\| user: (u[0-9]{4}) \\| label: urgent \\|', context)))\n"
        "submit('\\n'.join(a + ',' + b for a, b in itertools.combinations(users, 2)))"
    ),
    "code-qa": (
        "import ast\n"
        "callee = __CALLEE__\n"
        "def calls(node):\n"
        "    for sub in ast.walk(node):\n"
        "        if isinstance(sub, ast.Call):\n"
        "            f = sub.func\n"
        "            if getattr(f, 'id', None) == callee or getattr(f, 'attr', None) == callee:\n"
        "                return True\n"
        "    return False\n"
        "found = []\n"
        "for node in ast.parse(context).body:\n"
        "    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and calls(node):\n"
        "        found.append(node.name)\n"
        "    elif isinstance(node, ast.ClassDef):\n"
        "        found += [node.name + '.' + m.name for m in node.body\n"
        "                  if isinstance(m, (ast.FunctionDef, ast.AsyncFunctionDef))\n"
        "                  and calls(m)]\n"
        "submit(found[0])"
    ),
}

# Wrong first programs (error_rate): each changes the last line to a plausible bug.
_WRONG_SUBMIT = {
    "niah": 'submit(int(re.search(r"[0-9]+", reply).group()[::-1]))',  # digits reversed
    "niah-multi": "submit(','.join(str(n) for n in numbers[:-1]))",  # one number missed
    "niah-semantic": 'submit(int(re.search(r"[0-9]+", reply).group()[::-1]))',
    "oolong-count": "submit(sum(counts) + 1)",  # off by one
    "oolong-common": "submit(min(totals, key=totals.get))",  # the rarest label
    "oolong-pairs": 'submit("\\n".join(a + "," + b for a, b in zip(users, users[1:])))',
    "code-qa": "submit(callee)",  # the callee, not its caller
}

# --- reading a task off a prompt ---------------------------------------------------------------


def _which(question: str) -> tuple[str, dict[str, str]]:
    """The task a question asks and its parameters (the key, label or callee)."""
    if (m := _NIAH_KEY.search(question)) is not None:
        return "niah", {"key": m.group(1)}
    if (m := _MULTI_KEY.search(question)) is not None:
        return "niah-multi", {"key": m.group(1)}
    if (m := _SEMANTIC_KEY.search(question)) is not None:
        return "niah-semantic", {"key": m.group(1)}
    if (m := _COUNT_LABEL.search(question)) is not None:
        return "oolong-count", {"label": m.group(1)}
    if _PAIRS.search(question) is not None:
        return "oolong-pairs", {}
    if (m := _CALLEE.search(question)) is not None:
        return "code-qa", {"callee": m.group(1)}
    if _COMMON.search(question) is not None:
        return "oolong-common", {}
    raise ValueError("the fake model does not recognise this task")


def _solve(kind: str, params: dict[str, str], text: str) -> str:
    """What the fake reads off a text it was given whole."""
    if kind == "niah":
        found = re.search(rf"magic number for {params['key']} is (\d+)", text)
        return found.group(1) if found else "I could not find it."
    if kind == "niah-multi":
        numbers = re.findall(rf"special magic number for {params['key']} is (\d+)", text)
        return ", ".join(sorted(numbers))
    if kind == "niah-semantic":
        pattern = rf"the {params['key']} document store opens with the secret PIN (\d+)"
        found = re.search(pattern, text)
        return found.group(1) if found else "none"
    if kind == "oolong-pairs":
        users = sorted(set(re.findall(rf"\| user: (u\d{{4}}) \| label: {PAIRS_LABEL} \|", text)))
        return "\n".join(f"{a},{b}" for i, a in enumerate(users) for b in users[i + 1 :])
    if kind == "code-qa":
        start = text.find("# --- module ")
        source = text[start : text.rfind("\n\n", start)] if start >= 0 else text
        names = callers(source, params["callee"])
        return names[0] if names else "none"
    labels = Counter(_RECORD_LABEL.findall(text))
    if kind == "oolong-count":
        return str(labels[params["label"]])
    return labels.most_common(1)[0][0] if labels else "none"


def _program(kind: str, params: dict[str, str], *, fallback: bool, wrong: bool) -> str:
    code = _FALLBACK[kind] if fallback else _CODE[kind]
    if wrong and not fallback:
        code = code.rstrip().rsplit("\n", 1)[0] + "\n" + _WRONG_SUBMIT[kind] + "\n"
    for name, value in params.items():
        code = code.replace(f"__{name.upper()}__", repr(value))
    return code


def _dspy_program(code: str) -> str:
    """A session program rewritten for ``dspy.RLM``: ``llm_query_batched`` and ``SUBMIT``."""
    code = re.sub(r"\bsubmit\(", "SUBMIT(", code)
    code = re.sub(r"\bpredict_many\(", "_predict_many(", code)
    code = re.sub(r"\bpredict\(", "_predict(", code)
    helpers = (
        "import json as _json\n"
        f"_SPLIT = {DSPY_SPLIT!r}\n"
        "def _predict(instructions, text):\n"
        "    return llm_query(instructions + _SPLIT + text)\n"
        "def _predict_many(instructions, texts, output=None):\n"
        "    replies = llm_query_batched([instructions + _SPLIT + t for t in texts])\n"
        "    return [r if output is None else _json.loads(r) for r in replies]\n"
    )
    return helpers + code


# --- the models ---------------------------------------------------------------------------------


def fake_root(request: Request, *, wrong: bool = False) -> str | AssistantMessage:
    """The fake root model: answers a long prompt, acts through code in a session or in DSPy.

    In a session it calls the ``execute_code`` tool, or writes a fenced block when the session
    offers no tool (``code_tool=False``).

    *wrong*: its first program has a bug (the submit line of ``_WRONG_SUBMIT``).
    """
    users = [m for m in request.messages if isinstance(m, UserMessage)]
    system = " ".join(m.text for m in request.messages if isinstance(m, SystemMessage))
    if "[[ ## code ## ]]" in system:
        return _dspy_reply(users[-1].text, wrong=wrong)
    tool = any(tool.name == "execute_code" for tool in request.tools)
    if not tool and "You act by writing Python" not in system:
        kind, params = _which(users[-1].text[-600:])  # long prompt: the question ends it
        return _solve(kind, params, users[-1].text)
    kind, params = _which(users[0].text)
    attempts = sum(1 for m in request.messages if isinstance(m, AssistantMessage))
    if attempts >= 2:
        return "I could not solve it."
    fallback = attempts > 0 or _NO_SUB in system
    code = _program(kind, params, fallback=fallback, wrong=wrong and attempts == 0)
    if not tool:  # a session without the tool: fenced code blocks
        return f"```python\n{code}\n```"
    return AssistantMessage([ToolCall(f"call_{attempts + 1}", "execute_code", {"code": code})])


def _dspy_reply(prompt: str, *, wrong: bool) -> str:
    """One step of ``dspy.RLM``: the program on the first iteration, a fallback after that."""
    kind, params = _which(prompt)
    iteration = re.search(r"\[\[ ## iteration ## \]\]\s*(\d+)", prompt)
    first = iteration is None or int(iteration.group(1)) <= 1
    code = _program(kind, params, fallback=not first, wrong=wrong and first)
    code = _dspy_program(code) if first else re.sub(r"\bsubmit\(", "SUBMIT(", code)
    return (
        f"[[ ## reasoning ## ]]\nSolve {kind} with code.\n\n"
        f"[[ ## code ## ]]\n```python\n{code}\n```\n\n[[ ## completed ## ]]"
    )


def fake_sub(request: Request) -> str:
    """The fake sub-model: reads the instructions and its input, and answers from the input.

    A sunroom ``predict`` sends the instructions as the system message and the input as the
    last user message; the fake's DSPy programs send both in one prompt split by
    :data:`DSPY_SPLIT`.
    """
    system = next((m.text for m in request.messages if isinstance(m, SystemMessage)), "")
    last = request.messages[-1]
    text = last.text if isinstance(last, UserMessage) else ""
    if not system and DSPY_SPLIT in text:
        system, text = text.split(DSPY_SPLIT, 1)
    value: object
    if m := _NIAH_KEY.search(system) or re.search(r"magic number for ([a-z]+-[a-z]+)\?", system):
        value = _solve("niah", {"key": m.group(1)}, text)
    elif (m := re.search(r"magic numbers for ([a-z]+-[a-z]+) in", system)) is not None:
        value = [int(n) for n in _solve("niah-multi", {"key": m.group(1)}, text).split(", ") if n]
    elif (m := _SEMANTIC_KEY.search(system)) is not None:
        value = _solve("niah-semantic", {"key": m.group(1)}, text)
    elif "'urgent'" in system:
        value = sorted(set(re.findall(rf"\| user: (u\d{{4}}) \| label: {PAIRS_LABEL} \|", text)))
    elif (m := re.search(r"calls '([A-Za-z_][A-Za-z0-9_]*)'", system)) is not None:
        names = callers(text, m.group(1))
        value = names[0] if names else "none"
    else:
        labels = Counter(_RECORD_LABEL.findall(text))
        if (m := re.search(r"whose label is '([a-z]+)'", system)) is not None:
            value = labels[m.group(1)]
        else:
            value = dict(labels)
    if request.output_schema is not None:  # a scalar or list type is wrapped as {"value": ...}
        properties = request.output_schema.schema.get("properties")
        wrapped = isinstance(properties, dict) and "value" in properties
        return json.dumps({"value": value} if wrapped else value)
    return value if isinstance(value, str) else json.dumps(value)


def fake_models(*, seed: int = 0, error_rate: float = 0.0) -> tuple[FunctionModel, FunctionModel]:
    """The fake root and sub-model; the root's first program is wrong with *error_rate*.

    The draws come from one generator seeded by *seed*, in the order runs ask, so a run with
    ``parallel=1`` is reproducible; with more, which runs draw a wrong program may differ.
    """
    if not 0.0 <= error_rate <= 1.0:
        raise ValueError(f"error_rate must be from 0 to 1, got {error_rate!r}")
    draw = random.Random(seed)

    def root(request: Request) -> str | AssistantMessage:
        first = not any(isinstance(m, AssistantMessage) for m in request.messages)
        users = [m for m in request.messages if isinstance(m, UserMessage)]
        dspy_first = bool(users) and re.search(r"## iteration ## \]\]\s*1\b", users[-1].text)
        wrong = (first or bool(dspy_first)) and error_rate > 0 and draw.random() < error_rate
        return fake_root(request, wrong=wrong)

    return FunctionModel(root, name="fake-root"), FunctionModel(fake_sub, name="fake-sub")
