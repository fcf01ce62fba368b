# The development loop. `make test` is the README's test command.
PY := .venv/bin/python

.PHONY: venv compile test test-pure bench lint proto clean run

venv:
	scripts/bootstrap.sh

compile: venv
	$(PY) setup.py -q build_ext --inplace

test:
	scripts/test.sh

test-pure: venv
	RATELIMITD_NO_EXTENSIONS=1 $(PY) -m pytest -q tests/core

bench: venv
	$(PY) -m pytest bench --benchmark-only --benchmark-group-by=group,param:rules \
		--benchmark-columns=min,mean,median,ops --benchmark-json=bench/.results/core.json

lint: venv
	.venv/bin/ruff check .
	.venv/bin/ruff format --check .
	.venv/bin/mypy ratelimitd

run:
	scripts/run.sh

clean:
	rm -rf build dist *.egg-info .pytest_cache .benchmarks .hypothesis bench/.results
	find ratelimitd -name '*.c' -o -name '*.so' | xargs rm -f
	find . -name __pycache__ -prune -exec rm -rf {} +
