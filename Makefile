.PHONY: book test install
# Build the whole book on the embedded default model (installs first).
book:
	bash scripts/install.sh
	HF_HUB_OFFLINE=1 .venv/bin/depthkit book --model smollm2-135m

# Lint, then unit, integration, chapter-smoke, book-build and browser tests (installs first).
test:
	bash scripts/install.sh --test
	.venv/bin/ruff check
	HF_HUB_OFFLINE=1 .venv/bin/python -m pytest -q tests
