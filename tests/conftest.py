"""Shared fixtures: which backends the conformance and security suites run on; the test lanes.

``SUNROOM_TEST_BACKENDS`` (default: all) picks the backends to run. A backend that cannot start
on this machine is skipped with the reason, unless it is listed in ``SUNROOM_REQUIRE_BACKENDS``
(CI lists all three): then its tests fail instead, so a missing backend in CI is a failure.

Lanes (docs/testing.md): a test that starts a kernel, a service, a backend or any other process
is marked ``kernel``, by the fixtures it uses (:data:`KERNEL_FIXTURES`) or by where it lives
(:data:`KERNEL_TESTS`); ``pytest -m "not kernel"`` is the fast lane. In the fast lane an audit
hook fails any test that starts a process or reaches the Docker daemon anyway, saying to mark
it. ``serial`` tests (:data:`SERIAL_TESTS`) run alone, after the parallel pass.
"""

from __future__ import annotations

import asyncio
import gc
import os
import platform
import socket
import sys
import time
from collections.abc import Generator, Iterator
from typing import Any

import psutil
import pytest

from sunroom import AsyncKernel
from sunroom.errors import SandboxUnavailableError
from tests import sockets
from tests.pgserver import postgres_cluster, postgres_db_dsn, postgres_dsn

__all__ = ["postgres_cluster", "postgres_db_dsn", "postgres_dsn"]  # fixtures of tests/pgserver.py

ALL_BACKENDS = ("subprocess", "bwrap", "docker", "jupyter")
ISOLATED_BACKENDS = ("bwrap", "docker")
THREAT_BACKENDS = ("bwrap", "docker", "jupyter")
"""Where the core threat suite (tests/security/test_threats.py) runs: ``jupyter`` is an
IPython kernel in bwrap, under the same sandbox."""

_availability: dict[str, str | None] = {}


def _names(var: str, default: str) -> list[str]:
    return [b.strip() for b in os.environ.get(var, default).split(",") if b.strip()]


def backends_under_test(among: tuple[str, ...] = ALL_BACKENDS) -> list[str]:
    return [b for b in _names("SUNROOM_TEST_BACKENDS", ",".join(ALL_BACKENDS)) if b in among]


def _unavailable_reason(name: str) -> str | None:
    if name not in _availability:

        async def probe() -> None:
            async with AsyncKernel(backend=name) as k:
                r = await k.execute("1")
                assert r.ok, r

        try:
            asyncio.run(probe())
            _availability[name] = None
        except SandboxUnavailableError as exc:
            _availability[name] = str(exc)
    return _availability[name]


JUPYTER_EXCEPTIONS: dict[str, str] = {
    "test_exception_is_data_with_user_frames_only": (
        "IPython formats tracebacks itself (context lines, 'Cell In[n]'), not sunroom's way"
    ),
    "test_base_exceptions_do_not_desync[jupyter-exit()]": (
        "exit() is IPython's: it asks the kernel to end after the cell, which is not an error"
    ),
    "test_memory_limit_holds": (
        "ipykernel's threads reserve more address space than this test's 512 MB; "
        "tests/sandbox/backends/jupyter/test_jupyter_backend.py checks the memory limit with room for them"
    ),
    "test_a_broken_repr_is_reported_and_never_fails_the_cell": (
        "IPython renders reprs itself: a broken one is a FormatterWarning on stderr, and a "
        "_repr_png_ of the wrong type fails the cell, instead of sunroom's metadata errors"
    ),
    "test_open_figures_are_captured_as_png_and_closed": (
        "figures are drawn by IPython's inline backend (its size, dpi and tight bbox)"
    ),
    "test_a_figure_too_large_to_render_is_said_and_the_kernel_works": (
        "IPython's inline backend fails the cell with matplotlib's own error"
    ),
    "test_figures_are_rgb_when_opaque_rgba_when_not_and_renderers_are_reused": (
        "IPython's inline backend always draws RGBA PNGs"
    ),
    "test_open_shared_on_forked_kernels_takes_each_ones_own_file": (
        "Jupyter kernels cannot be forked (ipykernel's threads and ZeroMQ sockets do not "
        "survive a fork); fork refuses them with a clear UsageError"
    ),
}
"""Conformance cases that do not hold on the ``jupyter`` backend, each with its reason (by
test name, or name with parameters). They are reported as skipped with the reason, never
silently; docs/jupyter.md lists the same differences."""


def _require(name: str, test: pytest.Item | None = None) -> str:
    if name == "jupyter" and test is not None:
        reason = JUPYTER_EXCEPTIONS.get(test.name) or JUPYTER_EXCEPTIONS.get(
            getattr(test, "originalname", "")
        )
        if reason is not None:
            pytest.skip(f"documented jupyter exception: {reason}")
    reason = _unavailable_reason(name)
    if reason is not None:
        if name in _names("SUNROOM_REQUIRE_BACKENDS", ""):
            pytest.fail(f"required backend {name!r} is unavailable: {reason}")
        pytest.skip(f"backend {name!r} unavailable here: {reason}")
    return name


@pytest.fixture(params=backends_under_test())
def backend(request: pytest.FixtureRequest) -> str:
    """Every backend under test (kernel conformance)."""
    return _require(request.param, request.node)


@pytest.fixture(params=backends_under_test(ISOLATED_BACKENDS))
def isolated_backend(request: pytest.FixtureRequest) -> str:
    """The isolating backends under test (security suite)."""
    return _require(request.param)


@pytest.fixture(params=backends_under_test(THREAT_BACKENDS))
def threat_backend(request: pytest.FixtureRequest) -> str:
    """The isolating backends and the jupyter backend in bwrap (the core threat suite)."""
    return _require(request.param, request.node)


def _descendants() -> set[int]:
    """This process's descendants, but the docker watchdog (one per host process, by design)."""
    out = set()
    for p in psutil.Process().children(recursive=True):
        try:
            if not any("docker_watchdog" in part for part in p.cmdline()):
                out.add(p.pid)
        except psutil.Error:
            pass
    return out


def _live(pids: set[int]) -> set[int]:
    out = set()
    for pid in pids:
        try:
            if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                out.add(pid)
        except psutil.NoSuchProcess:
            pass
    return out


@pytest.fixture
def no_process_left() -> Iterator[None]:
    """Every process a test started is gone when it ends."""
    before = _descendants()
    yield
    deadline = time.monotonic() + 10
    while (left := _live(_descendants() - before)) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not left, f"processes left behind: {sorted(left)}"


# -- lanes ----------------------------------------------------------------------------------

KERNEL_FIXTURES = frozenset(
    {
        "backend",
        "isolated_backend",
        "threat_backend",
        "jail",
        "install_backend",
        "local_backend",
        "fork_backend",
        "bwrap",
        "make_server",
        "no_process_left",
        "postgres_cluster",
    }
)
"""Fixtures that start a kernel, a service or a backend (``no_process_left``: that check the
processes a test left; ``postgres_cluster``: a PostgreSQL server, under ``postgres_dsn`` and
``postgres_db_dsn`` too): a test using one, directly or through another fixture, is ``kernel``."""

KERNEL_TESTS: tuple[str, ...] = (
    # modules (most of their tests start one)
    "tests/agent/test_approvals.py",
    "tests/agent/test_images.py",
    "tests/agent/test_predict.py",
    "tests/agent/test_recursion_tree.py",
    "tests/agent/test_session.py",
    "tests/agent/test_submit.py",
    "tests/cli/test_approvals.py",
    "tests/cli/test_cli.py",
    "tests/cli/test_exec_errors.py",
    "tests/cli/test_functions_option.py",
    "tests/cli/test_run.py",
    "tests/cli/test_run_fenced.py",
    "tests/docs/test_snippets.py::test_a_doc_snippet_runs_as_written",
    "tests/embeddings/test_cli_embed.py",
    "tests/eval/test_cli.py",
    "tests/eval/test_dspy_arm.py",
    "tests/eval/test_runner.py",
    "tests/embeddings/test_session_embeddings.py",
    "tests/network/test_cli_network.py",
    "tests/packages/test_docs.py",
    "tests/packages/test_failures.py",
    "tests/packages/test_index.py",
    "tests/packages/test_install.py",
    "tests/packages/test_prompt.py",
    "tests/prelude/test_e2b_compat.py",
    "tests/prelude/test_fork_reap.py",
    "tests/prelude/test_supervisor_gate.py",
    "tests/sandbox/backends/jupyter/test_cli_jupyter.py",
    "tests/sandbox/backends/jupyter/test_forged_messages.py",
    "tests/sandbox/backends/jupyter/test_jupyter_backend.py",
    "tests/sandbox/backends/jupyter/test_kernel_side.py",
    "tests/sandbox/test_cancelled_start.py",
    "tests/sandbox/test_cgroup_sweep.py",
    "tests/sandbox/test_child.py",
    "tests/sandbox/test_child_reaping.py",
    "tests/sandbox/test_close_during_cell.py",
    "tests/sandbox/test_docker.py",
    "tests/sandbox/test_placing.py",
    "tests/sandbox/test_schema_constraints.py",
    "tests/sandbox/test_toolset.py",
    "tests/sandbox/test_watcher.py",
    "tests/service/mcp/test_server.py",
    "tests/service/test_crash.py",
    "tests/service/test_reclaim.py",
    "tests/service/test_resume_messages.py",
    "tests/service/test_send_while_ending.py",
    "tests/service/test_shutdown.py",
    "tests/store/test_processes.py",
    "tests/test_examples.py",
    # single tests of otherwise fast modules
    "tests/agent/test_events.py::test_a_slow_subscriber_does_not_stall_the_session",
    "tests/agent/test_events.py::test_secrets_in_tool_output_never_reach_a_model_or_an_event",
    "tests/agent/test_events.py::test_secrets_never_enter_the_kernel",
    "tests/agent/test_patterns.py::test_a_kernels_catastrophic_predict_schema_does_not_stall_the_host",
    "tests/agent/test_rlm_eval_smoke.py::test_best_of_k_votes_away_a_noisy_root",
    "tests/agent/test_rlm_eval_smoke.py::test_fake_run_prints_a_table_with_full_accuracy",
    "tests/agent/test_rlm_eval_smoke.py::test_rlm_run_keeps_the_context_out_of_the_prompt",
    "tests/embeddings/test_functions.py::test_bad_input_is_a_clear_error_in_the_kernel",
    "tests/embeddings/test_functions.py::test_before_call_counts_and_may_refuse",
    "tests/embeddings/test_functions.py::test_embed_crosses_packed_and_arrives_as_rows",
    "tests/embeddings/test_functions.py::test_empty_input_and_k_larger_than_texts",
    "tests/embeddings/test_functions.py::test_real_model_search_scores_are_the_published_similarities",
    "tests/embeddings/test_functions.py::test_real_model_vectors_from_the_kernel_match_the_numpy_reference",
    "tests/embeddings/test_functions.py::test_search_ranks_by_cosine_and_caches_documents",
    "tests/network/test_egress_thread.py::test_a_forked_process_gets_its_own_egress_thread",
    "tests/network/test_handoff.py::test_a_supervisor_that_cannot_reach_the_proxy_exits_before_any_kernel",
    "tests/network/test_relay_threads.py::test_a_fork_while_a_thread_is_inside_the_pool_leaves_the_child_a_working_pool",
    "tests/network/test_relay_threads.py::test_a_forked_process_has_a_pool_of_its_own",
    "tests/network/test_relay_threads.py::test_idle_threads_leave",
    "tests/network/test_relay_threads.py::test_when_the_system_gives_no_thread_none_start_and_the_counts_stay_right",
    "tests/prelude/test_kernel_modules.py::test_every_prelude_module_imports_only_the_stdlib_and_msgpack",
    "tests/prelude/test_kernel_modules.py::test_a_kernel_starts_without_the_costly_standard_modules",
    "tests/rpc/test_blobs.py::test_chunks_cross_both_ways_whole",
    "tests/rpc/test_speed_paths.py::test_cancelled_execute_abandons_its_answer_and_the_kernel_goes_on",
    "tests/sandbox/test_docker_watchdog.py::test_the_watchdog_removes_its_owners_containers_when_the_owner_goes",
    "tests/sandbox/test_inline_functions.py::test_inline_errors_budget_and_concurrency",
    "tests/sandbox/test_inline_functions.py::test_inline_runs_on_the_loop_thread_without_a_task",
    "tests/sandbox/test_inline_functions.py::test_inline_timeout_discards_a_late_result",
    "tests/sandbox/test_inline_functions.py::test_sync_twin_serves_inline_and_threaded_functions",
    "tests/security/test_identity.py::test_a_uid_in_use_by_a_live_process_is_never_leased",
    "tests/security/test_identity.py::test_no_free_uid_fails_closed",
    "tests/security/test_identity.py::test_uid_map_inside_the_sandbox_and_from_the_host",
    "tests/service/test_approvals.py::test_a_call_waiting_for_approval_when_the_service_dies_is_denied_and_told",
    "tests/service/test_crash_suite.py::test_crash_suite_fast_tier",
    "tests/service/test_crash_suite.py::test_crash_suite_slow_tier",
    "tests/service/test_failures.py::test_a_failure_to_record_a_sessions_end_is_logged",
    "tests/service/test_fairness.py::test_sunroom_serve_refuses_the_bound_out_of_range",
    "tests/service/test_http_limits.py::test_sigterm_with_a_live_sse_client_exits_0_at_once",
    "tests/service/test_notebook.py::test_sessions_export_writes_a_notebook",
    "tests/service/test_resume_unknown_calls.py::test_a_call_marked_unknown_without_its_event_is_reported_by_the_next_resume",
    "tests/service/test_resume_unknown_calls.py::test_a_note_lost_with_its_process_is_given_by_the_next_resume",
    "tests/test_portal.py::test_a_host_call_from_a_thread_the_cell_left_running_is_served_between_calls",
    "tests/test_public_api.py::test_kernel_side_imports_no_host_dependencies",
    "tests/test_public_api.py::test_kernel_side_imports_only_the_stdlib_and_msgpack",
    "tests/test_readme.py::test_a_guide_snippet_runs_as_written",
    "tests/test_readme.py::test_a_readme_snippet_runs_as_written",
    "tests/test_sync_twins.py::test_kernel_close_is_idempotent_and_closed_means_closed",
    "tests/test_sync_twins.py::test_session_events_unsubscribe_when_the_consumer_stops_early",
    "tests/test_sync_twins.py::test_session_lifecycle_and_closed_errors",
)
"""Tests that start a kernel, a service or another process in their bodies or in their
module's own fixtures, by node-id prefix: a directory (``tests/cli/``), a module
(``tests/x.py``) or a test (``tests/x.py::test_y``, with every parameter of it)."""

SERIAL_TESTS: tuple[str, ...] = (
    # timing: the longest stall of the host's event loop (under 100 ms) and a bystander's p99
    # against its own baseline; other workers' kernels on the same 2 cores make both flake
    "tests/security/test_host_dos.py",
    # they count every process on the host with a fixed command line (`sleep 1000`, `1003`,
    # `1013`, a daemon's marker): the same test for another backend, on another worker, plants
    # the same processes meanwhile
    "tests/conformance/test_kernel.py::test_close_leaves_zero_processes_after_fork_storm_and_daemon",
    "tests/conformance/test_reaping.py::test_kill_9_of_the_host_leaves_no_kernel_processes",
    "tests/conformance/test_fork.py::test_closing_a_copy_reaps_its_daemons_and_spares_the_parent",
    "tests/security/test_threats.py::test_daemons_do_not_outlive_the_kernel",
    # timing on a starved CPU: 20 ms windows between threads, a 10 s bound on building a 100k
    # allowlist (12.2 s with 4 workers on 2 cores)
    "tests/conformance/test_host_functions.py::test_sync_functions_respect_the_concurrency_limit_and_busy_is_reported",
    "tests/network/test_policy.py::test_a_100k_entry_allowlist_builds_and_matches_fast",
    # ipykernel forwards what a cell writes to fd 1 from a thread: on a starved CPU it came
    # after the cell's reply and was missing from stdout (once, with 2 workers)
    "tests/conformance/test_kernel.py::test_forged_frames_on_stdout_are_just_text[jupyter]",
    # timing between a stalled session's end record and a message to it: under load the end
    # is recorded first, the resume's small writes fit in SQLite's free pages though the
    # filesystem is full, and the message is accepted (and recorded) instead of refused
    "tests/service/test_disk_full.py::test_a_session_whose_events_cannot_be_stored_ends_failed_and_never_refills_the_disk",
    # the smoke suite builds the wheel and two venvs once per process (session fixtures): in
    # the parallel pass each worker built them again (xdist_group did not keep them together)
    "tests/smoke/",
)
"""Tests that must run alone (``serial``), by node-id prefix as :data:`KERNEL_TESTS`; each is
serial for the reason docs/testing.md gives."""

_MARK = "mark it: add its module to KERNEL_TESTS in tests/conftest.py (or use a fixture of KERNEL_FIXTURES, or @pytest.mark.kernel)"


def _under(nodeid: str, prefixes: tuple[str, ...]) -> bool:
    """Whether test *nodeid* is one of *prefixes* or lies under one."""
    for prefix in prefixes:
        if prefix.endswith("/"):
            if nodeid.startswith(prefix):
                return True
        elif nodeid == prefix or nodeid.startswith((prefix + "::", prefix + "[")):
            return True
    return False


@pytest.hookimpl(tryfirst=True)  # before -m deselects by these marks
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark ``kernel`` and ``serial`` tests (see the module docstring)."""
    for item in items:
        fixtures = set(getattr(item, "fixturenames", ()))
        if fixtures & KERNEL_FIXTURES or _under(item.nodeid, KERNEL_TESTS):
            item.add_marker(pytest.mark.kernel)
        if _under(item.nodeid, SERIAL_TESTS):
            item.add_marker(pytest.mark.serial)


class _FastLaneGuard:
    """An audit hook failing a fast-lane test that starts a process or reaches Docker.

    Installed once per process, only when the run deselects ``kernel`` tests (audit hooks
    cannot be removed); outside a test of that run (:attr:`test` is None) it does nothing.
    Watched: ``subprocess.Popen`` (asyncio's subprocesses too), ``os.posix_spawn``,
    ``os.fork``, ``os.forkpty``, ``os.exec*``, ``os.system``, and ``socket.connect`` to the
    Docker daemon. Not seen: a process started by C code without an audit event (uvloop's
    subprocesses, ``multiprocessing``'s spawn and forkserver).
    """

    def __init__(self) -> None:
        self.test: str | None = None
        self.seen: list[str] = []

    def __call__(self, event: str, args: tuple[Any, ...]) -> None:
        if self.test is None:
            return
        what = _started(event, args)
        if what is None:
            return
        self.seen.append(what)
        raise UnmarkedKernelTest(f"{self.test} is in the fast lane but called {what}: {_MARK}")


class UnmarkedKernelTest(RuntimeError):
    """A fast-lane test started a process or reached a daemon: it must be marked ``kernel``."""


def _started(event: str, args: tuple[Any, ...]) -> str | None:
    """What audit *event* starts (a process, a daemon's connection), or None."""
    if event == "subprocess.Popen":
        return f"subprocess.Popen({args[1]!r})"
    if event in ("os.posix_spawn", "os.exec"):
        return f"{event}({args[0]!r})"
    if event in ("os.fork", "os.forkpty"):
        return f"{event}()"
    if event == "os.system":
        return f"os.system({args[0]!r})"
    if event == "socket.connect" and _docker_address(args[0], args[1]):
        return f"socket.connect({args[1]!r})"
    return None


def _docker_address(sock: object, address: object) -> bool:
    """Whether *address* is the Docker daemon's (its Unix socket, or ``DOCKER_HOST``).

    Other Unix sockets are not watched: the network proxy's tests talk to proxies of their own
    process over them, and a kernel's socket exists only once a process was started.
    """
    if getattr(sock, "family", None) == socket.AF_UNIX:
        return "docker" in str(address)
    host = os.environ.get("DOCKER_HOST", "")
    return bool(host) and isinstance(address, tuple) and f"{address[0]}:{address[1]}" in host


_GUARD = _FastLaneGuard()


def _fast_lane(config: pytest.Config) -> bool:
    """Whether this run is the fast lane (its ``-m`` expression says ``not kernel``)."""
    return "not kernel" in " ".join(str(config.getoption("markexpr") or "").split())


def pytest_configure(config: pytest.Config) -> None:
    sockets.install()
    if _fast_lane(config):
        # a library probe, not a process a test starts: platform runs `uname -p` once per
        # process (the OpenAI SDK's headers ask for it), then answers from its cache
        platform.processor()
        sys.addaudithook(_GUARD)


@pytest.fixture(autouse=True)
def _fast_lane_guard(request: pytest.FixtureRequest) -> Iterator[None]:
    """In the fast lane, fail a test that starts a process (see :class:`_FastLaneGuard`)."""
    if not _fast_lane(request.config):
        yield
        return
    _GUARD.test, _GUARD.seen = request.node.nodeid, []
    try:
        yield
    finally:
        _GUARD.test = None
    if _GUARD.seen:
        pytest.fail(f"{request.node.nodeid} started {_GUARD.seen[0]} in the fast lane: {_MARK}")


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(
    item: pytest.Item, nextitem: pytest.Item | None
) -> Generator[None, object, object]:
    """Name the running test for :mod:`tests.sockets` (setup, call and teardown)."""
    sockets.current_test = item.nodeid
    try:
        return (yield)
    finally:
        sockets.current_test = None


def pytest_sessionfinish(session: pytest.Session) -> None:
    """Collect what is left, so a socket leaked late is reported too (:mod:`tests.sockets`)."""
    gc.collect()
    sockets.report_open()
