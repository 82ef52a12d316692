import pickle
from multiprocessing.reduction import ForkingPickler

import pytest
import torch

from kbench.results.verdict import Status, Verdict, from_error
from kbench.sandbox import safe_loads
from kbench.shared.protocol import WorkerError


def err(kind, message, stage="run"):
    return WorkerError(stage=stage, type=kind, message=message)


@pytest.mark.parametrize("error, device, status", [
    (err("builtins.RuntimeError", "Error building extension 'x'", "import"), "cpu",
     Status.BUILD_ERROR),
    (err("builtins.ModuleNotFoundError", "No module named 'x'", "import"), "cpu",
     Status.IMPORT_ERROR),
    (err("torch.AcceleratorError", "CUDA error: an illegal memory access was encountered"),
     "cuda", Status.CUDA_ERROR),
    (err("torch.OutOfMemoryError", "CUDA out of memory. Tried to allocate 2 GiB"), "cuda",
     Status.OUT_OF_MEMORY),
    (err("builtins.RuntimeError", "DefaultCPUAllocator: can't allocate memory"), "cpu",
     Status.OUT_OF_MEMORY),
    (err("builtins.RuntimeError", "Found no NVIDIA driver on your system."), "cpu",
     Status.SKIPPED),
    (err("builtins.ValueError", "bad"), "cpu", Status.RUNTIME_ERROR),
])
def test_worker_errors_classified(error, device, status):
    verdict = from_error(error, "case 0", device, log="")
    assert verdict.status is status
    assert verdict.reason


def test_build_error_quotes_first_compiler_line():
    log = "noise\nfoo.cu(3): error: identifier \"bar\" is undefined\nmore\n"
    verdict = from_error(err("builtins.RuntimeError", "Error building extension 'x'", "import"),
                         "build", "cpu", log)
    assert verdict.reason == 'foo.cu(3): error: identifier "bar" is undefined'


def test_a_triton_compile_error_is_a_build_error_quoting_triton():
    message = ("at 12:8:\n    acc = tl.zeros([BLOCK], dtype=tl.float32)\n        ^\n"
               "NameError('BLOCK is not defined')")
    verdict = from_error(err("triton.compiler.errors.CompilationError", message),
                         "build (JIT warm-up, case 0)", "cuda", log="")
    assert verdict.status is Status.BUILD_ERROR
    assert verdict.reason == ("build (JIT warm-up, case 0): Triton: at 12:8: "
                              "NameError('BLOCK is not defined')")


def test_a_tilelang_compile_error_is_a_build_error_quoting_tilelang():
    message = ("Selected loop range is smaller than original src range at matched non-1 "
               "dimension\nsrc buffer: x, scope=global\n  --> /tmp/w/l2norm_tl.py:8:1\n"
               "    |\n 8 |     a = T.alloc_shared((64, 64), \"float32\")\n")
    verdict = from_error(err("tvm.error.InternalError", message),
                         "build (JIT warm-up, case 0)", "cuda", log="")
    assert verdict.status is Status.BUILD_ERROR
    assert verdict.reason == ("build (JIT warm-up, case 0): TileLang: Selected loop range is "
                              "smaller than original src range at matched non-1 dimension "
                              "(at l2norm_tl.py:8)")
    fault = from_error(err("tvm.error.InternalError", "CUDA error: an illegal memory access"),
                       "case 3", "cuda", log="")
    assert fault.status is Status.CUDA_ERROR  # a fault at run time, not the compiler


# CuTe DSL's messages as it raised them (nvidia-cutlass-dsl 4.8.1, compiling on a CPU host),
# colours and all.
_CUTE_NAME_ERROR = (
    "\n\x1b[91m\x1b[1merror:\x1b[0m NameError in `_launch`: name 'undefined_scale' is not "
    "defined\n  \x1b[94m-->\x1b[0m /w/l2norm_cute.py:12\n   |\n12 |     y[tidx] = x[tidx] * "
    "undefined_scale\n   |     \x1b[91m^\x1b[0m\n  \x1b[94m= note:\x1b[0m Caused exception: "
    "name 'undefined_scale' is not defined\n")
_CUTE_INTERNAL = (
    "\n\x1b[91m\x1b[1merror[INTERNAL]:\x1b[0m The compiler hit an internal DSL problem while "
    "compiling your code.\n  \x1b[94mnote:\x1b[0m This is a bug in the DSL, not a mistake in "
    "your kernel.\n  \x1b[91merror:\x1b[0m dynamic range should be always preprocessed to IR\n")
_CUTE_MLIR = ("Operation creation failed:\nerror: unknown: expects coordinate to be weakly "
              "congruent to the layout, but got '!cute.coord<\"(?,3,4)\">'")


@pytest.mark.parametrize("kind, message, reason", [
    ("cutlass.base_dsl.common.DSLUserCodeError", _CUTE_NAME_ERROR,
     "NameError in `_launch`: name 'undefined_scale' is not defined (at l2norm_cute.py:12)"),
    ("cutlass.base_dsl.common.DSLRuntimeError", _CUTE_INTERNAL,
     "dynamic range should be always preprocessed to IR"),
    ("cutlass._mlir._mlir_libs._cutlass_ir._mlir.ir.MLIRError", _CUTE_MLIR,
     "unknown: expects coordinate to be weakly congruent to the layout, but got "
     "'!cute.coord<\"(?,3,4)\">'"),
])
def test_a_cute_dsl_compile_error_is_a_build_error_quoting_its_diagnosis(kind, message, reason):
    verdict = from_error(err(kind, message), "build (JIT warm-up, case 0)", "cuda", log="")
    assert verdict == Verdict(Status.BUILD_ERROR,
                              f"build (JIT warm-up, case 0): CuTe DSL: {reason}")
    launch = from_error(err("cutlass.base_dsl.common.DSLCudaRuntimeError",
                            "\x1b[91mCUDA launch failed: cudaErrorLaunchFailure (719)\x1b[0m"),
                        "case 2", "cuda", log="")
    assert launch == Verdict(Status.CUDA_ERROR, "case 2: DSLCudaRuntimeError: CUDA launch "
                                                "failed: cudaErrorLaunchFailure (719)")


class Sneaky:
    def __reduce__(self):
        return (print, ("pwned",))


def test_answers_unpickle_tensors_but_no_other_code():
    t = torch.arange(6.0).reshape(2, 3)
    answer = safe_loads(bytes(ForkingPickler.dumps({"ok": True, "output": t, "n": [1.5]})))
    assert torch.equal(answer["output"], t)
    with pytest.raises(pickle.UnpicklingError, match="builtins.print"):
        safe_loads(pickle.dumps({"ok": True, "output": Sneaky()}))
    with pytest.raises(pickle.UnpicklingError, match="Parameter"):
        safe_loads(bytes(ForkingPickler.dumps(torch.nn.Parameter(t))))
    assert safe_loads(pickle.dumps(torch.storage.TypedStorage)) is torch.storage.TypedStorage
    with pytest.raises(pickle.UnpicklingError, match="torch.serialization.load"):
        safe_loads(pickle.dumps(torch.load))
