"""Data stages: read raw inputs, curate them (filters, dedup, PII, mixing), write shards.

`iter_records` (in `readers`) is the one way every stage reads text records; `curate` (in
`pipeline`) is the function behind `groundup data curate`.
"""

from groundup.data.readers import ReadStats, iter_records

__all__ = ["ReadStats", "iter_records"]
