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
    ("http://host/x", "bad-scheme"),
    ("ftp://host/x", "bad-scheme"),
    ("s3://bucket/k", None),
]


@pytest.fixture
def enabled() -> Iterator[None]:
    movers.enable(ENABLED)
    yield
    movers.enable([])


@pytest.fixture(params=LUAS)
def lua(request: pytest.FixtureRequest, tmp_path: Path, enabled: None) -> Iterator[LuaParser]:
    site = tmp_path / "bbstage_site.lua"
    site.write_text(luainstall.site_lua(Config(), "test"))
    parser = LuaParser(request.param, site)
    yield parser
    parser.close()


def script(location: str, extra: str = "") -> str:
    return f"#!/bin/bash\n#BB_LUA stage_in source={location} destination=/fast/x {extra}\n"


@pytest.mark.parametrize(("location", "code"), CASES, ids=[c[0] for c in CASES])
def test_both_parsers_take_each_enabled_scheme_by_its_rule(
    lua: LuaParser, location: str, code: str | None
) -> None:
    result = parse(script(location))
    codes = [e["code"] for e in result["errors"]]
    assert codes == ([code] if code else []), result["errors"]
    if code is None:
        assert result["directives"][0]["source_kind"] == location.split("://")[0]
    assert lua.parse(script(location)) == result  # messages too


def test_a_disabled_scheme_is_refused_and_the_message_lists_the_enabled(lua: LuaParser) -> None:
    movers.enable([])
    result = parse(script("gs://bucket/k"))
    assert [e["code"] for e in result["errors"]] == ["bad-scheme"]
    assert "s3://bucket/key" in result["errors"][0]["message"]
    assert "gs://" not in result["errors"][0]["message"].split(":", 2)[2].replace('"gs://', "")
    movers.enable(ENABLED)
    assert parse(script("gs://bucket/k"))["errors"] == []


def test_profile_only_with_a_backend_that_takes_it(lua: LuaParser) -> None:
    for location, ok in [("gs://bucket/k", False), ("s3://bucket/k", True)]:
        result = parse(script(location, "profile=me"))
        assert [e["code"] for e in result["errors"]] == ([] if ok else ["profile-without-s3"])
        assert lua.parse(script(location, "profile=me")) == result
