"""Inference: the generation engine, sampling, and the `generate` / `chat` commands.

    from groundup.infer import Generator
    gen = Generator.from_checkpoint("out/model")          # or a training run directory
    print(gen.generate(["To be, or not"], max_new_tokens=32, temperature=0)[0])
"""

from groundup.infer.engine import Completion, Generator
from groundup.infer.sampling import SamplingConfig

__all__ = ["Completion", "Generator", "SamplingConfig"]
