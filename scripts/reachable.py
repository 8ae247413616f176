"""Exit 0 when other users can reach this interpreter, its prefix and the given paths.

When sunroom runs as root, every kernel runs as its own unprivileged uid and must read the
interpreter, its standard library, site-packages and the sunroom package. scripts/setup.sh runs
this with each candidate interpreter (stdlib only; it runs before sunroom is installed).
Usage: python scripts/reachable.py [PATH...]; prints the first obstacle on failure.
"""

import os
import stat
import sys


def obstacle(path: str) -> str | None:
    """The first ancestor of *path* (or *path* itself) that other users cannot pass."""
    real = os.path.realpath(path)
    parts = real.split("/")
    for i in range(1, len(parts)):
        parent = "/".join(parts[:i]) or "/"
        try:
            if not os.stat(parent).st_mode & stat.S_IXOTH:
                return f"{parent} is not searchable by other users"
        except OSError:
            continue
    try:
        if not os.stat(real).st_mode & stat.S_IROTH:
            return f"{real} is not readable by other users"
    except OSError as exc:
        return f"{real}: {exc.strerror}"
    return None


def main() -> int:
    """Check the interpreter, its base prefix and argv's paths."""
    for path in [sys.executable, sys.base_prefix, *sys.argv[1:]]:
        why = obstacle(path)
        if why is not None:
            print(why)
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
