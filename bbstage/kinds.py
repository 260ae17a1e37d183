"""One rule per kind of value of the config file (docs/configuration.md, "Kinds of values"):
a size, a path, a count, a number, a number of seconds, a choice, a list of strings, a
string. Each kind is a class (a subclass of the Python type it gives) whose ``of`` checks a
TOML value and gives it, or raises ``ValueError`` saying what was expected and what was
found, in the same words wherever the kind is used. A boolean is TOML's own (``bool``, no
class: ``bbstage.settings`` words its errors and reads the old ``"true"`` strings).

Plain Python, no msgspec: the client's few keys (``bbstage.clientconfig``) are read by
these rules on a node that has only the client's libraries; ``bbstage.settings`` applies
them to the typed tables.
"""

from __future__ import annotations

import json
import pathlib
from typing import Any, ClassVar

from bbstage.units import parse_size


class ConfigError(ValueError):
    """The configuration file is invalid; the message names the file, the table and the key."""


def shown(value: Any) -> str:
    """A TOML value as the file would write it (``"4"`` quoted, ``true``), for messages."""
    try:
        return json.dumps(value)
    except (TypeError, ValueError):
        return repr(value)


def expected(what: str, value: Any) -> ValueError:
    """The one form of a value's error: ``expected WHAT, got VALUE``."""
    return ValueError(f"expected {what}, got {shown(value)}")


def _number(value: Any) -> bool:
    """A TOML integer or float: not a boolean (Python's bool is an int), not a string."""
    return isinstance(value, int | float) and not isinstance(value, bool)


class Kind:
    """A kind of value: ``of`` checks a TOML value and gives it as an instance of the class."""

    what: ClassVar[str]  # the words after "expected"

    @classmethod
    def check(cls, value: Any) -> Any:
        """The value as the kind's Python type; ``ValueError`` (``expected``) if it is not one."""
        raise NotImplementedError

    @classmethod
    def of(cls, value: Any) -> Any:
        return cls(cls.check(value))  # type: ignore[call-arg]


class Text(str, Kind):
    what = "a string (quote it)"

    @classmethod
    def check(cls, value: Any) -> str:
        if not isinstance(value, str):
            raise expected(cls.what, value)
        return value


class FilePath(type(pathlib.Path()), Kind):  # type: ignore[misc]
    """A path: a string (``Path``'s subclass, equal to the ``Path`` of the same text)."""

    what = 'a path (a quoted string, e.g. "/var/lib/bbstage")'

    @classmethod
    def check(cls, value: Any) -> str:
        if not isinstance(value, str):
            raise expected(cls.what, value)
        return value


class Count(int, Kind):
    what = "a whole number (write it unquoted, e.g. 4)"

    @classmethod
    def check(cls, value: Any) -> int:
        if not isinstance(value, int) or isinstance(value, bool):
            raise expected(cls.what, value)
        if value < 0:
            raise expected("a whole number, 0 or more", value)
        return value


class Number(float, Kind):
    what = "a number (write it unquoted, e.g. 7.5)"

    @classmethod
    def check(cls, value: Any) -> float:
        if not _number(value):
            raise expected(cls.what, value)
        if value < 0:
            raise expected("a number, 0 or more", value)
        return float(value)


class Positive(float, Kind):
    what = "a number above 0 (write it unquoted, e.g. 2)"

    @classmethod
    def check(cls, value: Any) -> float:
        if not _number(value) or value <= 0:
            raise expected(cls.what, value)
        return float(value)


class Seconds(Positive):
    what = "a number of seconds above 0 (write it unquoted, e.g. 30)"


class Size(int, Kind):
    what = 'a size (e.g. "512M", "10G", or a number of bytes)'

    @classmethod
    def check(cls, value: Any) -> int:
        if not isinstance(value, str | int) or isinstance(value, bool):
            raise expected(cls.what, value)
        try:
            size = parse_size(value)
        except ValueError:
            raise expected(cls.what, value) from None
        if size < 0:
            raise expected(cls.what, value)
        return size


class Strings(tuple, Kind):  # type: ignore[type-arg]
    what = 'a list of strings (e.g. ["a", "b"])'

    @classmethod
    def check(cls, value: Any) -> tuple[str, ...]:
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise expected(cls.what, value)
        return tuple(value)


class Choice(str, Kind):
    """One of ``options`` (a subclass per set of options: ``choice``)."""

    options: ClassVar[tuple[str, ...]] = ()

    @classmethod
    def check(cls, value: Any) -> str:
        if value not in cls.options or not isinstance(value, str):
            raise expected(cls.what, value)
        return value

    def __reduce__(self) -> tuple[Any, ...]:
        return (str, (str(self),))  # a plain string: the class is made by ``choice``


def choice(*options: str) -> type[Choice]:
    """The kind "one of ``options``"."""
    words = " or ".join([", ".join(options[:-1]), options[-1]] if len(options) > 1 else options)
    return type("Choice", (Choice,), {"options": options, "what": words})


class Address(str, Kind):
    """``host:port`` of a listening socket, or ``""`` for off."""

    what = 'host:port (e.g. "0.0.0.0:9755"), or "" for off'

    @classmethod
    def check(cls, value: Any) -> str:
        if not isinstance(value, str):
            raise expected(cls.what, value)
        host, _, port = value.rpartition(":")
        if value and not (host and port.isdigit() and 0 < int(port) < 65536):
            raise expected(cls.what, value)
        return value


def flag(value: Any) -> bool:
    """A boolean: TOML's ``true`` or ``false``."""
    if not isinstance(value, bool):
        raise expected(FLAG, value)
    return value


FLAG = "true or false (unquoted)"
