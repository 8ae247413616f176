"""Host functions the crash tests load into a service subprocess (``--functions``)."""

from __future__ import annotations

import os
import time


def charge(amount: int, idempotency_key: str) -> str:
    """Charge *amount* (a side effect: a line in the ledger file), then take a moment."""
    fd = os.open(os.environ["SUNROOM_TEST_LEDGER"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    try:
        os.write(fd, f"{idempotency_key} {amount}\n".encode())
        os.fsync(fd)
    finally:
        os.close(fd)
    time.sleep(0.1)  # a window in which the call has happened but not finished
    # a test that must find the run in progress holds it here: every charge of at least
    # SUNROOM_TEST_HOLD_FROM waits until the file SUNROOM_TEST_GATE exists
    hold_from = os.environ.get("SUNROOM_TEST_HOLD_FROM")
    if hold_from is not None and amount >= int(hold_from):
        while not os.path.exists(os.environ["SUNROOM_TEST_GATE"]):
            time.sleep(0.02)
    return f"charged {amount}"
