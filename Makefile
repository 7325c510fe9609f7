# Crucible. `make demo` runs the main job, `make test` the tests (see README.md).
# BASE_IMAGE=debian:bookworm-slim builds the sandbox images on that image instead of a
# debootstrap base. PYTEST_ARGS passes extra arguments to pytest.

SHELL := /bin/bash
VENV := .venv
CRUCIBLE := $(VENV)/bin/crucible
PYTEST_ARGS ?=

export BASE_IMAGE
export CRUCIBLE_TEST_POSTGRES_URL ?= postgresql+psycopg://crucible:crucible@127.0.0.1:5432/crucible_test
export CRUCIBLE_TEST_REDIS_URL ?= redis://127.0.0.1:6379/0

.PHONY: setup images serve demo test bench lint stack stack-down

setup:
	@scripts/setup.sh

images: setup
	$(CRUCIBLE) images build $(if $(BASE_IMAGE),--base-image $(BASE_IMAGE))

serve: setup
	$(CRUCIBLE) serve

demo: setup images
	@scripts/demo.sh

test: setup images
	@scripts/services.sh >/dev/null
	$(VENV)/bin/pytest -q $(PYTEST_ARGS)

bench: setup images
	@if [ -f bench/run.py ]; then $(VENV)/bin/python bench/run.py; \
	else echo "bench: no benchmarks yet (bench/run.py)"; fi

# The local stack (docker-compose.yml; scripts/stack.sh). CRUCIBLE_STACK_IMAGES=official uses
# the postgres:15 and redis:7 images instead of building them from the local base.
stack:
	@scripts/stack.sh up

stack-down:
	@scripts/stack.sh down

lint: setup
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
