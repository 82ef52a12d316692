"""bench/identity_lanes.py: how bench/kernelbench_identity.py spreads its kbench runs over the
cores and GPUs of a host, and packs batches within each GPU's memory."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
import identity_lanes as il  # noqa: E402


def test_lanes_take_each_gpu_its_own_share_of_the_cores_in_turn_over_the_gpus() -> None:
    lanes = il.make_lanes(list(range(48)), ["0", "1", "2"], 6)
    assert [lane.gpu for lane in lanes] == ["0", "1", "2", "0", "1", "2"]
    for gpu, share in (("0", range(0, 16)), ("1", range(16, 32)), ("2", range(32, 48))):
        mine = [c for lane in lanes if lane.gpu == gpu for c in lane.cores]
        assert sorted(mine) == list(share)  # its share, whole, and no core twice
    alone = il.make_lanes(list(range(48)), ["0", "1", "2"], 3)
    assert [(lane.gpu, lane.cores[0], lane.cores[-1]) for lane in alone] == [
        ("0", 0, 15), ("1", 16, 31), ("2", 32, 47)]
    # no GPU named: every lane inherits the visible one; never more lanes than cores
    assert [lane.gpu for lane in il.make_lanes(list(range(16)), [None], 6)] == [None] * 6
    assert len(il.make_lanes([0, 1], [None], 6)) == 2


def _scheduler(gpus: str, budget_gib: float) -> il.Scheduler:
    args = argparse.Namespace(shards=2, gpus=gpus, device="cpu", deadline_s=None,
                              begun=time.monotonic())
    scheduler = il.Scheduler(args, {}, Path("."), Path("."), {"needs": {}}, lambda: None)
    scheduler.budget = dict.fromkeys(scheduler.gpus, budget_gib)
    return scheduler


def test_a_batch_starts_where_it_fits_beside_what_runs_on_that_gpu() -> None:
    scheduler = _scheduler("0,1", 100.0)
    lane0, lane1 = scheduler.lanes
    running = il.Batch(1, ["a"], 40.0, lane=lane0)  # holds 80 GiB of GPU 0
    large, small = il.Batch(2, ["b"], 30.0), il.Batch(3, ["c"], 10.0)  # 60 and 20 GiB
    chosen = scheduler._startable([large, small], [running], [lane0, lane1])
    # the large one does not fit beside GPU 0's 80 GiB, the small one does; GPU 1 is empty
    assert [(b.number, b.lane.gpu) for b in chosen] == [(3, "0"), (2, "1")]


def test_a_batch_alone_on_its_gpu_starts_even_past_the_budget_and_one_at_a_time() -> None:
    scheduler = _scheduler("0", 50.0)
    (lane,) = scheduler.alone_lanes()
    huge, other = il.Batch(1, ["a"], 60.0), il.Batch(2, ["b"], 1.0)
    chosen = scheduler._startable([huge, other], [], [lane])
    assert [b.number for b in chosen] == [1]  # the one lane: the largest first, alone


def test_near_the_deadline_a_batch_is_cut_to_what_fits_and_then_none_starts() -> None:
    scheduler = _scheduler("0", 100.0)
    scheduler.args.deadline_s = il._BATCH_S + 2.5 * il._PROBLEM_S  # room for two problems
    todo = [il.Batch(1, ["a", "b", "c", "d", "e"], 1.0)]
    chosen = scheduler._startable(todo, [], scheduler.lanes[:1])
    assert [b.problems for b in chosen] == [["a", "b"]]
    assert [b.problems for b in todo] == [["a", "b"], ["c", "d", "e"]]  # the rest stays to do
    scheduler.args.deadline_s = il._BATCH_S  # no room for one
    assert scheduler._startable(todo[1:], [], scheduler.lanes[:1]) == []
