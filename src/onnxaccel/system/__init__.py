"""What this machine can run: installed runtimes, GPUs (AMD, NVIDIA), the doctor, the telemetry sampler.

Import the module you need (``onnxaccel.system.telemetry``, ``onnxaccel.system.doctor``); this package
imports nothing itself, so ``bench`` and ``serve`` can use the sampler without loading the doctor.
"""
