# ddpfleet — every entry point a user or CI needs. `make help` lists them.
SHELL := /bin/bash
.SHELLFLAGS := -eu -o pipefail -c
.DEFAULT_GOAL := help

PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.ddpfleet-installed
JPEG_LIB := $(VENV)/lib/libddpfleet_jpeg.so
INVENTORY ?= inventory/sandbox/hosts.yml
RUN_ID ?= demo
export ANSIBLE_CONFIG := $(CURDIR)/ansible.cfg
export PATH := $(CURDIR)/$(BIN):$(PATH)

.PHONY: help venv venv-images host-deps lint generate format unit test-gpu check e2e test tensorboard report infra sandbox sandbox-down demo bench bench-decode bench-balance clean

help: ## List the targets
	@grep -hE '^[a-z0-9-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-14s %s\n", $$1, $$2}'

# pip byte-compiles one file at a time: the venv's modules are compiled after it, on every core
# (the torch stack: 58 s of a 90 s install, against 15 s; 2-core EPYC, 2026-12-01). Files that
# are not Python 3 (templates, test data) stay without .pyc, as pip leaves them.
$(STAMP): requirements.txt collections.txt tools/install_collections.py pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet --no-compile -r requirements.txt
	$(BIN)/python tools/install_collections.py
	$(BIN)/python -c 'import compileall, sysconfig; compileall.compile_dir(sysconfig.get_paths()["purelib"], quiet=2, workers=0)'
	$(BIN)/python -m pip install --quiet --no-deps --no-build-isolation -e .
	@touch $@

# The trainer's region JPEG decoder (trainer/jpeg.py), built as the image's jpeg stage builds it.
$(JPEG_LIB): images/trainer/jpegcrop.c $(STAMP)
	@printf '#include <stdio.h>\n#include <jpeglib.h>\n' | cc -E -x c - >/dev/null 2>&1 || { \
		echo "make: $@ needs a C compiler and libjpeg's headers (apt-get install gcc libc6-dev libjpeg-dev)" >&2; exit 1; }
	cc -O2 -Wall -Wextra -Werror -fPIC -shared -fvisibility=hidden -o $@ $< -ljpeg

venv: $(STAMP) $(JPEG_LIB) ## Create or update the pinned environment in .venv (seconds when nothing changed)

lint: $(STAMP) ## ansible-lint (production profile), yamllint, ruff lint + format check, generated files current
	$(BIN)/python tools/gen_options.py --check
	$(BIN)/yamllint --strict .
	$(BIN)/ansible-lint --offline --profile production
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

generate: $(STAMP) ## Rewrite the files generated from trainer/options.py (argument_specs, role defaults, sample inventory, the agent's flag table)
	$(BIN)/python tools/gen_options.py

format: $(STAMP) ## Apply ruff's formatting and safe fixes
	$(BIN)/ruff check --fix .
	$(BIN)/ruff format .

# One worker per core (pytest-xdist): on 2 cores the tier took 621 s instead of 865 s (EPYC
# without AVX512, 2026-11-26); its waits (torch start-up, playbook runs, timeouts) overlap.
# UNIT_ARGS: more pytest arguments (make test runs the tier in two parts with -m).
# tools/browser-deps.sh: the console page's unit test renders it in headless Chromium.
unit: $(STAMP) $(JPEG_LIB) ## Unit tier: pure Python, filters, trainer on CPU (incl. 2-rank gloo runs), the console page in Chromium
	bash tools/browser-deps.sh
	$(BIN)/python -m pytest tests/unit -n auto --durations=40 $(UNIT_ARGS)

test-gpu: $(STAMP) ## GPU tier, on a host with an NVIDIA GPU only (not in make test: CI has none)
	$(BIN)/python -m pytest tests/gpu

check: lint unit ## Fast inner loop: lint + unit tests

host-deps: ## Make sure a Docker engine and debootstrap are there (installs them on a bare Debian host as root)
	bash sandbox/host-deps.sh

e2e: $(STAMP) host-deps ## End-to-end tier on the sandbox cluster (needs a Docker engine; installs chromium for the console page)
	bash tools/browser-deps.sh
	$(BIN)/python -m pytest tests/e2e --durations=40

# tools/test_tiers.sh: lint beside the unit tier's wall-clock tests, then the e2e tier with the
# rest of the unit tier beside it on the CPU it leaves idle, each part's time printed.
test: ## Every test tier (what CI runs): lint, unit, e2e, each tier's time printed
	@MAKE="$(MAKE)" bash tools/test_tiers.sh

tensorboard: $(STAMP) ## Serve a run's TensorBoard curves on the controller: make tensorboard RUN=<id> [PORT=6006]
	@test -n "$(RUN)" || { echo "make tensorboard: give the run, e.g. make tensorboard RUN=1234" >&2; exit 2; }
	$(BIN)/ansible-playbook -i $(INVENTORY) tensorboard.yml -e run_id=$(RUN)
	$(BIN)/tensorboard --logdir .cache/tensorboard/$(RUN) --host 127.0.0.1 --port $(or $(PORT),6006)

# status.yml shows a run's state; for a completed run also its report, and it copies report.png
# to .cache/runs/<id>/ on the controller, as train.yml does when it has followed a run to its end.
report: $(STAMP) ## A run's state, and a completed run's report with report.png copied to .cache/runs/<id>/: make report RUN=<id>
	@test -n "$(RUN)" || { echo "make report: give the run, e.g. make report RUN=1234" >&2; exit 2; }
	$(BIN)/ansible-playbook -i $(INVENTORY) status.yml -e run_id=$(RUN)

infra: $(STAMP) ## testinfra node checks against INVENTORY (default: the sandbox)
	$(BIN)/python -m pytest tests/infra --hosts=ansible://all --ansible-inventory=$(INVENTORY)

# The node images (two debootstraps, mostly waiting on the package mirror) build while the
# venv installs: on a bare 2-core machine the two one after the other took about 2 min longer.
# `make sandbox` and CI's .ci/run both come through here. The sandbox package is stdlib only,
# so the system python runs it; each part's time is printed.
venv-images: host-deps ## The venv and the sandbox's node images, built side by side (each one's time printed)
	@log=$$(mktemp); start=$$(date +%s); $(PYTHON) -m sandbox images >"$$log" 2>&1 & images=$$!; \
	$(MAKE) --no-print-directory venv || { kill $$images; exit 1; }; \
	echo "make: venv took $$(( $$(date +%s) - start )) s"; \
	wait $$images || { cat "$$log"; echo "make: building the sandbox's node images failed" >&2; exit 1; }; \
	tail -n 3 "$$log"; rm -f "$$log"; \
	echo "make: the venv and the node images, side by side, took $$(( $$(date +%s) - start )) s"

sandbox: venv-images ## Create the sandbox cluster and write inventory/sandbox/hosts.yml
	$(BIN)/python -m sandbox up

sandbox-down: $(STAMP) ## Remove everything the sandbox made, and nothing else
	$(BIN)/python -m sandbox down

# The demo ends with train.yml's report: the summary table, report.png copied to
# .cache/runs/$(RUN_ID)/, the console page's address and the TensorBoard command.
demo: sandbox ## Sandbox up, site.yml, train.yml -e run_id=$(RUN_ID): summary table, report.png on the controller
	$(BIN)/ansible-playbook -i $(INVENTORY) site.yml
	$(BIN)/ansible-playbook -i $(INVENTORY) train.yml -e run_id=$(RUN_ID)

bench: $(STAMP) ## Benchmark: naive DDP loop vs the trainer (prints img/s and the ratio)
	$(BIN)/python bench/ddp_bench.py

bench-decode: $(STAMP) $(JPEG_LIB) ## CPU JPEG decode benchmark: JPEGs/s per core before vs --decode cpu, ratio last
	$(BIN)/python bench/decode_bench.py

bench-balance: $(STAMP) ## Sandbox: one host slowed at launch (train_balance off vs auto), then mid-run (train_rebalance off vs auto)
	$(BIN)/python bench/balance_bench.py
	$(BIN)/python bench/balance_bench.py --mid-run --cpus 0.1 --image-size 64 --mid-run-steps 80 --slow-at 12 --min-hosts 2

clean: ## Remove the venv and caches (not the sandbox: use sandbox-down)
	rm -rf $(VENV) .pytest_cache .ruff_cache
