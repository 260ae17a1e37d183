"""Settings parsed once, typed: the base of every config table's type and the one way to read
a table into it.

Each table of the config file is a frozen ``Settings`` struct (msgspec): ``[daemon]``,
``[movers]``, ``[fairshare]``, ``[[pools]]``, ``[backends]`` in ``bbstage.config``, and
each backend's own (``[s3]``, ``[gs]``, ``[az]``, ``[https]``, ``[sftp]``) in the backend's
module. Its fields are typed by the kinds of ``bbstage.kinds`` (a size, a path, a count...),
TOML's ``bool`` and other structs; ``convert`` reads a table with msgspec's strict
conversion, each kind by its one rule (``dec_hook``), and words any error as
``FILE: [TABLE] KEY: expected ..., got ...``. The result travels as it is: in the daemon's
``Config``, and in a transfer's spec to the worker (structs pickle), which reads no table.
"""

from __future__ import annotations

import re
from typing import Any, ClassVar, TypeVar

import msgspec

from bbstage.kinds import FLAG, ConfigError, Kind, shown

S = TypeVar("S", bound="Settings")


class Settings(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """One table of the config file (a subclass per table). ``legacy_flags``: boolean keys
    whose old string forms (``"true"``, ``"false"``) are still read, with a deprecation
    warning the daemon logs at start."""

    legacy_flags: ClassVar[frozenset[str]] = frozenset()


def dec_hook(kind: type, value: Any) -> Any:
    """msgspec's hook for the types it does not know: each kind by its rule."""
    if isinstance(kind, type) and issubclass(kind, Kind):
        return kind.of(value)
    raise NotImplementedError(f"no rule for {kind!r}")


def keys(cls: type[Settings]) -> tuple[str, ...]:
    """The keys of a table's type, as the file writes them."""
    return tuple(f.encode_name for f in msgspec.structs.fields(cls))


def convert(data: Any, cls: type[S], where: str, deprecated: list[str] | None = None) -> S:
    """The table ``data`` (as tomllib reads it) as ``cls``; ``ConfigError`` naming ``where``
    (``"bbstage.toml: [daemon]"``), the key and what was expected. Old string forms of the
    ``legacy_flags`` are read, each told in ``deprecated``."""
    if isinstance(data, Settings):
        return data  # type: ignore[return-value]
    if not isinstance(data, dict):
        raise ConfigError(f"{where}: expected a table, got {shown(data)}")
    known = keys(cls)
    for key in data:
        if key not in known:
            raise ConfigError(f"{where} unknown key {key!r} (known: {', '.join(sorted(known))})")
    data = dict(data)
    for key in cls.legacy_flags & set(data):
        value = data[key]
        if isinstance(value, str) and value in ("true", "false"):
            data[key] = value == "true"
            if deprecated is not None:
                deprecated.append(
                    f'{where} {key} = "{value}" is deprecated: write {key} = {value} (unquoted)'
                )
    try:
        return msgspec.convert(data, cls, strict=True, dec_hook=dec_hook)
    except msgspec.ValidationError as exc:
        raise ConfigError(explain(str(exc), data, where)) from None


_AT = re.compile(r"^(?P<message>.*?)(?: - at `\$(?P<path>[^`]*)`)?$", re.DOTALL)
_NATIVE = re.compile(r"^Expected `(?P<type>\w+)`(?P<rest>.*?), got `\w+`$")
_WORDS = {
    "bool": FLAG,
    "object": "a table",
    "array": "a list",
    "str": "a string (quote it)",
    "int": "a whole number (write it unquoted, e.g. 4)",
    "float": "a number (write it unquoted, e.g. 7.5)",
}


def explain(error: str, data: dict[str, Any], where: str) -> str:
    """msgspec's ``error`` (``"... - at `$.key`"``) in the config's words."""
    m = _AT.match(error)
    assert m is not None
    message, path = m["message"], (m["path"] or "").lstrip(".")
    key = path.replace("[...]", ".*")
    value = data.get(path, msgspec.UNSET) if path in data else msgspec.UNSET
    native = _NATIVE.match(message)
    if native and native["type"] in _WORDS:
        got = shown(value) if value is not msgspec.UNSET else message.rpartition(", got ")[2]
        message = f"expected {_WORDS[native['type']]}{native['rest']}, got {got}"
    unknown = re.match(r"Object contains unknown field `(.*)`$", message)
    if unknown:
        return f"{where} {key}: unknown key {unknown[1]!r}"
    missing = re.match(r"Object missing required field `(.*)`$", message)
    if missing:
        return f"{where} {key + ': ' if key else ''}missing key {missing[1]!r}"
    return f"{where} {key}: {message}" if key else f"{where} {message}"
