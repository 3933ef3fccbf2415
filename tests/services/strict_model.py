"""The tiny model with a chat template that refuses some conversations, as many real templates do
(Llama 2's and Mistral's raise "roles must alternate"): the weights are the tiny model's, linked,
so a cluster can serve it from a path."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from runner.models.tiny import cached_tiny

REFUSAL = "Conversation roles must alternate"
STRICT_TEMPLATE = (
    "{% for message in messages %}"
    "{% if loop.index0 > 0 and message['role'] == messages[loop.index0 - 1]['role'] %}"
    "{{ raise_exception('" + REFUSAL + ": two ' + message['role'] + ' messages in a row') }}"
    "{% endif %}"
    "<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def strict_tiny_model(dest: Path) -> Path:
    """A model directory at `dest`: the tiny model's weights, its tokenizer, the strict template."""
    source = cached_tiny()
    dest.mkdir(parents=True)
    for path in source.iterdir():
        if path.suffix == ".safetensors":
            (dest / path.name).symlink_to(path)
        else:
            shutil.copy(path, dest / path.name)
    config_path = dest / "tokenizer_config.json"
    config = json.loads(config_path.read_text())
    config["chat_template"] = STRICT_TEMPLATE
    config_path.write_text(json.dumps(config, indent=2))
    return dest
