"""The generic backends adopt the shared suite (``abstract.BackendSuite``), each against its
server of scripts/local-stores: GCS (gcp-storage-emulator), Azure Blob (Azurite), SFTP
(OpenSSH), HTTPS (a static server with a test CA, trusted through ``[https] ca_bundle``:
verification stays on)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from bbstage.movers.implementations.generic import StoreOptions
from tests.backends.abstract import ODD, BackendSuite
from tests.backends.stores import Store, open_store, stores_env, user_home

__all__ = ["stores_env"]  # the session fixture, registered here


class TestGCS(BackendSuite):
    # gcp-storage-emulator cuts an object name at ";" (its URL parser); GCS keeps it
    odd = ODD.replace(";", "")

    @pytest.fixture
    def store(self, stores_env: dict[str, str]) -> Iterator[Store]:
        options = StoreOptions(
            {"endpoint_url": stores_env["BBSTAGE_GS_ENDPOINT"], "anonymous": "true"}
        )
        yield from open_store("gs", stores_env, options)


class TestAzure(BackendSuite):
    @pytest.fixture
    def store(
        self, stores_env: dict[str, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
    ) -> Iterator[Store]:
        user_home(tmp_path, monkeypatch)  # the user's connection string, in their home
        yield from open_store("az", stores_env, StoreOptions({}))


class TestSFTP(BackendSuite):
    @pytest.fixture
    def store(
        self, stores_env: dict[str, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
    ) -> Iterator[Store]:
        user_home(tmp_path, monkeypatch)  # the user's key and known_hosts
        yield from open_store("sftp", stores_env, StoreOptions({}))


class TestHTTPS(BackendSuite):
    resumes = False  # fsspec's HTTP reads no Last-Modified: a resumed transfer copies again

    @pytest.fixture
    def store(self, stores_env: dict[str, str]) -> Iterator[Store]:
        options = StoreOptions({"ca_bundle": stores_env["BBSTAGE_HTTPS_CA"]})
        yield from open_store("https", stores_env, options)
