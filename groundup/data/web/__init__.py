"""Raw web data: reading crawls (WARC, ARC, WET), HTML to text, and the filters web text needs
(language identification, URL block lists, perplexity). Everything here needs `groundup[web]`.

`data/readers.py` hands `.warc`/`.arc`/`.wet` inputs to `records.py`, so `data curate` and
`data extract` read a crawl like any other input.
"""
