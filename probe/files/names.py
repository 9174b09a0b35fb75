"""Names from the file system, as text that can be shown, written and pasted back.

On Linux a file name is bytes; Python hands a name that is not UTF-8 over as text with each
undecodable byte as a lone surrogate (``\\udcff`` for the byte 0xff: PEP 383's
``surrogateescape``), which no UTF-8 page, netCDF attribute or terminal can hold.  Here
such a name becomes:

* :func:`readable`: text with each such byte as ``\\xff`` (what a page and a result show);
* :func:`as_bytes`: its bytes again (a link's percent-encoding, ``%FF``);
* :func:`quoted`: bash's ``$'...'`` quoting, which pastes back as the same bytes.
"""

from __future__ import annotations

import shlex


def as_bytes(text: str) -> bytes:
    """The bytes a file-system name stands for (lone surrogates outside the escaped bytes
    as UTF-8's backslash escapes)."""
    try:
        return text.encode("utf-8", "surrogateescape")
    except UnicodeEncodeError:
        return text.encode("utf-8", "backslashreplace")


def readable(text: str) -> str:
    """``text`` as valid UTF-8 text: unchanged where it is, each undecodable byte as
    ``\\xNN`` where it is not."""
    try:
        text.encode("utf-8")
        return text
    except UnicodeEncodeError:
        return as_bytes(text).decode("utf-8", "backslashreplace")


#: bash's escapes inside ``$'...'``.
_ESCAPES = {"\\": "\\\\", "'": "\\'", "\t": "\\t", "\n": "\\n", "\r": "\\r"}


def quoted(text: str) -> str:
    """``text`` in bash's ``$'...'`` quoting: printable characters as they are, control
    characters and undecodable bytes as ``\\xNN``, other unprintable ones as ``\\uNNNN``."""
    parts = []
    for char in text:
        code = ord(char)
        if char in _ESCAPES:
            parts.append(_ESCAPES[char])
        elif 0xDC80 <= code <= 0xDCFF:  # an undecodable byte (surrogateescape)
            parts.append(f"\\x{code - 0xDC00:02x}")
        elif char.isprintable() and not 0xD800 <= code <= 0xDFFF:
            parts.append(char)
        elif code < 0x80:  # above it, \x would be a raw byte to bash, not UTF-8
            parts.append(f"\\x{code:02x}")
        else:
            parts.append(f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}")
    return "$'" + "".join(parts) + "'"


def shell_word(text: str) -> str:
    """One argument of a command line a user can paste: shell-quoted where printable,
    ``$'...'`` where not."""
    text = str(text)
    return shlex.quote(text) if text.isprintable() and readable(text) == text else quoted(text)


def command(words) -> str:
    """A command line from its arguments (:func:`shell_word` each)."""
    return " ".join(shell_word(word) for word in words)
