"""Tokenizers: one interface (base.py), two backends, BPE training, the chat format.

    from groundup.tokenizer import load_tokenizer, TokenizerConfig, train_tokenizer
    tok = load_tokenizer("out/tokenizer")          # groundup's format, or any Hugging Face tokenizer.json
    tok = train_tokenizer(texts, TokenizerConfig(vocab_size=8192)); tok.save("out/tokenizer")

    base.py            BaseTokenizer: the interface every backend keeps (code outside this package uses only it)
    loading.py         load_tokenizer: the one entry point, which picks the backend for a directory
    tokenizer.py       Tokenizer: groundup's byte-level BPE, stored as tokenizer.json, encoded by tiktoken
    train.py           TokenizerConfig and train_tokenizer: BPE training with the `tokenizers` trainer
    hf_format.py       the tokenizer.json groundup writes and reads, and why tiktoken's encoding equals it
    hf_tokenizer.py    HFTokenizer: any Hugging Face tokenizer.json behind the same interface
    hf_files.py        a Hugging Face tokenizer directory read and checked, each malformed file a DataError
    chat.py            groundup's chat format: special tokens, roles, rendering with the assistant-only loss mask
    chat_template.py   Jinja chat templates rendered as transformers renders them, and the loss mask they imply
    tool_calls.py      tool definitions, calls and results in a chat (Hermes tags), and calls parsed back, streamed
    tool_tokens.py     the four tool tags as single tokens (TOOL_TOKENS), and chat text cut at the tags
    parallel.py        map_batches: a function over text batches on several processes, in order, bounded memory
    stats.py           bytes per token by domain, vocabulary use, the longest tokens
    commands.py        `groundup tokenizer train` and `groundup tokenizer stats`
"""

from groundup.tokenizer.base import BaseTokenizer
from groundup.tokenizer.chat import CHAT_ROLES, SPECIAL_TOKENS, TOOL_TOKENS
from groundup.tokenizer.loading import load_tokenizer
from groundup.tokenizer.tokenizer import Tokenizer
from groundup.tokenizer.train import TokenizerConfig, train_tokenizer

__all__ = ["BaseTokenizer", "CHAT_ROLES", "SPECIAL_TOKENS", "TOOL_TOKENS", "Tokenizer", "TokenizerConfig",
           "load_tokenizer", "train_tokenizer"]
