"""`groundup export gguf` read by llama.cpp itself (through llama-cpp-python, when it is installed).

tests/test_gguf_export.py checks the files with the `gguf` package and transformers' GGUF loader; this
runs llama.cpp's own graphs on them: with an f32 KV cache (its default f16 cache alone costs ~5e-4 of
relative logit error), f32 files give groundup's logits within 1e-5 relative for llama (whose Q/K rows
the exporter permutes), qwen2 and qwen3; q8_0 within 5e-2 (llama.cpp also rounds the activations to
8 bits in q8_0 matmuls); llama.cpp tokenizes as groundup does, with groundup's end-of-text id as BOS,
and llama-cpp-python renders the chat template in the metadata to groundup's chat tokens.

llama-cpp-python builds llama.cpp from source (about 15 minutes on 2 cores), so it is in no extra:
`pip install llama-cpp-python` to run these."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from groundup.interop.gguf_export import export_gguf
from infer_helpers import model_dir
from test_gguf import randomised
from test_gguf_export import ARCHES, gpt4_tokenizer, logits
from test_tokenizer_hf import CHAT, TEXTS, corpus_text

llama_cpp = pytest.importorskip("llama_cpp", reason="llama-cpp-python is not installed")
TOLERANCE = {"f32": 1e-5, "q8_0": 5e-2}


def _llama(path):
    return llama_cpp.Llama(model_path=str(path), n_ctx=64, n_batch=64, logits_all=True, verbose=False, n_threads=1,
                           type_k=0, type_v=0)  # GGML_TYPE_F32 KV cache


@pytest.mark.parametrize("arch", list(ARCHES))
def test_llama_cpp_computes_our_logits(tmp_path, arch):
    cfg = dict(ARCHES[arch])
    model = randomised(tie_embeddings=cfg.pop("tie_embeddings", False), **cfg).eval()
    source = model_dir(tmp_path / "m", model, gpt4_tokenizer())
    tokens = torch.randint(0, model.cfg.vocab_size, (1, 40), generator=torch.Generator().manual_seed(0))
    ours = logits(model, tokens)[0].numpy()
    for type_, tolerance in TOLERANCE.items():
        llm = _llama(export_gguf(source, tmp_path / f"{type_}.gguf", type_).path)
        llm.eval(tokens[0].tolist())
        theirs = np.asarray(llm.scores[: tokens.shape[1]], dtype=np.float32)
        assert np.linalg.norm(theirs - ours) / np.linalg.norm(ours) <= tolerance, (arch, type_)
        if type_ == "f32":
            assert (theirs.argmax(-1) == ours.argmax(-1)).all()


def test_llama_cpp_tokenizes_and_renders_the_chat_template_as_groundup(tmp_path):
    from llama_cpp.llama_chat_format import Jinja2ChatFormatter

    tok = gpt4_tokenizer()
    source = model_dir(tmp_path / "m", randomised(**ARCHES["llama"]), tok)
    llm = _llama(export_gguf(source, tmp_path / "m.gguf", "f16").path)
    for text in TEXTS + ["<|user|>hi<|end_of_turn|>", corpus_text(3000)[0]]:
        assert llm.tokenize(text.encode(), add_bos=False, special=False) == tok.encode(text), text
        assert llm.tokenize(text.encode(), add_bos=True, special=False) == tok.prefix_ids + tok.encode(text)
    assert llm.token_bos() == llm.token_eos() == tok.eot_id
    special = llm._model.token_get_text(tok.eot_id)
    render = Jinja2ChatFormatter(llm.metadata["tokenizer.chat_template"], eos_token=special, bos_token=special)
    prompt = render(messages=CHAT).prompt  # with the generation prompt, as llama-cpp-python serves chats
    assert llm.tokenize(prompt.encode(), add_bos=False, special=True) == \
        tok.render_chat(CHAT, add_generation_prompt=True)[0]
