"""Check engines/hostmem.py on an NVIDIA GPU without ONNX Runtime: --gpu-wait's primary-context flag is set and
read back, and a HostMemory buffer is page-locked (PyTorch, present on the lent GPU machine, reports it pinned and
times the host-to-device copy from it against ordinary memory).

Usage (repo root, NVIDIA GPU, PyTorch installed): python benchmarks/history/gpu_host_check.py
"""
import sys, time
sys.path.insert(0, "src")
from onnxaccel.engines.hostmem import set_gpu_wait, HostMemory
print("set_gpu_wait block before any context:", repr(set_gpu_wait("cuda", 0, "block")))
import torch  # loads a CUDA runtime and creates the primary context
x = torch.zeros(1, device="cuda")
import ctypes
flags = ctypes.c_uint(); active = ctypes.c_int()
lib = ctypes.CDLL("libcuda.so.1"); dev = ctypes.c_int(); lib.cuDeviceGet(ctypes.byref(dev), 0)
lib.cuDevicePrimaryCtxGetState(dev, ctypes.byref(flags), ctypes.byref(active))
print("primary context flags", hex(flags.value), "active", active.value, "(0x4 = CU_CTX_SCHED_BLOCKING_SYNC)")
host = HostMemory("cuda")
buf = host.buffer("x", (64, 3, 224, 224), "float32")
print("host memory:", host.describe())
buf[...] = 1.0
t = torch.from_numpy(buf)
for pinned in (True,):
    torch.cuda.synchronize(); t0 = time.perf_counter()
    for _ in range(10):
        d = t.to("cuda", non_blocking=False)
    torch.cuda.synchronize(); print(f"H2D 38.5 MB from the registered buffer: {(time.perf_counter()-t0)/10*1e3:.2f} ms, is_pinned={t.is_pinned()}")
plain = torch.from_numpy(buf.copy())
torch.cuda.synchronize(); t0 = time.perf_counter()
for _ in range(10):
    d = plain.to("cuda")
torch.cuda.synchronize(); print(f"H2D 38.5 MB from ordinary memory: {(time.perf_counter()-t0)/10*1e3:.2f} ms")
host.close(); print("after close:", host.describe())
