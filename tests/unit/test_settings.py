"""Settings parsed once, typed: one rule per kind of value (``bbstage.kinds``), one frozen
type per table (``bbstage.settings``), errors naming file, table, key and what was expected."""

from __future__ import annotations

import pickle
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from bbstage import config, kinds
from bbstage.settings import Settings, convert

REPO = Path(__file__).resolve().parents[2]


class Table(Settings, frozen=True):
    size: kinds.Size = 0
    path: kinds.FilePath | None = None
    count: kinds.Count = 0
    number: kinds.Number = 0.0
    seconds: kinds.Seconds = 1.0
    positive: kinds.Positive = 1.0
    pick: kinds.choice("fair", "fifo") = "fair"  # type: ignore[valid-type]
    names: kinds.Strings = ()
    flag: bool = False
    old_flag: bool = False
    legacy_flags = frozenset({"old_flag"})


def read(**table: Any) -> Table:
    return convert(table, Table, "bbstage.toml: [t]")


def refused(message: str, **table: Any) -> None:
    with pytest.raises(kinds.ConfigError) as caught:
        read(**table)
    assert str(caught.value) == f"bbstage.toml: [t] {message}"


def test_a_size_is_a_string_with_a_unit_or_bytes() -> None:
    assert read(size="512M").size == 512 << 20 and read(size=4096).size == 4096
    for bad in ("lots", True, -1, 1.5):
        with pytest.raises(kinds.ConfigError, match=r"\[t\] size: expected a size"):
            read(size=bad)


def test_a_path_is_a_string() -> None:
    assert read(path="/var/x").path == Path("/var/x")
    refused('path: expected a path (a quoted string, e.g. "/var/lib/bbstage"), got 4', path=4)


def test_a_count_is_a_whole_number_0_or_more_unquoted() -> None:
    assert read(count=0).count == 0 and read(count=4).count == 4
    refused('count: expected a whole number (write it unquoted, e.g. 4), got "4"', count="4")
    refused("count: expected a whole number (write it unquoted, e.g. 4), got true", count=True)
    refused("count: expected a whole number (write it unquoted, e.g. 4), got 4.5", count=4.5)
    refused("count: expected a whole number, 0 or more, got -1", count=-1)


def test_a_number_is_unquoted_0_or_more() -> None:
    assert read(number=7).number == 7.0 and read(number=0.5).number == 0.5
    refused('number: expected a number (write it unquoted, e.g. 7.5), got "7"', number="7")
    refused("number: expected a number, 0 or more, got -1", number=-1)


def test_seconds_and_positive_numbers_are_above_0() -> None:
    assert read(seconds=30).seconds == 30.0 and read(positive=0.5).positive == 0.5
    what = "a number of seconds above 0 (write it unquoted, e.g. 30)"
    refused(f"seconds: expected {what}, got 0", seconds=0)
    refused(f'seconds: expected {what}, got "30"', seconds="30")
    what = "a number above 0 (write it unquoted, e.g. 2)"
    refused(f"positive: expected {what}, got false", positive=False)


def test_a_choice_is_one_of_its_strings() -> None:
    assert read(pick="fifo").pick == "fifo"
    refused('pick: expected fair or fifo, got "lottery"', pick="lottery")
    assert pickle.loads(pickle.dumps(read(pick="fifo"))).pick == "fifo"


def test_a_list_of_strings() -> None:
    assert read(names=["a", "b"]).names == ("a", "b")
    refused('names: expected a list of strings (e.g. ["a", "b"]), got "a"', names="a")
    refused('names: expected a list of strings (e.g. ["a", "b"]), got ["a", 1]', names=["a", 1])


def test_a_boolean_is_toml_s_own_and_old_strings_are_read_deprecated() -> None:
    assert read(flag=True).flag is True
    refused('flag: expected true or false (unquoted), got "true"', flag="true")
    deprecated: list[str] = []
    table = convert({"old_flag": "true"}, Table, "bbstage.toml: [t]", deprecated)
    assert table.old_flag is True
    assert deprecated == [
        'bbstage.toml: [t] old_flag = "true" is deprecated: write old_flag = true (unquoted)'
    ]
    refused('old_flag: expected true or false (unquoted), got "yes"', old_flag="yes")


def test_a_quoted_number_is_refused_alike_in_every_table() -> None:
    for table, key in (("daemon", "transfers"), ("s3", "max_concurrency")):
        with pytest.raises(config.ConfigError) as caught:
            config.from_dict({table: {key: "4"}}, source="bbstage.toml")
        assert str(caught.value) == (
            f"bbstage.toml: [{table}] {key}: expected a whole number (write it unquoted,"
            ' e.g. 4), got "4"'
        )


@pytest.mark.parametrize(
    ("data", "table"),
    [
        ({"daemon": {"transfer": 4}}, "[daemon]"),
        ({"movers": {"engin": "local"}}, "[movers]"),
        ({"fairshare": {"share": 1}}, "[fairshare]"),
        ({"pools": [{"name": "s", "root": "/s", "capacity": "1G", "size": 1}]}, "[[pools]] #1"),
        ({"backends": {"enable": []}}, "[backends]"),
        ({"s3": {"part": 1}}, "[s3]"),
        ({"backends": {"enabled": ["gs"]}, "gs": {"endpoint": "x"}}, "[gs]"),
        ({"backends": {"enabled": ["az"]}, "az": {"endpoints": []}}, "[az]"),
        ({"backends": {"enabled": ["https"]}, "https": {"ca": "x"}}, "[https]"),
        ({"backends": {"enabled": ["sftp"]}, "sftp": {"hosts": []}}, "[sftp]"),
    ],
)
def test_each_table_names_an_unknown_key_and_the_known_ones(
    data: dict[str, Any], table: str
) -> None:
    with pytest.raises(config.ConfigError) as caught:
        config.from_dict(data, source="bbstage.toml")
    assert str(caught.value).startswith(f"bbstage.toml: {table} unknown key ")
    assert "(known: " in str(caught.value)


def test_the_typed_tables_travel_in_the_spec_and_the_old_gs_string_is_deprecated() -> None:
    from bbstage.movers.implementations.fsstore import StoreOptions
    from bbstage.movers.implementations.gcs import GCSSettings
    from bbstage.movers.implementations.s3 import S3Options, S3Settings
    from bbstage.transfer import TransferSpec

    conf = config.from_dict(
        {"backends": {"enabled": ["gs"]}, "gs": {"anonymous": "true"}, "s3": {"retries": 2}},
        source="b.toml",
    )
    assert conf.deprecated == (
        'b.toml: [gs] anonymous = "true" is deprecated: write anonymous = true (unquoted)',
    )
    assert conf.backend_settings["gs"] == GCSSettings(anonymous=True)
    directive = {"source": "gs://bkt/k", "destination": "s3://bkt/k", "source_kind": "gs",
                 "destination_kind": "s3"}  # fmt: skip
    spec = TransferSpec.of_directive(
        "1", directive, uid=0, backend_settings=conf.backend_settings, threads=1, chunk_size=1
    )
    assert isinstance(spec.source_options, StoreOptions)
    assert spec.source_options.settings is conf.backend_settings["gs"]
    assert isinstance(spec.destination_options, S3Options)
    assert isinstance(spec.destination_options.s3, S3Settings)
    assert spec.destination_options.s3.retries == 2
    assert pickle.loads(pickle.dumps(spec)) == spec  # as the executor and Dask send it


def test_the_client_reads_its_keys_without_msgspec(tmp_path: Path) -> None:
    """A job step's Python may have the client's libraries only: ``bbstage.api`` and the
    command's client paths read the config by ``clientconfig``, which imports no msgspec."""
    path = tmp_path / "bbstage.toml"
    path.write_text('[daemon]\napi_address = "10.0.0.1:9755"\ntransfers = 2\n')
    code = (
        "import sys; sys.modules['msgspec'] = None\n"
        "import bbstage.api, bbstage.cli.main\n"
        "from bbstage import clientconfig\n"
        f"print(clientconfig.load_client({str(path)!r}).api_address)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "10.0.0.1:9755"
    path.write_text('[daemon]\napi_address = "nowhere"\n')
    with pytest.raises(config.ConfigError, match=r"\[daemon\] api_address: expected host:port"):
        config.load_client(path)
