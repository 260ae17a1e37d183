"""``[s3]`` (and the daemon's other typed keys) read from real TOML: ``file_mode = 0o644`` is
0o644 (it was 0o420) and ``payload_signing = "false"`` is an error (it was true)."""

from __future__ import annotations

from pathlib import Path

import pytest

from bbstage import config
from bbstage.movers import MoverOptions, TransferError
from bbstage.movers.implementations import s3 as s3m
from bbstage.movers.implementations.s3.settings import S3Options, check_endpoint


def load(tmp_path: Path, text: str) -> config.Config:
    path = tmp_path / "bbstage.toml"
    path.write_text(text)
    return config.load(path)


def s3_settings(tmp_path: Path, line: str) -> s3m.S3Settings:
    settings = load(tmp_path, f"[s3]\n{line}\n").backend_settings["s3"]
    assert isinstance(settings, s3m.S3Settings)
    return settings


@pytest.mark.parametrize("value", ["0o644", '"644"', '"0644"', '"0o644"', "420"])
def test_file_mode_integer_is_the_mode_and_strings_are_octal(tmp_path: Path, value: str) -> None:
    assert s3_settings(tmp_path, f"file_mode = {value}").file_mode == 0o644


def test_file_mode_reaches_downloaded_files(tmp_path: Path) -> None:
    table = load(tmp_path, "[s3]\nfile_mode = 0o640").backend_settings["s3"]
    mover = s3m.S3Download(MoverOptions(source=S3Options(table)))
    assert mover._file("s3://b/k", "/x/k", 1, None).mode == 0o640
    assert mover._dir("/x").mode == 0o750


@pytest.mark.parametrize("value", ["644", '"1777"', '"rw-r--r--"', "true", '""', "-1"])
def test_bad_file_mode_is_an_error_naming_the_key(tmp_path: Path, value: str) -> None:
    with pytest.raises(config.ConfigError, match=r"\[s3\] file_mode: .*0o644"):
        load(tmp_path, f"[s3]\nfile_mode = {value}\n")


def test_payload_signing_takes_toml_booleans_only(tmp_path: Path) -> None:
    assert s3_settings(tmp_path, "payload_signing = true").payload_signing is True
    assert s3_settings(tmp_path, "payload_signing = false").payload_signing is False
    for value in ['"false"', '"true"', "0", '"no"']:
        with pytest.raises(config.ConfigError, match=r"\[s3\] payload_signing: .*true or false"):
            load(tmp_path, f"[s3]\npayload_signing = {value}\n")


def test_verify_is_a_boolean_or_a_ca_bundle_path(tmp_path: Path) -> None:
    assert s3_settings(tmp_path, "verify = false").verify is False
    assert s3_settings(tmp_path, 'verify = "/etc/ssl/ca.pem"').verify == "/etc/ssl/ca.pem"
    for value in ['"false"', '"True"', '"0"', '""']:
        with pytest.raises(config.ConfigError, match=r"\[s3\] verify: .*true or false"):
            load(tmp_path, f"[s3]\nverify = {value}\n")


@pytest.mark.parametrize(
    ("line", "key"),
    [
        ("files_in_flight = true", "files_in_flight"),
        ("files_in_flight = 8.5", "files_in_flight"),
        ("part_size = true", "part_size"),
        ("read_timeout = false", "read_timeout"),
    ],
)
def test_s3_numbers_are_not_booleans_or_cut_floats(tmp_path: Path, line: str, key: str) -> None:
    with pytest.raises(config.ConfigError, match=rf"\[s3\] {key}: "):
        load(tmp_path, f"[s3]\n{line}\n")
    # a quoted number is refused as everywhere in the file (it was read as 8 here alone)
    with pytest.raises(config.ConfigError, match=r'\[s3\] files_in_flight: .*unquoted.*got "8"'):
        load(tmp_path, '[s3]\nfiles_in_flight = "8"\n')
    assert s3_settings(tmp_path, "files_in_flight = 8").files_in_flight == 8


@pytest.mark.parametrize(
    ("line", "key"),
    [
        ("transfers = true", "transfers"),
        ('transfers = "4"', "transfers"),
        ("transfers = 4.5", "transfers"),
        ('retention_days = "7"', "retention_days"),
        ("reconcile_interval = false", "reconcile_interval"),
        ("log_level = true", "log_level"),
        ("chunk_size = true", "chunk_size"),
    ],
)
def test_daemon_keys_are_typed(tmp_path: Path, line: str, key: str) -> None:
    with pytest.raises(config.ConfigError, match=rf"\[daemon\] {key}: "):
        load(tmp_path, f"[daemon]\n{line}\n")


def test_daemon_keys_of_the_right_type_load(tmp_path: Path) -> None:
    cfg = load(
        tmp_path,
        "[daemon]\ntransfers = 2\nretention_days = 7\nreconcile_interval = 2.5\n"
        'log_level = "debug"\n',
    )
    assert (cfg.transfers, cfg.retention_days, cfg.reconcile_interval) == (2, 7.0, 2.5)
    assert cfg.log_level == "debug"


def test_allowed_endpoints(tmp_path: Path) -> None:
    """The site's endpoint_url and the listed endpoints; host:port means https; http only
    when listed as http://; AWS's own https endpoints only where the site names none."""
    site = s3_settings(
        tmp_path,
        'endpoint_url = "https://s3.example.org"\n'
        'allowed_endpoints = ["rgw2.example.org:7480", "http://10.0.0.5:8000", "HTTPS://S3.Lab"]',
    )
    for ok in (
        "https://s3.example.org",
        "https://s3.example.org:443/",
        "https://rgw2.example.org:7480",
        "http://10.0.0.5:8000",
        "https://s3.lab",
    ):
        check_endpoint(site, ok, "test")
    for refused in (
        "http://s3.example.org",
        "http://rgw2.example.org:7480",
        "https://10.0.0.5:8000",
        "http://10.0.0.5:8001",
        "https://s3.lab:8443",
        "http://169.254.169.254",
        "https://s3.us-east-1.amazonaws.com",  # the site named its own endpoint
        "not a url",
    ):
        with pytest.raises(TransferError, match=r"not allowed .*\[s3\] allowed_endpoints"):
            check_endpoint(site, refused, "test")
    aws = s3_settings(tmp_path, "region = 'eu-west-1'")
    check_endpoint(aws, "https://s3.eu-west-1.amazonaws.com", "test")
    for refused in ("http://s3.amazonaws.com", "https://amazonaws.com.evil.org", "https://x"):
        with pytest.raises(TransferError, match="not allowed"):
            check_endpoint(aws, refused, "test")


@pytest.mark.parametrize(
    "line",
    [
        'allowed_endpoints = "s3.example.org"',
        'allowed_endpoints = ["ftp://s3.example.org"]',
        'allowed_endpoints = ["s3.example.org:port"]',
        "allowed_endpoints = [9000]",
        'endpoint_url = "s3 example"',
    ],
)
def test_bad_endpoints_are_config_errors(tmp_path: Path, line: str) -> None:
    with pytest.raises(config.ConfigError, match=r"\[s3\] (allowed_endpoints|endpoint_url): "):
        load(tmp_path, f"[s3]\n{line}\n")
