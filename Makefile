# The two commands the README promises: `make run` and `make test`.
SHELL := /bin/bash
PY    := .venv/bin/python
AENV  := .venv/bin/aenv
UV    := .uv/bin/uv

.PHONY: run test test-long setup host-deps venv console-libs artifacts unit integration e2e lint bench clean

# Serves once base-minimal is ready; a missing familiar `base` is made by the node meanwhile.
run: host-deps venv console-libs
	$(AENV) setup --defer-base
	$(AENV) server

test: setup
	bash scripts/test.sh

# The cases too slow for CI: long soaks, large bursts, upstream suites (docs/testing.md).
test-long: setup
	bash scripts/test-long.sh

setup: host-deps venv console-libs artifacts

host-deps:
	bash scripts/install-host-deps.sh

venv: .venv/.synced

.venv/.synced: pyproject.toml uv.lock
	test -x $(UV) || (/usr/bin/python3.11 -m venv .uv && .uv/bin/pip install -q uv==0.13.9)
	UV_PROJECT_ENVIRONMENT=.venv $(UV) sync --frozen --python /usr/bin/python3.11 -q
	$(PY) -m pip check 2>/dev/null || $(UV) pip check --python $(PY)
	touch $@

# The web console's libraries (xterm.js), from the npm registry by the lock file, no install
# scripts run; served by the node as ES modules (docs/console.md).
CONSOLE_WEB := src/aenv/console/web
console-libs: $(CONSOLE_WEB)/node_modules/.package-lock.json

$(CONSOLE_WEB)/node_modules/.package-lock.json: $(CONSOLE_WEB)/package-lock.json
	cd $(CONSOLE_WEB) && npm ci --ignore-scripts --no-audit --no-fund --loglevel=error
	touch $@

# Kernel, tools drive and the default template: cached by their inputs' hashes.
artifacts: venv
	$(AENV) setup

lint: venv
	.venv/bin/ruff check src tests bench examples

unit: venv
	$(PY) -m pytest -q tests/unit

integration: venv
	$(PY) -m pytest -q tests/integration

e2e: venv
	$(PY) -m pytest -q tests/e2e

bench: setup
	$(PY) bench/run.py

clean:
	rm -rf .venv .uv
