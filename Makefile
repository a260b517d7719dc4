# The entry commands (each installs ./.venv on first use):
#   make demo   - the main job: toy data -> train a detector and a segmentor -> COCO AP / mIoU
#   make test   - the test suite (CI runs `make lint`, `make demo`, then this)
#   make lint   - ruff (ruff.toml: pycodestyle, pyflakes, import order; lines up to 100 characters)
VENV ?= .venv
PY := $(VENV)/bin/python
PYTEST_ARGS ?=
# make test's pytest-xdist workers (each file runs whole on one of them, its module fixtures once);
# 0 runs the suite in one process
TEST_WORKERS ?= 2

.PHONY: install demo lint test test-quick test-all test-compat bench gpu-check clean-venv

install:
	@bash tools/install.sh

demo: install
	$(PY) tools/demo.py

# The whole tree under ruff.toml (ruff pinned in requirements/tests.txt).
lint: install
	$(PY) -m ruff check .

# Default suite: everything except tests marked `heavy` (large-arch forwards, long trainings), on
# TEST_WORKERS processes. pytest's exit code 5 ("no tests collected") is turned into a failure.
test: install
	@$(PY) -m pytest -m "not heavy" -n $(TEST_WORKERS) --dist loadfile $(PYTEST_ARGS) tests; rc=$$?; \
	if [ $$rc -eq 5 ]; then echo "make test: pytest collected no tests - failing" >&2; exit 1; fi; \
	exit $$rc

# The unit tier: the attention math against its oracles, the modules, the settings (no training,
# no whole detector); a few minutes on 2 cores. `make test` includes it.
QUICK_TESTS ?= tests/test_ops.py tests/test_core_grads.py tests/test_cores.py \
	tests/test_attention_modules.py tests/test_oracles.py tests/test_families.py \
	tests/test_settings.py tests/test_seg_postprocess.py tests/test_compare.py
test-quick: install
	@$(PY) -m pytest -m "not heavy and not slow" $(PYTEST_ARGS) $(QUICK_TESTS); rc=$$?; \
	if [ $$rc -eq 5 ]; then echo "make test-quick: pytest collected no tests - failing" >&2; exit 1; fi; \
	exit $$rc

test-all: install
	@$(PY) -m pytest $(PYTEST_ARGS) tests; rc=$$?; [ $$rc -ne 5 ] || exit 1; exit $$rc

# Not part of `make test`: the OLDEST supported stack, the one most mmdet 3.x users have, in a 2nd
# environment, $(COMPAT_VENV).
# tools/install_compat.sh builds it: first the environment OpenMMLab's guide leaves for torch 2.1
# (torch 2.1.2 + torchvision 0.16.2, numpy 1.24.4, opencv-python 4.8.1.78, mmengine 0.10.4, mmcv
# 2.1.0 compiled against that torch: once per torch version and cached, ~10 min on 2 cores), into
# which it installs the package as docs/install.md says, failing if pip freeze --all changes for a
# package that was there; then requirements/oldest.txt (mmengine 0.10.0, mmdet 3.2.0,
# mmsegmentation 1.2.1, mmpretrain 1.1.1). A smoke subset runs:
# backbones, config builds, toy trainings, resume, inference, the authors' files, the guest checks
# (import changes nothing), the wheel, and mmdet's / mmseg's / mmpretrain's own tools building our
# Runner from the config they were given.
COMPAT_VENV ?= .venv-compat
COMPAT_TESTS ?= tests/test_install_ranges.py tests/test_stack.py tests/test_guest.py tests/test_wheel.py \
	tests/test_compare.py tests/test_mmengine_private.py tests/test_tools_build_our_runner.py \
	tests/test_backbones.py::test_any_input_size tests/test_backbones.py::test_every_out_indices_subset \
	tests/test_backbones.py::test_roi_align_reads_the_features_we_return \
	tests/test_backbones.py::test_authors_file_loads_exactly tests/test_backbones.py::test_autocast_matches_fp32 \
	tests/test_backbones.py::test_wrong_architecture_fails_with_keys_and_shapes \
	tests/test_configs.py::test_toy_config_builds tests/test_configs.py::test_config_builds \
	tests/test_custom_dataset.py::test_guide_config_trains_and_evaluates \
	tests/test_faults.py::test_untrusted_checkpoint_runs_no_code tests/test_faults.py::test_not_a_checkpoint \
	tests/test_stop_and_resume.py \
	tests/test_edges.py::test_preemption_checkpoint_counts_in_max_keep_ckpts_and_resume_continues \
	tests/test_classification.py tests/test_inference.py::test_inferencer_runs_config \
	tests/test_ops.py tests/test_core_grads.py tests/test_deploy_jit.py
test-compat: install
	@MMLINATTN_COMPAT_VENV=$(COMPAT_VENV) bash tools/install_compat.sh
	@$(COMPAT_VENV)/bin/python -m pytest -m "not heavy" $(PYTEST_ARGS) $(COMPAT_TESTS) \
	  tests/test_upstream_train.py \
	  --deselect tests/test_stack.py::test_versions_are_the_measured_stack; rc=$$?; \
	if [ $$rc -eq 5 ]; then echo "make test-compat: pytest collected no tests - failing" >&2; exit 1; fi; \
	exit $$rc

bench: install
	$(PY) tools/analysis_tools/benchmark_attention.py --repeats 3 --out docs/benchmarks
	$(PY) tools/analysis_tools/benchmark.py --out docs/benchmarks
	$(PY) tools/analysis_tools/get_flops.py --all-backbones

# The GPU check, on a CUDA machine with $(GPU_CHECK_PYTHON) (the node's python and its torch; no
# .venv is built): the CUDA cases of the suite's oracle tests (pytest -m gpu) and the benchmarks with
# --device cuda, into $(GPU_CHECK_OUT)/report.md (tests/gpu_suite.py; exits 2 in one
# line without CUDA). A node without network installs requirements/gpu_node.txt from
# wheels downloaded elsewhere first: docs/development.md, "The GPU check".
GPU_CHECK_PYTHON ?= python3
GPU_CHECK_OUT ?= docs/benchmarks/gpu_check
gpu-check:
	$(GPU_CHECK_PYTHON) tests/gpu_suite.py --out $(GPU_CHECK_OUT)

clean-venv:
	rm -rf $(VENV)
