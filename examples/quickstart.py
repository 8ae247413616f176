"""Quickstart: a kernel with a typed host function, state across cells, timeout recovery.

Runs on the default ``bwrap`` backend (an isolated sandbox); ``--backend subprocess`` needs
nothing but Python, ``--backend docker`` needs ``scripts/docker-setup.sh``.
"""

from __future__ import annotations

import argparse

import pydantic

import sunroom


class Quote(pydantic.BaseModel):
    """A price quote."""

    ticker: str
    price: float
    currency: str = "USD"


PRICES = {"AAPL": 231.5, "MSFT": 421.25}


def lookup(ticker: str, *, currency: str = "USD") -> Quote:
    """Look up the latest price of a ticker."""
    if ticker not in PRICES:
        raise KeyError(f"unknown ticker {ticker}")
    return Quote(ticker=ticker, price=PRICES[ticker], currency=currency)


def show(title: str, r: sunroom.ExecutionResult) -> None:
    print(
        f"--- {title}: status={r.status} state_lost={r.state_lost} ({r.duration_s * 1000:.1f} ms)"
    )
    if r.stdout:
        print(r.stdout, end="")
    if r.value is not None:
        print("value:", r.value)
    if r.error is not None:
        print(f"error: {r.error.type}: {r.error.message}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--backend", default="bwrap", choices=["bwrap", "docker", "subprocess"])
    args = parser.parse_args()
    print(f"backend: {args.backend}")
    with sunroom.Kernel(
        backend=args.backend,
        functions=[lookup],
        inputs={"tickers": ["AAPL", "MSFT"]},
        limits=sunroom.Limits(timeout_s=2, memory_mb=512),
    ) as k:
        show("typed host call", k.execute("quotes = [lookup(t) for t in tickers]\nquotes[0]"))
        show(
            "state kept",
            k.execute("total = sum(q.price for q in quotes)\nprint(f'{total=}')\ntotal"),
        )
        show("error as data", k.execute("lookup('NOPE')"))
        show("validation", k.execute("lookup(42)"))
        show("busy loop hits the timeout", k.execute("while True:\n    pass"))
        show("state survives an interrupt", k.execute("total"))
        show(
            "a loop that ignores SIGINT is killed",
            k.execute(
                "import signal\nsignal.signal(signal.SIGINT, signal.SIG_IGN)\nwhile True:\n    pass"
            ),
        )
        show("fresh kernel, inputs rebound", k.execute("tickers, 'total' in globals()"))
        show(
            f"a network connection from the {args.backend} kernel",
            k.execute("import socket\nsocket.create_connection(('127.0.0.1', 22), timeout=1)"),
        )
    print("closed: every kernel process is gone")


if __name__ == "__main__":
    main()
