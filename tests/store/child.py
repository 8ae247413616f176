"""A separate process for the store's cross-process tests: ``python child.py COMMAND STORE ...``.

STORE is what ``open_store`` takes: a SQLite file's path or a PostgreSQL DSN. Commands (each
opens its own store on STORE, prints ``ready``, then):

- ``claim OWNER``: for each session id read from stdin, claim it (lease 60 s) and print
  ``1`` or ``0``; exits at end of input.
- ``append SESSION OWNER``: append batches of 3 events forever, printing the last seq after
  each append returned (the parent kills it with SIGKILL).
- ``call SESSION OWNER CALL_ID``: record the start of a side-effecting call, print
  ``started``, then hang as if the call were running (the parent kills it).
"""

from __future__ import annotations

import asyncio
import sys
import time

from sunroom.store import NewEvent, open_store


def say(line: object) -> None:
    sys.stdout.write(f"{line}\n")
    sys.stdout.flush()


async def main(command: str, spec: str, *args: str) -> None:
    async with open_store(spec) as store:
        say("ready")
        if command == "claim":
            (owner,) = args
            loop = asyncio.get_running_loop()
            while line := await loop.run_in_executor(None, sys.stdin.readline):
                won = await store.claim(line.strip(), owner=owner, lease_s=60)
                say(int(won))
        elif command == "append":
            session_id, owner = args
            seq = await store.last_seq(session_id)
            while True:
                events = [
                    NewEvent(seq=n, kind="text", payload={"n": n}, ts=time.time())
                    for n in range(seq + 1, seq + 4)
                ]
                seq = await store.append(session_id, events, owner=owner)
                say(seq)
        elif command == "call":
            session_id, owner, call_id = args
            await store.record_call_started(
                session_id,
                call_id,
                name="charge",
                args={"amount": 5},
                side_effect=True,
                owner=owner,
            )
            say("started")
            await asyncio.sleep(3600)
        else:
            raise SystemExit(f"unknown command {command!r}")


if __name__ == "__main__":
    asyncio.run(main(*sys.argv[1:]))
