# The fake CUDA runtime, driver and NVML (csrc/phantom/README.md),
# included by the Makefile.
#
#   make fakecuda        build/fakecuda/libcudart.so.N, libcuda.so.1 and
#                        libnvidia-ml.so.1, for the CUDA major of the
#                        PyTorch that TORCH_PYTHON has, and the cuDNN
#                        stand-in libcudnn.so.M when its cuDNN wheel is there
#   make test-fakecuda   the fake's own C test, then the CUDA provider's virtual
#                        memory calls over it (test-fakecuda-san: sanitized)
#   make check-torch     the real PyTorch (tests/torch-requirements.txt) in
#                        .venv-torch, on the fake, runs the tests marked torch
#
# `fakecuda` first asks TORCH_PYTHON where the CUDA runtime wheel is
# (find_cuda.py, into build/fakecuda/cuda.mk), then builds with that
# configuration in a second make, so that the library names and the headers
# are known when the rules are read.

TORCH_PYTHON ?= python3
FAKECUDA = build/fakecuda
FC_SRC = csrc/phantom
FC_CFLAGS = -O2 -g -fPIC -std=c11 -D_GNU_SOURCE -Wall -Wextra -Werror -Wshadow \
            -Wstrict-prototypes -Wmissing-prototypes
FC_CORE = core_devices core_attrs core_memory core_knobs core_errors
FC_DRV = $(FC_CORE) drv_device drv_context drv_memory drv_vmm drv_module drv_entry
FC_RT = rt_errors rt_device rt_memory rt_stream rt_module rt_launch
FC_HDRS = $(filter-out $(FC_SRC)/cudnn_%,$(wildcard $(FC_SRC)/*.h)) $(FC_SRC)/shim/crt/host_defines.h

.PHONY: fakecuda fakecuda-libs test-fakecuda test-fakecuda-san check-torch

fakecuda:
	@mkdir -p $(FAKECUDA)
	$(TORCH_PYTHON) $(FC_SRC)/find_cuda.py > $(FAKECUDA)/cuda.mk.new
	@if cmp -s $(FAKECUDA)/cuda.mk.new $(FAKECUDA)/cuda.mk; then rm $(FAKECUDA)/cuda.mk.new; \
	 else mv $(FAKECUDA)/cuda.mk.new $(FAKECUDA)/cuda.mk; fi
	@$(MAKE) --no-print-directory fakecuda-libs FAKECUDA_CONF=$(FAKECUDA)/cuda.mk

test-fakecuda: fakecuda
	$(FAKECUDA)/test_fakecuda
	$(FAKECUDA)/test_cuda_vmm
	test ! -e $(FAKECUDA)/test_cublas || $(FAKECUDA)/test_cublas
	test ! -e $(FAKECUDA)/test_cudnn || $(FAKECUDA)/test_cudnn

# The same, the fake built with AddressSanitizer and UBSan, in its own directory.
test-fakecuda-san:
	$(MAKE) --no-print-directory test-fakecuda FAKECUDA=build/fakecuda-san FC_VG_BUILD=san \
		CC="$(CC) -fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=all"

ifdef FAKECUDA_CONF
include $(FAKECUDA_CONF)

FC_INC = -I$(CUDA_INC) -I$(FC_SRC)/shim -I$(FC_SRC) -I$(FAKECUDA) -Itests/c
FC_RUNTIME = $(FAKECUDA)/libcudart.so.$(CUDA_MAJOR)
FC_DRIVER = $(FAKECUDA)/libcuda.so.1
FC_NVML = $(FAKECUDA)/libnvidia-ml.so.1
FC_GEN = $(FAKECUDA)/gen
FC_PY = python3

fakecuda-libs: $(FC_RUNTIME) $(FC_DRIVER) $(FC_NVML) $(FAKECUDA)/test_fakecuda $(FAKECUDA)/test_cuda_vmm \
		$(FAKECUDA)/LD_PRELOAD

$(FAKECUDA)/obj/%.o: $(FC_SRC)/%.c $(FC_HDRS) $(FAKECUDA_CONF)
	@mkdir -p $(@D)
	$(CC) $(FC_CFLAGS) $(FC_INC) -c $< -o $@
$(FAKECUDA)/obj/%.o: $(FC_GEN)/%.c $(FC_HDRS)
	@mkdir -p $(@D)
	$(CC) $(FC_CFLAGS) -Wno-missing-prototypes $(FC_INC) -c $< -o $@

# The driver: its stubs, version script and cuGetProcAddress table follow
# cuda.h; the error names follow both headers.
$(FC_GEN)/errors_gen.c: $(FC_SRC)/gen_fakecuda.py $(FAKECUDA_CONF)
	@mkdir -p $(@D)
	$(FC_PY) $(FC_SRC)/gen_fakecuda.py errors --include $(CUDA_INC) --out $@
$(FC_GEN)/drv_stubs_gen.c $(FC_GEN)/procs_gen.c $(FC_GEN)/libcuda.map &: \
		$(FC_DRV:%=$(FAKECUDA)/obj/%.o) $(FC_SRC)/gen_fakecuda.py
	@mkdir -p $(@D)
	$(FC_PY) $(FC_SRC)/gen_fakecuda.py driver --include $(CUDA_INC) --cc "$(CC)" \
		--stubs $(FC_GEN)/drv_stubs_gen.c --procs $(FC_GEN)/procs_gen.c --map $(FC_GEN)/libcuda.map \
		$(FC_DRV:%=$(FAKECUDA)/obj/%.o)
FC_DRV_OBJ = $(FC_DRV:%=$(FAKECUDA)/obj/%.o) $(FAKECUDA)/obj/errors_gen.o \
             $(FAKECUDA)/obj/procs_gen.o $(FAKECUDA)/obj/drv_stubs_gen.o
$(FC_DRIVER): $(FC_DRV_OBJ) $(FC_GEN)/libcuda.map
	$(CC) -shared -o $@ -Wl,-soname,libcuda.so.1 -Wl,--version-script=$(FC_GEN)/libcuda.map \
		-Wl,--no-undefined $(FC_DRV_OBJ) -lpthread -ldl

# The runtime: stubs and version script follow the real libcudart.so.N. It
# needs the fake driver, found beside it ($ORIGIN) when preloaded.
$(FC_GEN)/rt_stubs_gen.c $(FC_GEN)/libcudart.map &: $(FC_RT:%=$(FAKECUDA)/obj/%.o) $(FC_SRC)/gen_fakecuda.py
	@mkdir -p $(@D)
	$(FC_PY) $(FC_SRC)/gen_fakecuda.py runtime --cudart $(CUDART_LIB) \
		--stubs $(FC_GEN)/rt_stubs_gen.c --map $(FC_GEN)/libcudart.map $(FC_RT:%=$(FAKECUDA)/obj/%.o)
FC_RT_OBJ = $(FC_RT:%=$(FAKECUDA)/obj/%.o) $(FAKECUDA)/obj/rt_stubs_gen.o
$(FC_RUNTIME): $(FC_RT_OBJ) $(FC_GEN)/libcudart.map $(FC_DRIVER)
	$(CC) -shared -o $@ -Wl,-soname,libcudart.so.$(CUDA_MAJOR) \
		-Wl,--version-script=$(FC_GEN)/libcudart.map -Wl,--no-undefined -Wl,-rpath,'$$ORIGIN' \
		$(FC_RT_OBJ) -L$(FAKECUDA) -l:libcuda.so.1 -lpthread

# NVML: without it PyTorch's expandable segments crash (see nvml.c).
$(FC_NVML): $(FAKECUDA)/obj/nvml.o $(FC_SRC)/libnvidia-ml.map $(FC_DRIVER)
	$(CC) -shared -o $@ -Wl,-soname,libnvidia-ml.so.1 -Wl,--version-script=$(FC_SRC)/libnvidia-ml.map \
		-Wl,--no-undefined -Wl,-rpath,'$$ORIGIN' $(FAKECUDA)/obj/nvml.o -L$(FAKECUDA) -l:libcuda.so.1

$(FAKECUDA)/test_fakecuda: tests/c/test_fakecuda.c $(FC_HDRS) $(FC_RUNTIME) $(FC_DRIVER)
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

# ---- cuBLAS and cuBLASLt stand-ins (README.md, "cuBLAS") -----------------
# libcublas.so.N and libcublasLt.so.N, built when find_cuda.py found the
# cuBLAS wheel: the hand-written entry points below, stubs for the rest of
# what the real library exports and its version script (gen_cublas.py
# library, from nm of the real one), and cuBLASLt's attribute sizes
# (gen_cublas.py attrs, from cublasLt.h). Both link the fake runtime and
# driver, found beside them ($ORIGIN). test_cublas calls every hand-written
# entry point.
ifneq ($(CUBLAS_LIB),)
FC_CUBLAS = cublas cublas_blas cublas_common
FC_CUBLASLT = cublaslt cublas_common
FC_CUBLAS_SO = $(FAKECUDA)/libcublas.so.$(CUDA_MAJOR)
FC_CUBLASLT_SO = $(FAKECUDA)/libcublasLt.so.$(CUDA_MAJOR)
FC_CUBLAS_PRELOAD = $(abspath $(FC_CUBLAS_SO)) $(abspath $(FC_CUBLASLT_SO))
FC_INC += -I$(CUBLAS_INC)
FC_CUBLAS_LINK = -Wl,--no-undefined -Wl,-rpath,'$$ORIGIN' -L$(FAKECUDA) \
                 -l:libcudart.so.$(CUDA_MAJOR) -l:libcuda.so.1

fakecuda-libs: $(FC_CUBLAS_SO) $(FC_CUBLASLT_SO) $(FAKECUDA)/test_cublas

$(FC_GEN)/cublaslt_attrs_gen.c: $(FC_SRC)/gen_cublas.py $(FAKECUDA_CONF)
	@mkdir -p $(@D)
	$(FC_PY) $(FC_SRC)/gen_cublas.py attrs --include $(CUBLAS_INC) --out $@
$(FC_GEN)/cublas_stubs_gen.c $(FC_GEN)/libcublas.map &: $(FC_CUBLAS:%=$(FAKECUDA)/obj/%.o) \
		$(FC_SRC)/gen_cublas.py $(FC_SRC)/gen_fakecuda.py
	@mkdir -p $(@D)
	$(FC_PY) $(FC_SRC)/gen_cublas.py library --real $(CUBLAS_LIB) --stubs $(FC_GEN)/cublas_stubs_gen.c \
		--map $(FC_GEN)/libcublas.map $(FC_CUBLAS:%=$(FAKECUDA)/obj/%.o)
$(FC_GEN)/cublaslt_stubs_gen.c $(FC_GEN)/libcublasLt.map &: $(FC_CUBLASLT:%=$(FAKECUDA)/obj/%.o) \
		$(FC_SRC)/gen_cublas.py $(FC_SRC)/gen_fakecuda.py
	@mkdir -p $(@D)
	$(FC_PY) $(FC_SRC)/gen_cublas.py library --real $(CUBLASLT_LIB) --stubs $(FC_GEN)/cublaslt_stubs_gen.c \
		--map $(FC_GEN)/libcublasLt.map $(FC_CUBLASLT:%=$(FAKECUDA)/obj/%.o)

FC_CUBLAS_OBJ = $(FC_CUBLAS:%=$(FAKECUDA)/obj/%.o) $(FAKECUDA)/obj/cublas_stubs_gen.o
FC_CUBLASLT_OBJ = $(FC_CUBLASLT:%=$(FAKECUDA)/obj/%.o) $(FAKECUDA)/obj/cublaslt_attrs_gen.o \
                  $(FAKECUDA)/obj/cublaslt_stubs_gen.o
$(FC_CUBLAS_SO): $(FC_CUBLAS_OBJ) $(FC_GEN)/libcublas.map $(FC_RUNTIME) $(FC_DRIVER)
	$(CC) -shared -o $@ -Wl,-soname,libcublas.so.$(CUDA_MAJOR) \
		-Wl,--version-script=$(FC_GEN)/libcublas.map $(FC_CUBLAS_OBJ) $(FC_CUBLAS_LINK)
$(FC_CUBLASLT_SO): $(FC_CUBLASLT_OBJ) $(FC_GEN)/libcublasLt.map $(FC_RUNTIME) $(FC_DRIVER)
	$(CC) -shared -o $@ -Wl,-soname,libcublasLt.so.$(CUDA_MAJOR) \
		-Wl,--version-script=$(FC_GEN)/libcublasLt.map $(FC_CUBLASLT_OBJ) $(FC_CUBLAS_LINK)

$(FAKECUDA)/test_cublas: tests/c/test_cublas.c $(FC_HDRS) $(FC_CUBLAS_SO) $(FC_CUBLASLT_SO)
	$(CC) $(FC_CFLAGS) $(FC_INC) -o $@ $< -l:libcublas.so.$(CUDA_MAJOR) \
		-l:libcublasLt.so.$(CUDA_MAJOR) $(FC_CUBLAS_LINK) -lpthread
endif
# ---- end of the cuBLAS stand-ins ------------------------------------------

# ---- the cuDNN stand-in (csrc/phantom/cudnn_*.c) -----------------------------
# libcudnn.so.M, built when find_cuda.py found PyTorch's cuDNN wheel: the
# hand-written files, the generator's stubs, version script and status names
# (gen_fakecuda.py cudnn, from the real libcudnn.so.M and its headers), one
# link with the real soname and version node. The fake driver provides the
# device's memory and knobs. -Wno-deprecated-declarations: cuDNN 9 marks
# deprecated the legacy API PyTorch still calls.
ifneq ($(CUDNN_INC),)
FC_DNN = cudnn_handle cudnn_legacy_desc cudnn_legacy_ops cudnn_backend cudnn_execute cudnn_rnn
FC_DNN_OBJ = $(FC_DNN:%=$(FAKECUDA)/obj/%.o)
FC_CUDNN = $(FAKECUDA)/libcudnn.so.$(CUDNN_MAJOR)
FC_CUDNN_PRELOAD = $(abspath $(FC_CUDNN))
$(FC_DNN_OBJ): FC_INC += -I$(CUDNN_INC)
$(FC_DNN_OBJ): FC_CFLAGS += -Wno-deprecated-declarations
$(FC_DNN_OBJ): $(wildcard $(FC_SRC)/cudnn_*.h)
$(FC_GEN)/cudnn_stubs_gen.c $(FC_GEN)/cudnn_status_gen.c $(FC_GEN)/libcudnn.map &: \
		$(FC_DNN_OBJ) $(FC_SRC)/gen_fakecuda.py
	@mkdir -p $(@D)
	$(FC_PY) $(FC_SRC)/gen_fakecuda.py cudnn --lib $(CUDNN_LIB) --include $(CUDNN_INC) \
		--stubs $(FC_GEN)/cudnn_stubs_gen.c --status $(FC_GEN)/cudnn_status_gen.c \
		--map $(FC_GEN)/libcudnn.map $(FC_DNN_OBJ)
FC_CUDNN_OBJ = $(FC_DNN_OBJ) $(FAKECUDA)/obj/cudnn_stubs_gen.o $(FAKECUDA)/obj/cudnn_status_gen.o
$(FC_CUDNN): $(FC_CUDNN_OBJ) $(FC_GEN)/libcudnn.map $(FC_DRIVER)
	$(CC) -shared -o $@ -Wl,-soname,libcudnn.so.$(CUDNN_MAJOR) -Wl,--version-script=$(FC_GEN)/libcudnn.map \
		-Wl,--no-undefined -Wl,-rpath,'$$ORIGIN' $(FC_CUDNN_OBJ) -L$(FAKECUDA) -l:libcuda.so.1 -lpthread
$(FAKECUDA)/test_cudnn: tests/c/test_cudnn.c $(FC_HDRS) $(FC_CUDNN) $(FC_RUNTIME) $(FC_DRIVER)
	$(CC) $(FC_CFLAGS) -Wno-deprecated-declarations $(FC_INC) -I$(CUDNN_INC) -o $@ $< \
		-Wl,-rpath,'$$ORIGIN' -L$(FAKECUDA) -l:libcudnn.so.$(CUDNN_MAJOR) \
		-l:libcudart.so.$(CUDA_MAJOR) -l:libcuda.so.1 -lpthread
fakecuda-libs: $(FC_CUDNN) $(FAKECUDA)/test_cudnn
endif
# ---- end of the cuDNN stand-in ---------------------------------------------------

# What LD_PRELOAD needs, for scripts: the libraries, absolute paths.
$(FAKECUDA)/LD_PRELOAD: $(FAKECUDA_CONF) $(FC_SRC)/fakecuda.mk
	echo "$(abspath $(FC_RUNTIME)) $(abspath $(FC_DRIVER)) $(abspath $(FC_NVML)) $(FC_CUBLAS_PRELOAD) $(FC_CUDNN_PRELOAD)" \
		| sed 's/  */ /g; s/ *$$//' > $@
endif

# The real PyTorch on the fake. Its own environment, so that `make check`
# stays free of PyTorch; pip's cache makes the reinstall cheap.
TORCH_VENV = .venv-torch

$(TORCH_VENV)/.installed: tests/torch-requirements.txt $(PY_SOURCES)
	test -x $(TORCH_VENV)/bin/python || $(PYTHON) -m venv $(TORCH_VENV)
	$(TORCH_VENV)/bin/python -m pip install -q -r tests/torch-requirements.txt
	VRAMGUARD_WERROR=1 $(TORCH_VENV)/bin/python -m pip install -q -e ".[test]"
	touch $@

# The fake's own test first, then PyTorch on it. pytest's exit code 5
# (nothing ran) fails this like any other.
check-torch: $(TORCH_VENV)/.installed
	$(MAKE) --no-print-directory test-fakecuda TORCH_PYTHON=$(TORCH_VENV)/bin/python
	LD_PRELOAD="$$(cat $(FAKECUDA)/LD_PRELOAD)" $(TORCH_VENV)/bin/python -m pytest -q -rs -m torch tests/torch
