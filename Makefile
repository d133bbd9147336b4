PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
INSTANCE ?= instances/two-campus-100km.yaml

.PHONY: venv run test lint bench clean test-consumers consumer-exports

$(BIN)/placer: pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev]'
	touch $(BIN)/placer

venv: $(BIN)/placer

run: venv
	$(BIN)/placer solve $(INSTANCE)

# two passes (tests/conftest.py): the suite spread over the cores, then the tests that
# assert wall-clock behaviour, alone
test: venv
	$(BIN)/python -m pytest -n auto --dist worksteal -m "not serial" --durations=15
	$(BIN)/python -m pytest -m serial --durations=10

lint: venv
	$(BIN)/ruff check placer tests benchmarks consumers

bench: venv
	$(BIN)/python benchmarks/solve_bench.py

# ---- consumer tier: placer's exports run in the real tools (README "Consumer tests")
CVENV := .venv-consumers
CBIN := $(CVENV)/bin
CBUILD := build/consumers
CASE := consumers/case

# torch first, pinned to the CPU build on disk (a download would be a CUDA build: refused),
# then the tools under the same constraint so that pip can never swap torch
$(CVENV)/.installed: consumers/constraints.txt consumers/requirements.txt
	rm -rf $(CVENV)
	mkdir -p $(CBUILD)
	$(PY) -m venv $(CVENV)
	$(CBIN)/pip install --quiet --log $(CBUILD)/pip-torch.log -c consumers/constraints.txt torch==2.13.0
	@if grep -E "Downloading (torch-[0-9]|nvidia[-_])" $(CBUILD)/pip-torch.log; then echo "torch was downloaded, not taken from disk" >&2; exit 1; fi
	$(CBIN)/pip install --quiet --log $(CBUILD)/pip-tools.log -c consumers/constraints.txt -r consumers/requirements.txt
	@if grep -E "Downloading (torch-[0-9]|nvidia[-_])" $(CBUILD)/pip-tools.log; then echo "a second torch or CUDA runtime was pulled" >&2; exit 1; fi
	$(CBIN)/pip install --quiet --no-deps --target $(CVENV)/torchtitan-0.2.2 -c consumers/constraints.txt torchtitan==0.2.2
	$(CBIN)/python -c "import torch; assert torch.__version__ == '2.13.0+cpu', torch.__version__"
	touch $@

# the tools' versions, printed by test-consumers (importing them takes ~15 s: once, at set-up)
$(CVENV)/tools.txt: $(CVENV)/.installed
	$(CBIN)/python -c "import torch, megatron.core, torchtitan; print('tools: torch', torch.__version__, '| megatron-core', megatron.core.__version__, '| torchtitan', __import__('importlib.metadata').metadata.version('torchtitan'))" > $@.tmp
	mv $@.tmp $@

# the exports, rebuilt when placer, a consumer case or the exported instance changes (a stamp,
# so that .ci/run can build them in the background during `make test`)
CEXPORTS := $(CBUILD)/.exports
EXPORT_INPUTS := $(shell find placer consumers -name '*.py' -o -name '*.yaml' -o -name '*.json') \
	instances/deepseek-v3-two-sites.yaml instances/plans/deepseek-v3-two-sites.json

consumer-exports: $(CEXPORTS)

$(CEXPORTS): $(BIN)/placer $(EXPORT_INPUTS)
	mkdir -p $(CBUILD)
	rm -rf $(CBUILD)/export $(CBUILD)/export-0.2 $(CBUILD)/export-uneven
	$(BIN)/placer export $(CASE)/plan.json -i $(CASE)/instance.yaml -f all -o $(CBUILD)/export
	$(BIN)/placer export $(CASE)/plan.json -i $(CASE)/instance.yaml -f torchtitan --torchtitan-version 0.2 -o $(CBUILD)/export-0.2
	rm -rf $(CBUILD)/export-5d
	$(BIN)/placer export consumers/case5d/plan.json -i consumers/case5d/instance.yaml -f all -o $(CBUILD)/export-5d
	rm -rf $(CBUILD)/export-ds3
	$(BIN)/placer export instances/plans/deepseek-v3-two-sites.json -i instances/deepseek-v3-two-sites.yaml -f all -o $(CBUILD)/export-ds3
	rm -rf $(CBUILD)/export-interleaved $(CBUILD)/export-interleaved-layout $(CBUILD)/export-interleaved-chunks
	$(BIN)/placer export $(CASE)-interleaved/plan.json -i $(CASE)-interleaved/instance.yaml -f all -o $(CBUILD)/export-interleaved
	$(BIN)/placer export $(CASE)-interleaved/plan-layout.json -i $(CASE)-interleaved/instance.yaml -f all -o $(CBUILD)/export-interleaved-layout
	$(BIN)/placer export $(CASE)-interleaved/plan-chunks.json -i $(CASE)-interleaved/instance.yaml -f all -o $(CBUILD)/export-interleaved-chunks
	$(BIN)/placer export $(CASE)/plan-uneven.json -i $(CASE)/instance.yaml -f all -o $(CBUILD)/export-uneven
	rm -rf $(CBUILD)/export-hsdp $(CBUILD)/export-hsdp-0.2
	$(BIN)/placer export consumers/case-hsdp/plan.json -i consumers/case-hsdp/instance.yaml -f all -o $(CBUILD)/export-hsdp
	$(BIN)/placer export consumers/case-hsdp/plan.json -i consumers/case-hsdp/instance.yaml -f torchtitan --torchtitan-version 0.2 -o $(CBUILD)/export-hsdp-0.2
	rm -rf $(CBUILD)/export-moe
	for p in pp1 vpp pp2; do $(BIN)/placer export consumers/case-moe/plan-$$p.json -i consumers/case-moe/instance.yaml -f megatron -o $(CBUILD)/export-moe/$$p || exit 1; done
	for p in etp1 etp2; do $(BIN)/placer export consumers/case-moe/plan-$$p.json -i consumers/case-moe/instance-etp.yaml -f all -o $(CBUILD)/export-moe/$$p || exit 1; done
	$(BIN)/placer export consumers/case-moe/plan-pp1.json -i consumers/case-moe/instance-graphs.yaml -f megatron -o $(CBUILD)/export-moe/graphs
	rm -rf $(CBUILD)/export-dualpipev
	$(BIN)/placer export consumers/case-dualpipev/plan.json -i consumers/case-dualpipev/instance.yaml -f torchtitan --torchtitan-version 0.2 -o $(CBUILD)/export-dualpipev
	$(BIN)/python consumers/export_splits.py $(CBUILD)/megatron_splits.json
	touch $@

test-consumers: venv $(CVENV)/.installed $(CVENV)/tools.txt consumer-exports
	@cat $(CVENV)/tools.txt
	@slurmd -V 2>/dev/null || echo "slurm-wlm: not installed"
	PLACER_EXPORT=$(CURDIR)/$(CBUILD)/export PLACER_EXPORT_02=$(CURDIR)/$(CBUILD)/export-0.2 PLACER_EXPORT_5D=$(CURDIR)/$(CBUILD)/export-5d PLACER_EXPORT_DS3=$(CURDIR)/$(CBUILD)/export-ds3 PLACER_EXPORT_HSDP=$(CURDIR)/$(CBUILD)/export-hsdp PLACER_EXPORT_HSDP_02=$(CURDIR)/$(CBUILD)/export-hsdp-0.2 PLACER_EXPORT_MOE=$(CURDIR)/$(CBUILD)/export-moe PLACER_EXPORT_DUALPIPEV=$(CURDIR)/$(CBUILD)/export-dualpipev \
	  PLACER_EXPORT_VPP=$(CURDIR)/$(CBUILD)/export-interleaved PLACER_EXPORT_VPP_LAYOUT=$(CURDIR)/$(CBUILD)/export-interleaved-layout PLACER_EXPORT_VPP_CHUNKS=$(CURDIR)/$(CBUILD)/export-interleaved-chunks \
	  PLACER_EXPORT_UNEVEN=$(CURDIR)/$(CBUILD)/export-uneven PLACER_SPLITS=$(CURDIR)/$(CBUILD)/megatron_splits.json \
	  $(CBIN)/python -m pytest consumers -rs -s -p no:cacheprovider --durations=10

clean:
	rm -rf $(VENV) $(CVENV) build out .pytest_cache
