"""A script of several SQL statements split into its statements (pure): a migration on
Citus, and a named script there (``write.execute_script``), are sent one statement at a
time, as Citus propagates some DDL with the text of the whole query string."""

from __future__ import annotations

import re

__all__ = ["statements"]

# What a ';' inside of does not end a statement: comments, strings (E'' with backslash
# escapes; '' and "" are read as two adjacent strings, which splits the same), quoted
# identifiers and dollar-quoted bodies. Block comments are taken as not nested.
_LEXEME = re.compile(
    r"--[^\n]*|/\*.*?\*/|(?<![\w$])[Ee]'(?:[^'\\]|\\.)*'|'[^']*'|\"[^\"]*\""
    r"|(?<![\w$])\$(?P<tag>(?:[A-Za-z_]\w*)?)\$.*?\$(?P=tag)\$|;",
    re.DOTALL)
_COMMENT = re.compile(r"--[^\n]*|/\*.*?\*/", re.DOTALL)


def statements(sql: str) -> list[str]:
    """``sql`` split at each ``;`` that ends a statement; pieces that hold only comments
    and blanks are left out."""
    pieces, start = [], 0
    for m in _LEXEME.finditer(sql):
        if m[0] == ";":
            pieces.append(sql[start:m.start()])
            start = m.end()
    pieces.append(sql[start:])
    return [p.strip() for p in pieces if _COMMENT.sub("", p).strip()]
