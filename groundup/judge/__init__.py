"""AI judges: a chat model (a groundup checkpoint run in-process through the engine, or any OpenAI-compatible
endpoint) asked to compare answers against a written rubric or constitution, its verdict parsed strictly.
Used by `groundup arena` (battles), `data pairs --judge` (preference data) and the demo's arena table.

    sources.py   open_source: a ChatSource, an OpenAI-compatible endpoint (key from the environment, retries,
                 rate limit) or a groundup checkpoint answering through the engine, batched
    verdict.py   pairwise judging: the rubric, strict [[A]]/[[B]]/[[C]]/[[D]] verdicts, retries, the position swap
    ranking.py   candidates ranked against a constitution, listwise or pairwise (Copeland), for `data pairs`
"""
