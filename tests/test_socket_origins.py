"""tests/sockets.py names the test and the line that made a socket collected unclosed."""

from __future__ import annotations

import gc
import socket
import warnings

import pytest


def _leak() -> None:
    socket.socket(socket.AF_INET, socket.SOCK_STREAM)  # never closed: collected at once


def test_a_socket_collected_unclosed_is_reported_with_its_test_and_line(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ResourceWarning)
        _leak()
        gc.collect()
    err = capsys.readouterr().err
    assert "collected unclosed" in err
    assert "test_a_socket_collected_unclosed_is_reported_with_its_test_and_line" in err
    assert f"{__file__}:{_leak.__code__.co_firstlineno + 1} in _leak" in err


def test_a_closed_or_detached_socket_is_not_reported(capsys: pytest.CaptureFixture[str]) -> None:
    socket.socket().close()
    with socket.socket() as s:
        s.settimeout(1)
    socket.socket(fileno=socket.socket().detach()).close()
    gc.collect()
    assert "collected unclosed" not in capsys.readouterr().err
