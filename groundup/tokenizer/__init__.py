"""Tokenizers: one interface (base.py), two backends, BPE training, the chat format.

    from groundup.tokenizer import load_tokenizer, TokenizerConfig, train_tokenizer
    tok = load_tokenizer("out/tokenizer")          # groundup's format, or any Hugging Face tokenizer.json
    tok = train_tokenizer(texts, TokenizerConfig(vocab_size=8192)); tok.save("out/tokenizer")

See `base.py` for the interface every backend keeps, `tokenizer.py` for groundup's own byte-level
BPE (tiktoken-fast), `hf_tokenizer.py` for Hugging Face tokenizers, `chat.py` for groundup's chat
format and `chat_template.py` for Jinja chat templates and their loss mask, `hf_format.py` for the
`tokenizer.json` layout groundup writes and why the fast encoder equals it.
"""

from groundup.tokenizer.base import BaseTokenizer
from groundup.tokenizer.chat import CHAT_ROLES, SPECIAL_TOKENS
from groundup.tokenizer.loading import load_tokenizer
from groundup.tokenizer.tokenizer import Tokenizer
from groundup.tokenizer.train import TokenizerConfig, train_tokenizer

__all__ = ["BaseTokenizer", "CHAT_ROLES", "SPECIAL_TOKENS", "Tokenizer", "TokenizerConfig", "load_tokenizer",
           "train_tokenizer"]
