"""groundup: build a language model from the ground up.

Stages (one CLI verb each): data curate -> tokenizer train -> data tokenize -> train ->
eval / generate / export. See README.md for the data flow and file formats.
"""

__version__ = "0.1.0"
