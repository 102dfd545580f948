# Every target creates its own virtual environment, so a fresh clone needs only Python 3.11+,
# gcc and make. `make demo` and `make test` are the two commands in the README. `make test`
# also needs a few Debian packages (Prometheus, PostgreSQL's server binaries, Node.js):
# tools/debian-packages installs them when run as root, else names the command to run.
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV   := .venv
BIN    := $(VENV)/bin
SIMLIB := build/sim/libnvidia-ml.so.1

.PHONY: demo test lint typecheck unit bench docs clean debian-packages image

$(BIN)/.installed: pyproject.toml setup.py
	@test -d $(VENV) || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[dev]'
	@touch $@

# The NVML stand-in: a C library built from NVIDIA's nvml.h (from nvidia-nvml-dev).
$(SIMLIB): $(BIN)/.installed $(wildcard sim/nvml/*.c sim/nvml/*.h)
	$(BIN)/python -m gpuquota.sim.nvml.build --out $(SIMLIB)

demo: $(BIN)/.installed $(SIMLIB)
	@tools/debian-packages prometheus
	$(BIN)/python -m gpuquota.sim.demo

lint: $(BIN)/.installed
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

typecheck: $(BIN)/.installed
	$(BIN)/mypy gpuquota bench

debian-packages:
	@tools/debian-packages

# compileall first: the suite starts hundreds of Python processes, and where the environment
# sets PYTHONDONTWRITEBYTECODE (this project's machines do) each would compile the project anew
unit: debian-packages $(BIN)/.installed $(SIMLIB)
	$(BIN)/python -m compileall -q gpuquota bench
	$(BIN)/python -m pytest

test: debian-packages lint typecheck unit

# The container image, built without a Docker daemon (buildah, a Debian base from mmdebstrap)
# and smoke-run with podman as non-root on a read-only root filesystem; see tools/image.
image: $(BIN)/.installed $(SIMLIB)
	@tools/debian-packages buildah podman mmdebstrap runc curl
	tools/image build
	tools/image smoke

docs: $(BIN)/.installed
	$(BIN)/python -m gpuquota.exporter.expose.metrics_doc --write docs/metrics.md
	$(BIN)/python -m gpuquota.quota.controller.metrics_doc --write docs/controller-metrics.md

bench: $(BIN)/.installed $(SIMLIB)
	@tools/debian-packages wrk
	$(BIN)/python -m bench.exporter
	$(BIN)/python -m bench.health
	$(BIN)/python -m bench.controller
	$(BIN)/python -m bench.report
	$(BIN)/python -m bench.sim_nvml
	$(BIN)/python -m bench.scrape
	$(BIN)/python -m bench.ledger
	$(BIN)/python -m bench.fleet_fetch

clean:
	rm -rf $(VENV) build .mypy_cache .pytest_cache .ruff_cache
