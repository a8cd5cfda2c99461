"""Token-faithful prompts: the engine gets the tokens the policy sampled, spliced back into the
prompt, not a re-render of them (prompt.py), kept per session in the request path (history.py),
sent through the engine's token-in route and read back as chat chunks (completion.py)."""
