"""Byte-level BPE tokenizer: training, special tokens, the chat format, encode/decode.

    from groundup.tokenizer import Tokenizer, TokenizerConfig, train_tokenizer
    tok = train_tokenizer(texts, TokenizerConfig(vocab_size=8192)); tok.save("out/tokenizer")
    tok = Tokenizer.load("out/tokenizer")

See `tokenizer.py` for the Tokenizer contract, `chat.py` for the chat format and loss mask,
`hf_format.py` for the `tokenizer.json` layout and why the fast encoder equals it.
"""

from groundup.tokenizer.chat import CHAT_ROLES, SPECIAL_TOKENS
from groundup.tokenizer.tokenizer import Tokenizer
from groundup.tokenizer.train import TokenizerConfig, train_tokenizer

__all__ = ["CHAT_ROLES", "SPECIAL_TOKENS", "Tokenizer", "TokenizerConfig", "train_tokenizer"]
