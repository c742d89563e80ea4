"""Data curation: read raw inputs, curate them (filters, dedup, PII, decontamination, mixing), write shards.
Text only: tokenizing comes after, in groundup.tokens.

    pipeline.py        `curate`: the whole run in three phases (shards, global decisions, output), the local executor
    curate_config.py   CurateConfig: every knob of `data curate`, the published thresholds as defaults
    readers.py         how every stage reads text records (JSONL, Parquet, text, source trees, WARC/ARC/WET): iter_records, or
                       per file iter_input_files + read_input_file; ReadStats, the counts of what reading saw
    read_stats.py      ReadStats: what reading saw (problems by kind with their first positions, crawl damage)
    input_tasks.py     the run cut into tasks (input files, small ones grouped) and each task's records into shards
    curate_shard.py    ShardCurator: one shard normalised, filtered per domain, scored, redacted, hashed for dedup
    normalize.py       NFC and control-character cleanup that never changes code; the exact-dedup key
    words.py           datatrove's (spaCy's) English word splitter, ported, for the prose filters
    gopher.py          Gopher quality and repetition rules and the n-gram repetition filter
    web_filters.py     C4 and FineWeb line rules for prose
    code_filters.py    the code and math filters
    classifier.py      the fastText-style quality classifier: hashed n-gram features, training, scoring
    pii.py             PIIRedactor: e-mail, public IP and phone numbers become placeholders
    hashing.py         64-bit hashing shared by the filters, MinHash, the classifier and content-based splits
    minhash.py         MinHash signatures and LSH band keys of word 5-grams
    simhash.py         SimHash fingerprints of the same shingles and their pairs within k bits (dedup.near = "simhash")
    dedup.py           exact and MinHash near-duplicate removal over all shards in bounded memory (union-find)
    substring_dedup.py exact repeated spans of N+ tokens removed (Lee et al.'s suffix arrays, sharded)
    decontaminate.py   benchmark items' word 13-grams (lm-eval's rule) and the stage that drops documents sharing one
    mixing.py          the mixing plan: copies per document so each domain reaches its share of output bytes
    output.py          one curated output shard (`shards/part-NNNNN.parquet` or `.jsonl`)
    stats.py           StageStats: documents and bytes in and out of each stage, per domain and source
    curation_report.py report.json and report.md of a curation run
    ray_curate.py      `--executor ray`: RayExecutor, curation's tasks on a Ray cluster, byte-identical output
    ray_dedup.py       dedup.py's pieces as Ray tasks, each result file its completion marker
    commands.py        `groundup data curate` and `groundup data train-classifier`
    annotate.py        `groundup data annotate`: documents scored by an LLM judge (FineWeb-Edu's rubric), resumable,
                       and the quality classifier trained on the scores
    annotate_client.py the OpenAI-compatible client: the rubric, strict verdict parsing, retries, rate limit
    annotate_report.py the annotation report: counts, score histogram, the classifier's agreement
    annotate_commands.py `groundup data annotate`
    web/               raw web data: warc.py (crawl files), charset.py, extract.py (HTML to text), records.py,
                       language.py (lid.176), url_lists.py (block lists), perplexity.py (CCNet), `data extract`
"""

from groundup.data.readers import ReadStats, iter_records

__all__ = ["ReadStats", "iter_records"]
