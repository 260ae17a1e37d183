"""Parser for the ``#BB_LUA`` staging directives of a batch script.

The grammar is specified in ``docs/directives.md``.  ``lua/bbstage/directives.lua`` implements
the same grammar for slurmctld; ``tests/corpus/*.json`` keeps the two in step, so any change
here must be made there too (same checks, same order, same messages).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

MAX_SCRIPT_BYTES = 4 * 1024 * 1024  # Slurm's default max_script_size
MAX_LINE_BYTES = 4096
MAX_DIRECTIVES = 256
MAX_ERRORS = 20
MAX_CAPACITY = 2**53  # exclusive: exact in a Lua 5.1 number

VERBS = ("stage_in", "stage_out")
STAGE_KEYS = ("source", "destination", "checksum", "overwrite", "profile")
OPTION_VALUES = {
    "checksum": ("none", "xxh3", "blake2b"),
    "overwrite": ("always", "never", "newer"),
}
OPTION_HINTS = {"checksum": "none, xxh3 or blake2b", "overwrite": "always, never or newer"}
UNITS = {"": 1, "K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40, "P": 2**50}

_CTRL = re.compile(r"[\x00-\x08\x0a-\x1f\x7f]")
_SBATCH_BB = re.compile(r"#SBATCH[ \t]+--bb")
_NAME = re.compile(r"[A-Za-z0-9_.-]{1,64}")
_BUCKET = re.compile(r"[a-z0-9][a-z0-9.-]*[a-z0-9]")
_SCHEME = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://")
_SIZE = re.compile(r"([0-9]+)([KMGTPkmgtp]?)")
_GLOB = re.compile(r"[*?\[]")
_WS = " \t"
_LOC_HINT = "use an absolute path, $BB_SCRATCH/..., or s3://bucket/key"
_NAME_HINT = "use 1-64 characters A-Z a-z 0-9 _ . -"


@dataclass
class Directive:
    """One ``stage_in``/``stage_out`` directive; ``to_dict()`` gives the corpus shape."""

    index: int
    line: int
    verb: str
    source: str
    destination: str
    source_kind: str
    destination_kind: str
    tree: bool
    glob: bool
    options: dict[str, str] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {
            "index": self.index,
            "line": self.line,
            "verb": self.verb,
            "source": self.source,
            "destination": self.destination,
            "source_kind": self.source_kind,
            "destination_kind": self.destination_kind,
            "tree": self.tree,
            "glob": self.glob,
            "options": dict(self.options),
        }


class _LineError(Exception):
    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


def _nbytes(s: str) -> int:
    return len(s.encode("utf-8", "surrogatepass")) if not s.isascii() else len(s)


def _strip(s: str) -> str:
    return s.strip(_WS)


def _header(text: str) -> list[tuple[int, str, bool]]:
    """Directive lines of the header as (line number, raw line, is_sbatch)."""
    out: list[tuple[int, str, bool]] = []
    pos, n, end = 0, 0, len(text)
    while pos < end:
        n += 1
        e = text.find("\n", pos)
        if e < 0:
            e = end
        if text[pos] != "#":
            if e != pos:
                break
        elif text.startswith("#BB_LUA", pos):
            if e == pos + 7 or text[pos + 7] in _WS:
                out.append((n, text[pos:e], False))
        elif text.startswith("#SBATCH", pos):
            line = text[pos:e]
            m = _SBATCH_BB.match(line)
            if m and (m.end() == len(line) or line[m.end()] in "= \t"):
                out.append((n, line, True))
        pos = e + 1
    return out


def _sbatch_spec(line: str) -> str:
    """The value of ``#SBATCH --bb``: rest of line, trimmed, outer double quotes removed."""
    m = _SBATCH_BB.match(line)
    assert m is not None
    rest = line[m.end() :]
    if rest.startswith("="):
        rest = rest[1:]
    spec = _strip(rest)
    if len(spec) >= 2 and spec[0] == '"' and spec[-1] == '"':
        spec = spec[1:-1]
    return spec


def _bb_content(spec: str) -> str | None:
    """Content after a leading ``#BB_LUA`` word, or None if ``spec`` has none."""
    if spec.startswith("#BB_LUA") and (len(spec) == 7 or spec[7] in _WS):
        return _strip(spec[7:])
    return None


def _tokenize(s: str, ctx: str) -> list[tuple[str | None, str, bool]]:
    """Split directive content into (key, value, quoted); key None for a bare word."""
    toks: list[tuple[str | None, str, bool]] = []
    p, n = 0, len(s)
    while True:
        while p < n and s[p] in _WS:
            p += 1
        if p >= n:
            return toks
        q = p
        while q < n and s[q] not in " \t=":
            q += 1
        if q >= n or s[q] != "=":
            toks.append((None, s[p:q], False))
            p = q
            continue
        key = s[p:q]
        if key == "":
            raise _LineError("bad-token", f'{ctx}"=" without a key: write key=value')
        p = q + 1
        if p < n and s[p] == '"':
            buf: list[str] = []
            q = p + 1
            while True:
                i = q
                while i < n and s[i] not in '"\\':
                    i += 1
                if i >= n or (s[i] == "\\" and i + 1 >= n):
                    raise _LineError(
                        "unterminated-quote",
                        f'{ctx}unterminated quote in value of "{key}": add the closing "',
                    )
                buf.append(s[q:i])
                if s[i] == '"':
                    p = i + 1
                    break
                c = s[i + 1]
                if c not in '"\\':
                    raise _LineError(
                        "bad-escape",
                        f'{ctx}bad escape in quoted value of "{key}": '
                        'only \\" and \\\\ are allowed inside quotes',
                    )
                buf.append(c)
                q = i + 2
            if p < n and s[p] not in _WS:
                raise _LineError(
                    "bad-quote",
                    f'{ctx}text after the closing quote in value of "{key}": '
                    'put a space after the closing "',
                )
            toks.append((key, "".join(buf), True))
        else:
            q = p
            while q < n and s[q] not in _WS:
                q += 1
            value = s[p:q]
            if '"' in value:
                raise _LineError(
                    "bad-quote",
                    f'{ctx}stray quote in value of "{key}": quote the whole value, '
                    f'e.g. {key}="/a b/c"',
                )
            toks.append((key, value, False))
            p = q


def _location(v: str, role: str, verb: str, ctx: str) -> tuple[str, bool, bool]:
    """Validate one location; return (kind, tree, glob)."""
    if v.startswith("$"):
        if v != "$BB_SCRATCH" and not v.startswith("$BB_SCRATCH/"):
            raise _LineError("unknown-variable", _var_msg(ctx, role, v))
        kind, path = "scratch", v[11:]
    elif v.startswith("/"):
        kind, path = "posix", v
    elif _SCHEME.match(v):
        if not v.startswith("s3://"):
            raise _LineError("bad-scheme", f'{ctx}unsupported scheme in {role} "{v}": {_LOC_HINT}')
        rest = v[5:]
        slash = rest.find("/")
        if slash < 0:
            raise _LineError(
                "bad-bucket",
                f'{ctx}{role} "{v}" has no key part: '
                "write s3://bucket/ for a whole bucket or s3://bucket/key",
            )
        bucket = rest[:slash]
        if not (3 <= len(bucket) <= 63 and _BUCKET.fullmatch(bucket)):
            raise _LineError(
                "bad-bucket",
                f'{ctx}bad S3 bucket in {role} "{v}": bucket names have 3-63 characters '
                "a-z 0-9 . - and start and end with a letter or digit",
            )
        kind, path = "s3", rest[slash:]
    else:
        raise _LineError("relative-path", f'{ctx}relative path "{v}" in {role}: {_LOC_HINT}')
    if "/../" in path + "/":
        raise _LineError(
            "dot-dot", f'{ctx}".." component in {role} "{v}": write the path without ..'
        )
    if "$" in path:
        raise _LineError("unknown-variable", _var_msg(ctx, role, v))
    tree = v.endswith("/") or v == "$BB_SCRATCH"
    glob = _GLOB.search(path) is not None
    if glob:
        if role == "destination" or verb == "stage_out":
            raise _LineError(
                "bad-glob",
                f'{ctx}wildcard in {role} "{v}": wildcards are only allowed in a stage_in source',
            )
        if tree:
            raise _LineError(
                "bad-glob", f'{ctx}wildcard source "{v}" ends with /: drop the / or the wildcard'
            )
        if kind == "posix" and _GLOB.search(path.split("/", 2)[1]):
            raise _LineError(
                "bad-glob",
                f'{ctx}wildcard in the first directory of source "{v}": '
                "start with a literal directory, e.g. /data/...",
            )
        if _unclosed_bracket(path):
            raise _LineError("bad-glob", f'{ctx}unclosed [ in source "{v}": close it with ]')
    return kind, tree, glob


def _unclosed_bracket(path: str) -> bool:
    """True if some ``[`` has no ``]`` before the next ``/`` (linear scan, as in Lua)."""
    i = path.find("[")
    while i >= 0:
        j = path.find("]", i + 1)
        k = path.find("/", i + 1)
        if j < 0 or (0 <= k < j):
            return True
        i = path.find("[", j + 1)
    return False


def _var_msg(ctx: str, role: str, v: str) -> str:
    return (
        f'{ctx}"{v}" in {role}: only a leading $BB_SCRATCH is expanded '
        "(use %u for the user name, %j for the job id)"
    )


class _State:
    def __init__(self) -> None:
        self.directives: list[Directive] = []
        self.pool: str | None = None
        self.capacity: int | None = None
        self.pool_line = 0
        self.dests: dict[str, int] = {}


def _stage(st: _State, n: int, verb: str, toks: list[tuple[str | None, str, bool]]) -> None:
    ctx = f"line {n}: {verb}: "
    kv: dict[str, str] = {}
    for key, value, _quoted in toks[1:]:
        if key is None:
            raise _LineError("bad-token", f'{ctx}"{value}" is not key=value: write key=value')
        if key not in STAGE_KEYS:
            if key in ("pool", "capacity"):
                msg = f"{ctx}pool= and capacity= go on a #BB_LUA line of their own"
            else:
                msg = (
                    f'{ctx}unknown key "{key}": '
                    "use source, destination, checksum, overwrite or profile"
                )
            raise _LineError("unknown-key", msg)
        if key in kv:
            raise _LineError("duplicate-key", f'{ctx}"{key}" given twice: keep one')
        if value == "":
            raise _LineError("empty-value", f'{ctx}empty value for "{key}": give a value')
        kv[key] = value
    for role in ("source", "destination"):
        if role not in kv:
            raise _LineError("missing-value", f"{ctx}missing {role}=: add {role}=<location>")
    src, dst = kv["source"], kv["destination"]
    skind, stree, sglob = _location(src, "source", verb, ctx)
    dkind, dtree, _ = _location(dst, "destination", verb, ctx)
    if sglob:
        if not dtree:
            raise _LineError(
                "bad-glob",
                f'{ctx}destination "{dst}" of a wildcard source must be a directory '
                "ending in /: add the /",
            )
    elif stree != dtree:
        raise _LineError(
            "tree-mismatch",
            f'{ctx}source "{src}" and destination "{dst}" must both be directories '
            "(ending in /) or both files",
        )
    options = {"checksum": "none", "overwrite": "always"}
    for opt in ("checksum", "overwrite"):
        if opt in kv:
            if kv[opt] not in OPTION_VALUES[opt]:
                raise _LineError(
                    "bad-option-value",
                    f'{ctx}{opt}="{kv[opt]}" is not allowed: use {OPTION_HINTS[opt]}',
                )
            options[opt] = kv[opt]
    if "profile" in kv:
        if not _NAME.fullmatch(kv["profile"]):
            raise _LineError(
                "bad-option-value",
                f'{ctx}profile="{kv["profile"]}" is not a valid profile name: {_NAME_HINT}',
            )
        if skind != "s3" and dkind != "s3":
            raise _LineError(
                "profile-without-s3", f"{ctx}profile= applies only to s3:// locations: remove it"
            )
        options["profile"] = kv["profile"]
    for _k, value, _q in toks[1:]:
        if "capacity=" in value:
            raise _LineError(
                "capacity-in-value",
                f'{ctx}"capacity=" inside a value would be read by Slurm as a capacity '
                "request: rename the path",
            )
    norm = dst.rstrip("/")
    if norm in st.dests:
        raise _LineError(
            "duplicate-destination",
            f'{ctx}destination "{dst}" is also written by line {st.dests[norm]}: '
            "give each directive its own destination",
        )
    st.dests[norm] = n
    st.directives.append(
        Directive(len(st.directives), n, verb, src, dst, skind, dkind, stree, sglob, options)
    )


def _pool_line(st: _State, n: int, toks: list[tuple[str | None, str, bool]]) -> None:
    ctx = f"line {n}: "
    kv: dict[str, str] = {}
    for key, value, quoted in toks:
        if key is None:
            raise _LineError("bad-token", f'{ctx}"{value}" is not key=value: write key=value')
        if key not in ("pool", "capacity"):
            raise _LineError(
                "unknown-key",
                f'{ctx}unknown key "{key}" on a line without a verb: start the line with '
                "stage_in or stage_out, or use only pool= and capacity=",
            )
        if key in kv:
            raise _LineError("duplicate-key", f'{ctx}"{key}" given twice: keep one')
        if quoted:
            raise _LineError(
                "bad-quote",
                f'{ctx}value of "{key}" must not be quoted '
                "(Slurm reads pool= and capacity= verbatim)",
            )
        if value == "":
            raise _LineError("empty-value", f'{ctx}empty value for "{key}": give a value')
        kv[key] = value
    if "capacity" in kv and "pool" not in kv:
        raise _LineError(
            "capacity-without-pool", f"{ctx}capacity= needs pool=: write pool=NAME capacity=SIZE"
        )
    pool = kv["pool"]
    if not _NAME.fullmatch(pool):
        raise _LineError(
            "bad-option-value", f'{ctx}pool="{pool}" is not a valid pool name: {_NAME_HINT}'
        )
    size = None
    if "capacity" in kv:
        m = _SIZE.fullmatch(kv["capacity"])
        if m:
            digits = m.group(1).lstrip("0")
            size = int(digits or "0") * UNITS[m.group(2).upper()] if len(digits) <= 17 else None
        if size is None or size <= 0 or size >= MAX_CAPACITY:
            raise _LineError(
                "bad-size",
                f'{ctx}bad capacity "{kv["capacity"]}": use a whole number of bytes with an '
                "optional K, M, G, T or P suffix (binary units), above 0 and below 8P",
            )
    if st.pool_line:
        raise _LineError(
            "duplicate-pool",
            f"{ctx}pool=/capacity= already given on line {st.pool_line}: use one line",
        )
    st.pool_line, st.pool, st.capacity = n, pool, size


def _line(st: _State, n: int, raw: str, sbatch: bool) -> None:
    ctx = f"line {n}: "
    size = _nbytes(raw)
    if size > MAX_LINE_BYTES:
        raise _LineError(
            "line-too-long",
            f"{ctx}directive line is {size} bytes, over the {MAX_LINE_BYTES} byte limit: "
            "shorten the paths or stage a directory",
        )
    if raw.endswith("\r"):
        raise _LineError(
            "crlf",
            f"{ctx}line ends with a carriage return (DOS line ending): "
            "convert the script with dos2unix",
        )
    m = _CTRL.search(raw)
    if m:
        raise _LineError(
            "control-char", f"{ctx}control character 0x{ord(m.group()):02x} in directive: remove it"
        )
    if sbatch:
        spec = _sbatch_spec(raw)
        if spec == "":
            raise _LineError(
                "missing-value", f'{ctx}#SBATCH --bb has no value: write #SBATCH --bb="#BB_LUA ..."'
            )
        content = _bb_content(spec)
        if content is None:
            raise _LineError(
                "bad-bb-option",
                f"{ctx}#SBATCH --bb value must start with #BB_LUA (Slurm inserts it into the "
                'script as a line): write #SBATCH --bb="#BB_LUA ..."',
            )
    else:
        if raw.endswith("\\"):
            raise _LineError(
                "continuation",
                f'{ctx}line ends with "\\": continuation lines are not supported: '
                "put the whole directive on one line",
            )
        content = raw[7:]
    toks = _tokenize(content, ctx)
    if not toks:
        return
    key, word, _ = toks[0]
    if key is not None:
        _pool_line(st, n, toks)
    elif word in VERBS:
        _stage(st, n, word, toks)
    else:
        raise _LineError(
            "unknown-verb",
            f'{ctx}unknown verb "{word}": use stage_in or stage_out '
            "(or pool=NAME capacity=SIZE on a line of its own)",
        )


def parse(text: str) -> dict[str, Any]:
    """Parse the directive header of a batch script; never raises."""
    st = _State()
    errors: list[dict[str, Any]] = []
    size = _nbytes(text) if len(text) > MAX_SCRIPT_BYTES // 4 else len(text)
    if size > MAX_SCRIPT_BYTES:
        errors.append(
            {
                "line": 0,
                "code": "script-too-large",
                "message": f"script: {size} bytes is over the {MAX_SCRIPT_BYTES} byte limit: "
                "shorten the script",
            }
        )
    else:
        lines = _header(text)
        seen = {
            _strip(raw[7:]) for _, raw, sb in lines if not sb and _nbytes(raw) <= MAX_LINE_BYTES
        }
        count = 0
        for n, raw, sbatch in lines:
            if sbatch and _bb_content(_sbatch_spec(raw)) in seen:
                continue  # the copy Slurm inserted as a #BB_LUA line is already counted
            count += 1
            if count > MAX_DIRECTIVES:
                errors.append(
                    {
                        "line": n,
                        "code": "too-many-directives",
                        "message": f"line {n}: more than {MAX_DIRECTIVES} directive lines: "
                        "stage a directory tree or a wildcard instead of single files",
                    }
                )
                break
            try:
                _line(st, n, raw, sbatch)
            except _LineError as e:
                errors.append({"line": n, "code": e.code, "message": e.message})
                if len(errors) >= MAX_ERRORS:
                    break
    return {
        "directives": [d.to_dict() for d in st.directives],
        "pool": st.pool,
        "capacity": st.capacity,
        "errors": errors,
    }
