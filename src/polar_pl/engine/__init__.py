"""Inference engines behind one contract (docs/architecture.md, "Engine contract").

Handles (what the rest of the system holds), `protocol.Engine`:
  embedded.EmbeddedEngine   transformers engine of this package (thread or subprocess)
  vllm_engine.VLLMEngine    vLLM's OpenAI server, launched from $POLAR_VLLM_PYTHON or by URL

The embedded server: `server.create_app(backend)` (the router of `routes.py`, its state on
`app.state`) over a `backend.GenerationBackend`
(`transformers_backend.TransformersBackend` with `scheduler.Scheduler`, whose forward is
`decoder.FastDecoder` where it covers the model and transformers' otherwise, or the test double
`polar_pl.testing.scripted.ScriptedBackend`); `serving` (OpenAI JSON), `detok` (incremental
text, stop handling), `sampling`, `errors`, `openai_protocol` (request models). Rendering, tool-call
and reasoning parsing are `polar_pl.chat` (shared with the gateway and sft).
"""
