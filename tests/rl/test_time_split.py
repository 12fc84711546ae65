"""The RL step's wall-time split (rl.phases.time_split): parts that add up to the step, never more."""

from __future__ import annotations

import types

import pytest

from rl.phases.time_split import SPLIT, rollout_split, wait_s


def _episodes(*verify_s: float) -> list[types.SimpleNamespace]:
    return [types.SimpleNamespace(verification={"reward": 1.0, "duration_s": v}) for v in verify_s]


def test_non_decode_wall_time_is_split_by_work():
    # 10 s of rollout, 4 s decoding: 6 s waited on the environment, whose jobs did 8 s of tool work
    # (in parallel) and 4 s of judging: tools get 2/3 of the 6 s, verification 1/3.
    timing = {"total_s": 10.0, "generate_s": 4.0, "env_s": 10.0, "reset_s": 2.0}
    split = rollout_split(timing, _episodes(1.0, 3.0))
    assert split == {"time/tools_s": pytest.approx(4.0), "time/verify_s": pytest.approx(2.0)}


def test_queue_wait_takes_its_share_and_leaves_it_to_waiting():
    # 6 s waited; work: 2 s tools, 2 s judging, 2 s queued: a third each, the queue's third is waiting.
    timing = {"total_s": 10.0, "generate_s": 4.0, "env_s": 4.0, "reset_s": 0.0, "job_queue_wait_s": 2.0}
    split = rollout_split(timing, _episodes(2.0))
    assert split == {"time/tools_s": pytest.approx(2.0), "time/verify_s": pytest.approx(2.0)}
    metrics = {"time/generate_s": 4.0, **split, "time/learn_s": 1.0}
    assert wait_s(metrics, 11.0) == pytest.approx(2.0)  # the 2 s of queueing come back as waiting


def test_parts_add_up_to_the_step():
    timing = {"total_s": 3.0, "generate_s": 1.0, "env_s": 5.0, "reset_s": 1.0}
    metrics = {"time/generate_s": 1.0, **rollout_split(timing, _episodes(0.5, 0.5)), "time/learn_s": 2.0}
    metrics["time/wait_s"] = wait_s(metrics, 5.5)
    assert sum(metrics[k] for k in SPLIT) == pytest.approx(5.5)
    assert metrics["time/wait_s"] == pytest.approx(0.5)


def test_no_environment_work_and_overlap_never_go_negative():
    split = rollout_split({"total_s": 1.0, "generate_s": 1.0, "env_s": 0.0, "reset_s": 0.0}, _episodes())
    assert split == {"time/tools_s": 0.0, "time/verify_s": 0.0}
    # an asynchronous rollout overlapped the previous update: its parts exceed the step; waiting is 0
    assert wait_s({"time/generate_s": 3.0, "time/learn_s": 2.0}, 4.0) == 0.0


def test_generate_splits_into_prefill_and_decode_and_the_engine_counts_what_it_computed():
    """The engine rollout's timing: prefill and decode add up to generate (decode keeps the engine's
    bookkeeping); padded counts sit beside the real ones; active slots are tokens per decode step."""
    from rl.phases.rl_phase import engine_metrics

    timing = {
        "generate_s": 10.0, "prefill_s": 3.5, "decode_s": 6.0, "prefill_tokens": 1000.0,
        "prefill_tokens_reused": 4000.0, "prefill_tokens_padded": 1500.0, "decode_tokens": 800.0,
        "decode_tokens_padded": 1200.0, "decode_steps": 100.0,
    }  # fmt: skip
    m = engine_metrics(timing)
    assert m["time/prefill_s"] + m["time/decode_s"] == pytest.approx(timing["generate_s"])
    assert (m["time/prefill_s"], m["rollout/active_slots_mean"]) == (3.5, 8.0)
    assert (m["rollout/prefill_tokens_padded"], m["rollout/decode_tokens_padded"]) == (1500.0, 1200.0)
    # a timer's rounding never makes decode negative
    assert engine_metrics({**timing, "prefill_s": 10.2})["time/decode_s"] == 0.0
