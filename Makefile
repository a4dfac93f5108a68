# Every target sets up what it needs (scripts/setup-env): Graphviz, .venv, the pins.
SHELL := /bin/bash
.DEFAULT_GOAL := help
VENV := .venv
BIN := $(VENV)/bin
PORT ?= 8000
# -W: a warning fails the build; -n: a broken reference is a warning;
# --keep-going: report every warning of the run, not just the first.
# --all: read every page again (executed chapters still come from the cache), so a
# link's text follows its target's title even on a page that did not change.
BOOK_FLAGS := --warningiserror --nitpick --keep-going --all

.PHONY: help book pdf test quick lint bench matrix serve lab clean distclean install-check

help:
	@echo "make book   build the HTML book into _build/html (executes the chapters)"
	@echo "make pdf    the whole book as one PDF in _build/pdf/ (and a link to it on the intro)"
	@echo "make test   lint, build the book and run the whole test suite"
	@echo "make quick  the edit loop: lint, the unit tests, and the chapters changed since the last build"
	@echo "make lint   ruff on the code and the chapters; notebooks committed without outputs"
	@echo "make install-check  the tool page's install line, in an empty virtual environment"
	@echo "make bench  time the build against the chapters' own compute (_build/bench.json)"
	@echo "make matrix run every chapter on the newest torch too; compare (book/torch-matrix.json)"
	@echo "make serve  serve _build/html on http://localhost:$(PORT)"
	@echo "make lab    open the chapters in JupyterLab from the pinned environment"
	@echo "make clean  remove _build/ (distclean also removes .venv/ and .venv-matrix/)"

book:
	@scripts/setup-env book
	@scripts/invalidate-stale-cache
	@# the changed chapters, in parallel, into the cache jupyter-book then reads
	$(BIN)/python scripts/execute_chapters.py
	$(BIN)/jupyter-book build . $(BOOK_FLAGS)
	@echo "The book is at $(CURDIR)/_build/html/index.html"

# The whole book on one page (singlehtml), printed by Chromium (scripts/book_pdf.py);
# then the HTML book again, whose intro now links the PDF. `make book` has just read
# every page, so these two builds only write (no --all).
pdf: book
	@scripts/setup-env dev
	$(BIN)/jupyter-book build . --builder singlehtml $(filter-out --all,$(BOOK_FLAGS))
	$(BIN)/python scripts/book_pdf.py
	$(BIN)/jupyter-book build . $(filter-out --all,$(BOOK_FLAGS))

test: lint
	$(BIN)/python -m pytest

# The loop for an edit (CONTRIBUTING.md): the linters, the tests that need no built book
# (the helper package, the notebook checker, the check counts, the Summary links), and
# only the chapters whose code changed since the execution cache last saw them, each
# run with all its checks. Not a substitute for make test before a push.
UNIT_TESTS := tests/test_check_counts.py tests/test_claims.py tests/test_diagnosis.py \
	tests/test_diagnosis_families.py tests/test_gradstop.py tests/test_gradstop_errors.py \
	tests/test_nbcheck.py tests/test_seed_coverage.py tests/test_skeleton.py tests/test_tables.py
quick: lint
	$(BIN)/python -m pytest -q $(UNIT_TESTS)
	@scripts/invalidate-stale-cache
	$(BIN)/python scripts/execute_chapters.py

# Not part of `make test` (it installs torch into a new environment: minutes): the
# install line of the tool's page, run in an empty venv against a tagged copy.
install-check:
	@scripts/setup-env dev
	$(BIN)/python -m pytest -q tests/check_install.py

lint:
	@scripts/setup-env dev
	$(BIN)/ruff check .
	$(BIN)/ruff format --check src/gradstop/*.py src/gradstop/*/*.py tests/*.py book/*.py book/_ext/*.py scripts/*.py
	$(BIN)/python scripts/check-notebooks

bench:
	@scripts/setup-env dev
	@test -f _build/html/index.html || { echo "Run 'make book' first." >&2; exit 1; }
	$(BIN)/python scripts/bench.py

# Not part of `make test`: installs the newest torch (a CUDA build of several GB) into
# .venv-matrix/, runs every chapter there and compares each output with make book's.
matrix: book
	$(BIN)/python scripts/matrix.py

serve:
	@test -f _build/html/index.html || { echo "No book built yet: run 'make book' first." >&2; exit 1; }
	@echo "Serving on http://localhost:$(PORT) (Ctrl-C stops)"
	$(BIN)/python -m http.server $(PORT) --bind 127.0.0.1 --directory _build/html

# JupyterLab refuses to start as root without --allow-root; as root (containers, cloud
# notebooks, CI) it gets that flag, and says so. LAB_ARGS passes more options along.
lab:
	@scripts/setup-env lab
	@if [ "$$(id -u)" = 0 ]; then \
	  echo "make lab: running as root, so JupyterLab starts with --allow-root"; \
	  exec $(BIN)/jupyter lab notebooks/ --allow-root $(LAB_ARGS); \
	else \
	  exec $(BIN)/jupyter lab notebooks/ $(LAB_ARGS); \
	fi

clean:
	rm -rf _build

distclean: clean
	rm -rf $(VENV) .venv-matrix
