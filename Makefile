# creditflow: the one entry point for building, testing and linting, used by people and by CI
# (.ci/run calls `make test`). `make help` lists the targets.
#
# Python tools come only from .venv, which `make venv` creates from requirements-dev.txt.
# Tests and lints run against an installed wheel, not against python/ in place: one built with
# the `fast` cargo profile (thin LTO, 16 codegen units: minutes faster to build), while
# `make build` makes the distributable one with the release profile (fat LTO).

SHELL := bash
.SHELLFLAGS := -euo pipefail -c
.DEFAULT_GOAL := help
.DELETE_ON_ERROR:
MAKEFLAGS += --no-print-directory

# Interpreter that creates .venv (3.10+), resolved before .venv/bin goes first on PATH.
PYTHON ?= python3
BASE_PYTHON := $(or $(shell command -v $(PYTHON)),$(PYTHON))
VENV := .venv
PY := $(abspath $(VENV)/bin/python)
BIN := $(abspath $(VENV)/bin)
WHEEL_DIR := dist
# The wheel `make test-python` and `make lint-python` install: its cargo profile and where it goes
# (not dist/, which only ever holds the distributable wheel).
TEST_PROFILE ?= fast
TEST_WHEEL_DIR := target/wheels/$(TEST_PROFILE)
# Extra pytest arguments, e.g. make test-python PYTEST_ARGS='-m "not spark" -x'
PYTEST_ARGS ?=
# How long `make soak` runs, and its other options, e.g. SOAK_ARGS='--flow-control tcp'
SOAK_MINUTES ?= 10
SOAK_ARGS ?=

# One interpreter for everything: maturin, pyo3's build script (cargo), pytest and Spark workers.
export VIRTUAL_ENV := $(abspath $(VENV))
export PATH := $(BIN):$(PATH)
export PYO3_PYTHON := $(PY)
export PYSPARK_PYTHON := $(PY)
export PYSPARK_DRIVER_PYTHON := $(PY)
# Spark binds to loopback only; no test traffic leaves the machine.
export SPARK_LOCAL_IP ?= 127.0.0.1
ifeq ($(strip $(JAVA_HOME)),)
JAVA_HOME := $(shell scripts/java-home.sh)
endif
export JAVA_HOME
export CARGO_TERM_COLOR ?= $(if $(CI),never,auto)

.PHONY: help
help: ## Show this help
	@echo "usage: make <target>   (Python tools live in $(VENV); JAVA_HOME=$(JAVA_HOME))"
	@grep -hE '^[a-zA-Z0-9_-]+:.*## ' $(MAKEFILE_LIST) | \
		awk 'BEGIN {FS = ":.*## "}; {printf "  %-13s %s\n", $$1, $$2}'

# ---------------------------------------------------------------------------------- environment

# Always runs the script: it checks the venv still works and compares its own stamp (interpreter
# version + hash of requirements-dev.txt), so an up-to-date .venv costs a fraction of a second.
.PHONY: venv
venv: ## Create .venv and install the pinned dev tools (no-op when up to date)
	@PYTHON=$(BASE_PYTHON) scripts/bootstrap-venv.sh $(VENV)

# ------------------------------------------------------------------------------------- building

# $(call wheel,PROFILE,DIR): build the abi3 wheel with that cargo profile into DIR, check it,
# and install it into .venv.
define wheel
	rm -f $(2)/creditflow-*.whl
	$(BIN)/maturin build --profile $(1) --interpreter $(PY) --out $(2)
	scripts/check-wheel.sh $(2)/creditflow-*.whl
	$(PY) -m pip install --quiet --disable-pip-version-check --no-deps --force-reinstall \
		$(2)/creditflow-*.whl
endef

.PHONY: build
build: venv ## Build the release abi3 wheel (fat LTO) into dist/ and install it into .venv
	$(call wheel,release,$(WHEEL_DIR))

.PHONY: build-test
build-test: venv ## Build the wheel tests use (fast profile: thin LTO) and install it into .venv
	$(call wheel,$(TEST_PROFILE),$(TEST_WHEEL_DIR))

.PHONY: develop
develop: venv ## Faster edit loop: maturin develop with the fast profile into .venv (no wheel file)
	$(BIN)/maturin develop --profile $(TEST_PROFILE)

.PHONY: demo
demo: build ## Build, then run the PySpark demo (examples/spark_demo.py; needs Java 17; CONNECT=1: on Spark Connect)
	$(PY) examples/spark_demo.py $(if $(filter-out 0,$(CONNECT)),--connect)

# -------------------------------------------------------------------------------------- testing

.PHONY: test
test: disk-check lint test-rust test-python ## Everything CI runs: lint, Rust tests, loom models, Python tests incl. Spark

# A fresh clone's build and test run writes about 5 GB (target/ and .venv). A linker that runs
# out of disk dies with a Bus error that does not say why, so say it first.
.PHONY: disk-check
disk-check:
	@free=$$(df -Pk . | awk 'NR == 2 { print int($$4 / 1048576) }'); \
	if [ "$$free" -lt 6 ]; then \
		echo "warning: $$free GB free here; building and testing needs about 5 GB (target/ and .venv)" >&2; \
	fi

# Test binaries of the bindings crate link libpython (no extension-module there); make it findable
# for interpreters outside the default library path (pyenv, uv).
PY_LIBDIR = $(shell $(PY) -c 'import sysconfig; print(sysconfig.get_config_var("LIBDIR") or "")')

.PHONY: test-rust
test-rust: venv ## Rust unit/property tests (nextest if installed), doctests, then the loom models
	export LD_LIBRARY_PATH="$(PY_LIBDIR)$${LD_LIBRARY_PATH:+:$$LD_LIBRARY_PATH}"; \
	if cargo nextest --version >/dev/null 2>&1; then \
		cargo nextest run --workspace; \
	else \
		cargo test --workspace --lib --bins --tests; \
	fi
	cargo test -p creditflow-core --doc
	$(MAKE) test-loom

.PHONY: test-loom
# LOOM_MAX_PREEMPTIONS=3 bounds the search (the usual setting; unbounded runs take hours). The
# store/load version of the subpartition wake-up protocol deadlocks within this bound, so it bites.
test-loom: ## Loom model checks of the lock-free core (own target dir: --cfg loom rebuilds everything; loom profile)
	mkdir -p target
	LOOM_MAX_PREEMPTIONS=3 RUSTFLAGS="--cfg loom" cargo test -p creditflow-core --profile loom --lib --target-dir target/loom \
		loom 2>&1 | tee target/loom.log
	@if ! grep -Eq 'test result: ok\. [1-9][0-9]* passed' target/loom.log; then \
		echo "error: no loom model ran (expected tests named *loom* under cfg(loom))" >&2; exit 1; \
	fi

# pytest exits 5 when it collects no test; that fails the target like any other non-zero exit.
# tests/test_netns.py needs iproute2 (ip, tc); as root, install it when missing (CI starts from
# a fresh image). Its delay and loss come from the userspace wire (tests/wire.py: Python's
# standard library and TUN devices, no sch_netem): as root, make /dev/net/tun when a minimal
# /dev lacks it (the kernel may still refuse; the test then skips with the reason). Without
# root the netns tests skip themselves.
.PHONY: netns-deps
netns-deps:
	@if [ "$$(id -u)" = 0 ] && ! command -v tc >/dev/null; then \
		apt-get install -y iproute2 || { apt-get update && apt-get install -y iproute2; }; \
	fi
	@if [ "$$(id -u)" = 0 ] && [ ! -e /dev/net/tun ]; then \
		mkdir -p /dev/net && mknod -m 0666 /dev/net/tun c 10 200 || true; \
	fi

# tests/test_web.py renders the pipeline page in headless Chromium; as root, install Debian's
# chromium when no Chromium is on PATH (the test skips with the reason if there is none).
.PHONY: browser-deps
browser-deps:
	@if [ "$$(id -u)" = 0 ] && ! command -v chromium >/dev/null && ! command -v chromium-browser >/dev/null; then \
		apt-get install -y chromium || { apt-get update && apt-get install -y chromium; } || \
			echo "warning: could not install chromium; tests/test_web.py will skip its browser test" >&2; \
	fi

.PHONY: test-python
test-python: build-test netns-deps browser-deps ## Python tests (incl. Spark) against the installed (fast) wheel
	$(PY) -m pytest --benchmark-disable --durations=10 $(PYTEST_ARGS)

.PHONY: bench
bench: build ## Benchmarks: pytest-benchmark (benches/) and criterion (cargo bench)
	cargo build --release -p creditflow-rawtcp  # the raw-TCP ceiling of benches/test_bench_remote.py
	$(PY) -m pytest benches/ --benchmark-only --benchmark-columns=min,median,max,ops \
		--benchmark-sort=name $(PYTEST_ARGS)
	cargo bench -p creditflow-core

# Not part of `test` or `bench`: a DataFrame from Spark local[2] into 2 PyTorch ranks, creditflow
# against Petastorm, Mosaic streaming, Hugging Face datasets and Parquet + pyarrow
# (benches/training/), in its own environment BENCH_VENV: torch and the peers stay out of .venv
# (scripts/bootstrap-bench-venv.sh). TRAINING_ARGS e.g. '--rounds 1 --contenders parquet'.
BENCH_VENV ?= .venv-bench
TRAINING_ARGS ?=
BENCH_PY = $(abspath $(BENCH_VENV))/bin/python

.PHONY: bench-training
bench-training: build ## Spark -> 2 PyTorch ranks: creditflow vs Petastorm, Mosaic, HF datasets, Parquet (own venv)
	PYTHON=$(BASE_PYTHON) scripts/bootstrap-bench-venv.sh $(BENCH_VENV) $(WHEEL_DIR)/creditflow-*.whl
	VIRTUAL_ENV=$(abspath $(BENCH_VENV)) PYSPARK_PYTHON=$(BENCH_PY) PYSPARK_DRIVER_PYTHON=$(BENCH_PY) \
		$(BENCH_PY) -m benches.training $(TRAINING_ARGS)

# Not part of `test`: it runs for SOAK_MINUTES and exits non-zero on any lost, duplicated,
# reordered or corrupted batch, or any error.
.PHONY: soak
soak: build ## Soak the transport: 4x4 channels, two processes, random stalls, SOAK_MINUTES (10)
	$(PY) scripts/soak.py --minutes $(SOAK_MINUTES) $(SOAK_ARGS)

# Not part of `test`. cargo-fuzz needs nightly flags (-Zsanitizer, -Cpasses); on the stable
# toolchain RUSTC_BOOTSTRAP=1 unlocks them. Each target runs FUZZ_SECONDS in turn (they
# compete for the cores), growing fuzz/corpus/<target>/; `make fuzz-cmin` minimizes it before
# a commit. `cargo test` replays the committed corpus (rust/core/tests/fuzz_corpus.rs).
FUZZ_SECONDS ?= 600
FUZZ_TARGETS := frame_decoder credit ready_queue attach_codec
FUZZ := RUSTC_BOOTSTRAP=1 cargo fuzz

.PHONY: fuzz
fuzz: ## Fuzz each target FUZZ_SECONDS (600) in turn (cargo-fuzz, installed if missing)
	command -v cargo-fuzz >/dev/null || cargo install cargo-fuzz --locked
	cd fuzz && for t in $(FUZZ_TARGETS); do \
		$(FUZZ) run -O $$t corpus/$$t -- -max_total_time=$(FUZZ_SECONDS) -print_final_stats=1; \
	done

# Not part of `test`: the core's unit, property and integration tests under AddressSanitizer,
# whose LeakSanitizer reports memory still allocated at exit. --target keeps the sanitizer
# out of build scripts and proc macros; its own target dir, as every crate is rebuilt.
HOST_TRIPLE = $(shell rustc -vV | sed -n 's/^host: //p')

.PHONY: sanitize
sanitize: ## Core tests under AddressSanitizer/LeakSanitizer (RUSTC_BOOTSTRAP=1 on stable)
	RUSTC_BOOTSTRAP=1 RUSTFLAGS="-Zsanitizer=address" ASAN_OPTIONS="detect_leaks=1" \
		cargo test -p creditflow-core --target $(HOST_TRIPLE) --target-dir target/asan --lib --tests

# Minimizing drops inputs that add no coverage, the frame decoder's seeds among them: they
# are written back after it. fuzz/regressions/ (inputs that once broke a target) is not touched.
.PHONY: fuzz-cmin
fuzz-cmin: ## Minimize the fuzz corpus (keeps the inputs that add coverage, and the seeds)
	cd fuzz && for t in $(FUZZ_TARGETS); do $(FUZZ) cmin -O $$t corpus/$$t; done
	$(MAKE) fuzz-seeds

.PHONY: fuzz-seeds
fuzz-seeds: ## Write the seeds built from the wire and attach formats into the fuzz corpus
	cargo run -q -p creditflow-core --features fuzz --example fuzz_seeds

# Not part of `test` (root): 4x4 channels between two network namespaces, random stalls, every
# third exchange over the userspace wire at 20 ms delay + 1% loss, a link cut every --cut-every
# seconds and a fresh exchange after each; SOAK_NETNS_MINUTES (30).
SOAK_NETNS_MINUTES ?= 30
SOAK_NETNS_ARGS ?=

.PHONY: soak-netns
soak-netns: build netns-deps ## Soak across two network namespaces with link cuts, SOAK_NETNS_MINUTES (30)
	$(PY) scripts/soak_netns.py --minutes $(SOAK_NETNS_MINUTES) $(SOAK_NETNS_ARGS)

# Not part of `test` (root): the README's "Impaired networks" table, NETNS_TABLE_ARGS e.g.
# '--repeat 5 --seconds 10'.
NETNS_TABLE_ARGS ?=

.PHONY: netns-table
netns-table: build netns-deps ## Throughput under each impairment (veth, tbf cap, delay, loss, cut) as a table
	$(PY) scripts/netns_table.py $(NETNS_TABLE_ARGS)

# -------------------------------------------------------------------------------------- linting

.PHONY: lint
lint: lint-layers lint-settings lint-rust lint-python ## All linters: layering, settings, rustfmt, clippy, ruff, mypy, stubtest

# Standard library only: needs neither the venv nor a build.
.PHONY: lint-layers
lint-layers: ## No import from a lower layer to a higher one, no cycle of files (scripts/check_layers.py)
	$(BASE_PYTHON) scripts/check_layers.py

.PHONY: lint-rust
lint-rust: venv ## cargo fmt --check and clippy -D warnings
	cargo fmt --all --check
	cargo clippy --workspace --all-targets -- -D warnings

.PHONY: lint-python
lint-python: build-test ## ruff check/format, mypy --strict, stubtest of _native.pyi against the built module
	$(BIN)/ruff check
	$(BIN)/ruff format --check
	$(BIN)/mypy python/creditflow examples
	$(PY) -m mypy.stubtest creditflow._native --mypy-config-file pyproject.toml \
		--allowlist .mypy-stubtest-allowlist

# The settings table lives once, in rust/core (SETTINGS in settings.rs); the generator reads the
# Rust source, so neither target needs a build.
.PHONY: lint-settings
lint-settings: venv ## Check README.md's settings table and _native.pyi's constructor against the core's table
	$(PY) scripts/gen_settings.py --check

.PHONY: settings
settings: venv ## Write README.md's settings table and _native.pyi's constructor from the core's table
	$(PY) scripts/gen_settings.py

.PHONY: format
format: venv ## Apply rustfmt and ruff format/fixes
	cargo fmt --all
	$(BIN)/ruff check --fix
	$(BIN)/ruff format

# ------------------------------------------------------------------------------------- cleaning

.PHONY: clean
clean: ## Remove build outputs and caches (keeps .venv)
	cargo clean
	rm -rf $(WHEEL_DIR) .pytest_cache .mypy_cache .ruff_cache .benchmarks
	find python tests benches -name __pycache__ -type d -prune -exec rm -rf {} +
	find python -name '*.so' -delete

.PHONY: distclean
distclean: clean ## clean, and remove .venv (and .venv-bench) too
	rm -rf $(VENV) $(BENCH_VENV)
