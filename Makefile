# The two commands of the README:  make demo  and  make test.  Both set up what they need first
# and are quick on a second run (the virtualenv is rebuilt only when the pins change).
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed-$(shell cat pyproject.toml requirements.lock | sha256sum | cut -c1-12)

.PHONY: setup chromium demo test test-unit test-image lint format kafka-down clean docker-check data-docs-assets

$(STAMP): pyproject.toml requirements.lock
	@command -v javac >/dev/null || { echo "Java 17 with javac is required (apt-get install openjdk-17-jdk-headless)"; exit 1; }
	@command -v mvn >/dev/null || { echo "Maven is required (apt-get install maven)"; exit 1; }
	@$(PYTHON) -c 'import sys; assert (3, 11) <= sys.version_info[:2] < (3, 14), "Python 3.11-3.13 is required"'
	rm -f $(VENV)/.installed-*
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -c requirements.lock -e ".[test,seismic,audio,ecg,xarray]"
	$(BIN)/pip check
	touch $@

setup: $(STAMP)
	$(BIN)/wavepipe setup

demo: setup
	$(BIN)/wavepipe demo

# The Airflow UI test drives Debian's Chromium headless (through playwright, which does not
# download a browser of its own); without it that one test is skipped with the reason.
chromium:
	@if [ -x /usr/bin/chromium ]; then :; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
		echo "installing Chromium for the Airflow UI test (apt-get install chromium)"; \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null; \
	else echo "note: /usr/bin/chromium is missing, so the Airflow UI test will be skipped; install it with" \
		"'sudo apt-get install chromium' (Debian/Ubuntu)"; fi

# The fast tier: lint and format (ruff), pure logic, the DAG files' import, the stack's files; no
# broker, Spark or Airflow service (well under 2 minutes). `make test` runs it first.
# `make format` rewrites the tree the way `make lint` expects it.
lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

format: $(STAMP)
	$(BIN)/ruff check --fix .
	$(BIN)/ruff format .

test-unit: lint
	$(BIN)/python -m pytest -q tests/unit

# Then the integration tier (after building the local object store its S3 tests start, SeaweedFS
# with Go, and the GCS and Azure emulators, fake-gcs-server with Go and Azurite with npm, each
# once), two test files at a time (pytest-xdist; a file's tests stay on one worker, each worker
# has its own broker and Spark engine); TEST_WORKERS=1 runs them one by one.
TEST_WORKERS ?= 2
test: test-unit setup chromium
	$(BIN)/wavepipe setup --object-store --emulators
	$(BIN)/python -m pytest -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder --durations=25 tests/integration
	$(MAKE) test-image

# Last, the image tier: docker/Dockerfile built with buildah on a Debian base made with debootstrap
# (docker/build-local; about 5 minutes the first time, seconds when its inputs are unchanged), and
# run: the CLI, offline setup, the DAG folder, a bounded run and the ingest DAG inside the image;
# and the README followed on that Debian base (its apt-get line, then make demo; about 4 minutes).
# Needs root (buildah, network namespaces); without it every test there is skipped, saying why.
test-image: $(STAMP)
	WAVEPIPE_IMAGE_TEST=1 $(BIN)/python -m pytest -q --durations=10 tests/image

kafka-down:
	$(BIN)/wavepipe kafka down

# Validate docker/compose.yaml and the image's inputs without a Docker engine (builds the compose
# CLI plugin with Go into .cache/ the first time when `docker compose` is missing)
docker-check:
	docker/check

clean: kafka-down
	$(BIN)/wavepipe spark down --force
	rm -rf .wavepipe

# Refetch the files Great Expectations' Data Docs load from CDNs (wavepipe/offline_docs.py ships
# them in wavepipe/resources/data_docs so the pages render with no network) from the npm registry.
# Run it only when GX's templates name other versions (tests/unit/test_offline_docs.py says so).
DOCS_ASSETS := wavepipe/resources/data_docs
data-docs-assets:
	docs/data-docs-assets $(DOCS_ASSETS)
