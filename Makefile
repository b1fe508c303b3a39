# Two entry points (see README): `make demo` runs the main job, `make test` runs the tests.
# Both set up everything on a fresh machine first: a virtualenv in .venv with the CPU build of torch,
# the package (which generates the gRPC code from protos/), and the offline Fashion-MNIST files.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.secureflhv-installed
FMNIST := /usr/share/datasets/fashion-mnist

.PHONY: demo test setup datasets browser docs-img bench bench-all clean

demo: setup
	$(PY) examples/vertical_lr.py

test: setup datasets browser
	$(PY) -m pytest -n 2 --durations=15

setup: $(STAMP)

$(STAMP): pyproject.toml setup.py $(wildcard protos/secureflhv/proto/*.proto)
	$(PYTHON) -m venv $(VENV)
	# the CPU wheel of torch first, so that nothing later pulls CUDA packages
	$(PY) -m pip install --quiet "torch==2.13.0"
	$(PY) -m pip install --quiet -e ".[ml,test,ray]"
	touch $(STAMP)

# Fashion-MNIST as IDX files from Debian (no download at run time); needs root or sudo.
datasets:
	@if [ ! -d $(FMNIST) ]; then \
	  SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
	  $$SUDO apt-get update -qq && $$SUDO apt-get install -y -qq dataset-fashion-mnist >/dev/null; \
	fi

# Headless Chromium and its driver from Debian, for the job page's browser test; needs root or sudo.
browser:
	@if ! command -v chromium >/dev/null || ! command -v chromedriver >/dev/null; then \
	  SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
	  $$SUDO apt-get update -qq && $$SUDO apt-get install -y -qq chromium chromium-driver >/dev/null; \
	fi

# The job page's screenshot in the README, from the browser test's real run.
docs-img: setup browser
	SECUREFLHV_DOCS_IMG=docs/img/dashboard.png $(PY) -m pytest -n 0 -q tests/runtime/test_dashboard_browser.py

bench: setup
	$(PY) benchmarks/vertical_lr.py --quick

# Every benchmark's recorded configuration (~11 min on 2 idle cores), then the README's table.
bench-all: setup datasets
	$(PY) benchmarks/run_all.py

clean:
	rm -rf $(VENV) build *.egg-info secureflhv/proto/*_pb2*.py secureflhv/proto/*_pb2*.pyi runs
