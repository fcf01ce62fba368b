# The development loop. `make test` is the README's test command.
PY := .venv/bin/python

.PHONY: venv compile test test-pure bench bench-load lint proto clean run constraints

venv:
	scripts/bootstrap.sh

# The editable install compiles the Cython extensions in place (Cython lives in its isolated
# build environment, not in .venv).
compile: venv
	$(PY) -m pip install -q -e ".[test]" -e ./tests

test:
	scripts/test.sh

test-pure: venv
	RATELIMITD_NO_EXTENSIONS=1 $(PY) -m pytest -q tests/core

# Core benchmarks: CPU time per call (time.process_time), compiled vs pure side by side.
bench: venv
	mkdir -p bench/.results
	$(PY) -m pytest bench/test_core.py -p no:cacheprovider --benchmark-only \
		--benchmark-timer=time.process_time --benchmark-columns=min,median,mean,ops \
		--benchmark-sort=name --benchmark-json=bench/.results/core.json
	$(PY) bench/report_core.py

# Load benchmarks (gRPC, /json, Envoy): regenerates bench/results/load.md from one run.
bench-load: venv
	$(PY) bench/load/run_all.py

# The protobuf/gRPC modules are generated from proto/ by setup.py at every install.
proto: compile

lint: venv
	.venv/bin/ruff check .
	.venv/bin/ruff format --check .
	.venv/bin/mypy ratelimitd

run:
	scripts/run.sh

# The pinned versions the images and the release wheels build with (constraints.txt).
constraints: venv
	$(PY) scripts/constraints.py

clean:
	rm -rf build dist *.egg-info .pytest_cache .benchmarks .hypothesis bench/.results
	find ratelimitd -name '*.c' -o -name '*.so' | xargs rm -f
	find . -name __pycache__ -prune -exec rm -rf {} +
