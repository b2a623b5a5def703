# FasterFS: the two commands of the README, and the pieces they are made of.
# Hydra overrides go in ARGS, e.g.  make run ARGS="nodes=4 data.format=arrow"
VENV := .venv/bin
ARGS ?=

.PHONY: setup run test up ingest readback demo_a status down clean

setup:            ## install everything (idempotent): Debian packages, kernel headers link, MinIO, virtualenv
	bash scripts/setup.sh

run: setup        ## the main job: a local cluster, ingest of the LOBSTER sample, read-back, the demos
	@$(VENV)/fasterfs status $(ARGS) >/dev/null 2>&1 || $(VENV)/fasterfs up $(ARGS)
	$(VENV)/fasterfs ingest $(ARGS)
	$(VENV)/python jobs/readback.py $(ARGS)
	$(VENV)/python jobs/demo_a.py $(ARGS)
	@echo "The cluster keeps running (Ray dashboard above; notebooks/quickstart.ipynb). Stop it with: $(VENV)/fasterfs down"

test: setup       ## the whole test suite against real MinIO, Ray and kernel
	$(VENV)/python -m pytest tests

up status down ingest: setup
	$(VENV)/fasterfs $@ $(ARGS)

readback demo_a: setup
	$(VENV)/python jobs/$@.py $(ARGS)

clean:            ## remove the virtualenv and built MinIO (stop the cluster first)
	rm -rf .venv .deps
