"""Does kbench's hold kernel keep every other kernel off the GPU while it spins?

    PYTHONPATH=. python bench/studies/hold_check.py

Prints the hold kernel's registers and resident blocks per SM, then, five times: a 0.3 ms hold
on the current stream and an F.normalize of 8192x8192 launched on a private stream that does
not wait for it; where the private stream's work ends, measured from the hold's start. If the
hold is exclusive, that work ends about one hold plus one normalisation after the start.
Needs a CUDA GPU.
"""

import ctypes

import torch
import torch.nn.functional as F

from kbench.worker import hold


def main() -> None:
    device = torch.device("cuda")
    torch.cuda.synchronize()
    cuda = ctypes.CDLL("libcuda.so.1")
    module, func = ctypes.c_void_p(), ctypes.c_void_p()
    assert cuda.cuModuleLoadData(ctypes.byref(module), ctypes.c_char_p(hold._SPIN_PTX)) == 0
    assert cuda.cuModuleGetFunction(ctypes.byref(func), module, b"kbench_spin") == 0
    regs, blocks = ctypes.c_int(), ctypes.c_int()
    cuda.cuFuncGetAttribute(ctypes.byref(regs), 4, func)  # CU_FUNC_ATTRIBUTE_NUM_REGS
    cuda.cuOccupancyMaxActiveBlocksPerMultiprocessor(ctypes.byref(blocks), func, 1024,
                                                     ctypes.c_size_t(0))
    props = torch.cuda.get_device_properties(device)
    print(f"{props.name}: {props.multi_processor_count} SMs x "
          f"{props.max_threads_per_multi_processor} threads; hold kernel: {regs.value} "
          f"registers a thread, {blocks.value} blocks of 1024 threads per SM")
    spin = hold._spin_all_sms(device)
    x = torch.randn(8192, 8192, device=device)
    side = torch.cuda.Stream()
    for trial in range(6):
        torch.cuda.synchronize()
        start, held, done = (torch.cuda.Event(enable_timing=True) for _ in range(3))
        start.record()
        spin(300_000)
        held.record()
        with torch.cuda.stream(side):
            F.normalize(x, dim=1)
            done.record(side)
        torch.cuda.synchronize()
        t0, t1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        t0.record()
        F.normalize(x, dim=1)
        t1.record()
        torch.cuda.synchronize()
        if trial:  # the first trial includes one-time setup
            print(f"hold {start.elapsed_time(held):.3f} ms; private-stream work done "
                  f"{start.elapsed_time(done):.3f} ms after the hold started "
                  f"(the work alone takes {t0.elapsed_time(t1):.3f} ms)")


if __name__ == "__main__":
    main()
