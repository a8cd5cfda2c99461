"""The call path of one model call: the proxy (request -> engine stream -> trace record), the
capture of token ids and logprobs, the engine gate (pause around weight pushes), side-call
tagging, volatile-content removal and per-call statistics."""
