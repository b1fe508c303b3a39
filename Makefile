# Two entry points (see README): `make demo` runs the main job, `make test` runs the tests.
# Both set up everything on a fresh machine first: a virtualenv in .venv with the CPU build of torch,
# the package (which generates the gRPC code from protos/), and the offline Fashion-MNIST files.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.secureflhv-installed
FMNIST := /usr/share/datasets/fashion-mnist

.PHONY: demo test setup gmp datasets browser docs-img bench bench-all clean flower

demo: setup
	$(PY) examples/vertical_lr.py

test: setup datasets browser
	$(PY) -m pytest -n 2 --dist worksteal --durations=15

setup: $(STAMP)

$(STAMP): pyproject.toml setup.py $(wildcard protos/secureflhv/proto/*.proto)
	$(PYTHON) -m venv $(VENV)
	# the CPU wheel of torch first, so that nothing later pulls CUDA packages
	$(PY) -m pip install --quiet "torch==2.13.0"
	$(PY) -m pip install --quiet -e ".[ml,test,ray]"
	$(MAKE) --no-print-directory gmp
	touch $(STAMP)

# gmpy2 rebuilt against the system's GMP: Debian's libgmp10 picks this CPU's assembly at run time, and its
# modular exponentiation (Paillier decryption, scalar products, compression) takes ~25% less time than
# the GMP bundled in gmpy2's wheel, its products of 4096-bit numbers ~8% less (benchmarks/paillier.py
# names the GMP it ran on). Needs gcc and the GMP, MPFR and MPC headers (Debian: libgmp-dev libmpfr-dev
# libmpc-dev, installed here with root or sudo); where the build fails, the wheel stays and setup goes on.
GMP_DEV := libgmp-dev libmpfr-dev libmpc-dev
gmp:
	@if command -v apt-get >/dev/null && ! dpkg -s $(GMP_DEV) >/dev/null 2>&1; then \
	  SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
	  $$SUDO apt-get update -qq && $$SUDO apt-get install -y -qq $(GMP_DEV) >/dev/null || true; \
	fi
	@v=$$($(PY) -c 'import gmpy2; print(gmpy2.version())'); \
	if $(PY) -m pip install --quiet --force-reinstall --no-deps --no-binary gmpy2 "gmpy2==$$v"; then \
	  $(PY) -c 'import gmpy2; print("gmpy2", gmpy2.version(), "built on the system", gmpy2.mp_version())'; \
	else \
	  echo "note: gmpy2 keeps the GMP of its wheel (modular exponentiation ~25% slower): install $(GMP_DEV) and run 'make gmp'"; \
	fi

# Flower in its own virtualenv (.venv-flower: it pins protobuf < 7), for benchmarks/byom_throughput.py's comparison
flower:
	bash benchmarks/flower_env.sh

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
