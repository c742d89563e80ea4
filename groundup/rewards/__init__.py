"""Rewards: a completion's score, for GRPO, rejection sampling, `data pairs` and best-of-n generation.

functions.py     the shipped rewards (exact match, format, code in the sandbox), `module:function`
                 rewards, loading them by name and scoring a completion with weights
model_scorer.py  `rm:PATH`: a trained reward model's value head as a reward
"""

from groundup.rewards.functions import Reward, extract_answer, load_reward, load_rewards, parse_reward_args, score

__all__ = ["Reward", "extract_answer", "load_reward", "load_rewards", "parse_reward_args", "score"]
