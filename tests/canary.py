"""Kernel code that scans a sandbox for a canary: environment, /proc, files, its own memory.

Shared by the tests that give a secret to something on the host (an MCP server's env, a
header the egress proxy injects) and check that it never reaches the kernel.
"""

from __future__ import annotations


def scan_code(pattern: str) -> str:
    """A cell whose value is ``(hits, scanned_memory)``: where *pattern* (a bytes regex) was.

    It looks in the environment, every ``/proc/*/environ`` and ``cmdline``, files under
    ``/tmp``, the workdir, ``/forks`` and ``/run``, and every readable mapping of the kernel's
    own memory; ``scanned_memory`` is True when more than 1 MB of memory was read (the scan
    really looked).
    """
    return (
        "import os, re, glob\n"
        f"pat = re.compile({pattern.encode()!r})\n"
        "hits = []\n"
        "hits += [k for k, v in os.environ.items() if pat.search(v.encode())]\n"
        "for path in glob.glob('/proc/*/environ') + glob.glob('/proc/*/cmdline'):\n"
        "    try:\n        data = open(path, 'rb').read()\n    except OSError:\n        continue\n"
        "    if pat.search(data):\n        hits.append(path)\n"
        "for root in ('/tmp', os.getcwd(), '/forks', '/run'):\n"
        "    for dirpath, _, files in os.walk(root):\n"
        "        for f in files:\n"
        "            try:\n                data = open(os.path.join(dirpath, f), 'rb').read(1 << 20)\n"
        "            except OSError:\n                continue\n"
        "            if pat.search(data):\n                hits.append(f)\n"
        "mem = 0\n"
        "with open('/proc/self/maps') as maps, open('/proc/self/mem', 'rb', 0) as m:\n"
        "    for line in maps:\n"
        "        addr, perms = line.split()[:2]\n"
        "        if 'r' not in perms:\n            continue\n"
        "        lo, hi = (int(x, 16) for x in addr.split('-'))\n"
        "        try:\n            m.seek(lo); chunk = m.read(hi - lo)\n"
        "        except (OSError, OverflowError, ValueError):\n            continue\n"
        "        mem += len(chunk)\n"
        "        if pat.search(chunk):\n            hits.append(line.strip())\n"
        "(hits, mem > 1_000_000)"
    )
