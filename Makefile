# The two commands a new user needs: `make demo` and `make test`.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
TORCH  := torch==2.13.0
# pytest-xdist worker processes for `make test` and `make test-fast` (0: the tests run in pytest's own process)
TEST_JOBS ?= 2

.PHONY: demo test test-fast lint s3-dev

$(VENV)/.installed: pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q $(TORCH)
	$(PY) -m pip install -q -e '.[dev,demo]'
	$(PY) -m pip install -q --no-deps --no-build-isolation basicsr==1.4.2   # for tests/test_integrations_basicsr.py; its pins would replace torch
	$(PY) -m pip install -q --no-deps spandrel==0.4.2   # for tests/test_zoo.py; its torchvision would replace torch (tests stub it)
	touch $@

demo: $(VENV)/.installed
	$(PY) -m wdsr.tools.demo --out demo-out

test: $(VENV)/.installed lint
	$(PY) -m pytest -q -n $(TEST_JOBS) --dist loadgroup

# ruff (lint + format check) and mypy on the packages, with the versions pinned in the dev extra; part of `make test`
lint: $(VENV)/.installed
	$(PY) -m ruff check shardmaker wdsr
	$(PY) -m ruff format --check shardmaker wdsr
	$(PY) -m mypy

# the edit-test loop: no S3 server, no torchrun or other multi-process tests (CI runs `make test`)
test-fast: $(VENV)/.installed
	$(PY) -m pytest -q -n $(TEST_JOBS) --dist loadgroup -m "not slow and not s3"

# a local S3 (SeaweedFS, bound to 127.0.0.1, the tests' settings) to try the S3 path: prints the
# AWS_* variables to export in another shell; Ctrl-C stops it
s3-dev: $(VENV)/.installed
	$(PY) -m tests.s3server --dir .s3-dev
