"""``SunroomExecutor`` under smolagents: a ``CodeAgent`` run end to end, and the contract's edges.

The agent talks to a real HTTP server on 127.0.0.1 replaying OpenAI chat completions through
smolagents' own ``OpenAIServerModel`` (the openai SDK); its code runs in real bwrap kernels.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import os
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import PIL.Image
import pytest
from smolagents import CodeAgent, OpenAIServerModel, tool
from smolagents.default_tools import FinalAnswerTool
from smolagents.utils import AgentError

from sunroom.errors import UsageError
from sunroom.integrations.smolagents import SunroomExecutor
from tests.providers.replay import ReplayServer, reply_from

pytestmark = pytest.mark.kernel

DATA = Path(__file__).parent / "data"
ROOT = Path(__file__).resolve().parents[2]
SECRET = "sk-host-only-7f3a"  # a credential only the host tool holds


@pytest.fixture
def executor() -> Iterator[SunroomExecutor]:
    ex = SunroomExecutor(backend="bwrap")
    yield ex
    ex.cleanup()


def _completion(content: str) -> Any:
    """The recorded chat.completion of openai-python, with *content* as the assistant's."""
    reply = reply_from("openai/chat_text")
    body = json.loads(reply.body)
    body["choices"][0]["message"]["content"] = content
    reply.body = json.dumps(body)
    return reply


def test_a_code_agent_with_a_host_tool_and_a_managed_agent_runs_end_to_end() -> None:
    calls: list[tuple[int, str]] = []

    def multiply(a: int, b: int) -> int:
        """Multiply two integers.

        Args:
            a: the first factor
            b: the second factor
        """
        calls.append((os.getpid(), SECRET))  # runs here, on the host, with the credential
        return a * b

    script = json.loads((DATA / "smolagents_code_agent.json").read_text())
    with ReplayServer() as server, contextlib.ExitStack() as stack:
        for turn in script["turns"]:
            server.add("/v1/chat/completions", _completion(turn["content"]))
        model = OpenAIServerModel(model_id="gpt-4o", api_base=f"{server.url}/v1", api_key="k")
        # the model's OpenAI client keeps its connection to the server open until closed: left
        # to the collector (the agents hold it in cycles) its socket warns in a later test
        stack.callback(model.client.close)
        helper = CodeAgent(
            tools=[],
            model=model,
            name="helper",
            description="Greets whoever asks.",
            executor=SunroomExecutor(backend="bwrap"),
        )
        manager_executor = SunroomExecutor(backend="bwrap")
        with (
            CodeAgent(
                tools=[tool(multiply)],
                model=model,
                managed_agents=[helper],
                executor=manager_executor,
            ) as manager,
            helper,
        ):
            answer = manager.run("What is 6 times 7, and what does the helper say?")
            kernel_view = manager_executor.kernel.execute(
                "import os\nrepr(globals()) + repr(dict(os.environ))"
            )
        assert server.unexpected == []
        assert len(server.requests) == 3
    assert answer == "42 / True"
    assert calls == [(os.getpid(), SECRET)]
    assert kernel_view.ok and kernel_view.value is not None
    assert "product" in kernel_view.value  # the agent's variables live in the kernel ...
    assert SECRET not in kernel_view.value  # ... the tool's credential never got there
    assert "def multiply" not in kernel_view.value and "calls.append" not in kernel_view.value


def test_a_tools_exception_reaches_the_code_with_its_type_and_the_agent_error_names_it(
    executor: SunroomExecutor,
) -> None:
    def lookup(key: str) -> str:
        """Look a key up.

        Args:
            key: the key
        """
        raise KeyError(f"no entry {key}")

    executor.send_tools({"lookup": tool(lookup)})
    caught = executor("try:\n    lookup(key='x')\nexcept KeyError as e:\n    print('caught', e)")
    assert "caught" in caught.logs and "no entry x" in caught.logs
    with pytest.raises(AgentError, match="KeyError"):
        executor("lookup(key='y')")


def test_final_answer_cannot_be_swallowed_by_the_codes_except_exception(
    executor: SunroomExecutor,
) -> None:
    executor.send_tools({"final_answer": FinalAnswerTool()})
    out = executor("try:\n    final_answer({'a': [1, 2]})\nexcept Exception:\n    print('no')")
    assert out.is_final_answer and out.output == {"a": [1, 2]} and "no" not in out.logs


def test_a_variable_is_sent_once_and_a_new_value_is_sent_again(
    executor: SunroomExecutor,
) -> None:
    data = {"rows": list(range(5))}
    executor.send_variables({"data": data})
    executor("data = 'changed in the kernel'")
    executor.send_variables({"data": data})  # the same object: not sent again
    assert executor("data").output == "'changed in the kernel'"
    executor.send_variables({"data": {"rows": [9]}})
    assert executor("data").output == "{'rows': [9]}"


def test_tools_and_image_variables_work_again_after_the_kernel_died_and_restarted(
    executor: SunroomExecutor,
) -> None:
    def double(x: int) -> int:
        """Double it.

        Args:
            x: the number
        """
        return 2 * x

    executor.send_tools({"double": tool(double)})
    executor.send_variables({"images": [PIL.Image.new("RGB", (2, 2))]})
    with pytest.raises(AgentError):
        executor("import os\nos._exit(3)")
    assert executor("double(x=21)").output == "42"
    assert executor("images[0].size").output == "(2, 2)"


def test_an_image_returned_by_a_host_tool_is_an_image_in_the_kernel(
    executor: SunroomExecutor,
) -> None:
    def red_square(size: int) -> PIL.Image.Image:
        """A red square.

        Args:
            size: its side in pixels
        """
        return PIL.Image.new("RGB", (size, size), (255, 0, 0))

    executor.send_tools({"red_square": tool(red_square)})
    assert executor("img = red_square(size=4)\n(type(img).__module__, img.size)").output == (
        "('PIL.PngImagePlugin', (4, 4))"
    )


def test_the_entry_point_names_the_executor() -> None:
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    target = pyproject["project"]["entry-points"]["smolagents.executors"]["sunroom"]
    module, _, name = target.partition(":")
    assert getattr(importlib.import_module(module), name) is SunroomExecutor


def test_images_among_the_variables_arrive_as_images(executor: SunroomExecutor) -> None:
    square = PIL.Image.new("RGB", (3, 3), (0, 0, 255))
    executor.send_variables({"images": [square], "task": "look"})
    out = executor("(type(images[0]).__module__, images[0].size, images[0].getpixel((1, 1)), task)")
    assert out.output == "('PIL.PngImagePlugin', (3, 3), (0, 0, 255), 'look')"


def test_a_tool_name_that_is_not_an_identifier_is_refused(executor: SunroomExecutor) -> None:
    with pytest.raises(UsageError, match="identifier"):
        executor.send_tools({"x = 1; import os": FinalAnswerTool()})
