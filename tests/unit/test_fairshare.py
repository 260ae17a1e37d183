"""The scheduling policy alone: fair shares, weights, a lone user, order within a user."""

from __future__ import annotations

from typing import Any

import pytest

from bbstage.daemon.fairshare import FIFO, Policy, Queue

A, B, C = 1001, 1002, 1003


def fill(policy: Policy, user: int, n: int, prefix: str = "") -> list[str]:
    keys = [f"{prefix or user}:{i}" for i in range(n)]
    for key in keys:
        policy.add(key, user)
    return keys


def test_a_lone_user_uses_every_slot() -> None:
    policy = Policy(4)
    fill(policy, A, 10)
    assert policy.pick() == ["1001:0", "1001:1", "1001:2", "1001:3"]
    assert policy.pick() == []  # no more: the slots are taken and nobody else waits


def test_another_users_first_transfer_gets_the_next_free_slot() -> None:
    """A has 100 queued and every slot; B's one transfer starts as soon as it comes (a user
    with nothing running is admitted beyond the slots), and the next slot freed goes to the
    user under their share, B again when B has more."""
    policy = Policy(4)
    heavy = fill(policy, A, 100)
    assert policy.pick() == heavy[:4]
    policy.add("b:0", B)
    policy.add("b:1", B)
    assert policy.pick() == ["b:0"]  # beyond the 4 slots: B had none running
    policy.release(heavy[0])
    assert policy.pick() == []  # 4 still run (A 3, B 1): the freed slot refills nothing
    policy.release(heavy[1])
    assert policy.pick() == ["b:1"]  # B (1 running) is under A (2 running)
    policy.release(heavy[2])
    assert policy.pick() == [heavy[4]]  # A 1 running, B 2: A's turn


def test_shares_are_equal_when_several_wait() -> None:
    policy = Policy(6)
    for user in (A, B, C):
        fill(policy, user, 10)
    started = policy.pick()
    assert [k.split(":")[0] for k in started].count(str(A)) == 2
    assert policy.users() == {A: (8, 2), B: (8, 2), C: (8, 2)}


def test_weights_divide_the_slots() -> None:
    policy = Policy(6, weights={A: 2.0})
    fill(policy, A, 10)
    fill(policy, B, 10)
    policy.pick()
    assert policy.users() == {A: (6, 4), B: (8, 2)}


def test_within_a_user_the_smallest_order_goes_first_then_arrival() -> None:
    policy = Policy(1)
    policy.add("late-start", A, (200.0,))
    policy.add("early-start", A, (100.0,))
    policy.add("unknown-1", A, (float("inf"),))
    policy.add("unknown-2", A, (float("inf"),))
    order = []
    while policy.waiting:
        (key,) = policy.pick()
        order.append(key)
        policy.release(key)
    assert order == ["early-start", "late-start", "unknown-1", "unknown-2"]


def test_fifo_serves_in_arrival_order_whoever_waits() -> None:
    policy = Policy(4, mode=FIFO)
    heavy = fill(policy, A, 100)
    policy.add("b:0", B)
    assert policy.pick() == heavy[:4]
    policy.release(heavy[0])
    assert policy.pick() == [heavy[4]]  # B waits behind A's 96
    assert policy.reason("b:0") == (
        "queued: 95 transfers ahead (first come, first served); 2 users share 4 slots"
    )


def test_never_more_than_twice_the_slots_run() -> None:
    policy = Policy(2)
    fill(policy, A, 5)
    policy.pick()
    for user in range(2000, 2010):
        policy.add(f"{user}:0", user)
    assert len(policy.pick()) == 2  # two newcomers beyond the slots, the others wait
    assert policy.running == 4


def test_the_reason_names_what_is_ahead_and_who_shares() -> None:
    policy = Policy(8)
    fill(policy, A, 12)
    policy.pick()
    assert policy.reason("1001:0") is None  # running
    assert policy.reason("1001:11") == (
        "queued: 3 of your transfers ahead, 8 running; 1 user share 8 slots"
    )


def test_a_cancelled_waiting_transfer_leaves_its_queue() -> None:
    policy = Policy(1)
    fill(policy, A, 3)
    assert policy.pick() == ["1001:0"]
    assert policy.remove("1001:1") and not policy.remove("1001:1")
    policy.release("1001:0")
    assert policy.pick() == ["1001:2"]


def test_a_key_is_queued_once() -> None:
    policy = Policy(1)
    policy.add("k", A)
    with pytest.raises(ValueError, match="already queued"):
        policy.add("k", A)


def test_the_queue_starts_what_the_policy_picks_outside_its_lock() -> None:
    started: list[tuple[str, str]] = []
    queue: Queue[str] = Queue(Policy(1), lambda key, item: started.append((key, item)))
    queue.add("a", A, (), "first")
    queue.add("b", A, (), "second")
    assert started == [("a", "first")]
    assert queue.withdraw("a") is None  # running, not waiting
    queue.release("a")
    assert started == [("a", "first"), ("b", "second")]
    queue.add("c", A, (), "third")
    assert queue.drain() == ["third"]


def test_the_config_names_the_policy_the_weights_and_the_stall_timeout() -> None:
    from bbstage.config import from_dict

    config = from_dict(
        {
            "daemon": {"stall_timeout": 30},
            "fairshare": {"policy": "fifo", "weights": {"root": 2, "1234": 0.5}},
        }
    )
    assert config.stall_timeout == 30.0
    assert config.fairshare.policy == "fifo"
    assert config.fairshare.weights == {0: 2.0, 1234: 0.5}
    assert from_dict({}).fairshare.policy == "fair" and from_dict({}).stall_timeout == 300


@pytest.mark.parametrize(
    ("section", "message"),
    [
        ({"fairshare": {"policy": "lottery"}}, 'policy: expected fair or fifo, got "lottery"'),
        ({"fairshare": {"weights": {"nosuchuser-x": 2}}}, "weights.nosuchuser-x: no such user"),
        (
            {"fairshare": {"weights": {"root": 0}}},
            "weights.root: expected a number above 0 (write it unquoted, e.g. 2), got 0",
        ),
        (
            {"fairshare": {"weights": {"root": "2"}}},
            'weights.root: expected a number above 0 (write it unquoted, e.g. 2), got "2"',
        ),
        ({"fairshare": {"share": 1}}, "[fairshare] unknown key 'share' (known: policy, weights)"),
        (
            {"daemon": {"stall_timeout": 0}},
            "stall_timeout: expected a number of seconds above 0 (write it unquoted, e.g. 30),"
            " got 0",
        ),
    ],
)
def test_a_bad_fairshare_config_names_the_key(section: dict[str, Any], message: str) -> None:
    from bbstage.config import ConfigError, from_dict

    with pytest.raises(ConfigError) as caught:
        from_dict(section)
    assert message in str(caught.value)
