"""Post-training: SFT, DPO, KTO, reward models, GRPO and rejection-sampling fine-tuning on the training core
(each verb opens its run with train/session.py's open_run and brings its data and objective), plus LoRA merging
and preference pairs sampled from a model. Nothing is imported here, so importing the package is cheap.

    config.py          the verbs' configs: the core's sections, the base model and LoRA, plus each verb's own
    records.py         fine-tuning records (TRL conversational or prompt-completion, text, ShareGPT, Alpaca) as
                       one Example shape, bad records counted
    sft_data.py        examples tokenized with their loss mask, packed best-fit or padded, SFTLoader with replay
    sft.py             sft(): supervised fine-tuning (full or LoRA) on the learned tokens, held-out chat metrics
    pairs.py           preference data (DPO pairs, KTO feedback) in TRL's shapes, tokenized into prompt and completion
    preference.py      DPO and KTO losses, PreferenceLoader, reference log-likelihoods, PreferenceObjective
    align.py           dpo() and kto(): preference optimisation with the reference log-likelihoods cached in the run
    reward_model.py    rm(): a reward model (value head) trained on pairs with the Bradley-Terry loss
    rollout.py         GRPO's data: read_prompts, and RolloutLoader sampling scored groups of completions, advantages
    tool_rollout.py    multi-turn rollouts with tools: only sampled ids trained, the malformed-ending penalty
    grpo.py            grpo(): the GRPO token loss (clipping, KL, TRL's aggregations) and its objective
    sampled_data.py    preference pairs and best completions from a model's own samples, ranked by rewards
    sampling_job.py    SamplingJob: sampled records written a chunk at a time, resumable, never losing finished work
    rft.py             rft(): rejection-sampling fine-tuning in rounds (sample, keep the best, SFT)
    chat_eval.py       greedy replies to held-out chats: end-of-turn share and arithmetic exact match
    merge.py           merge_adapter: a LoRA adapter folded into its base, saved as a plain model directory
    judged_pairs.py    `data pairs --judge`: samples ranked by an AI judge against a constitution
    pair_formats.py    pairs written as DPO pairs or TRL's unpaired KTO records (`--format`)
    prm.py             process_rm(): `reward-model --process`, a value head at every step end, BCE at step ends
    prm_labels.py      Math-Shepherd step labels: continuations sampled from each step, resumable
    trajectories.py    agent logs (OpenAI messages, tools) checked call by call and split to the context, for SFT
    data_commands.py   `groundup data pairs` and `groundup data trajectories`
    commands.py        `groundup sft`, `dpo`, `kto`, `reward-model`, `grpo`, `rft` and `merge-lora`
"""
