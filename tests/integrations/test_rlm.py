"""rlm's ``RLM(...)`` on sunroom kernels: a completion end to end, and SunroomEnv's contract.

The model is a recorded OpenAI chat reply served by ``ReplayServer`` on 127.0.0.1 (its text
replaced per turn); rlm's own ``OpenAIClient`` reaches it through ``base_url``. Kernels are
real (bwrap, the default backend).
"""

from __future__ import annotations

import gc
import json
from collections.abc import Iterator
from typing import Any

import pytest
from rlm import RLM
from rlm.clients.base_lm import BaseLM
from rlm.core.lm_handler import LMHandler
from rlm.core.types import ModelUsageSummary, RLMChatCompletion, UsageSummary
from rlm.environments import SupportsPersistence

from sunroom.errors import KernelError, UsageError
from sunroom.integrations import rlm as sunroom_rlm
from sunroom.integrations.rlm import SunroomEnv
from tests.providers.replay import ReplayServer, load, reply_from

pytestmark = [
    pytest.mark.kernel,
    # rlm's own leaks, not sunroom's: LMHandler.stop() never closes its listening socket, and
    # its batched requests run AsyncOpenAI under asyncio.run() without closing the client
    pytest.mark.filterwarnings("ignore:unclosed:ResourceWarning"),
    pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning"),
]

MODEL = "gpt-4o-2024-08-06"
PATH = "/v1/chat/completions"


def _chat(text: str) -> Any:
    """The recorded chat.completions reply with its message text replaced by *text*."""
    body = json.loads(load("openai/chat_text")["response"]["body"])
    body["choices"][0]["message"]["content"] = text
    return reply_from("openai/chat_text", body=json.dumps(body))


def _messages(server: ReplayServer) -> list[list[dict[str, Any]]]:
    return [r.json()["messages"] for r in server.requests]


class EchoLM(BaseLM):  # type: ignore[misc]  # rlm ships no type information
    """A language model that answers ``echo:<prompt>`` (rlm's client interface, no network)."""

    def __init__(self) -> None:
        super().__init__(model_name="echo")

    def completion(self, prompt: Any, model: str | None = None) -> str:
        return f"echo:{str(prompt)[:40]}"

    async def acompletion(self, prompt: Any, model: str | None = None) -> str:
        return self.completion(prompt)

    def get_usage_summary(self) -> UsageSummary:
        return UsageSummary({"echo": ModelUsageSummary(1, 10, 10)})

    def get_last_usage(self) -> ModelUsageSummary:
        return ModelUsageSummary(1, 10, 10)


@pytest.fixture(autouse=True)
def _rlm_leaks_end_here() -> Iterator[None]:
    """Collect rlm's leaks (above) in the test that made them, under this module's filters.

    Left to the collector, a socket rlm never closed warns in whichever later test the
    collector happens to run in, and fails it.
    """
    yield
    gc.collect()


@pytest.fixture
def handler() -> Iterator[LMHandler]:
    lm = LMHandler(EchoLM())
    lm.start()
    server = lm._server
    yield lm
    lm.stop()
    server.server_close()  # rlm's stop() leaves its listening socket open


@pytest.fixture
def registered() -> Iterator[None]:
    sunroom_rlm.register()
    yield
    sunroom_rlm.unregister()


def _done(text: str) -> RLMChatCompletion:
    return RLMChatCompletion(
        root_model="child",
        prompt="p",
        response=text,
        usage_summary=UsageSummary(model_usage_summaries={}),
        execution_time=0.0,
    )


# -- RLM(...) end to end -------------------------------------------------------------------


def test_an_rlm_completion_over_a_bound_context_with_sub_calls(
    registered: None, no_process_left: None
) -> None:
    """The root model writes code that reads the bound context and calls llm_query and
    llm_query_batched; those sub-calls reach the recorded server from the host, and the code's
    ``answer`` ends the run with text built from their replies."""
    context = "".join(f"line {i}: the ledger says {i * 7}\n" for i in range(100_000))  # ~3 MB
    first = (
        "Let me look.\n```repl\n"
        "head = context[:40]\n"
        "one = llm_query(f'Summarise: {head}')\n"
        "many = llm_query_batched([context[-30:], context[1000:1030]])\n"
        "print(len(context), one, many)\n```"
    )
    final = "```repl\nanswer['content'] = one + '/' + ','.join(many)\nanswer['ready'] = True\n```"
    with ReplayServer() as server:
        server.add(PATH, _chat(first))
        server.add(PATH, _chat("SUM"))
        server.add(PATH, _chat("PART"), times=2)
        server.add(PATH, _chat(final))
        rlm = RLM(
            backend="openai",
            backend_kwargs={"model_name": MODEL, "base_url": f"{server.url}/v1", "api_key": "k"},
            environment="sunroom",
            max_iterations=4,
        )
        result = rlm.completion(context, root_prompt="What does the ledger say?")
        assert result.response == "SUM/PART,PART"
        assert not server.unexpected
        sent = _messages(server)
        del rlm
        gc.collect()  # rlm's leaked async transports are reported here, under this test's filter
    assert len(sent) == 5
    sub_prompts = sorted(m[-1]["content"] for m in sent[1:4])
    assert sub_prompts == sorted(["Summarise: " + context[:40], context[-30:], context[1000:1030]])
    # the kernel's output (the context's length, the sub-calls' replies) reached the root model
    assert f"{len(context)} SUM ['PART', 'PART']" in sent[4][-2]["content"]
    # the context itself was bound, never sent to the root model
    assert all(len(json.dumps(m)) < len(context) // 10 for m in sent)


def test_without_register_rlm_refuses_the_name_and_register_is_undone_cleanly() -> None:
    assert not sunroom_rlm.registered()
    with pytest.raises(ValueError, match="Unknown environment: sunroom"):
        RLM(environment="sunroom", backend_kwargs={"model_name": MODEL, "api_key": "k"}).completion(
            "x"
        )
    import rlm.core.rlm as core
    import rlm.environments as environments

    original = environments.get_environment
    sunroom_rlm.register()
    sunroom_rlm.register()  # idempotent
    try:
        assert sunroom_rlm.registered()
        assert core.get_environment is environments.get_environment is not original
    finally:
        sunroom_rlm.unregister()
    assert core.get_environment is environments.get_environment is original
    assert not sunroom_rlm.registered()


def test_registered_get_environment_builds_sunroom_and_still_builds_the_others(
    registered: None,
) -> None:
    import rlm.environments as environments
    from rlm.environments.local_repl import LocalREPL

    local = environments.get_environment("local", {})
    assert isinstance(local, LocalREPL)
    local.cleanup()
    env = environments.get_environment("sunroom", {"context_payload": "abc"})
    try:
        assert isinstance(env, SunroomEnv)
        assert env.execute_code("print(context)").stdout == "abc\n"
    finally:
        env.cleanup()


# -- the environment contract --------------------------------------------------------------


@pytest.fixture
def env(handler: LMHandler) -> Iterator[SunroomEnv]:
    e = SunroomEnv(lm_handler_address=handler.address)
    yield e
    e.cleanup()


def test_state_persists_across_cells_and_errors_are_stderr(env: SunroomEnv) -> None:
    assert env.execute_code("x = 40\ndef f(y):\n    return y + 2").stderr == ""
    out = env.execute_code("print(f(x))")
    assert (out.stdout, out.stderr, out.locals["x"]) == ("42\n", "", "40")
    err = env.execute_code("print('before')\n1 / 0")
    assert err.stdout == "before\n"
    assert err.stderr.rstrip().endswith("ZeroDivisionError: division by zero")
    syntax = env.execute_code("def broken(")
    assert "SyntaxError" in syntax.stderr
    assert syntax.stderr.count("SyntaxError") == 1
    assert env.execute_code("print(x)").stdout == "40\n"  # an error loses nothing
    kernel = env.kernel
    env.setup()  # rlm's contract calls it once; again is a no-op, not a second kernel
    assert env.kernel is kernel
    assert env.execute_code("print(x)").stdout == "40\n"


def test_llm_queries_run_on_the_host_and_are_tracked_per_cell(env: SunroomEnv) -> None:
    one = env.execute_code("print(llm_query('hi'))")
    assert one.stdout == "echo:hi\n"
    assert [c.response for c in one.rlm_calls] == ["echo:hi"]
    many = env.execute_code("print(llm_query_batched(['a', 'b', 'c']))")
    assert many.stdout == "['echo:a', 'echo:b', 'echo:c']\n"
    assert len(many.rlm_calls) == 3
    assert env.execute_code("y = 1").rlm_calls == []
    # a model that overwrites a helper gets it back in the next cell
    env.execute_code("llm_query = lambda *a: 'HIJACKED'")
    assert env.execute_code("print(llm_query('x'))").stdout == "echo:x\n"


def test_the_kernel_cannot_reach_the_lm_handler_that_its_llm_query_reaches(
    env: SunroomEnv, handler: LMHandler
) -> None:
    host, port = handler.address
    direct = env.execute_code(f"import socket\nsocket.create_connection(({host!r}, {port}), 2)")
    assert direct.stderr.rstrip().rpartition("\n")[2].startswith(("OSError", "Connection"))
    assert env.execute_code("print(llm_query('via host'))").stdout == "echo:via host\n"


def test_without_a_handler_llm_query_returns_an_error_string() -> None:
    with SunroomEnv() as e:
        r = e.execute_code("print(llm_query('hi'))\nprint(llm_query_batched(['a']))")
    assert r.stdout == "Error: No LM handler configured\n['Error: No LM handler configured']\n"


def test_rlm_query_uses_the_subcall_function_in_order(handler: LMHandler) -> None:
    def sub(prompt: str, model: str | None = None) -> RLMChatCompletion:
        if prompt == "bad":
            raise RuntimeError("child failed")
        return _done(f"child:{prompt}")

    with SunroomEnv(lm_handler_address=handler.address, subcall_fn=sub) as e:
        r = e.execute_code("print(rlm_query('t'))\nprint(rlm_query_batched(['a', 'bad', 'b']))")
    assert r.stdout.splitlines() == [
        "child:t",
        "['child:a', 'Error: RLM query failed - child failed', 'child:b']",
    ]
    assert [c.response for c in r.rlm_calls] == ["child:t", "child:a", "child:b"]


def test_answer_ready_is_the_final_answer_once(env: SunroomEnv) -> None:
    assert env.execute_code("answer['content'] = 'partial'").final_answer is None
    done = env.execute_code("answer['content'] = 1234\nanswer['ready'] = True")
    assert done.final_answer == "1234"
    assert env.execute_code("z = 1").final_answer is None
    rebound = env.execute_code("answer = {'content': 'X', 'ready': True}")
    assert rebound.final_answer == "X"
    # the rebound dict is wrapped again: setting ready in a later cell still counts
    assert env.execute_code("answer['ready'] = True").final_answer == "X"


def test_a_large_context_is_bound_and_aliased(handler: LMHandler) -> None:
    big = "".join(f"line {i}\n" for i in range(2_000_000))  # ~17 MB, streamed in chunks
    with SunroomEnv(lm_handler_address=handler.address, context_payload=big) as e:
        r = e.execute_code("lines = context.splitlines()\nprint(len(lines), lines[123456])")
        assert r.stdout == "2000000 line 123456\n"
        assert len(r.locals["context"]) < 200  # a short repr, never the whole value
        e.execute_code("context = 'clobbered'")
        assert e.execute_code("print(context == context_0, len(context))").stdout == (
            f"True {len(big)}\n"
        )


def test_dict_contexts_histories_and_the_persistence_protocol(env: SunroomEnv) -> None:
    assert isinstance(env, SupportsPersistence)
    assert env.add_context({"k": [1, 2, 3]}) == 0
    assert env.add_context("second") == 1
    history = [{"role": "user", "content": "orig"}]
    assert env.add_history(history) == 0
    history[0]["content"] = "mutated"  # the bound history is a copy
    r = env.execute_code("print(context['k'][2], context_1, history[0]['content'])")
    assert r.stdout == "3 second orig\n"
    assert (env.get_context_count(), env.get_history_count()) == (2, 1)
    env.execute_code("answer['ready'] = True")
    env.update_handler_address(("127.0.0.1", 1))
    assert env.lm_handler_address == ("127.0.0.1", 1)
    assert env.execute_code("print(answer)").stdout == "{'content': '', 'ready': False}\n"


def test_show_vars_lists_the_code_s_variables(env: SunroomEnv) -> None:
    assert "No variables" in env.execute_code("print(SHOW_VARS())").stdout
    env.execute_code("import math\nn = 3")
    assert env.execute_code("print(SHOW_VARS())").stdout == "Available variables: {'n': 'int'}\n"


def test_custom_tools_callables_run_on_the_host(handler: LMHandler) -> None:
    seen: list[int] = []

    def lookup(n: int) -> int:
        """Look a number up (on the host)."""
        seen.append(n)
        return n * 10

    tools = {
        "lookup": {"tool": lookup, "description": "multiply by ten"},
        "square": "def square(x):\n    return x * x",
        "CFG": {"vals": [1, 2, 3]},
    }
    with SunroomEnv(lm_handler_address=handler.address, custom_tools=tools) as e:
        r = e.execute_code("print(lookup(square(CFG['vals'][2])))")
    assert (r.stdout, r.stderr) == ("90\n", "")
    assert seen == [9]


def test_reserved_tool_names_and_unknown_options_are_refused() -> None:
    with pytest.raises(ValueError, match="reserved"):
        SunroomEnv(custom_tools={"llm_query": "x"})
    with pytest.raises(UsageError, match="unknown options: imagee"):
        SunroomEnv(imagee="python")


def test_a_timeout_that_loses_state_is_reported_and_the_scaffold_is_back(
    handler: LMHandler,
) -> None:
    from sunroom.sandbox.limits import Limits

    limits = Limits(timeout_s=1.0, interrupt_grace_s=0.2)
    code = "import signal, time\nsignal.signal(signal.SIGINT, signal.SIG_IGN)\ntime.sleep(30)"
    with SunroomEnv(lm_handler_address=handler.address, limits=limits, context_payload="c") as e:
        e.execute_code("kept = 1")
        r = e.execute_code(code)
        assert "variables defined by earlier cells are gone" in r.stderr
        after = e.execute_code("print(context, llm_query('q'), 'kept' in globals())")
        assert after.stdout == "c echo:q False\n"
        assert e.execute_code("answer['ready'] = True").final_answer == ""


def test_cleanup_leaves_no_process_and_is_idempotent(
    handler: LMHandler, no_process_left: None
) -> None:
    e = SunroomEnv(lm_handler_address=handler.address, context_payload="x")
    e.execute_code("import subprocess\np = subprocess.Popen(['sleep', '1000'])")
    e.cleanup()
    e.cleanup()
    with pytest.raises(KernelError, match="cleaned up"):
        e.execute_code("1")
    with pytest.raises(KernelError, match="cleaned up"):
        e.setup()
