"""Parser for the staging directives of a batch script: ``#BB_LUA``, and DataWarp/NNF ``#DW``.

The grammar is specified in ``docs/directives.md``.  ``lua/bbstage/directives.lua`` implements
the same grammar for slurmctld; ``tests/corpus/*.json`` keeps the two in step, so any change
to a check here must be made there too (same checks in the same order, same message
templates). The tables at the top are the one copy: ``bbstage install-lua`` hands them to the
Lua module (``lua_tables``), whose own literal copy, for a parser without a site file, is
checked equal by tests/test_grammar.py.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from bbstage import movers

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
# #DW jobdw capacity=: Slurm's own units (suffix_mult: "GB" is 10^9, "G" and "GiB" are 2^30)
DW_UNITS = dict(UNITS)
for _u, _e in (("K", 1), ("M", 2), ("G", 3), ("T", 4), ("P", 5)):
    DW_UNITS[_u + "IB"], DW_UNITS[_u + "B"] = 2 ** (10 * _e), 10 ** (3 * _e)
# #DW verbs that stage, and what they are in bbstage (NNF's copy_in is DataWarp's stage_in)
DW_VERBS = {"stage_in": "stage_in", "stage_out": "stage_out", "copy_in": "stage_in",
            "copy_out": "stage_out"}  # fmt: skip
DW_STAGE_KEYS = {
    "stage_in": ("source", "destination", "type"),
    "copy_in": ("source", "destination"),
}
DW_STAGE_KEYS["stage_out"], DW_STAGE_KEYS["copy_out"] = (
    DW_STAGE_KEYS["stage_in"],
    DW_STAGE_KEYS["copy_in"],
)
DW_REFUSED = {
    "persistentdw": "persistent",
    "create_persistent": "persistent",
    "destroy_persistent": "persistent",
    "swap": "swap",
    "container": "container",
}
JOBDW_KEYS = ("capacity", "pool", "type", "access_mode", "name")
JOBDW_TYPES = ("scratch", "xfs", "gfs2", "lustre")  # DataWarp's scratch; NNF's file systems
ACCESS_MODES = ("striped", "private", "striped,private", "private,striped")
DW_SCRATCH_VARS = ("DW_JOB_STRIPED", "DW_JOB_PRIVATE")


def lua_tables() -> dict[str, Any]:
    """The tables above, by their names, in the shape ``lua/bbstage/directives.lua`` looks
    them up: sets as ``{name: 1}``, capacity units as floats but the bare unit 1 (Lua 5.3+
    then multiplies a size in floats, never overflowing an integer, as its ``2 ^ 10`` do).
    ``bbstage install-lua`` writes this into bbstage_site.lua as ``grammar``; the Lua
    module's own tables, used without one, hold the same (tests/test_grammar.py)."""

    def names(items: tuple[str, ...]) -> dict[str, int]:
        return dict.fromkeys(items, 1)

    def units(table: dict[str, int]) -> dict[str, int | float]:
        return {u: float(m) if u else m for u, m in table.items()}

    return {
        "MAX_SCRIPT_BYTES": MAX_SCRIPT_BYTES,
        "MAX_LINE_BYTES": MAX_LINE_BYTES,
        "MAX_DIRECTIVES": MAX_DIRECTIVES,
        "MAX_ERRORS": MAX_ERRORS,
        "MAX_HEADER_LINES": MAX_HEADER_LINES,
        "MAX_CAPACITY": float(MAX_CAPACITY),
        "VERBS": names(VERBS),
        "STAGE_KEYS": names(STAGE_KEYS),
        "OPTION_VALUES": {k: names(v) for k, v in OPTION_VALUES.items()},
        "OPTION_HINTS": dict(OPTION_HINTS),
        "UNITS": units(UNITS),
        "DW_UNITS": units(DW_UNITS),
        "DW_VERBS": dict(DW_VERBS),
        "DW_STAGE_KEYS": {k: names(v) for k, v in DW_STAGE_KEYS.items()},
        "DW_REFUSED": dict(DW_REFUSED),
        "JOBDW_KEYS": names(JOBDW_KEYS),
        "JOBDW_TYPES": names(JOBDW_TYPES),
        "ACCESS_MODES": names(ACCESS_MODES),
        "DW_SCRATCH_VARS": list(DW_SCRATCH_VARS),
    }


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
        "#SBATCH --bb value must start with #BB_LUA or #DW (Slurm inserts it into the script "
        'as a line): write #SBATCH --bb="#BB_LUA ..."'
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
        '"%s" in %s: only a leading $BB_SCRATCH, $DW_JOB_STRIPED, $DW_JOB_PRIVATE or '
        "$DW_JOB_<name of a #DW jobdw above> is expanded (use %%u for the user name, %%j for "
        "the job id)"
    ),
    "bad-scheme": 'unsupported scheme in %s "%s": use an absolute path, $BB_SCRATCH/..., or %s',
    "bad-bucket/key": '%s "%s" has no key part: write %s/ for a whole %s or %s/key',
    "bad-bucket": 'bad %s in %s "%s": %s',
    "host-not-allowed": (
        'host %s in %s "%s" is not allowed on this site: the administrator may add "%s" to %s'
        " in the daemon config"
    ),
    "non-utf8": (
        'byte 0x%02x in %s "%s" is not UTF-8 and %s keys are UTF-8 text: save the script as '
        "UTF-8 (iconv -f LATIN1 -t UTF-8) or rename the key"
    ),
    "relative-path": 'relative path "%s" in %s: use an absolute path, $BB_SCRATCH/..., or %s',
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
    "profile-without-s3": "profile= applies only to %s locations: remove it",
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
    "unknown-verb/dw": (
        'unknown #DW verb "%s": use jobdw, stage_in, stage_out, copy_in or copy_out (or a '
        "#BB_LUA line)"
    ),
    "unknown-key/dw": 'unknown key "%s" on a #DW %s line: use %s',
    "missing-value/type": "missing type=: add type=file or type=directory",
    "tree-mismatch/file": 'type=file but "%s" is a directory: drop the / or write type=directory',
    "dw-unsupported/persistent": (
        "#DW %s: persistent burst buffers do not exist with bbstage: stage the data from the "
        "shared file system in each job (#DW stage_in, #DW copy_in or #BB_LUA stage_in)"
    ),
    "dw-unsupported/swap": "#DW %s: bbstage gives no swap space: remove the line",
    "dw-unsupported/container": (
        "#DW %s: bbstage runs no containers on storage nodes: remove the line"
    ),
    "dw-unsupported/list": (
        "type=list would read the list file at submission, which bbstage does not do: write "
        "one #DW %s line per file (type=file), or stage their directory (type=directory)"
    ),
    "dw-unsupported/cache": (
        "type=cache (DataWarp cache mode) is not available: use type=scratch and stage the "
        "files with #DW stage_in and stage_out"
    ),
    "dw-unsupported/raw": (
        "type=raw is a block device and bbstage gives a directory: use type=xfs"
    ),
    "dw-unsupported/profile": (
        "profile= on a #DW line names an NNF profile, which bbstage has not: remove it"
    ),
    "dw-unsupported/requires": "requires= (NNF daemons) is not available: remove it",
    "capacity-without-pool/dw": (
        "capacity= needs pool= (Slurm's burst_buffer/lua rejects the job without it): add "
        "pool=NAME to the #DW jobdw line"
    ),
    "bad-size/dw": (
        'bad capacity "%s": use a whole number with an optional unit K, M, G, T, P or KiB ... '
        "PiB (powers of 1024), or KB ... PB (powers of 1000), above 0 and below 8 PiB"
    ),
    "bad-option-value/name": (
        'name="%s" is not a valid jobdw name: use 1-64 characters A-Z a-z 0-9 _ -'
    ),
    "duplicate-pool/jobdw": (
        "a job has one scratch space and line %d already asks for it: use one #DW jobdw "
        "(or one pool= line)"
    ),
    "late-directive": (
        "%s line after the first command (line %d) is ignored by Slurm: move it above line %d"
    ),
    "late-directive/indented": (
        "indented %s line is a command for Slurm and ends the script header: remove the indentation"
    ),
    "internal-error": "%s",
}

_CTRL = re.compile(r"[\x00-\x08\x0a-\x1f\x7f]")
_SBATCH_BB = re.compile(r"#SBATCH[ \t]+--bb")
# a staging line anywhere in the body (after the header), indented or not
_LATE = re.compile(
    r"^([ \t]*)(#BB_LUA(?=[ \t\n]|$)|#DW(?=[ \t\n]|$)|#SBATCH[ \t]+--bb(?=[= \t\n]|$))", re.M
)
_VAR = re.compile(r"\$([A-Za-z0-9_]+)(?=/|$)")
_DW_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")
_DW_SIZE = re.compile(r"([0-9]+)([A-Za-z]*)")
_NAME = re.compile(r"[A-Za-z0-9_.-]{1,64}")
_SCHEME = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://")
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


def _prefix(spec: str) -> str | None:
    """``#BB_LUA`` or ``#DW`` if ``spec`` starts with it and a space, a tab or its end."""
    for prefix in ("#BB_LUA", "#DW"):
        if spec.startswith(prefix) and (len(spec) == len(prefix) or spec[len(prefix)] in _WS):
            return prefix
    return None


def _sbatch_content(raw: str) -> tuple[str, str | None, str | None]:
    """Spec of an ``#SBATCH --bb`` line, its prefix (#BB_LUA or #DW) and content (or None)."""
    m = _SBATCH_BB.match(raw)
    assert m is not None
    rest = raw[m.end() :]
    spec = _strip(rest[1:] if rest.startswith("=") else rest)
    if len(spec) > 1 and spec[0] == '"' and spec[-1] == '"':
        spec = spec[1:-1]
    prefix = _prefix(spec)
    if prefix:
        return spec, prefix, _strip(spec[len(prefix) :])
    return spec, None, None


def _header(text: str) -> tuple[list[tuple[int, str | None, str]], int, int]:
    """Directive lines of the header as (line number, raw line, kind: bb, dw or sbatch), and
    the number and offset of the first command's line (0, -1: none, or the header is too long).

    A last entry (n, None, "") means the header reached line MAX_HEADER_LINES + 1.
    """
    out: list[tuple[int, str | None, str]] = []
    pos, n, end = 0, 0, len(text)
    while pos < end:
        n += 1
        e = text.find("\n", pos)
        if e < 0:
            e = end
        if text[pos] != "#" and e != pos:
            return out, n, pos
        if n > MAX_HEADER_LINES:
            out.append((n, None, ""))
            break
        if text[pos] != "#":
            pass
        elif text.startswith("#SBATCH", pos):
            raw = text[pos:e]
            m = _SBATCH_BB.match(raw)
            if m and (m.end() == len(raw) or raw[m.end()] in "= \t"):
                out.append((n, raw, "sbatch"))
        else:
            prefix = _prefix(text[pos : min(e, pos + 8)])
            if prefix:
                out.append((n, text[pos:e], "bb" if prefix == "#BB_LUA" else "dw"))
        pos = e + 1
    return out, 0, -1


def _late(text: str, first: int, pos: int) -> list[dict[str, Any]]:
    """Staging lines at or after the first command (line ``first``, offset ``pos``)."""
    out: list[dict[str, Any]] = []
    if pos < 0:
        return out
    line, at = first, pos
    for m in _LATE.finditer(text, pos):
        line += text.count("\n", at, m.start())
        at = m.start()
        what = "#SBATCH --bb" if m.group(2).startswith("#S") else m.group(2)
        ctx = f"line {line}: "
        if line == first and m.group(1):
            out.append(_error(line, ctx, "late-directive/indented", what))
        else:
            out.append(_error(line, ctx, "late-directive", what, first, first))
        if len(out) >= MAX_ERRORS:
            break
    return out


def _put_verbatim(kv: dict[str, str], key: str, value: str, was_quoted: bool) -> None:
    """``key=value`` of a line Slurm also reads (pool=, capacity=; #DW jobdw): once, unquoted
    (Slurm reads those values verbatim), not empty."""
    if key in kv:
        raise _Fail("duplicate-key", key)
    if was_quoted:
        raise _Fail("bad-quote/pool", key)
    if value == "":
        raise _Fail("empty-value", key)
    kv[key] = value


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


@dataclass
class _State:
    registry: movers.Registry  # the site's backends: the schemes a location may have
    directives: list[Directive] = field(default_factory=list)
    pool: str | None = None
    capacity: int | None = None
    pool_line: int = 0
    dests: dict[str, int] = field(default_factory=dict)
    verb: str | None = None
    dw: bool = False  # a #DW line or a $DW_JOB_ variable: the job gets the DW_JOB_ names
    dw_vars: set[str] = field(default_factory=lambda: set(DW_SCRATCH_VARS))
    dw_names: list[str] = field(default_factory=lambda: list(DW_SCRATCH_VARS))


def _location(v: str, role: str, verb: str, st: _State) -> tuple[str, bool, bool, str]:
    """Validate one location; return (kind, tree, glob, location). A #DW scratch variable
    (``$DW_JOB_STRIPED/x``) comes back as ``$BB_SCRATCH/x``: it names the same directory."""
    kind, path = "posix", v
    if v[0] == "$":
        m = _VAR.match(v)
        name = m.group(1) if m else ""
        if name != "BB_SCRATCH" and name not in st.dw_vars:
            raise _Fail("unknown-variable", v, role)
        if name != "BB_SCRATCH":
            st.dw = True
            v = "$BB_SCRATCH" + v[len(name) + 1 :]
        kind, path = "scratch", v[11:]
    elif v[0] != "/":
        # A URL: its scheme must be an enabled backend's, checked by that backend's rule
        # (Registry.url_rules; the Lua parser gets the same from bbstage_site.lua).
        rules = st.registry.url_rules()
        if not _SCHEME.match(v):
            raise _Fail("relative-path", v, role, _examples(rules))
        scheme = v[: v.index("://")]
        rule = rules.get(scheme)
        if rule is None:
            raise _Fail("bad-scheme", role, v, _examples(rules))
        start = len(scheme) + 3
        slash = v.find("/", start)
        top = f"{scheme}://{rule.what.split()[-1]}"
        if slash < 0:
            raise _Fail("bad-bucket/key", role, v, top, rule.what.split()[-1], top)
        if not rule.check(v[start:slash]):
            raise _Fail("bad-bucket", rule.what, role, v, rule.rules)
        host = rule.refused_host(v[start:slash])  # the site's allowed_hosts
        if host is not None:
            raise _Fail("host-not-allowed", host, role, v, host, rule.key)
        kind, path = scheme, v[slash:]
        bad = _SURROGATE.search(v) if rule.utf8 else None
        if bad:  # U+DC80+byte; another surrogate came from a JSON escape: its UTF-8 starts 0xed
            c = ord(bad.group())
            byte = c - 0xDC00 if 0xDC80 <= c <= 0xDCFF else 0xED
            raise _Fail("non-utf8", byte, role, v, rule.what.split()[0])
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
    return kind, tree, glob, v


def _examples(rules: dict[str, movers.UrlRule]) -> str:
    """What a location may be besides a path, one example per enabled scheme."""
    return ", ".join(f"{k}://{r.what.split()[-1]}/key" for k, r in rules.items()) or "nothing else"


def _stage_options(
    written: str, keys: list[str | None], vals: list[str], dw: bool
) -> dict[str, str]:
    """The key=value tokens after the verb, checked against the keys the form takes."""
    allowed = DW_STAGE_KEYS[written] if dw else STAGE_KEYS
    kv: dict[str, str] = {}
    for key, value in zip(keys[1:], vals[1:], strict=True):
        if key is None:
            raise _Fail("bad-token", value)
        if key not in allowed:
            if dw:
                if key == "profile" and written.startswith("copy"):
                    raise _Fail("dw-unsupported/profile")
                hint = "source=, destination=" + (" and type=" if "type" in allowed else "")
                raise _Fail("unknown-key/dw", key, written, hint + " (other options: #BB_LUA)")
            if key in ("pool", "capacity"):
                raise _Fail("unknown-key/pool")
            raise _Fail("unknown-key", key)
        if key in kv:
            raise _Fail("duplicate-key", key)
        if value == "":
            raise _Fail("empty-value", key)
        kv[key] = value
    return kv


def _stage(
    st: _State, n: int, written: str, keys: list[str | None], vals: list[str], dw: bool
) -> None:
    """A stage line: #BB_LUA stage_in/out, #DW stage_in/out (DataWarp), #DW copy_in/out (NNF)."""
    st.verb = written
    verb = DW_VERBS[written]
    kv = _stage_options(written, keys, vals, dw)
    for role in ("source", "destination"):
        if role not in kv:
            raise _Fail("missing-value", role, role)
    src, dst = kv["source"], kv["destination"]
    kind = kv.get("type")
    if dw and written.startswith("stage"):
        if kind is None:
            raise _Fail("missing-value/type")
        if kind == "list":
            raise _Fail("dw-unsupported/list", written)
        if kind not in ("file", "directory"):
            raise _Fail("bad-option-value", "type", kind, "file or directory")
        if kind == "directory":  # a DataWarp directory is written without the final /
            src = src if src.endswith("/") else src + "/"
            dst = dst if dst.endswith("/") else dst + "/"
    skind, stree, sglob, src = _location(src, "source", verb, st)
    dkind, dtree, _, dst = _location(dst, "destination", verb, st)
    if kind == "file" and (stree or dtree):
        raise _Fail("tree-mismatch/file", src if stree else dst)
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
        takers = [
            k
            for k, r in st.registry.url_rules().items()
            if "profile" in movers.backend(k).directive_keys
        ]
        if skind not in takers and dkind not in takers:
            raise _Fail("profile-without-s3", " and ".join(f"{k}://" for k in takers))
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


def _size(cap: str, units: dict[str, int]) -> int | None:
    """Bytes of ``digits[unit]`` (unit case-insensitive), or None if not a size we take."""
    m = _DW_SIZE.fullmatch(cap)
    if not m or m.group(2).upper() not in units:
        return None
    digits = m.group(1).lstrip("0")
    if len(digits) > 17:  # larger numbers are over the limit anyway
        return None
    size = int(digits or "0") * units[m.group(2).upper()]
    return size if 0 < size < MAX_CAPACITY else None


def _jobdw(st: _State, n: int, keys: list[str | None], vals: list[str], quoted: list[bool]) -> None:
    """``#DW jobdw``: the job's scratch space (DataWarp or NNF), as ``pool= capacity=``."""
    st.verb = "jobdw"
    kv: dict[str, str] = {}
    for key, value, was_quoted in zip(keys[1:], vals[1:], quoted[1:], strict=True):
        if key is None:
            raise _Fail("bad-token", value)
        if key in ("profile", "requires"):
            raise _Fail("dw-unsupported/" + key)
        if key == "pfs":  # DataWarp's cache mode: type=cache pfs=/path
            raise _Fail("dw-unsupported/cache")
        if key not in JOBDW_KEYS:
            raise _Fail(
                "unknown-key/dw", key, "jobdw", "capacity=, pool=, type=, access_mode=, name="
            )
        _put_verbatim(kv, key, value, was_quoted)
    kind = kv.get("type", "scratch")
    if kind in ("cache", "raw"):
        raise _Fail("dw-unsupported/" + kind)
    if kind not in JOBDW_TYPES:
        raise _Fail("bad-option-value", "type", kind, "scratch, xfs, gfs2 or lustre")
    mode = kv.get("access_mode", "striped")
    if mode not in ACCESS_MODES:
        raise _Fail("bad-option-value", "access_mode", mode, "striped or private")
    name = kv.get("name")
    if name is not None and not _DW_NAME.fullmatch(name):
        raise _Fail("bad-option-value/name", name)
    pool, cap, size = kv.get("pool"), kv.get("capacity"), None
    if pool is not None and not _NAME.fullmatch(pool):
        raise _Fail("bad-option-value/pool", pool)
    if cap is not None:
        if pool is None:
            raise _Fail("capacity-without-pool/dw")
        size = _size(cap, DW_UNITS)
        if size is None:
            raise _Fail("bad-size/dw", cap)
    if st.pool_line:
        raise _Fail("duplicate-pool/jobdw", st.pool_line)
    st.pool_line, st.pool, st.capacity = n, pool, size
    if name is not None:
        var = "DW_JOB_" + name.replace("-", "_")
        st.dw_vars.add(var)
        if var not in st.dw_names:
            st.dw_names.append(var)


def _pool_line(
    st: _State, n: int, keys: list[str | None], vals: list[str], quoted: list[bool]
) -> None:
    kv: dict[str, str] = {}
    for key, value, was_quoted in zip(keys, vals, quoted, strict=True):
        if key is None:
            raise _Fail("bad-token", value)
        if key not in ("pool", "capacity"):
            raise _Fail("unknown-key/verbless", key)
        _put_verbatim(kv, key, value, was_quoted)
    pool, cap, size = kv.get("pool"), kv.get("capacity"), None
    if pool is None:
        raise _Fail("capacity-without-pool")
    if not _NAME.fullmatch(pool):
        raise _Fail("bad-option-value/pool", pool)
    if cap is not None:
        size = _size(cap, UNITS)
        if size is None:
            raise _Fail("bad-size", cap)
    if st.pool_line:
        raise _Fail("duplicate-pool", st.pool_line)
    st.pool_line, st.pool, st.capacity = n, pool, size


def _dw_line(
    st: _State, n: int, keys: list[str | None], vals: list[str], quoted: list[bool]
) -> None:
    """A ``#DW`` line (DataWarp or NNF): jobdw, a stage line, or a refusal saying why."""
    st.dw = True
    if keys[0] is not None:
        raise _Fail("unknown-verb/dw", keys[0] + "=")
    verb = vals[0]
    if verb == "jobdw":
        _jobdw(st, n, keys, vals, quoted)
    elif verb in DW_VERBS:
        _stage(st, n, verb, keys, vals, True)
    elif verb in DW_REFUSED:
        raise _Fail("dw-unsupported/" + DW_REFUSED[verb], verb)
    else:
        raise _Fail("unknown-verb/dw", verb)


def _line(st: _State, n: int, raw: str, kind: str) -> None:
    size = _nbytes(raw)
    if size > MAX_LINE_BYTES:
        raise _Fail("line-too-long", size, MAX_LINE_BYTES)
    if raw.endswith("\r"):
        raise _Fail("crlf")
    m = _CTRL.search(raw)
    if m:
        raise _Fail("control-char", ord(m.group()))
    prefix: str | None = "#DW" if kind == "dw" else "#BB_LUA"
    content: str | None = raw[len(prefix) :]
    if kind == "sbatch":
        spec, prefix, content = _sbatch_content(raw)
        if spec == "":
            raise _Fail("missing-value/sbatch")
        if content is None:
            raise _Fail("bad-bb-option")
    elif raw.endswith("\\"):
        raise _Fail("continuation")
    keys, vals, quoted = _tokenize(content)
    if prefix == "#DW":
        st.dw = True
    if not keys:
        return
    if prefix == "#DW":
        _dw_line(st, n, keys, vals, quoted)
    elif keys[0] is not None:
        _pool_line(st, n, keys, vals, quoted)
    elif vals[0] in VERBS:
        _stage(st, n, vals[0], keys, vals, False)
    else:
        raise _Fail("unknown-verb", vals[0])


def parse(text: str, registry: movers.Registry) -> dict[str, Any]:
    """Parse the directive header of a batch script into the documented result; never raises.
    ``registry``: the site's backends (``config.registry``), whose URLs a location may be."""
    st = _State(registry)
    errors: list[dict[str, Any]] = []
    warnings: list[dict[str, Any]] = []
    size = _nbytes(text) if len(text) > MAX_SCRIPT_BYTES // 4 else len(text)
    if size > MAX_SCRIPT_BYTES:
        errors.append(_error(0, "", "script-too-large", size, MAX_SCRIPT_BYTES))
    else:
        lines, first, pos = _header(text)
        seen = {  # "#BB_LUA content" and "#DW content" of the header's lines
            ("#DW " + _strip(raw[3:]) if kind == "dw" else "#BB_LUA " + _strip(raw[7:]))
            for _, raw, kind in lines
            if raw is not None and kind != "sbatch" and _nbytes(raw) <= MAX_LINE_BYTES
        }
        count = 0
        for n, raw, kind in lines:
            if kind == "sbatch":
                _, prefix, content = _sbatch_content(raw)
                if prefix and f"{prefix} {content}" in seen:
                    continue  # the copy Slurm inserted as a line of its own is already counted
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
                _line(st, n, raw, kind)
            except _Fail as e:
                verb = f"{st.verb}: " if st.verb else ""
                errors.append(_error(n, ctx + verb, e.key, *e.args_))
                if len(errors) >= MAX_ERRORS:
                    break
        warnings = _late(text, first, pos)
    return {
        "directives": [d.to_dict() for d in st.directives],
        "pool": st.pool,
        "capacity": st.capacity,
        "scratch_names": st.dw_names if st.dw else [],
        "errors": errors,
        "warnings": warnings,
    }


def copy(
    source: str, destination: str, options: dict[str, str], registry: movers.Registry
) -> dict[str, Any]:
    """An in-job copy (``bbstage copy``) as a directive, by a directive's rules: the same
    locations, ``$BB_SCRATCH``, S3 URLs and options as a ``stage_out`` line (no globs), the
    same errors; the spec without its index (``Store.add_directive`` gives it one).
    ValueError with the message a script's line would get; ``registry`` as ``parse``'s."""
    keys: list[str | None] = [None, "source", "destination"]
    vals = ["stage_out", source, destination]
    for key, value in options.items():
        keys.append(key)
        vals.append(value)
    st = _State(registry)
    try:
        for value in vals:
            size = _nbytes(value)
            if size > MAX_LINE_BYTES:
                raise _Fail("line-too-long", size, MAX_LINE_BYTES)
            m = _CTRL.search(value)
            if m:
                raise _Fail("control-char", ord(m.group()))
        for role, value in (("source", source), ("destination", destination)):
            if value == "":
                raise _Fail("empty-value", role)
        _stage(st, 0, "stage_out", keys, vals, False)
    except _Fail as e:
        raise ValueError(MESSAGES[e.key] % e.args_) from None
    return st.directives[0].to_dict()
