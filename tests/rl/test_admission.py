"""rl.rollout.admission: episodes holding a sandbox start only while the pool has one; the rest wait their turn.

The end-to-end case (a sandbox-holding domain with more episodes than sandboxes trains with no
anomaly, and the lock-step rollout is refused) is in tests/envs/test_new_domain.py.
"""

from __future__ import annotations

from rl.rollout.admission import CAPACITY_FIELD, Admission, progress_error


def test_holding_episodes_beyond_the_capacity_wait_and_start_in_order_as_others_end():
    started: list[str] = []
    gate = Admission(lambda: 2)
    for name in "abcde":
        gate.offer(name, True, lambda name=name: started.append(name))
    assert started == ["a", "b"] and gate.waiting == 3 and gate.holding == 2
    gate.ended(True)
    assert started == ["a", "b", "c"] and gate.holding == 2
    for _ in range(4):
        gate.ended(True)
    assert started == list("abcde") and gate.waiting == 0 and gate.holding == 0


def test_stateless_episodes_pass_freely_and_free_no_slot():
    started: list[str] = []
    gate = Admission(lambda: 1)
    gate.offer("held", True, lambda: started.append("held"))
    gate.offer("stateless", False, lambda: started.append("stateless"))
    gate.offer("queued", True, lambda: started.append("queued"))
    assert started == ["held", "stateless"]
    gate.ended(False)  # a stateless episode ending frees nothing
    assert started == ["held", "stateless"]
    gate.ended(True)
    assert started == ["held", "stateless", "queued"]


def test_a_failed_rollouts_waiting_episodes_are_dropped_and_a_pool_with_no_host_still_admits_one():
    started: list[tuple[int, int]] = []
    capacity = [0]
    gate = Admission(lambda: capacity[0])
    for key in [(0, 0), (0, 1), (1, 0)]:
        gate.offer(key, True, lambda key=key: started.append(key))
    assert started == [(0, 0)]  # one goes (and fails as host_unavailable) rather than all waiting forever
    gate.drop(lambda key: key[0] != 0)
    capacity[0] = 4
    gate.ended(True)
    assert started == [(0, 0), (1, 0)]


def test_only_a_lock_step_rollout_over_capacity_with_a_holding_domain_is_refused():
    refused = progress_error(lock_step=True, holding_domains=["sql"], episodes=8, capacity=4)
    assert refused and CAPACITY_FIELD + "=4" in refused and "8 episodes" in refused and "\n" not in refused
    assert progress_error(lock_step=False, holding_domains=["sql"], episodes=8, capacity=4) is None
    assert progress_error(lock_step=True, holding_domains=[], episodes=8, capacity=4) is None
    assert progress_error(lock_step=True, holding_domains=["sql"], episodes=4, capacity=4) is None
