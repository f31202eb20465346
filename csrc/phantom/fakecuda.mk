# The fake CUDA runtime, driver and NVML (csrc/phantom/README.md),
# included by the Makefile.
#
#   make fakecuda        build/fakecuda/libcudart.so.N, libcuda.so.1 and
#                        libnvidia-ml.so.1, for the CUDA major of the
#                        PyTorch that TORCH_PYTHON has, and the cuBLAS and
#                        cuDNN stand-ins when its wheels for them are there
#   make test-fakecuda   the fake's own C test, then the CUDA provider's virtual
#                        memory calls over it (test-fakecuda-san: sanitized)
#   make check-torch     the real PyTorch (tests/torch-requirements.txt) in
#                        .venv-torch, on the fake, runs the tests marked torch
#   make check-torch-cu12  the same for a CUDA 12 PyTorch
#                        (tests/torch-cu12-requirements.txt) in .venv-torch-cu12,
#                        the fake built for CUDA 12 in build/fakecuda-cu12
#
# `fakecuda` runs the builder (csrc/phantom/build.py, the same one that
# vramguard.phantom.gpu.preload() runs on first use) under TORCH_PYTHON: it
# finds that PyTorch's CUDA runtime wheel, generates, compiles and links the
# libraries into $(FAKECUDA) (whole, atomically, and only when what it reads
# changed), with their LD_PRELOAD listing and cuda.mk (CUDA_INC, CUDART_LIB,
# CUDA_MAJOR). A second make then builds the C tests against them, with that
# configuration known when the rules are read. The libraries themselves are
# the builder's table (LIBRARIES in build.py), not make rules.

TORCH_PYTHON ?= python3
FAKECUDA = build/fakecuda
FC_SRC = csrc/phantom
FC_CFLAGS = -O2 -g -fPIC -std=c11 -D_GNU_SOURCE -Wall -Wextra -Werror -Wshadow \
            -Wstrict-prototypes -Wmissing-prototypes
FC_HDRS = $(wildcard $(FC_SRC)/*.h) $(FC_SRC)/shim/crt/host_defines.h tests/c/rerun.h

.PHONY: fakecuda fakecuda-tests test-fakecuda test-fakecuda-san test-phantom-builder check-torch check-torch-cu12 check-torch-cu12-full

fakecuda:
	$(TORCH_PYTHON) $(FC_SRC)/build.py --out $(FAKECUDA) --cc "$(CC)"
	@$(MAKE) --no-print-directory fakecuda-tests FAKECUDA_CONF=$(FAKECUDA)/cuda.mk

test-fakecuda: fakecuda
	$(FAKECUDA)/test_fakecuda
	$(FAKECUDA)/test_cuda_vmm
	test ! -e $(FAKECUDA)/test_cublas || $(FAKECUDA)/test_cublas
	test ! -e $(FAKECUDA)/test_cudnn || $(FAKECUDA)/test_cudnn
	test ! -e $(FAKECUDA)/test_nccl || $(FAKECUDA)/test_nccl

# The phantom builder's own tests under a tier's torch (TORCH_PYTHON): the fast
# suites run them as well, but make test installs the tiers beside those, and
# they take a tier only once its libraries are in, so here is where they
# always run (TORCH_PYTHON named: a build test fails rather than skips).
# A CUDA 11 runtime wheel (headers and libcudart.so.11.0, 1 MB; PyTorch 1.13
# to 2.0 are built for it) is unpacked for the builder's CUDA 11 test; where
# pip cannot fetch it, that test skips, saying so. cuDNN 8's wheel (700 MB) is
# not fetched: its build test takes one installed under build/day-torch
# (bench/public_ooms/day_torch.sh), else skips, saying so.
CUDA11_RUNTIME = build/cuda11-runtime
CUDNN8_WHEEL = $(firstword $(foreach d,$(wildcard build/day-torch/*/lib/python*/site-packages/nvidia/cudnn),\
	$(if $(wildcard $(d)/lib/libcudnn.so.8),$(CURDIR)/$(d))))
test-phantom-builder:
	$(MAKE) --no-print-directory $(CUDA11_RUNTIME)/.unpacked || echo "no CUDA 11 runtime wheel: its build test skips"
	TORCH_PYTHON=$(TORCH_PYTHON) VG_TEST_CUDA11_RUNTIME=$$(test -f $(CUDA11_RUNTIME)/.unpacked && \
		echo $(CURDIR)/$(CUDA11_RUNTIME)/nvidia/cuda_runtime) VG_TEST_CUDNN8=$(CUDNN8_WHEEL) \
		$(TORCH_PYTHON) -m pytest -q -rs -p no:cacheprovider tests/test_phantom_build.py

$(CUDA11_RUNTIME)/.unpacked:
	rm -rf $(CUDA11_RUNTIME) && mkdir -p $(CUDA11_RUNTIME)
	$(TORCH_PYTHON) -m pip download -q --no-deps --only-binary=:all: -d $(CUDA11_RUNTIME) nvidia-cuda-runtime-cu11==11.7.99
	$(TORCH_PYTHON) -m zipfile -e $(CUDA11_RUNTIME)/nvidia_cuda_runtime_cu11-*.whl $(CUDA11_RUNTIME)
	touch $@

# The same, the fake built with AddressSanitizer and UBSan, in its own directory.
FAKECUDA_SAN = $(FAKECUDA)-san
test-fakecuda-san:
	$(MAKE) --no-print-directory test-fakecuda FAKECUDA=$(FAKECUDA_SAN) FC_VG_BUILD=san \
		CC="$(CC) -fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=all"

ifdef FAKECUDA_CONF
include $(FAKECUDA_CONF)

FC_INC = -I$(CUDA_INC) -I$(FC_SRC)/shim -I$(FC_SRC) -Itests/c
FC_RUNTIME = $(FAKECUDA)/libcudart.so.$(CUDA_MAJOR)
FC_DRIVER = $(FAKECUDA)/libcuda.so.1

fakecuda-tests: $(FAKECUDA)/test_fakecuda $(FAKECUDA)/test_cuda_vmm

$(FAKECUDA)/test_fakecuda: tests/c/test_fakecuda.c $(FC_HDRS) tests/c/harness.h $(FC_RUNTIME) $(FC_DRIVER)
	$(CC) $(FC_CFLAGS) $(FC_INC) -o $@ $< -Wl,-rpath,'$$ORIGIN' -L$(FAKECUDA) \
		-l:libcudart.so.$(CUDA_MAJOR) -l:libcuda.so.1 -lpthread

# The CUDA provider's virtual memory calls over this fake (tests/c/test_cuda_vmm.c),
# with the library objects of one of the C tests' builds (the sanitized one
# for test-fakecuda-san).
FC_VG_BUILD ?= obj
$(FAKECUDA)/test_cuda_vmm: tests/c/test_cuda_vmm.c $(LIB_SRC:csrc/%.c=$(BUILD)/$(FC_VG_BUILD)/%.o) $(HDRS) \
		$(FC_RUNTIME) $(FC_DRIVER)
	$(CC) $(FLAGS_$(FC_VG_BUILD)) $(DEBUG) $(CWARN) $(INC) -I$(FC_SRC) -o $@ $< $(filter %.o,$^) \
		-Wl,-rpath,'$$ORIGIN' -L$(FAKECUDA) -l:libcudart.so.$(CUDA_MAJOR) -l:libcuda.so.1 $(LIBS)

# The cuBLAS and cuBLASLt stand-ins' C test (README.md, "cuBLAS"): every
# hand-written entry point. The builder leaves the stand-ins out, and
# cuda.mk's CUBLAS_ variables empty, when PyTorch has no cuBLAS wheel.
ifneq ($(CUBLAS_LIB),)
FC_INC += -I$(CUBLAS_INC)
fakecuda-tests: $(FAKECUDA)/test_cublas
$(FAKECUDA)/test_cublas: tests/c/test_cublas.c $(FC_HDRS) $(FAKECUDA)/libcublas.so.$(CUDA_MAJOR) \
		$(FAKECUDA)/libcublasLt.so.$(CUDA_MAJOR)
	$(CC) $(FC_CFLAGS) $(FC_INC) -o $@ $< -l:libcublas.so.$(CUDA_MAJOR) -l:libcublasLt.so.$(CUDA_MAJOR) \
		-Wl,--no-undefined -Wl,-rpath,'$$ORIGIN' -L$(FAKECUDA) -l:libcudart.so.$(CUDA_MAJOR) -l:libcuda.so.1 \
		-lpthread
endif

# The cuDNN stand-in's C test, likewise when PyTorch has the cuDNN wheel.
# -Wno-deprecated-declarations: cuDNN 9 marks deprecated the legacy API
# PyTorch still calls.
ifneq ($(CUDNN_LIB),)
fakecuda-tests: $(FAKECUDA)/test_cudnn
$(FAKECUDA)/test_cudnn: tests/c/test_cudnn.c $(FC_HDRS) $(FAKECUDA)/libcudnn.so.$(CUDNN_MAJOR) $(FC_RUNTIME) $(FC_DRIVER)
	$(CC) $(FC_CFLAGS) -Wno-deprecated-declarations $(FC_INC) -I$(CUDNN_INC) -o $@ $< \
		-Wl,-rpath,'$$ORIGIN' -L$(FAKECUDA) -l:libcudnn.so.$(CUDNN_MAJOR) \
		-l:libcudart.so.$(CUDA_MAJOR) -l:libcuda.so.1 -lpthread
endif

# The NCCL stand-in's C test (README.md, "NCCL"), likewise when PyTorch has
# the NCCL wheel: every hand-written entry point and each bad argument.
ifneq ($(NCCL_LIB),)
fakecuda-tests: $(FAKECUDA)/test_nccl
$(FAKECUDA)/test_nccl: tests/c/test_nccl.c $(FC_HDRS) tests/c/harness.h $(FAKECUDA)/libnccl.so.$(NCCL_MAJOR) \
		$(FC_RUNTIME) $(FC_DRIVER)
	$(CC) $(FC_CFLAGS) $(FC_INC) -I$(NCCL_INC) -o $@ $< -Wl,--no-undefined -Wl,-rpath,'$$ORIGIN' -L$(FAKECUDA) \
		-l:libnccl.so.$(NCCL_MAJOR) -l:libcudart.so.$(CUDA_MAJOR) -l:libcuda.so.1 -lpthread
endif
endif

# The real PyTorch on the fake. Its own environment, so that `make check`
# stays free of PyTorch; pip's cache, where it keeps wheels, makes the
# reinstall cheap. pip compiles the bytecode at install (38 s a tier) and
# must: where PYTHONDONTWRITEBYTECODE is set, as on these machines, a
# module without it is compiled again by every process that imports it
# (with --no-compile the 2.15 tier's pytest had not ended after 17 minutes,
# against 14 in all with the bytecode).
# TORCH_VENV, TORCH_REQUIREMENTS and FAKECUDA name one tier's;
# check-torch-cu12 passes its own.
TORCH_VENV = .venv-torch
TORCH_REQUIREMENTS = tests/torch-requirements.txt

#
# Two stamps: .deps, the pinned libraries (the long part, one pip process:
# make test runs it beside the C tests and the fast suite, tests/beside.sh,
# with a wheelhouse of the tiers' own, TORCH_WHEELHOUSE, so that no two pip
# processes write one folder at once), and .installed, vramguard itself,
# editable. The latter rewrites python/vramguard/_core.abi3.so, which other
# processes of the source tree may have loaded: it never runs beside them.
ifneq ($(WHEELHOUSE),)
TORCH_WHEELHOUSE = $(WHEELHOUSE)-torch
endif
$(TORCH_VENV)/.deps: $(TORCH_REQUIREMENTS)
	test -x $(TORCH_VENV)/bin/python || $(PYTHON) -m venv $(TORCH_VENV)
	WHEELHOUSE=$(TORCH_WHEELHOUSE) tests/pip_install.sh $(TORCH_VENV)/bin/python -q -- -r $(TORCH_REQUIREMENTS)
	touch $@

$(TORCH_VENV)/.installed: $(TORCH_VENV)/.deps $(PY_SOURCES)
	VRAMGUARD_WERROR=1 tests/pip_install.sh $(TORCH_VENV)/bin/python -q -- -e ".[test]"
	$(TORCH_VENV)/bin/python $(COMPILE_SOURCES) >/dev/null
	touch $@

# The fake's own tests first, plain and under ASan+UBSan, then PyTorch on
# it, each a timed step (tests/timed_step.sh) named after the tier's torch.
# pytest's exit code 5 (nothing ran) fails this like any other. TORCH_MARK
# selects the tier's tests: all of them here, those marked torch_version in
# the CUDA 12 tier.
TORCH_MARK = torch
# Inductor compiles in its own process: with more than one compile thread
# it first starts a pool of worker processes, each importing torch (7.6 s
# of CPU more per compiled run, 33.4 s against 25.8 s, on 2 cores), which
# the tests' compiled runs do not need: their kernels are few.
TORCH_TEST_ENV = TORCHINDUCTOR_COMPILE_THREADS=1
TIER = torch $(shell sed -n 's/^torch==//p' $(TORCH_REQUIREMENTS))
check-torch:
	$(STEP) "$(TIER): install" $(SUBMAKE) $(TORCH_VENV)/.installed
	$(STEP) "$(TIER): phantom C tests, plain and ASan+UBSan" $(SUBMAKE) test-fakecuda test-fakecuda-san \
		TORCH_PYTHON=$(TORCH_VENV)/bin/python FAKECUDA=$(FAKECUDA)
	$(STEP) "$(TIER): phantom builder's tests" $(SUBMAKE) test-phantom-builder TORCH_PYTHON=$(TORCH_VENV)/bin/python
	$(STEP) "$(TIER): pytest -m '$(TORCH_MARK)'" env LD_PRELOAD="$$(cat $(FAKECUDA)/LD_PRELOAD)" $(TORCH_TEST_ENV) \
		$(TORCH_VENV)/bin/python -m pytest -q -rs -m "$(TORCH_MARK)" $(PYTEST_PAR) $(DURATIONS) tests/torch

# The same tier on the newest PyTorch whose PyPI wheel is built for CUDA 12
# (what Colab ships is of that kind): the fake's CUDA 12 build, and
# vramguard on an older PyTorch. A test that calls what this PyTorch lacks
# is skipped, naming it (tests/torch/torchfeature.py).
#
# CI runs here only the tests whose outcome can depend on the torch version
# (marked torch_version; docs/development.md says which and why the rest
# cannot differ); check-torch-cu12-full runs the whole tier, for releases.
CU12_VENV = .venv-torch-cu12
CU12_REQUIREMENTS = tests/torch-cu12-requirements.txt
CU12 = TORCH_VENV=$(CU12_VENV) TORCH_REQUIREMENTS=$(CU12_REQUIREMENTS) FAKECUDA=build/fakecuda-cu12
TIER_CU12 = torch $(shell sed -n 's/^torch==//p' $(CU12_REQUIREMENTS))
check-torch-cu12:
	$(SUBMAKE) check-torch $(CU12) TORCH_MARK="torch and torch_version"
check-torch-cu12-full:
	$(SUBMAKE) check-torch $(CU12)
