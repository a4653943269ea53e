"""What ``--help`` shows: plain text (docstrings' reST markup taken out), paragraphs
wrapped to the terminal but indented blocks (the ``environment:`` list) kept as written,
and each option's default where it has one."""

from __future__ import annotations

import argparse
import re
import textwrap
from pathlib import Path

__all__ = ["HelpFormatter", "plain", "tidy"]

_ROLE = re.compile(r":[a-z]+:`~?([^`]+)`")  # :class:`~callwarden.x.Y` -> Y, :mod:`a.b` -> a.b
_LITERAL = re.compile(r"``([^`]+)``|`([^`]+)`")
_SHOWN_AS_IS = (str, int, float, Path)  # defaults worth showing (not None, False, [])


def plain(text: str) -> str:
    """``text`` without reST markup: roles as their target (``~`` keeping its last part),
    literals (and interpreted text) as their text."""
    def role(m: re.Match[str]) -> str:
        return m[1].rsplit(".", 1)[-1] if "`~" in m[0] else m[1]

    return _LITERAL.sub(lambda m: m[1] or m[2], _ROLE.sub(role, text))


class HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """Descriptions and epilogs: each paragraph wrapped (never inside a word: an option's
    name stays whole), a block with indented lines kept as written. Options: `` (default:
    X)`` added where there is a default to show and the help does not already say it."""

    def _fill_text(self, text: str, width: int, indent: str) -> str:
        blocks = []
        for block in re.split(r"\n\s*\n", text.strip("\n")):
            lines = block.splitlines()
            if any(line[:1].isspace() for line in lines[1:]):
                blocks.append("\n".join(indent + line for line in lines))
            else:
                blocks.append(textwrap.fill(" ".join(line.strip() for line in lines), width,
                                            initial_indent=indent, subsequent_indent=indent,
                                            break_on_hyphens=False))
        return "\n\n".join(blocks)

    def _split_lines(self, text: str, width: int) -> list[str]:
        """An option's help wrapped, never inside a word (``--read-token-env``)."""
        return textwrap.wrap(" ".join(text.split()), width, break_on_hyphens=False)

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help or ""
        default = action.default
        if ("default" in text or isinstance(default, bool) or default == ""
                or default is argparse.SUPPRESS or not isinstance(default, _SHOWN_AS_IS)):
            return text
        return f"{text} (default: %(default)s)"


def tidy(parser: argparse.ArgumentParser) -> None:
    """``parser`` shown by :class:`HelpFormatter`, its texts plain."""
    parser.formatter_class = HelpFormatter
    for name in ("description", "epilog"):
        value = getattr(parser, name)
        if value:
            setattr(parser, name, plain(value))
    for action in parser._actions:
        if action.help and action.help is not argparse.SUPPRESS:
            action.help = plain(action.help)
