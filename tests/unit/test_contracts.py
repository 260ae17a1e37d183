"""The contracts of bbstage/daemon/contracts.py, checked without a type checker: both executors are
``Executor``s (``isinstance``: every member present) with the contract's signatures."""

from __future__ import annotations

import inspect

import pytest

from bbstage.config import Movers
from bbstage.daemon.contracts import Executor
from bbstage.daemon.dask_executor import DaskExecutor
from bbstage.daemon.executor import TransferExecutor

MEMBERS = sorted(name for name in vars(Executor) if not name.startswith("_"))


def test_the_contract_names_what_the_engine_server_and_metrics_use() -> None:
    assert MEMBERS == [
        "abandon", "cancel", "hold", "queued", "running", "shutdown", "submit", "users", "why"
    ]  # fmt: skip


def test_both_executors_are_executors_and_a_partial_one_is_not() -> None:
    local = TransferExecutor(1)
    try:
        assert isinstance(local, Executor)
    finally:
        local.shutdown()
    remote = DaskExecutor(Movers(executor="dask"))  # connects at its first submit: never here
    try:
        assert isinstance(remote, Executor)
    finally:
        remote.shutdown()

    class NoCancel:
        def submit(self) -> None: ...

    assert not isinstance(NoCancel(), Executor)


@pytest.mark.parametrize("cls", [TransferExecutor, DaskExecutor], ids=lambda c: c.__name__)
def test_each_member_has_the_contracts_signature(cls: type) -> None:
    for name in MEMBERS:
        wanted, got = inspect.getattr_static(Executor, name), inspect.getattr_static(cls, name)
        if isinstance(wanted, property):
            assert isinstance(got, property), f"{cls.__name__}.{name} is not a property"
            continue
        want, have = inspect.signature(wanted), inspect.signature(got)
        assert [(p.name, p.kind, p.default) for p in have.parameters.values()] == [
            (p.name, p.kind, p.default) for p in want.parameters.values()
        ], f"{cls.__name__}.{name}{have} is not {name}{want}"
        assert have.return_annotation == want.return_annotation, f"{cls.__name__}.{name}"
