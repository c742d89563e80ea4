"""`groundup serve`: an OpenAI-compatible HTTP server over one model, with continuous batching,
many LoRA adapters in one batch, echo + log-probs for evaluation harnesses, metrics and a chat page.

    app.py          the routes, errors, API key             protocol.py   request models and validation
    generation.py   requests -> jobs -> responses           streaming.py  server-sent events
    scheduler.py    the thread that drives the engine core (groundup/infer/core.py): continuous batching, paged KV
    adapters.py     multi-LoRA on one base                  tokens.py     prompts, chats, token strings
    adapter_updates.py  loading and unloading adapters while serving (vLLM's /v1/load_lora_adapter)
    responses.py    OpenAI's response objects               metrics.py    Prometheus text
    server.py       what one serving process holds          page.py/.html the chat page (and blind battles)
    votes.py        blind battles between two served models, voted by people, appended to a battle log
    tool_exec.py    `serve --execute-tools`: built-in tools run server-side in a loop, the final message returned
    commands.py     the CLI verb

FastAPI and uvicorn (the `serve` extra) are imported only here.
"""
