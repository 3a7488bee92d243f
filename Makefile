# `make demo` and `make test` each work as the first command on a fresh machine.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test test-newest newest-venv lint typecheck check docs clean

# The demo needs breakwater and its three runtime dependencies only: no dev tools to download, and
# the pip that Python >= 3.11 ships already installs editable projects.
RUN_STAMP := $(VENV)/.installed-run

$(RUN_STAMP): pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q --disable-pip-version-check -e .
	touch $(RUN_STAMP)

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[dev]'
	touch $(STAMP) $(RUN_STAMP)

demo: $(RUN_STAMP)
	$(BIN)/breakwater demo

# Three workers on two cores: the suite is real processes starting and waiting, and with two workers a
# quarter of the CPU sat idle (three: 6 %; 837 s with two, 756 s with three, one host, one hour). A
# module's tests stay on one worker (--dist loadfile), so module fixtures (the conformance runs, the
# npm servers) start once; the longest modules start first (tests/conftest.py), which needs xdist's own
# reorder (by number of tests) off. The slowest tests are listed at the end (--durations): on a slow host
# the suite's tail is what keeps CI long, and this says where it is.
test: $(STAMP)
	$(BIN)/pytest -q -n 3 --dist loadfile --no-loadscope-reorder --durations=25

# A newer Python than 3.11 (`NEWEST`, a command or a path; .ci/run finds the newest it has) in a venv of its
# own, against the tests of what a newer Python changed before: `sum` of floats (the lab's goldens),
# exceptions no longer wrapped (Ctrl-C), the stdlib's JSON depth, and the modules that lean on asyncio's,
# threading's and uvicorn's internals. The whole suite passed on 3.12 and 3.13 (CONTRIBUTING.md); only
# these run in CI, which has 15 minutes. Test by test across the workers (`--dist load`), not file by file:
# test_cli.py alone was the tail of a file-by-file run (94 s against 66 s, session 33).
NEWEST ?= python3.13
NEWEST_VENV := .venv-newest
NEWEST_TESTS := tests/test_codec.py tests/lab/test_golden.py tests/cli/test_cli.py tests/cli/test_exit.py \
	tests/test_platform.py tests/gate/test_gate_fake_clock.py tests/connect/test_broken_upstream.py \
	tests/gateway/test_known_heads.py

NEWEST_STAMP := $(NEWEST_VENV)/.installed

# The venv alone: .ci/run builds it while the main suite's own venv and checks run.
newest-venv: $(NEWEST_STAMP)

$(NEWEST_STAMP): pyproject.toml
	test -x $(NEWEST_VENV)/bin/python || $(NEWEST) -m venv $(NEWEST_VENV)
	$(NEWEST_VENV)/bin/pip install -q --disable-pip-version-check -e '.[dev]'
	touch $(NEWEST_STAMP)

test-newest: $(NEWEST_STAMP)
	$(NEWEST_VENV)/bin/python --version
	$(NEWEST_VENV)/bin/pytest -q -n 3 --dist load -p no:cacheprovider $(NEWEST_TESTS)

lint: $(STAMP)
	$(BIN)/ruff check src tests bench examples
	$(BIN)/ruff format --check src tests bench examples

typecheck: $(STAMP)
	$(BIN)/mypy

check: lint typecheck test

# Regenerate the README's knob and error tables from the code.
docs: $(STAMP)
	$(BIN)/python -m breakwater.cli._docs README.md

clean:
	rm -rf $(VENV) $(NEWEST_VENV) build dist *.egg-info
