"""Tiny random causal LMs for tests and benchmarks: no hub, no download.

``build_tiny_model(folder)`` trains a byte-level BPE tokenizer on a small built-in corpus with
``tokenizers``, builds a 2-layer Llama (or GPT-2) from a config with random weights, and saves
both with ``save_pretrained``. The folder then loads through ``AutoModelForCausalLM`` /
``AutoTokenizer`` exactly like a hub checkpoint, chat template included.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Literal

CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]

_WORDS_TEXT = (
    "the a queue worker request token stream batch model cache redis lease priority answer "
    "question capital france paris city river bridge server network garden teacher student "
    "market window library company painter mountain kitchen museum station letter harbour "
    "forest meeting machine child budget council hospital airport recipe storm orchestra "
    "database neighbour festival bicycle experiment manager schedule small large quiet busy "
    "old new bright careful local remote simple early late public private strong gentle rapid "
    "steady hidden open modern ancient shared single red green warm cold found built opened "
    "watched described repaired visited followed changed moved reviewed answered carried "
    "measured painted closed explained protected delivered checked replaced studied near "
    "behind under across beside inside after before during around without through along "
    "above quickly slowly again carefully finally often together and but because while so "
    "what is of in to it was for on are with as his they be at one have this from by hot "
    "word but not what all were we when your can said there use an each which she do how "
    "their if will up other about out many then them these so some her would make like him "
    "into time has look two more write go see number no way could people my than first water"
)


def corpus(lines: int = 2000, seed: int = 7) -> list[str]:
    import random

    rng = random.Random(seed)
    words = _WORDS_TEXT.split()
    out = []
    for _ in range(lines):
        n = rng.randint(4, 18)
        words = [rng.choice(words) for _ in range(n)]
        sentence = " ".join(words).capitalize() + rng.choice([".", "?", "!", ",", ";"])
        out.append(sentence)
    out += ["What is the capital of France?", "The capital of France is Paris.",
            "0 1 2 3 4 5 6 7 8 9 10 100 1000", "Hello, world! How are you today?"]
    return out


def build_tokenizer(folder: Path, vocab_size: int = 512) -> None:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=SPECIAL_TOKENS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tok.train_from_iterator(corpus(), trainer=trainer)
    fast = PreTrainedTokenizerFast(  # type: ignore[no-untyped-call]
        tokenizer_object=tok, eos_token="<|im_end|>",
                                   pad_token="<|endoftext|>", bos_token=None,
                                   unk_token=None, model_max_length=2048)
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(str(folder))


def build_tiny_model(folder: str | Path, *, arch: Literal["llama", "gpt2"] = "llama",
                     hidden: int = 64, layers: int = 2, heads: int = 4, kv_heads: int = 2,
                     vocab_size: int = 512, max_positions: int = 1024, seed: int = 0,
                     init_range: float = 0.2) -> Path:
    """Write a tiny random model and its tokenizer to ``folder`` (created) and return it.

    ``init_range`` is larger than the usual 0.02 so that logits are spread out: greedy choices
    are then far from ties, and batched and unbatched runs pick the same tokens."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, GPT2Config, LlamaConfig

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    build_tokenizer(folder, vocab_size)
    tokenizer = AutoTokenizer.from_pretrained(str(folder))
    eos, pad = tokenizer.eos_token_id, tokenizer.pad_token_id
    vocab = len(tokenizer)
    config: LlamaConfig | GPT2Config
    if arch == "llama":
        config = LlamaConfig(vocab_size=vocab, hidden_size=hidden, intermediate_size=hidden * 2,
                             num_hidden_layers=layers, num_attention_heads=heads,
                             num_key_value_heads=kv_heads, max_position_embeddings=max_positions,
                             eos_token_id=eos, pad_token_id=pad, bos_token_id=None,
                             initializer_range=init_range, tie_word_embeddings=False)
    elif arch == "gpt2":
        config = GPT2Config(vocab_size=vocab, n_embd=hidden, n_layer=layers, n_head=heads,
                            n_positions=max_positions, eos_token_id=eos, pad_token_id=pad,
                            bos_token_id=eos, initializer_range=init_range)
    else:
        raise ValueError(f"arch must be llama or gpt2, got {arch!r}")
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config)  # type: ignore[no-untyped-call]
    model.generation_config.eos_token_id = eos
    model.generation_config.pad_token_id = pad
    model.save_pretrained(str(folder))
    (folder / "inferq_tiny.json").write_text(json.dumps({"arch": arch, "seed": seed}))
    return folder
