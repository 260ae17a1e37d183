"""The directive parsers accept the URL schemes of the enabled backends, each by its own
rule (``Backend.url_rule``), in step: the Python parser asks the registry, the Lua parser
reads the same rules from the ``bbstage_site.lua`` that ``bbstage install-lua`` writes."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from bbstage import movers
from bbstage.cli import luainstall
from bbstage.config import Config
from bbstage.directives import parse
from tests.luas import LUAS
from tests.test_directives import LuaParser

ENABLED = ["abfs", "az", "gs", "https", "sftp"]

# (location as a stage_in source to a local file, the error code or None)
CASES = [
    ("gs://my-bucket_1/k.dat", None),
    ("gs://UPPER/k", "bad-bucket"),
    ("gs://ab/k", "bad-bucket"),
    ("gs://bucket", "bad-bucket"),  # no key part: its own code's family
    ("az://container-1/dir/k.dat", None),
    ("az://under_score/k", "bad-bucket"),
    ("abfs://container/k", None),
    ("https://data.example.org:8443/pub/file.nc", None),
    ("https://-bad/x", "bad-bucket"),
    ("sftp://user@dtn.example.org:2222/home/u/x", None),
    ("sftp://host/x", None),
    # only the hosts of [https]/[sftp] allowed_hosts (ALLOWED), by host:port, default ports
    # 443 and 22, host names in any case, the port without leading zeros, after any user@
    ("https://data.example.org/pub/file.nc", "host-not-allowed"),  # 443: not listed
    ("https://Mirror.EXAMPLE.org/x", None),
    ("https://mirror.example.org:443/x", None),
    ("https://mirror.example.org:0443/x", None),
    ("https://mirror.example.org:4430/x", "host-not-allowed"),
    ("https://mirror.example.org.evil.net/x", "host-not-allowed"),
    ("https://127.0.0.1:8443/x", "host-not-allowed"),
    ("sftp://dtn.example.org/x", "host-not-allowed"),  # 22: not listed
    ("sftp://a@b@HOST:22/x", None),
    ("sftp://host@evil.net/x", "host-not-allowed"),
    ("http://host/x", "bad-scheme"),
    ("ftp://host/x", "bad-scheme"),
    ("s3://bucket/k", None),
]


# the daemon config's tables of the backends whose URLs name a host to reach
ALLOWED = {
    "https": {"allowed_hosts": ["data.example.org:8443", "Mirror.Example.org"]},
    "sftp": {"allowed_hosts": ["dtn.example.org:2222", "host"]},
}


@pytest.fixture
def registry() -> movers.Registry:
    return movers.Registry(ENABLED).with_settings(ALLOWED)  # as bbstage.config builds it


@pytest.fixture(params=LUAS)
def lua(
    request: pytest.FixtureRequest, tmp_path: Path, registry: movers.Registry
) -> Iterator[LuaParser]:
    site = tmp_path / "bbstage_site.lua"
    site.write_text(luainstall.site_lua(Config(registry=registry), "test"))
    parser = LuaParser(request.param, site)
    yield parser
    parser.close()


def script(location: str, extra: str = "") -> str:
    return f"#!/bin/bash\n#BB_LUA stage_in source={location} destination=/fast/x {extra}\n"


@pytest.mark.parametrize(("location", "code"), CASES, ids=[c[0] for c in CASES])
def test_both_parsers_take_each_enabled_scheme_by_its_rule(
    lua: LuaParser, registry: movers.Registry, location: str, code: str | None
) -> None:
    result = parse(script(location), registry)
    codes = [e["code"] for e in result["errors"]]
    assert codes == ([code] if code else []), result["errors"]
    if code is None:
        assert result["directives"][0]["source_kind"] == location.split("://")[0]
    assert lua.parse(script(location)) == result  # messages too


def test_a_disabled_scheme_is_refused_and_the_message_lists_the_enabled(lua: LuaParser) -> None:
    result = parse(script("gs://bucket/k"), movers.Registry())
    assert [e["code"] for e in result["errors"]] == ["bad-scheme"]
    assert "s3://bucket/key" in result["errors"][0]["message"]
    assert "gs://" not in result["errors"][0]["message"].split(":", 2)[2].replace('"gs://', "")
    assert parse(script("gs://bucket/k"), movers.Registry(ENABLED))["errors"] == []


def test_profile_only_with_a_backend_that_takes_it(
    lua: LuaParser, registry: movers.Registry
) -> None:
    for location, ok in [("gs://bucket/k", False), ("s3://bucket/k", True)]:
        result = parse(script(location, "profile=me"), registry)
        assert [e["code"] for e in result["errors"]] == ([] if ok else ["profile-without-s3"])
        assert lua.parse(script(location, "profile=me")) == result


def test_a_host_the_site_has_not_allowed_is_refused_at_sbatch_naming_line_and_key(
    lua: LuaParser, registry: movers.Registry
) -> None:
    """Both parsers, each form that reaches a URL (a #BB_LUA source and destination, a #DW
    stage_in source, NNF's copy_in): the error names the line, the host:port and the key
    the administrator may set; the same words on both sides."""
    text = (
        "#!/bin/bash\n"
        "#BB_LUA stage_in source=https://data.example.org:8443/ok destination=/fast/ok\n"
        "#BB_LUA stage_in source=https://other.example.org/x destination=/fast/x\n"
        "#DW stage_in source=sftp://u@Other.example.org:2200/y destination=$DW_JOB_STRIPED/y"
        " type=file\n"
        "#DW copy_in source=https://data.example.org/z destination=$DW_JOB_STRIPED/z\n"
        "#BB_LUA stage_out source=$BB_SCRATCH/o destination=sftp://dtn.example.org:22/o\n"
    )
    result = parse(text, registry)
    assert [(e["line"], e["code"]) for e in result["errors"]] == [
        (n, "host-not-allowed") for n in (3, 4, 5, 6)
    ], result["errors"]
    messages = [e["message"] for e in result["errors"]]
    assert messages[0] == (
        'line 3: stage_in: host other.example.org:443 in source "https://other.example.org/x"'
        ' is not allowed on this site: the administrator may add "other.example.org:443" to'
        " [https] allowed_hosts in the daemon config"
    )
    assert '"other.example.org:2200" to [sftp] allowed_hosts' in messages[1]
    assert '"data.example.org:443" to [https] allowed_hosts' in messages[2]
    assert 'destination "sftp://dtn.example.org:22/o"' in messages[3]
    assert lua.parse(text) == result


@pytest.mark.parametrize("name", LUAS)
def test_without_allowed_hosts_no_host_is_taken(name: str, tmp_path: Path) -> None:
    """Unset or empty ``allowed_hosts``: none (as the worker's check)."""
    registry = movers.Registry(ENABLED).with_settings({"https": {"allowed_hosts": []}})
    site = tmp_path / "bbstage_site.lua"
    site.write_text(luainstall.site_lua(Config(registry=registry), "test"))
    assert site.read_text().count("hosts = { }") == 2
    parser = LuaParser(name, site)
    try:
        for location in ("https://data.example.org:8443/x", "sftp://host/x"):
            result = parse(script(location), registry)
            assert [e["code"] for e in result["errors"]] == ["host-not-allowed"]
            assert parser.parse(script(location)) == result
    finally:
        parser.close()
