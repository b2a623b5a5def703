# FasterFS: the two commands of the README, and the pieces they are made of.
# Hydra overrides go in ARGS, e.g.  make run ARGS="nodes=4 data.format=arrow"
VENV := .venv/bin
ARGS ?=

.PHONY: setup setup-test run lab test lint docs notebook up ingest readback demo_a backtest demo_b cross_host graysort status down clean

setup:            ## install what running needs (idempotent): Debian packages, kernel headers link, MinIO, virtualenv, the daemon
	bash scripts/setup.sh

setup-test:       ## and what the tests and benchmarks use: a browser, fio, s3fs, rclone, bpftool, pytest, ruff, mypy
	bash scripts/setup.sh test

# The README's first command sets everything up, the tests' tools too, so its second one only tests.
run: setup-test   ## the main job: a local cluster, ingest of the LOBSTER sample, read-back, the demos, a backtest
	@$(VENV)/fasterfs status $(ARGS) >/dev/null 2>&1 || $(VENV)/fasterfs up $(ARGS)
	$(VENV)/fasterfs ingest $(ARGS)
	$(VENV)/python jobs/readback.py $(ARGS)
	$(VENV)/python jobs/demo_a.py $(ARGS)
	$(VENV)/python jobs/backtest.py $(ARGS)
	$(VENV)/python jobs/demo_b.py $(ARGS)
	$(VENV)/python jobs/graysort.py $(ARGS)
	@$(VENV)/fasterfs status $(ARGS)
	@echo "The cluster keeps running (FasterFS and Ray dashboards above; notebooks/quickstart.ipynb)."
	@echo "Ray's tools from a new shell: eval \"\$$($(VENV)/fasterfs env)\"; ray job submit --working-dir . -- python jobs/graysort.py"
	@echo "Stop it with: $(VENV)/fasterfs down"

lab: setup        ## Demo B and cross-host caching on 4 lab hosts with per-host limits, then the lab is removed
	@$(VENV)/fasterfs status $(ARGS) >/dev/null 2>&1 && { echo "a cluster is running under this root: fasterfs down first"; exit 1; } || true
	$(VENV)/fasterfs lab up --nodes 4 $(ARGS)
	$(VENV)/fasterfs ingest $(ARGS) && $(VENV)/python jobs/demo_b.py $(ARGS) && $(VENV)/python jobs/cross_host.py $(ARGS); \
	  rc=$$?; $(VENV)/fasterfs lab down $(ARGS); exit $$rc

test: setup-test  ## the whole test suite against real MinIO, Ray and kernel: the unit and cluster tiers beside the lab's
	$(VENV)/python -m pytest tests -n 2

lint: setup-test  ## ruff, the layers' import contract, mypy, the docs' tables current and built strict: any finding fails
	$(VENV)/ruff check fasterfs jobs bench tests
	$(VENV)/lint-imports --no-cache
	$(VENV)/mypy fasterfs
	$(VENV)/python -m fasterfs.ui.reference --check
	$(VENV)/mkdocs build --strict --quiet

docs:             ## docs/'s generated tables made again: from conf/, the CLI's table of commands, docs/results/
	$(VENV)/python -m fasterfs.ui.reference

notebook: setup   ## JupyterLab on the head's address, beside the dashboards (the cluster must be up)
	$(VENV)/fasterfs notebook $(ARGS)

up status down ingest: setup
	$(VENV)/fasterfs $@ $(ARGS)

readback demo_a backtest demo_b cross_host graysort: setup
	$(VENV)/python jobs/$@.py $(ARGS)

clean:            ## remove the virtualenv and built MinIO (stop the cluster first)
	rm -rf .venv .deps
