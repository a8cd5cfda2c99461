"""The chat format shared by the engine, the gateway and sft, each copied from what vLLM does so
that every side agrees on the tokens:

  render     chat messages -> prompt token ids through the HF chat template (vLLM's renderer)
  toolparse  hermes `<tool_call>` parsing, full and streaming (vLLM's `hermes` tool parser)
  reasoning  `<think>` splitting, full and streaming (vLLM's `qwen3` reasoning parser)

Pure functions over text, token ids and tokenizers: this package imports no other polar_pl part.
"""
