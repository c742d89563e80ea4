"""Rewards: a completion's score, for GRPO, rejection sampling, `data pairs` and best-of-n generation.

functions.py     the shipped rewards (exact match, format, code and tests passed in the sandbox),
                 `module:function` rewards, loading them by name and scoring a completion with weights
code_tests.py    the code rewards' programs: a reply's code, a record's tests counted one by one
model_scorer.py  `rm:PATH`: a trained reward model's value head as a reward
process_scorer.py `prm:PATH`: a process reward model's step scores, a solution's lowest as its reward
health.py        RewardHealth: a run whose rewards fail on every call, or never vary, stops and says why
"""

from groundup.rewards.functions import (Reward, Scored, extract_answer, load_reward, load_rewards, parse_reward_args,
                                        score, score_each)
from groundup.rewards.health import BatchTally, RewardHealth, RewardsBroken

__all__ = ["BatchTally", "Reward", "RewardHealth", "RewardsBroken", "Scored", "extract_answer", "load_reward",
           "load_rewards", "parse_reward_args", "score", "score_each"]
