"""`groundup arena`: models answer the same prompts, a judge (or people, on the chat page) picks the better
answer, and Bradley-Terry ratings with bootstrap intervals come out, as FastChat's Chatbot Arena computes them.

    battles.py      run_battles and BattleConfig: answers cached per model and prompt, every battle judged in both
                    orders, resumable (OUT/battles.jsonl in FastChat's columns)
    battle_plan.py  the prompts, the uniform and active samplers, the append-only JSONL writer
    battle_log.py   reading battle logs (JSONL, Parquet; bad rows counted), one_per_battle across the swap
    ratings.py      Bradley-Terry as FastChat's compute_mle_elo, bootstrap intervals, rank ranges, online Elo
    style.py        style control: length and markdown as covariates, as FastChat's
    winrate.py      win fractions, battles per pair, AlpacaEval 2's length-controlled win rate, swap agreement
    report.py       rate_log: ratings.json, report.md and the plots
    commands.py     `groundup arena` (--battles to rate a log; --models/--prompts/--judge to fight first)
"""
