"""The tokenizer files of a Hugging Face model directory, written from a groundup Tokenizer.

`tokenizer.json` is the tokenizer itself (see groundup.tokenizer.hf_format); `tokenizer_config.json`
and `special_tokens_map.json` name the special tokens and carry the chat template, which is what
`AutoTokenizer` (transformers 4.x and 5.x) and `apply_chat_template` read. `groundup_tokenizer.json`
rides along, so `groundup import hf` restores the tokenizer exactly.
"""

from __future__ import annotations

from pathlib import Path

from groundup.io import atomic_write_json
from groundup.layout import HF_SPECIAL_TOKENS_FILE, HF_TOKENIZER_CONFIG_FILE
from groundup.tokenizer import Tokenizer

EXTRA_ROLES = ("system", "user", "assistant", "end_of_turn")


def write_tokenizer_files(tok: Tokenizer, out_dir: Path, model_max_length: int) -> None:
    tok.save(out_dir)  # tokenizer.json and groundup_tokenizer.json
    names = tok.special_names
    extra = [names[r] for r in EXTRA_ROLES]
    named = {"bos_token": names["bos"], "eos_token": names["eot"], "pad_token": names["pad"]}
    added = {str(tok.special_ids[role]): {"content": name, "lstrip": False, "normalized": False, "rstrip": False,
                                          "single_word": False, "special": True}
             for role, name in names.items()}
    atomic_write_json(out_dir / HF_TOKENIZER_CONFIG_FILE, {
        "tokenizer_class": "PreTrainedTokenizerFast", **named, "additional_special_tokens": extra,
        "added_tokens_decoder": added, "chat_template": tok.chat_template, "model_max_length": model_max_length,
        "clean_up_tokenization_spaces": False, "add_bos_token": False, "add_eos_token": False,
    })
    atomic_write_json(out_dir / HF_SPECIAL_TOKENS_FILE, {**named, "additional_special_tokens": extra})
