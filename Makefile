# C build of the allocator core, its tests and benchmarks. The Python
# extension is built by setup.py from the same sources.
CC ?= cc
CFLAGS ?= -O2 -g
WARN = -std=c11 -D_GNU_SOURCE -Wall -Wextra -Werror -Wshadow -Wstrict-prototypes -Wmissing-prototypes
CORE = csrc/bins.c csrc/addr_map.c csrc/heap.c csrc/policy.c csrc/policy_torch.c \
       csrc/stats.c csrc/check.c csrc/trace.c csrc/device_sim.c csrc/oom_message.c csrc/replay.c
HDRS = $(wildcard csrc/*.h) tests/c/harness.h
SAN = -O1 -g -fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=all
BUILD = build/c

.PHONY: all test-c test-c-san bench clean check pytest
all: $(BUILD)/test_core

$(BUILD)/test_core: $(CORE) tests/c/test_core.c $(HDRS)
	@mkdir -p $(BUILD)
	$(CC) $(CFLAGS) $(WARN) -Icsrc -o $@ $(CORE) tests/c/test_core.c -lpthread

$(BUILD)/test_core_san: $(CORE) tests/c/test_core.c $(HDRS)
	@mkdir -p $(BUILD)
	$(CC) $(SAN) $(WARN) -Icsrc -o $@ $(CORE) tests/c/test_core.c -lpthread

$(BUILD)/bench_hot_path: $(CORE) bench/bench_hot_path.c $(HDRS)
	@mkdir -p $(BUILD)
	$(CC) -O2 -DNDEBUG $(WARN) -Icsrc -o $@ $(CORE) bench/bench_hot_path.c -lpthread

test-c: $(BUILD)/test_core
	$(BUILD)/test_core

test-c-san: $(BUILD)/test_core_san
	ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1 $(BUILD)/test_core_san

bench: $(BUILD)/bench_hot_path
	$(BUILD)/bench_hot_path

clean:
	rm -rf build

# The whole test suite, from a fresh clone: a virtual environment with the
# package built warnings-as-errors, the C tests plain and under ASan/UBSan,
# then pytest (whose exit code 5, "no tests ran", fails the target too).
PYTHON ?= python3
VENV = .venv
PY_SOURCES = $(wildcard csrc/*.c csrc/*.cc csrc/*.h python/vramguard/*.py) setup.py pyproject.toml

$(VENV)/.installed: $(PY_SOURCES)
	test -x $(VENV)/bin/python || $(PYTHON) -m venv $(VENV)
	VRAMGUARD_WERROR=1 $(VENV)/bin/python -m pip install -q -e ".[test]"
	touch $@

pytest: $(VENV)/.installed
	$(VENV)/bin/python -m pytest -q -rs

check: test-c test-c-san pytest
