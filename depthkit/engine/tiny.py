"""Tiny random-weight models of the paper's architecture families (llama, gpt2,
neox, gemma3), built from a local config and a small in-process tokenizer: fast,
deterministic under a seed, and needing no download. For tests and examples.
"""

from __future__ import annotations

import functools
import tempfile
import warnings

import torch

from depthkit.engine.catalog import TINY, ModelLoadError

_TINY_TEXT = (
    "The capital of France is Paris. The cat sat on the mat, and the dog lay by the door. "
    "In 1905 Albert Einstein wrote four papers. Water boils at 100 degrees. "
    "A quick brown fox jumps over the lazy dog; she said that it was good. "
)


@functools.lru_cache(maxsize=1)
def tiny_tokenizer_dir() -> str:
    """A small byte-level BPE tokenizer (a few hundred tokens), trained in-process on a
    fixed text and saved to a temporary folder (TransformerLens re-loads tokenizers from
    their path)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tk = Tokenizer(models.BPE())
    tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tk.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=320,
        special_tokens=["<|endoftext|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tk.train_from_iterator([_TINY_TEXT] * 4, trainer)
    tok = PreTrainedTokenizerFast(
        tokenizer_object=tk, bos_token="<|endoftext|>", eos_token="<|endoftext|>", pad_token="<|endoftext|>"
    )
    out = tempfile.mkdtemp(prefix="depthkit-tiny-tokenizer-")
    tok.save_pretrained(out)
    return out


def tiny_config(arch: str, vocab_size: int, n_layers: int = 4):
    """Config of a tiny model of one of the paper's architecture families."""
    from transformers import Gemma3TextConfig, GPT2Config, GPTNeoXConfig, LlamaConfig

    common = dict(vocab_size=vocab_size)
    if arch == "llama":
        return LlamaConfig(
            hidden_size=64, intermediate_size=128, num_hidden_layers=n_layers, num_attention_heads=4,
            num_key_value_heads=2, max_position_embeddings=256, tie_word_embeddings=False, **common,
        )
    if arch == "gpt2":
        return GPT2Config(n_embd=64, n_layer=n_layers, n_head=4, n_positions=256, **common)
    if arch == "neox":
        return GPTNeoXConfig(
            hidden_size=64, intermediate_size=128, num_hidden_layers=n_layers, num_attention_heads=4,
            max_position_embeddings=256, **common,
        )
    if arch == "gemma3":
        return Gemma3TextConfig(
            hidden_size=64, intermediate_size=128, num_hidden_layers=n_layers, num_attention_heads=4,
            num_key_value_heads=2, head_dim=16, max_position_embeddings=256, sliding_window=32, **common,
        )
    raise ModelLoadError(f"No tiny architecture {arch!r}; choose one of {', '.join(TINY)}.")


def _build_tiny(arch: str, *, seed: int, n_layers: int):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_tokenizer_dir())
    cfg = tiny_config(arch, vocab_size=len(tok), n_layers=n_layers)
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            model = AutoModelForCausalLM.from_config(cfg)
        # Random init leaves the final layers nearly silent; scale the weights up a
        # little so that lens distributions differ visibly between layers in tests.
        with torch.no_grad():
            for p in model.parameters():
                if p.dim() >= 2:
                    p.mul_(4.0)
    return model, tok
