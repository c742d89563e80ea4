"""AI judges: a chat model (a groundup checkpoint run in-process through the engine, or any OpenAI-compatible
endpoint) asked to compare answers against a written rubric or constitution, its verdict parsed strictly.
Used by `groundup arena` (battles), `data pairs --judge` (preference data) and the demo's arena table."""
