"""Removing a kernel's container: the daemon's race with a container that stopped meanwhile.

A fake daemon (no Docker here): the removal is asked again when, and only when, the daemon
says the container it was told to kill had stopped already.
"""

from __future__ import annotations

from typing import Any, cast

import docker
import pytest

from sunroom.sandbox.backends.docker_process import REMOVE_ATTEMPTS, _remove

RACE = "Could not kill running container abc, cannot remove - Container abc is not running"


class _FakeAPI:
    """The daemon's answers to ``remove_container``, one per call (None: removed)."""

    def __init__(self, answers: list[Exception | None]) -> None:
        self.answers = answers
        self.calls: list[tuple[str, bool, bool]] = []

    def remove_container(self, cid: str, *, force: bool, v: bool) -> None:
        self.calls.append((cid, force, v))
        answer = self.answers.pop(0)
        if answer is not None:
            raise answer


class _FakeClient:
    def __init__(self, answers: list[Exception | None]) -> None:
        self.api = _FakeAPI(answers)


def _server_error(explanation: str) -> docker.errors.APIError:
    return docker.errors.APIError("500 Server Error", explanation=explanation)


def _run(answers: list[Exception | None]) -> _FakeAPI:
    client = _FakeClient(answers)
    _remove(cast(Any, client), "abc")
    return client.api


def test_a_container_that_stopped_during_its_removal_is_removed_on_the_next_ask() -> None:
    api = _run([_server_error(RACE), None])
    assert api.calls == [("abc", True, True)] * 2


def test_the_race_every_time_is_raised_after_the_last_attempt() -> None:
    client = _FakeClient([_server_error(RACE)] * REMOVE_ATTEMPTS)
    with pytest.raises(docker.errors.APIError, match="is not running"):
        _remove(cast(Any, client), "abc")
    assert len(client.api.calls) == REMOVE_ATTEMPTS


def test_any_other_daemon_error_is_raised_at_once() -> None:
    client = _FakeClient([_server_error("driver failed to remove root filesystem"), None])
    with pytest.raises(docker.errors.APIError, match="root filesystem"):
        _remove(cast(Any, client), "abc")
    assert len(client.api.calls) == 1


@pytest.mark.parametrize(
    "answer",
    [
        docker.errors.NotFound("404 Client Error", explanation="No such container: abc"),
        docker.errors.APIError(
            "409 Client Error",
            response=cast(Any, type("R", (), {"status_code": 409})()),
            explanation="removal of container abc is already in progress",
        ),
    ],
    ids=["gone", "in-progress"],
)
def test_a_container_gone_or_being_removed_is_fine(answer: Exception) -> None:
    assert len(_run([answer]).calls) == 1
