"""How the ``sunroom`` commands print ``--help``: the text as written, labels that read well.

typer renders help with rich, whose markup takes a bracketed word for a style tag and drops
it: ``[y]es / [n]o / [a]lways`` printed as ``es / o / lways``, ``[default: bwrap]`` vanished.
Every help text of a :class:`Command` or :class:`Group` is escaped, so what is written is what
is shown. typer labels an option by its Python type (``<str>``, ``<list[str]>``, ``<bool>``);
here an option is labelled by its ``metavar`` when it sets one (``NAME=FILE``), else by a
word for its type (TEXT, INTEGER, NUMBER, PATH), a flag has no label, and an argument is its
name in capitals (``TASK``), with no type beside it. Pass
``cls=Command`` to each ``app.command()`` and ``cls=Group`` to each ``typer.Typer()``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from rich.markup import escape
from typer.core import TyperArgument, TyperCommand, TyperGroup, TyperOption

if TYPE_CHECKING:
    from typer._click.core import Context  # the overridden methods' own (typer vendors click)

__all__ = ["Command", "Group"]

_LABELS = {"str": "TEXT", "int": "INTEGER", "float": "NUMBER", "Path": "PATH"}


def _label(option: TyperOption) -> str:
    """The metavar of *option* when it sets none: a word for its type ('' for a flag)."""
    if option.is_flag:
        return ""
    bare = option.bare_type()
    if bare.startswith("list[") and bare.endswith("]"):  # repeatable: its help says so
        bare = bare[5:-1]
    return _LABELS.get(bare, bare.upper())


class _Argument(TyperArgument):
    """An argument shown by its name alone: no type label beside it."""

    def display_type_rich(self, ctx: Context) -> str | None:
        return None


def reflow(text: str) -> str:
    """*text* with each paragraph on one line, for the terminal to wrap at its own width.

    Docstrings are wrapped at 100 columns in the source; printed as they are, each source
    line break lands mid-sentence in an 80-column terminal. A paragraph whose lines are indented
    or are list items (``- ``) keeps its line breaks.
    """
    paragraphs = []
    for paragraph in text.strip().split("\n\n"):
        lines = paragraph.splitlines()
        if any(line.startswith((" ", "\t", "- ", "* ")) for line in lines):
            paragraphs.append(paragraph)
        else:
            paragraphs.append(" ".join(line.strip() for line in lines))
    return "\n\n".join(paragraphs)


def _readable(command: TyperCommand | TyperGroup) -> None:
    """Reflow and escape *command*'s help texts and give its options readable labels."""
    if command.help:
        command.help = escape(reflow(command.help))
    if command.short_help:
        command.short_help = escape(command.short_help)
    for param in command.params:
        if isinstance(param, TyperOption | TyperArgument) and param.help:
            param.help = escape(param.help)
        if isinstance(param, TyperOption) and param.metavar is None:
            param.metavar = _label(param)
        elif isinstance(param, TyperArgument) and type(param) is TyperArgument:
            param.__class__ = _Argument  # typer builds the parameters; only the label differs
            if param.metavar is None and param.name:
                param.metavar = param.name.upper()


def _unlabelled(option: TyperOption | None) -> TyperOption | None:
    if option is not None:
        option.metavar = ""
    return option


class Command(TyperCommand):
    """A typer command whose help shows its text as written (see the module docstring)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        _readable(self)

    def get_help_option(self, ctx: Context) -> TyperOption | None:
        """The ``-h``/``--help`` flag, unlabelled."""
        return _unlabelled(super().get_help_option(ctx))


class Group(TyperGroup):
    """A typer group whose help shows its text as written (see the module docstring)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        _readable(self)

    def get_help_option(self, ctx: Context) -> TyperOption | None:
        """The ``-h``/``--help`` flag, unlabelled."""
        return _unlabelled(super().get_help_option(ctx))
