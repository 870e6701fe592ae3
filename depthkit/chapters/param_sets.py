"""The parameters several chapters share: the choice lists, the model and lens
parameters of every chapter that loads a model, and the seed, bootstrap and size
parameters. Plain data, so that checking a command line imports neither torch nor
the analysis modules."""

from __future__ import annotations

from depthkit.core.params import Param

# Kept here rather than imported from the analysis modules, so that checking a
# command line does not import torch; tests hold the two lists equal.
MCQ_TASKS = (
    "mmlu", "sst2", "mrpc", "rte", "arc_easy", "arc_challenge", "sciq", "openbookqa", "piqa",
    "arc_easy_words", "arc_challenge_words", "sciq_words", "openbookqa_words",
)
UPOS_TAGS = tuple(sorted("ADJ ADP ADV AUX CCONJ DET INTJ NOUN NUM PART PRON PROPN PUNCT SCONJ SYM VERB X".split()))
UPDATE_STATS = ("norm_h", "attn_rel", "mlp_rel", "block_rel", "cos_attn", "cos_mlp", "cos_update", "block_influence")

# Parameters of every chapter that loads a model: which model, in what precision, where.
MODEL_PARAMS: dict[str, Param] = {
    "model": Param(str, example="smollm2-135m", help="embedded name (smollm2-135m, gemma3-270m), hub id or local folder"),
    "dtype": Param(str, choices=("float32", "bfloat16", "float16"), help="precision of the model's weights"),
    "device": Param(str, optional=True, help="'cpu', 'cuda', 'cuda:1', ...; None picks a GPU if there is one"),
    "device_map": Param(str, optional=True, help="transformers device_map for hub models, e.g. 'auto'"),
    "backend": Param(str, optional=True, choices=("bridge", "nnsight"), help="engine of the forward passes (default bridge)"),
    "remote": Param(
        str, optional=True, choices=("true", "false", "local"),
        help="nnsight only: run on NDIF ('true', needs NDIF_API_KEY) or rehearse that here ('local')",
    ),
}
LENS_PARAMS: dict[str, Param] = {
    "lens": Param(str, example="tuned", help="'tuned', 'logit' or the path of a saved lens (.safetensors)"),
    "lens_budget": Param(
        str, example="default",
        help="tuned-lens budget if none is cached: 'default', 'smoke' or fields such as 'steps=200'",
    ),
    "convention": Param(str, choices=("canonical", "authors"), help="layer convention"),
}
RESULTS_PARAM: dict[str, Param] = {"results_root": Param(str, optional=True, help="folder of the result tables")}
# Parameters many chapters share, with one meaning and one range everywhere.
SEED = Param(int, min=0)
N_BOOT = Param(int, min=10, max=100_000, help="bootstrap resamples of the 95 % intervals")
BATCH_SIZE = Param(int, min=1, max=512)
N_TEXTS = Param(int, min=2, max=3000, help="number of passages")
MAX_TOKENS = Param(int, min=16, max=4096, help="tokens per passage")
# By name, for the specs that say which of them a chapter takes.
SHARED = {"seed": SEED, "n_boot": N_BOOT, "batch_size": BATCH_SIZE}
