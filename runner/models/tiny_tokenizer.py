"""A byte-level BPE tokenizer built offline, deterministically, from a fixed built-in text.

No download and no trainer whose tie-breaking might change between library versions: the
merges are computed here by a plain BPE loop (most frequent pair, ties by the pair itself),
then handed to the `tokenizers` library, which writes a standard tokenizer.json.
"""

from __future__ import annotations

import json
from collections import Counter
from itertools import pairwise
from pathlib import Path

SPECIAL_TOKENS: tuple[str, ...] = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
EOS_TOKEN = "<|im_end|>"
# Tools as Hermes/Qwen 2.5 templates render them: mlx-lm reads this template's `<tool_call>` and
# `tool_call.name` as its `json_tools` format, `<tool_call>{"name": ..., "arguments": {...}}</tool_call>`
# (runner/models/grammar.py forces the same format). Without tools a prompt renders as before.
CHAT_TEMPLATE = (
    "{% if tools %}<|im_start|>system\nYou may call these functions:\n<tools>\n"
    "{% for tool in tools %}{{ tool | tojson }}\n{% endfor %}</tools>\n"
    'Call one as <tool_call>{"name": <name>, "arguments": <arguments>}</tool_call><|im_end|>\n'
    "{% endif %}"
    "{% for message in messages %}"
    "<|im_start|>{{ message['role'] }}\n{{ message['content'] or '' }}"
    "{% for call in message['tool_calls'] or [] %}{% set tool_call = call['function'] %}"
    '<tool_call>{"name": {{ tool_call.name | tojson }}, "arguments": {{ tool_call.arguments | tojson }}}</tool_call>'
    "{% endfor %}<|im_end|>\n"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)

_BUILTIN_TEXT = (
    "A shoal of fish moves as one body. Each fish watches its neighbours and keeps pace, "
    "so the school turns together without a leader. The quick brown fox jumps over the lazy dog. "
    "Pipeline parallel inference splits the layers of a model across machines; every rank "
    "receives activations from the previous rank, runs its layers, and sends the result on. "
    "Hello, world! How are you today? I am fine, thank you. What is the capital of France? "
    "Paris is the capital of France. The weather is sunny and warm, with a light breeze. "
)


def builtin_corpus() -> str:
    numbers = " ".join(str(n) for n in range(1000))
    return (_BUILTIN_TEXT * 3) + numbers


def byte_alphabet() -> dict[int, str]:
    """GPT-2's reversible map from bytes to printable characters (what ByteLevel expects)."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    chars = list(printable)
    extra = 0
    for byte in range(256):
        if byte not in printable:
            printable.append(byte)
            chars.append(256 + extra)
            extra += 1
    return {byte: chr(char) for byte, char in zip(printable, chars, strict=True)}


def learn_merges(words: list[str], max_merges: int) -> list[tuple[str, str]]:
    """Plain BPE over pre-split words (already in the byte alphabet), fully deterministic."""
    word_counts = Counter(words)
    splits = {word: list(word) for word in word_counts}
    merges: list[tuple[str, str]] = []
    while len(merges) < max_merges:
        pairs: Counter[tuple[str, str]] = Counter()
        for word, count in word_counts.items():
            symbols = splits[word]
            for pair in pairwise(symbols):
                pairs[pair] += count
        if not pairs:
            break
        best = min(pairs.items(), key=lambda item: (-item[1], item[0]))[0]
        merges.append(best)
        for word in word_counts:
            splits[word] = _merge_pair(splits[word], best)
    return merges


def _merge_pair(symbols: list[str], pair: tuple[str, str]) -> list[str]:
    merged: list[str] = []
    i = 0
    while i < len(symbols):
        if i + 1 < len(symbols) and (symbols[i], symbols[i + 1]) == pair:
            merged.append(symbols[i] + symbols[i + 1])
            i += 2
        else:
            merged.append(symbols[i])
            i += 1
    return merged


def write_tokenizer(
    out_dir: Path,
    vocab_size: int,
    *,
    specials: tuple[str, ...] = SPECIAL_TOKENS,
    chat_template: str = CHAT_TEMPLATE,
    eos_token: str = EOS_TOKEN,
    bos_token: str | None = None,
    pad_token: str = "<|endoftext|>",
) -> dict[str, int]:
    """Write tokenizer.json + tokenizer_config.json; return the special token ids. Another model
    family's tiny model gives its own special tokens (`<think>`, ...), chat template and BOS/EOS
    (among its specials)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    pre = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    words = [piece for piece, _ in pre.pre_tokenize_str(builtin_corpus())]
    n_specials = len(specials)
    if vocab_size < 256 + n_specials:
        raise ValueError(f"vocab must be at least {256 + n_specials} for a byte-level tokenizer")
    merges = learn_merges(words, vocab_size - 256 - n_specials)
    vocab: dict[str, int] = {}
    for char in sorted(byte_alphabet().values()):
        vocab[char] = len(vocab)
    for left, right in merges:
        vocab.setdefault(left + right, len(vocab))
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=merges))
    tokenizer.pre_tokenizer = pre
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.add_special_tokens(list(specials))
    tokenizer.save(str(out_dir / "tokenizer.json"))
    special_ids = {token: int(tokenizer.token_to_id(token) or 0) for token in specials}
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": bos_token,
        "eos_token": eos_token,
        "pad_token": pad_token,
        "unk_token": None,
        "model_max_length": 1_000_000,
        "clean_up_tokenization_spaces": False,
        "chat_template": chat_template,
    }
    (out_dir / "tokenizer_config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    return special_ids
