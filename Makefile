# The allocator core's C build, its tests and benchmark, and `make check`,
# the whole test suite. The Python extension is built by setup.py from the
# same sources.
CC ?= cc
CXX ?= c++
PYTHON ?= python3
CFLAGS ?= -O2 -g
WARN = -Wall -Wextra -Werror -Wshadow
CWARN = -std=c11 -D_GNU_SOURCE $(WARN) -Wstrict-prototypes -Wmissing-prototypes
CXXWARN = -std=c++17 -D_GNU_SOURCE $(WARN)
SAN = -O1 -g -fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=all
# The same at -O0, for the tests whose defects -O1 can optimise away (a
# load from freed memory whose value is then unused).
SAN0 = $(subst -O1,-O0,$(SAN))
TSAN = -O1 -g -fsanitize=thread -fno-omit-frame-pointer
# The test builds assert the core's invariants as it runs (csrc/core/debug.h);
# the benchmark and the Python extension do not.
DEBUG = -DVG_DEBUG
LIBS = -lpthread -ldl

# The C library the tests link: the core, the replays (which drive the
# core's heap and emulate PyTorch's allocators) and the device layer (the
# Python extension and the torch hook are built by setup.py from csrc/ as
# well). csrc/replay's own header is included only from its folder, found
# beside the file that includes it; -Icsrc/core serves both folders.
LIB_SRC = $(wildcard csrc/core/*.c) $(wildcard csrc/replay/*.c) $(wildcard csrc/device/*.c)
INC = -Iinclude -Icsrc/core
HDRS = $(wildcard include/vramguard/*.h csrc/*/*.h) tests/c/harness.h tests/c/fake_cudart.h
BUILD = build/c

.PHONY: all test-c test-c-san test-c-tsan bench bench-compare bench-oom bench-oom-compare bench-zoo bench-public-ooms check-zoo check pytest clean fuzz test test-c-and-fast check-other-pythons
C_TESTS = test_core test_hostile test_devices test_cuda test_hook test_threads test_expandable test_report test_arena test_pools
all: $(C_TESTS:%=$(BUILD)/%)

# Three builds of the library and the C tests, each in its own object
# directory: obj (plain), san (AddressSanitizer + UBSan), tsan
# (ThreadSanitizer). All three define VG_DEBUG, so the invariants next to
# the structs are asserted on every operation (the bench and the Python
# extension leave it out).
FLAGS_obj = $(CFLAGS)
FLAGS_san = $(SAN)
FLAGS_tsan = $(TSAN)
FLAGS_san0 = $(SAN0)
SUFFIX_obj =
SUFFIX_san = _san
SUFFIX_tsan = _tsan
SUFFIX_san0 = _san0
BUILDS = obj san tsan san0

define object_rules
$(BUILD)/$(1)/%.o: csrc/%.c $$(HDRS)
	@mkdir -p $$(@D)
	$$(CC) $$(FLAGS_$(1)) $$(DEBUG) $$(CWARN) $$(INC) -c $$< -o $$@
$(BUILD)/$(1)/%.o: csrc/%.cc $$(HDRS)
	@mkdir -p $$(@D)
	$$(CXX) $$(FLAGS_$(1)) $$(CXXWARN) $$(INC) -c $$< -o $$@
$(BUILD)/$(1)/tests/%.o: tests/c/%.c $$(HDRS)
	@mkdir -p $$(@D)
	$$(CC) $$(FLAGS_$(1)) $$(DEBUG) $$(CWARN) $$(INC) -c $$< -o $$@
$(BUILD)/$(1)/tests/%.o: tests/c/%.cc $$(HDRS)
	@mkdir -p $$(@D)
	$$(CXX) $$(FLAGS_$(1)) $$(CXXWARN) $$(INC) -c $$< -o $$@
endef
$(foreach b,$(BUILDS),$(eval $(call object_rules,$(b))))

HOOK_SRC = $(wildcard csrc/torch/*.cc)
# What each test links besides the library: its own source, and extras.
SRC_test_hook = test_torch_hook
EXTRA_test_hook = $(HOOK_SRC:csrc/%.cc=%.o)
DEPS_test_cuda = $(FAKE_CUDART)
LINK_test_cuda = $(FAKE_LINK)
# The emulation's test refuses host allocations midway (its own malloc).
LINK_test_expandable = -Wl,--wrap=malloc,--wrap=calloc,--wrap=realloc

# $(1) test, $(2) build. Linked by the C++ driver: test_hook is C++, and
# the rest link the same way.
define test_rule
$(BUILD)/$(1)$(SUFFIX_$(2)): $(LIB_SRC:csrc/%.c=$(BUILD)/$(2)/%.o) \
		$(BUILD)/$(2)/tests/$(or $(SRC_$(1)),$(1)).o $(EXTRA_$(1):%=$(BUILD)/$(2)/%) $(DEPS_$(1))
	$$(CXX) $$(FLAGS_$(2)) -o $$@ $$(filter %.o,$$^) $$(LINK_$(1)) $$(LIBS)
endef

# The CUDA provider's test runs over a small fake CUDA runtime, named as
# older PyTorch wheels name theirs and linked in, so that it is already
# loaded when the provider looks for one.
FAKE_CUDART = $(BUILD)/fakecudart/libcudart-9335f6a2.so.11.0
$(FAKE_CUDART): tests/c/fake_cudart.c tests/c/fake_cudart.h
	@mkdir -p $(@D)
	$(CC) $(CFLAGS) $(CWARN) -shared -fPIC -Wl,-soname,$(@F) -o $@ $<
FAKE_LINK = $(FAKE_CUDART) -Wl,-rpath,'$$ORIGIN/fakecudart'

$(foreach t,$(C_TESTS),$(foreach b,$(BUILDS),$(eval $(call test_rule,$(t),$(b)))))

$(BUILD)/bench_hot_path: $(LIB_SRC) bench/bench_hot_path.c $(HDRS)
	@mkdir -p $(@D)
	$(CC) -O2 -DNDEBUG $(CWARN) $(INC) -o $@ $(LIB_SRC) bench/bench_hot_path.c $(LIBS)

# The out-of-memory path under pressure: N threads under a budget, both
# policies in one run (bench/bench_oom.c says what it reports).
$(BUILD)/bench_oom: $(LIB_SRC) bench/bench_oom.c $(HDRS)
	@mkdir -p $(@D)
	$(CC) -O2 -g -DNDEBUG $(CWARN) $(INC) -o $@ $(LIB_SRC) bench/bench_oom.c $(LIBS)

test-c: $(C_TESTS:%=$(BUILD)/%)
	set -e; for t in $(C_TESTS); do $(BUILD)/$$t; done

# The -O0 builds: the tests of the code that frees what it walks (pools).
C_TESTS_O0 = test_hook
test-c-san: $(C_TESTS:%=$(BUILD)/%_san) $(C_TESTS_O0:%=$(BUILD)/%_san0)
	set -e; for t in $(C_TESTS:%=%_san) $(C_TESTS_O0:%=%_san0); do \
	  ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1 $(BUILD)/$$t; done

# ThreadSanitizer: any data race fails the run. Its runtime needs its shadow
# memory at fixed addresses, which kernels with more than 28 bits of mmap
# randomisation (vm.mmap_rnd_bits = 32) can refuse ("unexpected memory
# mapping"); the tests then run with ASLR off for their own process
# (setarch -R, no root needed). When neither works the target fails and says
# why: a sanitizer that cannot run is not a pass.
TSAN_ENV = TSAN_OPTIONS="halt_on_error=1 second_deadlock_stack=1"
test-c-tsan: $(C_TESTS:%=$(BUILD)/%_tsan)
	@probe="$(BUILD)/test_threads_tsan no-test-is-named-this"; \
	if $$probe >/dev/null 2>&1; then run=""; \
	elif setarch "$$(uname -m)" -R $$probe >/dev/null 2>&1; then run="setarch $$(uname -m) -R"; \
	else echo "ThreadSanitizer cannot run on this machine:"; $$probe; \
	  echo "(vm.mmap_rnd_bits is $$(cat /proc/sys/vm/mmap_rnd_bits 2>/dev/null || echo unknown);" \
	       "setarch -R did not help; try: sudo sysctl vm.mmap_rnd_bits=28)"; exit 1; fi; \
	for t in $(C_TESTS); do echo "$(TSAN_ENV) $$run $(BUILD)/$${t}_tsan"; \
	  $(TSAN_ENV) $$run $(BUILD)/$${t}_tsan || exit 1; done

bench: $(BUILD)/bench_hot_path
	$(BUILD)/bench_hot_path

# OOM_ARGS, e.g. "--threads 6 --budget 2 --repeats 5" (the defaults).
OOM_ARGS ?=
bench-oom: $(BUILD)/bench_oom
	$(BUILD)/bench_oom $(OOM_ARGS)

# This tree's hot path against a baseline commit (BASE, default origin/main),
# both built from this tree's bench driver and run alternately.
BASE ?= origin/main
bench-compare:
	bench/compare.sh $(BASE)

# The same for bench-oom: ROUNDS runs of each build, alternating.
ROUNDS ?= 9
bench-oom-compare:
	bench/compare_oom.sh $(BASE) $(ROUNDS) $(OOM_ARGS)

# The Python side: a virtual environment with the package built
# warnings-as-errors, then pytest (whose exit code 5, "no tests ran", fails
# the target too).
VENV = .venv
PY_SOURCES = $(wildcard csrc/*/*.c csrc/*/*.cc $(HDRS) python/vramguard/*.py python/vramguard/*/*.py python/vramguard/*/*/*.py) setup.py pyproject.toml

# The source tree's bytecode, compiled once: an editable install leaves it
# to each process, and where PYTHONDONTWRITEBYTECODE is set (as on these
# machines) every dry run's child would compile vramguard's modules again.
COMPILE_SOURCES = -m compileall -q python/vramguard csrc/phantom

$(VENV)/.installed: $(PY_SOURCES)
	test -x $(VENV)/bin/python || $(PYTHON) -m venv $(VENV)
	VRAMGUARD_WERROR=1 tests/pip_install.sh $(VENV)/bin/python -q -- -e ".[test]"
	$(VENV)/bin/python $(COMPILE_SOURCES) >/dev/null
	touch $@

# Work done side by side (make test): this machine's cores, at most 4, as
# each pytest worker's tests start PyTorch processes of their own.
JOBS ?= $(shell n=$$(nproc 2>/dev/null || echo 2); [ $$n -gt 4 ] && n=4; echo $$n)
# pytest's workers (pytest-xdist): every test has folders of its own and
# its children pick free ports, so tests run side by side (PYTEST_JOBS=0
# runs them in pytest's own process).
PYTEST_JOBS ?= $(JOBS)
PYTEST_PAR = $(if $(filter 0,$(PYTEST_JOBS)),,-n $(PYTEST_JOBS) --dist worksteal)
# Each tier's slowest tests, for the table in docs/development.md.
DURATIONS = --durations=25

pytest: $(VENV)/.installed
	$(VENV)/bin/python -m pytest -q -rs $(PYTEST_PAR) $(DURATIONS)

check: test-c test-c-san test-c-tsan pytest

# The Python side on the other CPython versions CI covers (3.12, 3.13;
# `make check` runs $(PYTHON)'s): the abi3 extension built once, installed
# from its wheel into a virtual environment of each, then pytest there
# (tests/check_other_pythons.sh; a version not installed is skipped with a
# line that says so).
OTHER_PYTHONS ?= python3.12 python3.13
OTHER_PYTEST_ARGS ?= $(PYTEST_PAR)
check-other-pythons:
	tests/check_other_pythons.sh $(PYTHON) build/wheel $(OTHER_PYTHONS) -- $(OTHER_PYTEST_ARGS)

# The README's test command: the C tests and the fast suite, then the
# real-PyTorch tier on the pinned PyTorch, the reduced model zoo's goals,
# then the tier's torch_version tests on the CUDA 12 PyTorch. The tiers'
# environments are 5.9 and 7.4 GB (PyTorch and its NVIDIA libraries), and
# pip would keep their wheels besides: with
# SPARE_DISK=1 (CI sets it) pip installs from a wheelhouse of the run's own
# (build/wheelhouse, tests/pip_install.sh), from which every file over
# 100 MB is dropped after each install (PyTorch's, Triton's and NVIDIA's
# wheels: no two environments share one), so that the wheels the
# environments share (the test tools, transformers, accelerate, ...) are
# downloaded once in a run (pip's own cache keeps nothing here: the
# index's responses say not to); and the first tier's environment is
# removed once the zoo is done with it, so that the disk holds one tier at
# a time (docs/development.md).
ifneq ($(SPARE_DISK),)
export WHEELHOUSE = $(CURDIR)/build/wheelhouse
export PIP_NO_CACHE_DIR = 1
endif
#
# Each step is timed (tests/timed_step.sh) and the run ends with the table of
# steps (tests/steps_table.sh; docs/development.md keeps it). Independent
# work uses every core (JOBS): the three C builds and their tests side by
# side, pytest's workers in every suite, the zoo's runs JOBS at a time.
STEP = tests/timed_step.sh
SUBMAKE = $(MAKE) --no-print-directory
export STEPS_FILE ?= $(CURDIR)/build/steps.tsv
#
# A tier's libraries install in one pip process, a core's work at most: each
# is installed beside work that uses every core (tests/beside.sh), the
# pinned tier's beside the C tests and the fast suite, the CUDA 12 tier's
# beside the other Pythons' check (which the first tier's removal, with
# SPARE_DISK, has made room for).
BESIDE = tests/beside.sh
test:
	@mkdir -p build && rm -f $(STEPS_FILE)
	$(STEP) "fast suite: install" $(SUBMAKE) $(VENV)/.installed
	$(BESIDE) "$(TIER): libraries" $(SUBMAKE) $(TORCH_VENV)/.deps -- $(SUBMAKE) test-c-and-fast
	$(SUBMAKE) check-torch
	$(STEP) "reduced zoo" $(SUBMAKE) check-zoo
	$(if $(SPARE_DISK),rm -rf $(TORCH_VENV))
	$(BESIDE) "$(TIER_CU12): libraries" $(SUBMAKE) $(CU12_VENV)/.deps $(CU12) -- \
		$(STEP) "other Pythons ($(OTHER_PYTHONS:python%=%)): wheel, install, pytest" $(SUBMAKE) check-other-pythons
	$(SUBMAKE) check-torch-cu12
	@tests/steps_table.sh

# The C tests and the fast suite, each a step (make test runs them beside
# the first tier's libraries).
test-c-and-fast:
	$(STEP) "C tests: build, run plain, ASan+UBSan, TSan" $(SUBMAKE) -j$(JOBS) test-c test-c-san test-c-tsan
	$(STEP) "fast suite: pytest" $(SUBMAKE) pytest

# Fuzzing (not in CI): libFuzzer harnesses, built with clang under ASan and
# UBSan, each run FUZZ_SECONDS from a corpus kept in build/fuzz/corpus;
# then the Python readers under atheris when it is installed in .venv.
FUZZ_CC ?= clang
FUZZ_SECONDS ?= 120
FUZZ_FLAGS = -g -O1 -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=all \
	-fno-omit-frame-pointer $(DEBUG) $(CWARN) $(INC) -Icsrc/python -Itests/fuzz
FUZZ = build/fuzz
FUZZ_RUN = -max_total_time=$(FUZZ_SECONDS) -timeout=10 -max_len=8192 -print_final_stats=1
FUZZ_HDRS = $(HDRS) tests/fuzz/fuzz_input.h csrc/python/pickle_scan.h

$(FUZZ)/heap_ops: $(LIB_SRC) tests/fuzz/fuzz_heap_ops.c $(FUZZ_HDRS)
	@mkdir -p $(@D)
	$(FUZZ_CC) $(FUZZ_FLAGS) -o $@ $(LIB_SRC) tests/fuzz/fuzz_heap_ops.c $(LIBS)
$(FUZZ)/trace: $(LIB_SRC) tests/fuzz/fuzz_trace.c $(FUZZ_HDRS)
	@mkdir -p $(@D)
	$(FUZZ_CC) $(FUZZ_FLAGS) -o $@ $(LIB_SRC) tests/fuzz/fuzz_trace.c $(LIBS)
$(FUZZ)/pickle_scan: csrc/python/pickle_scan.c tests/fuzz/fuzz_pickle_scan.c $(FUZZ_HDRS)
	@mkdir -p $(@D)
	$(FUZZ_CC) $(FUZZ_FLAGS) -o $@ csrc/python/pickle_scan.c tests/fuzz/fuzz_pickle_scan.c

fuzz: $(FUZZ)/heap_ops $(FUZZ)/trace $(FUZZ)/pickle_scan $(VENV)/.installed
	mkdir -p $(FUZZ)/corpus/heap_ops $(FUZZ)/corpus/trace $(FUZZ)/corpus/pickle $(FUZZ)/corpus/readers
	$(VENV)/bin/python tests/fuzz/fuzz_support.py $(FUZZ)/corpus/pickle
	$(VENV)/bin/python tests/fuzz/fuzz_support.py $(FUZZ)/corpus/readers
	$(FUZZ)/heap_ops $(FUZZ_RUN) $(FUZZ)/corpus/heap_ops
	$(FUZZ)/trace $(FUZZ_RUN) $(FUZZ)/corpus/trace
	$(FUZZ)/pickle_scan $(FUZZ_RUN) $(FUZZ)/corpus/pickle
	if $(VENV)/bin/python -c "import atheris" 2>/dev/null; then \
		PYTHONPATH=tests/fuzz $(VENV)/bin/python tests/fuzz/fuzz_readers.py $(FUZZ_RUN) $(FUZZ)/corpus/readers; \
	else echo "atheris is not installed in $(VENV): the Python readers were not fuzzed" \
		"($(VENV)/bin/pip install atheris)"; fi

clean:
	rm -rf build

# The fake CUDA and the real-PyTorch checks: fakecuda, test-fakecuda,
# check-torch (csrc/phantom/README.md).
include csrc/phantom/fakecuda.mk

# The model zoo on phantom GPUs (bench/zoo.py): every model at full size,
# each allocator in its own processes; JSON and a markdown table under
# bench/results/. ZOO_ARGS to narrow it (--models gpt2,bert --size small).
# Then the zoo past one GPU: the decoder with DDP and FSDP2 on 2 and 4
# phantom ranks (bench/zoo_ranks.py).
ZOO_ARGS ?=
bench-zoo: $(TORCH_VENV)/.installed
	$(TORCH_VENV)/bin/python bench/zoo.py $(ZOO_ARGS)
	$(TORCH_VENV)/bin/python bench/zoo_ranks.py --out build/zoo-ranks --check

# Public out-of-memory reports rebuilt on the phantom (bench/public_ooms/run.py): each
# report's figures against the phantom's, JSON and the table under bench/results/. The
# libraries of the reports' day first (bench/public_ooms/deps.sh, into build/).
# PUBLIC_OOMS_ARGS to narrow it (--only ID,ID) or to read another corpus (--reports FILE).
PUBLIC_OOMS_ARGS ?=
bench-public-ooms: $(TORCH_VENV)/.installed
	PYTHON=$(TORCH_VENV)/bin/python bench/public_ooms/deps.sh
	$(TORCH_VENV)/bin/python bench/public_ooms/run.py $(PUBLIC_OOMS_ARGS)

# CI's reduced zoo: GPT-2 at its small size, the largest batch on a T4 only;
# fails on a goal missed for a cause not known (bench/zoo.py --check,
# KNOWN_MISSES). It takes the phantom and the out-of-memory shim the torch
# tier's tests built (their cache, tests/torch/hookrun.py), not a build of
# its own.
TORCH_TEST_CACHE = $(CURDIR)/build/torch-test-cache
CI_ZOO_MODELS ?= gpt2
check-zoo: $(TORCH_VENV)/.installed
	XDG_CACHE_HOME=$(TORCH_TEST_CACHE) $(TORCH_VENV)/bin/python bench/zoo.py --size small --models $(CI_ZOO_MODELS) --gpus T4 --steps 4 \
		--timing-rounds 0 --jobs $(JOBS) --out build/zoo-ci --check --quiet
