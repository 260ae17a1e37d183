"""Parser for the ``#BB_LUA`` staging directives of a batch script.

The grammar is specified in ``docs/directives.md``.  ``lua/bbstage/directives.lua`` implements
the same grammar for slurmctld; ``tests/corpus/*.json`` keeps the two in step, so any change
here must be made there too (same checks in the same order, same message templates).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

MAX_SCRIPT_BYTES = 4 * 1024 * 1024  # Slurm's default max_script_size
MAX_LINE_BYTES = 4096
MAX_DIRECTIVES = 256
MAX_ERRORS = 20
MAX_HEADER_LINES = 65536
MAX_CAPACITY = 2**53  # exclusive: exact in a Lua 5.1 number

VERBS = ("stage_in", "stage_out")
STAGE_KEYS = ("source", "destination", "checksum", "overwrite", "profile")
OPTION_VALUES = {
    "checksum": ("none", "xxh3", "blake2b"),
    "overwrite": ("always", "never", "newer"),
}
OPTION_HINTS = {"checksum": "none, xxh3 or blake2b", "overwrite": "always, never or newer"}
UNITS = {"": 1, "K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40, "P": 2**50}

# Message templates by key; the error code is the key up to "/". Identical to MSGS in the Lua
# module (tests/test_directives.py compares them). Every message is "line N: [verb: ]" + this.
MESSAGES: dict[str, str] = {
    "script-too-large": "script: %d bytes is over the %d byte limit: shorten the script",
    "too-many-directives": (
        "more than %d directive lines: stage a directory tree or a wildcard instead of single files"
    ),
    "header-too-long": (
        "the script header (the lines before the first command) is over %d lines: move "
        "comments below the first command"
    ),
    "line-too-long": (
        "directive line is %d bytes, over the %d byte limit: shorten the paths or stage a directory"
    ),
    "crlf": "line ends with a carriage return (DOS line ending): convert the script with dos2unix",
    "control-char": "control character 0x%02x in directive: remove it",
    "continuation": (
        'line ends with "\\": continuation lines are not supported: put the whole '
        "directive on one line"
    ),
    "missing-value/sbatch": '#SBATCH --bb has no value: write #SBATCH --bb="#BB_LUA ..."',
    "bad-bb-option": (
        "#SBATCH --bb value must start with #BB_LUA (Slurm inserts it into the script as "
        'a line): write #SBATCH --bb="#BB_LUA ..."'
    ),
    "bad-token/key": '"=" without a key: write key=value',
    "unterminated-quote": 'unterminated quote in value of "%s": add the closing "',
    "bad-escape": 'bad escape in quoted value of "%s": only \\" and \\\\ are allowed inside quotes',
    "bad-quote/after": (
        'text after the closing quote in value of "%s": put a space after the closing "'
    ),
    "bad-quote/stray": 'stray quote in value of "%s": quote the whole value, e.g. %s="/a b/c"',
    "bad-token": '"%s" is not key=value: write key=value',
    "unknown-verb": (
        'unknown verb "%s": use stage_in or stage_out (or pool=NAME capacity=SIZE on a '
        "line of its own)"
    ),
    "unknown-key": 'unknown key "%s": use source, destination, checksum, overwrite or profile',
    "unknown-key/pool": "pool= and capacity= go on a #BB_LUA line of their own",
    "unknown-key/verbless": (
        'unknown key "%s" on a line without a verb: start the line with stage_in or '
        "stage_out, or use only pool= and capacity="
    ),
    "duplicate-key": '"%s" given twice: keep one',
    "empty-value": 'empty value for "%s": give a value',
    "missing-value": "missing %s=: add %s=<location>",
    "unknown-variable": (
        '"%s" in %s: only a leading $BB_SCRATCH is expanded (use %%u for the user name, '
        "%%j for the job id)"
    ),
    "bad-scheme": (
        'unsupported scheme in %s "%s": use an absolute path, $BB_SCRATCH/..., or s3://bucket/key'
    ),
    "bad-bucket/key": (
        '%s "%s" has no key part: write s3://bucket/ for a whole bucket or s3://bucket/key'
    ),
    "bad-bucket": (
        'bad S3 bucket in %s "%s": bucket names have 3-63 characters a-z 0-9 . - and '
        "start and end with a letter or digit"
    ),
    "non-utf8": (
        'byte 0x%02x in %s "%s" is not UTF-8 and S3 keys are UTF-8 text: save the script as '
        "UTF-8 (iconv -f LATIN1 -t UTF-8) or rename the key"
    ),
    "relative-path": (
        'relative path "%s" in %s: use an absolute path, $BB_SCRATCH/..., or s3://bucket/key'
    ),
    "dot-dot": '".." component in %s "%s": write the path without ..',
    "bad-glob": 'wildcard in %s "%s": wildcards are only allowed in a stage_in source',
    "bad-glob/tree": 'wildcard source "%s" ends with /: drop the / or the wildcard',
    "bad-glob/first": (
        'wildcard in the first directory of source "%s": start with a literal directory, '
        "e.g. /data/..."
    ),
    "bad-glob/bracket": 'unclosed [ in source "%s": close it with ]',
    "bad-glob/dest": (
        'destination "%s" of a wildcard source must be a directory ending in /: add the /'
    ),
    "tree-mismatch": (
        'source "%s" and destination "%s" must both be directories (ending in /) or both files'
    ),
    "bad-option-value": '%s="%s" is not allowed: use %s',
    "bad-option-value/profile": (
        'profile="%s" is not a valid profile name: use 1-64 characters A-Z a-z 0-9 _ . -'
    ),
    "bad-option-value/pool": (
        'pool="%s" is not a valid pool name: use 1-64 characters A-Z a-z 0-9 _ . -'
    ),
    "profile-without-s3": "profile= applies only to s3:// locations: remove it",
    "capacity-in-value": (
        '"capacity=" inside a value would be read by Slurm as a capacity request: rename the path'
    ),
    "duplicate-destination": (
        'destination "%s" is also written by line %d: give each directive its own destination'
    ),
    "bad-quote/pool": 'value of "%s" must not be quoted (Slurm reads pool= and capacity= verbatim)',
    "capacity-without-pool": "capacity= needs pool=: write pool=NAME capacity=SIZE",
    "bad-size": (
        'bad capacity "%s": use a whole number of bytes with an optional K, M, G, T or P '
        "suffix (binary units), above 0 and below 8P"
    ),
    "duplicate-pool": "pool=/capacity= already given on line %d: use one line",
    "internal-error": "%s",
}

_CTRL = re.compile(r"[\x00-\x08\x0a-\x1f\x7f]")
_SBATCH_BB = re.compile(r"#SBATCH[ \t]+--bb")
_NAME = re.compile(r"[A-Za-z0-9_.-]{1,64}")
_BUCKET = re.compile(r"[a-z0-9][a-z0-9.-]*[a-z0-9]")
_SCHEME = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://")
_SIZE = re.compile(r"([0-9]+)([KMGTPkmgtp]?)")
_GLOB = re.compile(r"[*?\[]")
_SURROGATE = re.compile("[\ud800-\udfff]")  # a byte that is not UTF-8 (surrogateescape)
_WS = " \t"


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


class _Fail(Exception):
    """A line's error: a MESSAGES key and the template's arguments."""

    def __init__(self, key: str, *args: object) -> None:
        super().__init__(key)
        self.key = key
        self.args_ = args


def _error(line: int, ctx: str, key: str, *args: object) -> dict[str, Any]:
    return {"line": line, "code": key.split("/")[0], "message": ctx + MESSAGES[key] % args}


def _nbytes(s: str) -> int:
    """UTF-8 length; surrogate escapes (from undecodable bytes) count as the byte they were."""
    if s.isascii():
        return len(s)
    try:
        return len(s.encode("utf-8", "surrogateescape"))
    except UnicodeEncodeError:
        return len(s.encode("utf-8", "surrogatepass"))


def _strip(s: str) -> str:
    return s.strip(_WS)


def _sbatch_content(raw: str) -> tuple[str, str | None]:
    """Spec of an ``#SBATCH --bb`` line and its content after ``#BB_LUA`` (None if absent)."""
    m = _SBATCH_BB.match(raw)
    assert m is not None
    rest = raw[m.end() :]
    spec = _strip(rest[1:] if rest.startswith("=") else rest)
    if len(spec) > 1 and spec[0] == '"' and spec[-1] == '"':
        spec = spec[1:-1]
    if spec.startswith("#BB_LUA") and (len(spec) == 7 or spec[7] in _WS):
        return spec, _strip(spec[7:])
    return spec, None


def _header(text: str) -> list[tuple[int, str | None, bool]]:
    """Directive lines of the header as (line number, raw line, is_sbatch).

    A last entry (n, None, False) means the header reached line MAX_HEADER_LINES + 1.
    """
    out: list[tuple[int, str | None, bool]] = []
    pos, n, end = 0, 0, len(text)
    while pos < end:
        n += 1
        e = text.find("\n", pos)
        if e < 0:
            e = end
        if text[pos] != "#" and e != pos:
            break
        if n > MAX_HEADER_LINES:
            out.append((n, None, False))
            break
        if text[pos] != "#":
            pass
        elif text.startswith("#BB_LUA", pos):
            if e == pos + 7 or text[pos + 7] in _WS:
                out.append((n, text[pos:e], False))
        elif text.startswith("#SBATCH", pos):
            raw = text[pos:e]
            m = _SBATCH_BB.match(raw)
            if m and (m.end() == len(raw) or raw[m.end()] in "= \t"):
                out.append((n, raw, True))
        pos = e + 1
    return out


def _tokenize(s: str) -> tuple[list[str | None], list[str], list[bool]]:
    """Split directive content into keys (None for a bare word), values and quoted flags."""
    keys: list[str | None] = []
    vals: list[str] = []
    quoted: list[bool] = []
    p, n = 0, len(s)
    while True:
        while p < n and s[p] in _WS:
            p += 1
        if p >= n:
            return keys, vals, quoted
        q = p
        while q < n and s[q] not in " \t=":
            q += 1
        if q >= n or s[q] != "=":
            keys.append(None)
            vals.append(s[p:q])
            quoted.append(False)
            p = q
            continue
        key = s[p:q]
        if key == "":
            raise _Fail("bad-token/key")
        p = q + 1
        if p < n and s[p] == '"':
            buf: list[str] = []
            r = p + 1
            while True:
                j = r
                while j < n and s[j] not in '"\\':
                    j += 1
                if j >= n or (s[j] == "\\" and j + 1 >= n):
                    raise _Fail("unterminated-quote", key)
                buf.append(s[r:j])
                if s[j] == '"':
                    p = j + 1
                    break
                c = s[j + 1]
                if c not in '"\\':
                    raise _Fail("bad-escape", key)
                buf.append(c)
                r = j + 2
            if p < n and s[p] not in _WS:
                raise _Fail("bad-quote/after", key)
            value, was_quoted = "".join(buf), True
        else:
            q = p
            while q < n and s[q] not in _WS:
                q += 1
            value, was_quoted = s[p:q], False
            if '"' in value:
                raise _Fail("bad-quote/stray", key, key)
            p = q
        keys.append(key)
        vals.append(value)
        quoted.append(was_quoted)


def _unclosed_bracket(path: str) -> bool:
    """True if some ``[`` has no ``]`` before the next ``/`` (linear scan, as in Lua)."""
    i, k = path.find("["), 0
    while i >= 0:
        if 0 <= k <= i:
            k = path.find("/", i + 1)  # the next "/" after i (-1: none)
        j = path.find("]", i + 1)
        if j < 0 or 0 <= k < j:
            return True
        i = path.find("[", j + 1)
    return False


def _location(v: str, role: str, verb: str) -> tuple[str, bool, bool]:
    """Validate one location; return (kind, tree, glob)."""
    kind, path = "posix", v
    if v[0] == "$":
        if v != "$BB_SCRATCH" and not v.startswith("$BB_SCRATCH/"):
            raise _Fail("unknown-variable", v, role)
        kind, path = "scratch", v[11:]
    elif v[0] != "/":
        if not _SCHEME.match(v):
            raise _Fail("relative-path", v, role)
        if not v.startswith("s3://"):
            raise _Fail("bad-scheme", role, v)
        slash = v.find("/", 5)
        if slash < 0:
            raise _Fail("bad-bucket/key", role, v)
        bucket = v[5:slash]
        if not (3 <= len(bucket) <= 63 and _BUCKET.fullmatch(bucket)):
            raise _Fail("bad-bucket", role, v)
        kind, path = "s3", v[slash:]
        bad = _SURROGATE.search(v)
        if bad:  # U+DC80+byte; another surrogate came from a JSON escape: its UTF-8 starts 0xed
            c = ord(bad.group())
            raise _Fail("non-utf8", c - 0xDC00 if 0xDC80 <= c <= 0xDCFF else 0xED, role, v)
    if "/../" in path + "/":
        raise _Fail("dot-dot", role, v)
    if "$" in path:
        raise _Fail("unknown-variable", v, role)
    tree = v.endswith("/") or v == "$BB_SCRATCH"
    glob = _GLOB.search(path) is not None
    if glob:
        if role == "destination" or verb == "stage_out":
            raise _Fail("bad-glob", role, v)
        if tree:
            raise _Fail("bad-glob/tree", v)
        if kind == "posix" and _GLOB.search(path.split("/", 2)[1]):
            raise _Fail("bad-glob/first", v)
        if _unclosed_bracket(path):
            raise _Fail("bad-glob/bracket", v)
    return kind, tree, glob


@dataclass
class _State:
    directives: list[Directive] = field(default_factory=list)
    pool: str | None = None
    capacity: int | None = None
    pool_line: int = 0
    dests: dict[str, int] = field(default_factory=dict)
    verb: str | None = None


def _stage(st: _State, n: int, verb: str, keys: list[str | None], vals: list[str]) -> None:
    st.verb = verb
    kv: dict[str, str] = {}
    for key, value in zip(keys[1:], vals[1:], strict=True):
        if key is None:
            raise _Fail("bad-token", value)
        if key not in STAGE_KEYS:
            if key in ("pool", "capacity"):
                raise _Fail("unknown-key/pool")
            raise _Fail("unknown-key", key)
        if key in kv:
            raise _Fail("duplicate-key", key)
        if value == "":
            raise _Fail("empty-value", key)
        kv[key] = value
    for role in ("source", "destination"):
        if role not in kv:
            raise _Fail("missing-value", role, role)
    src, dst = kv["source"], kv["destination"]
    skind, stree, sglob = _location(src, "source", verb)
    dkind, dtree, _ = _location(dst, "destination", verb)
    if sglob:
        if not dtree:
            raise _Fail("bad-glob/dest", dst)
    elif stree != dtree:
        raise _Fail("tree-mismatch", src, dst)
    options = {"checksum": kv.get("checksum", "none"), "overwrite": kv.get("overwrite", "always")}
    for opt in ("checksum", "overwrite"):
        if options[opt] not in OPTION_VALUES[opt]:
            raise _Fail("bad-option-value", opt, options[opt], OPTION_HINTS[opt])
    if "profile" in kv:
        if not _NAME.fullmatch(kv["profile"]):
            raise _Fail("bad-option-value/profile", kv["profile"])
        if skind != "s3" and dkind != "s3":
            raise _Fail("profile-without-s3")
        options["profile"] = kv["profile"]
    if any("capacity=" in v for v in vals[1:]):
        raise _Fail("capacity-in-value")
    norm = dst.rstrip("/")
    if norm in st.dests:
        raise _Fail("duplicate-destination", dst, st.dests[norm])
    st.dests[norm] = n
    st.directives.append(
        Directive(len(st.directives), n, verb, src, dst, skind, dkind, stree, sglob, options)
    )


def _pool_line(
    st: _State, n: int, keys: list[str | None], vals: list[str], quoted: list[bool]
) -> None:
    kv: dict[str, str] = {}
    for key, value, was_quoted in zip(keys, vals, quoted, strict=True):
        if key is None:
            raise _Fail("bad-token", value)
        if key not in ("pool", "capacity"):
            raise _Fail("unknown-key/verbless", key)
        if key in kv:
            raise _Fail("duplicate-key", key)
        if was_quoted:
            raise _Fail("bad-quote/pool", key)
        if value == "":
            raise _Fail("empty-value", key)
        kv[key] = value
    pool, cap, size = kv.get("pool"), kv.get("capacity"), None
    if pool is None:
        raise _Fail("capacity-without-pool")
    if not _NAME.fullmatch(pool):
        raise _Fail("bad-option-value/pool", pool)
    if cap is not None:
        m = _SIZE.fullmatch(cap)
        if m:
            digits = m.group(1).lstrip("0")
            if len(digits) <= 17:  # larger numbers are over the limit anyway
                size = int(digits or "0") * UNITS[m.group(2).upper()]
        if size is None or size <= 0 or size >= MAX_CAPACITY:
            raise _Fail("bad-size", cap)
    if st.pool_line:
        raise _Fail("duplicate-pool", st.pool_line)
    st.pool_line, st.pool, st.capacity = n, pool, size


def _line(st: _State, n: int, raw: str, sbatch: bool) -> None:
    size = _nbytes(raw)
    if size > MAX_LINE_BYTES:
        raise _Fail("line-too-long", size, MAX_LINE_BYTES)
    if raw.endswith("\r"):
        raise _Fail("crlf")
    m = _CTRL.search(raw)
    if m:
        raise _Fail("control-char", ord(m.group()))
    content: str | None = raw[7:]
    if sbatch:
        spec, content = _sbatch_content(raw)
        if spec == "":
            raise _Fail("missing-value/sbatch")
        if content is None:
            raise _Fail("bad-bb-option")
    elif raw.endswith("\\"):
        raise _Fail("continuation")
    keys, vals, quoted = _tokenize(content)
    if not keys:
        return
    if keys[0] is not None:
        _pool_line(st, n, keys, vals, quoted)
    elif vals[0] in VERBS:
        _stage(st, n, vals[0], keys, vals)
    else:
        raise _Fail("unknown-verb", vals[0])


def parse(text: str) -> dict[str, Any]:
    """Parse the directive header of a batch script into the documented result; never raises."""
    st = _State()
    errors: list[dict[str, Any]] = []
    size = _nbytes(text) if len(text) > MAX_SCRIPT_BYTES // 4 else len(text)
    if size > MAX_SCRIPT_BYTES:
        errors.append(_error(0, "", "script-too-large", size, MAX_SCRIPT_BYTES))
    else:
        lines = _header(text)
        seen = {
            _strip(raw[7:])
            for _, raw, sb in lines
            if raw is not None and not sb and _nbytes(raw) <= MAX_LINE_BYTES
        }
        count = 0
        for n, raw, sbatch in lines:
            if sbatch and _sbatch_content(raw)[1] in seen:
                continue  # the copy Slurm inserted as a #BB_LUA line is already counted
            ctx = f"line {n}: "
            if raw is None:
                errors.append(_error(n, ctx, "header-too-long", MAX_HEADER_LINES))
                break
            count += 1
            if count > MAX_DIRECTIVES:
                errors.append(_error(n, ctx, "too-many-directives", MAX_DIRECTIVES))
                break
            st.verb = None
            try:
                _line(st, n, raw, sbatch)
            except _Fail as e:
                verb = f"{st.verb}: " if st.verb else ""
                errors.append(_error(n, ctx + verb, e.key, *e.args_))
                if len(errors) >= MAX_ERRORS:
                    break
    return {
        "directives": [d.to_dict() for d in st.directives],
        "pool": st.pool,
        "capacity": st.capacity,
        "errors": errors,
    }
