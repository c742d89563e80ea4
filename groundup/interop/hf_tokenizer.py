"""The tokenizer files of a Hugging Face model directory, written from either tokenizer backend.

groundup's own: `tokenizer.json` is the tokenizer itself (see groundup.tokenizer.hf_format; its
post-processor puts <|end_of_text|> before a text, as groundup does); `tokenizer_config.json` and
`special_tokens_map.json` name the special tokens and carry the chat template, which is what
`AutoTokenizer` (transformers 4.x and 5.x) and `apply_chat_template` read; the tool tags
(<tool_call>, ...) are added tokens that are not special, as Qwen2.5's are, so transformers matches
them whole in rendered text and shows them when decoding with skip_special_tokens. They carry no
add_bos_token/add_eos_token: transformers would then rebuild the post-processor from those flags
and drop the end-of-text prefix. `groundup_tokenizer.json` rides along, so `groundup import hf`
restores the tokenizer exactly.

A Hugging Face tokenizer (a model imported with `import hf` or `import gguf`) goes back out as its
own files: tokenizer.json, tokenizer_config.json and special_tokens_map.json as they were.
"""

from __future__ import annotations

from pathlib import Path

from groundup.io import atomic_write_json
from groundup.layout import HF_SPECIAL_TOKENS_FILE, HF_TOKENIZER_CONFIG_FILE
from groundup.tokenizer import BaseTokenizer, Tokenizer

EXTRA_ROLES = ("system", "user", "assistant", "end_of_turn")


def write_tokenizer_files(tok: BaseTokenizer, out_dir: Path, model_max_length: int) -> None:
    if not isinstance(tok, Tokenizer):
        tok.save(out_dir)
        return
    tok.save(out_dir)  # tokenizer.json and groundup_tokenizer.json
    names = tok.special_names
    extra = [names[r] for r in EXTRA_ROLES]
    named = {"bos_token": names["bos"], "eos_token": names["eot"], "pad_token": names["pad"]}
    added = {str(tok.special_ids[role]): {"content": name, "lstrip": False, "normalized": False, "rstrip": False,
                                          "single_word": False, "special": True}
             for role, name in names.items()}
    added.update({str(i): {"content": name, "lstrip": False, "normalized": False, "rstrip": False,
                           "single_word": False, "special": False} for name, i in tok.tool_ids.items()})
    atomic_write_json(out_dir / HF_TOKENIZER_CONFIG_FILE, {
        "tokenizer_class": "PreTrainedTokenizerFast", **named, "additional_special_tokens": extra,
        "added_tokens_decoder": added, "chat_template": tok.chat_template, "model_max_length": model_max_length,
        "clean_up_tokenization_spaces": False,
    })
    atomic_write_json(out_dir / HF_SPECIAL_TOKENS_FILE, {**named, "additional_special_tokens": extra})
