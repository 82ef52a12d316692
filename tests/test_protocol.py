"""The messages between the trusted side and a worker: typed, versioned, checked on decoding."""

import pytest
import torch

from kbench.shared import protocol as p


def samples_wire(n: int = 3) -> dict:
    return {"ms": [1.0] * n, "after_ms": [0.0] * n, "idle_ms": [0.0] * n, "host_ms": [0.01] * n,
            "sm_mhz": [None] * n, "mem_mhz": [None] * n, "slowed": [False] * n, "kept": [1, 2]}


@pytest.mark.parametrize("message", [
    p.Load(path="/x.py", module_name="m", class_name="ModelNew", device="cpu",
           reference="/ref.py", model=p.ModelSpec([1, 2.0, (3, 3)], "float32", 5, {"batch": 2})),
    p.Time(params={"batch": 2, "dim": 3}, dtype="float32", distribution="problem",
           model=p.ModelSpec([], "float16", 1, {"layers[0]": 3}), keep=True,
           timing=p.TimingSettings(5.0, 3, 10, 20.0, 0.01, "eager")),
    p.Outputs([3, 1]),
    p.Profiled([p.KernelRun("void l2norm_kernel<256>(float const*, float*, int)", 9.5, ""),
                p.KernelRun("Memset (Device)", 0.5, "aten::zeros")]),
    p.Release(),
    p.Loaded([p.WeightPrint("fc.weight", [2, 3], "float32", [1.0, 2.0, 3.0])]),
    p.KeptOutputs([p.KeptOutput(call=1, seed=7, outputs=[torch.ones(2), 3, 0.5],
                                structure="tuple(tensor, int, float)", norm=1.5)]),
    p.Failed(p.WorkerError("run", "builtins.ValueError", "bad", "trace")),
])
def test_every_message_survives_the_wire(message):
    decoded = p.decode(p.encode(message), (type(message),))
    assert type(decoded) is type(message)
    if isinstance(message, p.KeptOutputs):
        assert torch.equal(decoded.outputs[0].outputs[0], message.outputs[0].outputs[0])
        assert decoded.outputs[0].outputs[1:] == [3, 0.5] and decoded.outputs[0].seed == 7
    else:
        assert decoded == message


def test_timed_samples_are_checked_as_they_are_decoded():
    wire = {"v": p.VERSION, "kind": "Timed", "samples": samples_wire()}
    assert p.decode(wire, (p.Timed,)).samples.kept == [1, 2]
    wire["samples"]["ms"][1] = float("nan")
    with pytest.raises(p.BadSamples, match="no valid timings"):
        p.decode(wire, (p.Timed,))


@pytest.mark.parametrize("wire, message", [
    ("ok", "a message is a dict"),
    ({"v": 1, "kind": "Released"}, "protocol version 1"),
    ({"v": p.VERSION, "kind": "Timed", "samples": samples_wire()}, "expected Released"),
    ({"v": p.VERSION, "kind": "os.system"}, "kind 'os.system'"),
    ({"v": p.VERSION, "kind": "Prepared", "calls": True}, "Prepared.calls: expected int"),
    ({"v": p.VERSION, "kind": "Prepared", "calls": 3, "extra": 1}, "unknown field 'extra'"),
    ({"v": p.VERSION, "kind": "Prepared"}, "missing field 'calls'"),
    ({"v": p.VERSION, "kind": "ClockedPass", "calls": 3, "kept": [1, "2"]}, r"kept\[1\]"),
    ({"v": p.VERSION, "kind": "Ran", "outputs": [[1.0]], "returned": [torch.ones(1)],
      "structure": "tensor", "aliases_input": False}, r"Ran.outputs\[0\]"),
    ({"v": p.VERSION, "kind": "Ran", "outputs": ["x"], "returned": [torch.ones(1)],
      "structure": "tensor", "aliases_input": False}, r"Ran.outputs\[0\]"),
])
def test_what_a_worker_never_sends_is_refused(wire, message):
    expected = (p.Released,) if isinstance(wire, dict) and wire.get("kind") == "Timed" else \
        (p.Released, p.Prepared, p.ClockedPass, p.Ran)
    with pytest.raises(p.ProtocolError, match=message):
        p.decode(wire, expected)


def test_a_failure_is_an_answer_to_any_request():
    failed = p.encode(p.Failed(p.WorkerError("import", "builtins.ImportError", "no")))
    assert isinstance(p.decode(failed, p.Outputs.answers), p.Failed)


def test_tensors_cross_as_the_worker_s_own_memory_never_copies():
    out = torch.ones(4)
    wire = p.encode(p.KeptOutputs([p.KeptOutput(call=1, seed=2, outputs=[out],
                                                 structure="tensor", norm=None)]))
    assert wire["outputs"][0]["outputs"][0] is out  # shared: later writes stay visible


@pytest.mark.parametrize("wire", [
    {"v": torch.ones(2), "kind": "Released"},
    {"v": p.VERSION, "kind": [[[[]]]]},
    {"v": 10**5000, "kind": "Released"},
    {"v": p.VERSION, "kind": "Prepared", "calls": 1, ("x",) * 3: 1},
])
def test_hostile_values_are_refused_without_echoing_them(wire):
    with pytest.raises(p.ProtocolError) as err:
        p.decode(wire, (p.Released, p.Prepared))
    assert len(str(err.value)) < 200
