# The two entry commands (both install ./.venv on first use):
#   make demo   - the main job: toy data -> train a detector and a segmentor -> COCO AP / mIoU
#   make test   - the test suite (what CI runs)
VENV ?= .venv
PY := $(VENV)/bin/python
PYTEST_ARGS ?=

.PHONY: install demo test test-all bench gpu-report clean-venv

install:
	@bash tools/install.sh

demo: install
	$(PY) tools/demo.py

# Default suite: everything except tests marked `heavy` (large-arch forwards, long trainings).
# pytest's exit code 5 ("no tests collected") is turned into a failure.
test: install
	@$(PY) -m pytest -m "not heavy" $(PYTEST_ARGS) tests; rc=$$?; \
	if [ $$rc -eq 5 ]; then echo "make test: pytest collected no tests - failing" >&2; exit 1; fi; \
	exit $$rc

test-all: install
	@$(PY) -m pytest $(PYTEST_ARGS) tests; rc=$$?; [ $$rc -ne 5 ] || exit 1; exit $$rc

bench: install
	$(PY) tools/analysis_tools/benchmark_attention.py --repeats 3 --out docs/benchmarks
	$(PY) tools/analysis_tools/benchmark.py --out docs/benchmarks
	$(PY) tools/analysis_tools/get_flops.py --all-backbones

# On a CUDA machine: the GPU-only tests, fp16/bf16 attention vs fp32 and flash attention, training
# memory and it/s with and without --amp -> docs/benchmarks/gpu_report.md (exits 2 without CUDA).
gpu-report: install
	$(PY) tools/analysis_tools/gpu_report.py --out docs/benchmarks/gpu_report

clean-venv:
	rm -rf $(VENV)
