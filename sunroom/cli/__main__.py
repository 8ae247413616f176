"""``python -m sunroom.cli``: the ``sunroom`` command."""

from sunroom.cli import main

main()
