"""Token shards: `groundup data tokenize` writes them, the training loader reads them.

    shards.py        the on-disk format (flat token files + index.json), tokenize_to_shards, and reading shards back
    writer.py        encode_here (local processes) and write_splits: each document to its split and domain's file
    ray_tokenize.py  `--executor ray`: encoding as one Ray task per input file, merged into the same bytes
    loader.py        TokenLoader: memory-mapped batches for training and evaluation, domain weights, exact resume
    commands.py      `groundup data tokenize`

The curation package (`groundup.data`) never imports from here or from the tokenizer: text is
curated first, tokenized after.
"""
