"""The copy-bandwidth bound accuses only what it can prove: the bytes a call must move
counted as a lower bound (kbench.problems.trial: what it writes, and of what it reads, what
it must: a table looked up, an input gathered, indexed, masked or sliced counts what the op
returns or covers), and a finding only where those bytes cannot stay in a cache between calls
(kbench.grading.timing.integrity.within_copy_bandwidth)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from kbench.grading.channel import Stop
from kbench.grading.timing import integrity
from kbench.problems import trial
from kbench.problems.load import load_task
from kbench.results.run_record import Benchmark, Measurement
from kbench.results.verdict import Status

_PROBLEM = '''import torch
import torch.nn as nn

rows = 4096
width = 256
picks = 64


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.table = nn.Embedding(rows, width)
        self.unused = nn.Parameter(torch.zeros(rows, width))

    def forward(self, ids, x):
        looked_up = self.table(ids)                      # picks rows of the table
        gathered = x.index_select(0, ids)                # picks rows of x
        picked = torch.gather(x, 1, ids[:16, None].expand(16, 2) % width)  # 32 values of x
        head = x[:, :8].sum(dim=1)                       # 8 columns of every row
        return looked_up + gathered, picked, head


def get_inputs():
    return [torch.randint(0, rows, (picks,)), torch.randn(rows, width)]


def get_init_inputs():
    return []
'''


def test_a_call_counts_what_it_must_read_not_every_byte_it_holds(tmp_path):
    path = tmp_path / "lookups.py"
    path.write_text(_PROBLEM)
    module = load_task(str(path)).reference_module()
    work = trial.on_meta(module, {"rows": 4096, "width": 256, "picks": 64})
    f4 = 4
    ids, row = 64 * 8, 256 * f4
    out = 64 * row + 16 * 2 * f4 + 4096 * f4  # the sum of lookups, the picks, the heads
    held = ids + 4096 * row + 2 * 4096 * row + out  # inputs, table and unused, outputs
    assert work.bytes == held
    # The ids whole; 64 rows of the table (never the unused parameter); of x, the most one op
    # reads: 8 columns of every row (the slice), more than 64 rows or 32 values.
    assert work.moved == ids + 64 * row + 4096 * 8 * f4 + out
    assert work.moved < work.bytes / 3


def test_a_call_whose_reads_depend_on_its_data_has_no_bound(tmp_path):
    # A boolean mask's selection cannot be sized without the data: nothing to count, so the
    # bound can accuse nothing (its figures show no GB/s).
    path = tmp_path / "masked.py"
    path.write_text(_PROBLEM.replace("looked_up + gathered, picked, head",
                                     "x[x > 0].sum(), picked, head"))
    task = load_task(str(path))
    assert task.min_bytes({"rows": 4096, "width": 256, "picks": 64}, "float32") == 0


def _bench(gbps: float, nbytes: int) -> Benchmark:
    bench = Benchmark(params={"n": 1}, dtype="float32", nbytes=nbytes)
    bench.candidate = Measurement(ms=1.0, ci=[1.0, 1.0], samples=10, gbps=gbps)
    return bench


@pytest.mark.parametrize("device, nbytes, flagged", [
    ("cpu", 10 << 30, False),  # a CPU's cache may hold them, however much kbench flushes
    ("cuda", 8 << 20, False),  # they fit the L2
    ("cuda", 10 << 30, True),  # far past the L2: the calls cannot have moved them
])
def test_the_bound_accuses_only_past_the_cache(monkeypatch, device, nbytes, flagged):
    monkeypatch.setattr(integrity, "_l2_bytes", lambda ctx: 50 << 20)
    ctx = SimpleNamespace(device=torch.device(device))
    notes: list[str] = []
    integrity.within_copy_bandwidth(ctx, _bench(100.0, nbytes), 1000.0, notes)  # below copy
    assert notes == []
    if flagged:
        with pytest.raises(Stop) as stop:
            integrity.within_copy_bandwidth(ctx, _bench(2000.0, nbytes), 1000.0, notes)
        assert stop.value.verdict.status is Status.FLAGGED
        assert "cannot have moved the bytes" in stop.value.verdict.reason
    else:
        integrity.within_copy_bandwidth(ctx, _bench(2000.0, nbytes), 1000.0, notes)
        assert len(notes) == 1 and "2.0x the copy bandwidth" in notes[0] and \
            "not judged" in notes[0]


def test_honest_lookups_graded_on_a_cpu_are_not_accused(tmp_path, cache_dir):
    # The bundled embedding baseline (flagged once on a 2-core machine: its whole table
    # counted) and a gather of rows, timed on the CPU.
    from conftest import FIXTURES, ROOT, grade

    for name, args in (
            ("embedding", [str(ROOT / "kbench" / "submissions" / "embedding_torch.py")]),
            ("gather", [str(FIXTURES / "problem_subs" / "gather_rows" / "honest.py"),
                        "--task", str(FIXTURES / "problems" / "gather_rows.py")])):
        code, results = grade([*args, "--device", "cpu", "--profile", "quick", "--seed", "3"],
                              tmp_path / name, cache_dir)
        (sub,) = results["submissions"]
        assert code == 0 and sub["status"] == "ok", sub["reason"]
        assert not any("copy bandwidth" in flag and "not judged" not in flag
                       for flag in sub["flags"])
