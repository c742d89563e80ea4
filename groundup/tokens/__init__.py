"""Token shards: `groundup data tokenize` writes them, the training loader reads them.

    shards.py    the on-disk format (flat token files + index.json) and the writer
    loader.py    memory-mapped batches for training and evaluation, with exact resume
    commands.py  the `data tokenize` verb

The curation package (`groundup.data`) never imports from here or from the tokenizer: text is
curated first, tokenized after.
"""
