"""The cell that leaves a daemon behind: a double-forked ``setsid`` sleeper, named by a marker."""

from __future__ import annotations


def daemon_cell(marker: str, then: str) -> str:
    """A cell that starts ``sleep 600`` as a daemon named *marker*, waits 0.3 s, then runs *then*.

    The daemon is forked twice with a new session between, so it is re-parented away from
    the cell's process: only a subreaper, a PID namespace or a cgroup can still end it.
    """
    return (
        "import os, time\n"
        "if os.fork() == 0:\n"
        "    os.setsid()\n"
        "    if os.fork() == 0:\n"
        f"        os.execv('/bin/sleep', [{marker!r}, '600'])\n"
        "    os._exit(0)\n"
        "time.sleep(0.3)\n"
        f"{then}"
    )
