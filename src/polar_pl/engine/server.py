"""The engine's FastAPI app: the engine contract of DESIGN.md over any `GenerationBackend`.

Routes (thin; conversion lives in `engine/serving.py`):
  POST /v1/chat/completions      chat, streaming or not, tools, logprobs, token ids
  POST /v1/completions           token-id (or text) prompt in, tokens + logprobs out
  GET  /v1/models, GET /health   discovery and liveness
  POST /update_weights_from_disk {"path": DIR} -> {"policy_version": v}   (Bearer admin token;
                                 off without one: weights must never come from a sandbox)
  GET  /policy_version, GET /weight_info (vLLM's shape), GET /stats
Every response carries the header `x-policy-version`.
"""

from __future__ import annotations

import secrets
import time
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import replace
from http import HTTPStatus

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, StreamingResponse
from pydantic import ValidationError
from starlette.concurrency import run_in_threadpool

from polar_pl.chat.reasoning import check_reasoning_parser, thinking_enabled
from polar_pl.chat.render import RenderError, render_chat
from polar_pl.engine import serving
from polar_pl.engine.backend import GenerationBackend, GenerationRequest, SamplingParams
from polar_pl.engine.errors import EngineError, context_length_error, error_body, error_response
from polar_pl.engine.openai_protocol import (
    ChatCompletionRequest,
    CompletionRequest,
    DetokenizeRequest,
    TokenizeRequest,
    UpdateWeightsFromDiskRequest,
)

VERSION_HEADER = "x-policy-version"


def _request_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex}"


async def _prepend(first, rest: AsyncIterator):
    if first:
        yield first
    async for item in rest:
        yield item


async def _guarded(lines: AsyncIterator[str], gen: AsyncIterator) -> AsyncIterator[str]:
    """Stream lines; a failure mid-stream becomes an error event, as vLLM sends it; a client that
    goes away aborts the backend request."""
    try:
        async for line in lines:
            yield line
    except EngineError as exc:
        yield serving.sse(error_body(exc))
        yield "data: [DONE]\n\n"
    except Exception as exc:  # noqa: BLE001 -- the status is already sent: only an event is left
        yield serving.sse(error_body(EngineError(f"{type(exc).__name__}: {exc}", 500)))
        yield "data: [DONE]\n\n"
    finally:
        await gen.aclose()


def create_app(
    backend: GenerationBackend,
    served_model_name: str | None = None,
    reasoning_parser: str | None = None,
    admin_token: str | None = None,
) -> FastAPI:
    """Build the app. The backend is started and closed with the app's lifespan.
    reasoning_parser: None or "qwen3" (vLLM's `--reasoning-parser qwen3`, see chat/reasoning.py).
    admin_token: the bearer token weight updates need; None turns the weight route off."""
    model_name = served_model_name or backend.model_name
    reasoning_parser = check_reasoning_parser(reasoning_parser)

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        backend.start()
        try:
            yield
        finally:
            backend.close()

    app = FastAPI(title="polar_pl engine", lifespan=lifespan)
    app.state.backend = backend

    def headers() -> dict[str, str]:
        return {VERSION_HEADER: str(backend.policy_version)}

    @app.exception_handler(EngineError)
    async def _engine_error(request: Request, exc: EngineError):
        return error_response(exc, headers())

    @app.exception_handler(RequestValidationError)
    async def _validation_error(request: Request, exc: RequestValidationError):
        first = exc.errors()[0] if exc.errors() else {}
        loc = ".".join(str(p) for p in first.get("loc", ()) if p != "body")
        msg = f"{loc}: {first.get('msg', 'invalid request')}" if loc else first.get("msg", "invalid request")
        return error_response(EngineError(msg, HTTPStatus.BAD_REQUEST, param=loc or None), headers())

    @app.exception_handler(Exception)
    async def _internal_error(request: Request, exc: Exception):
        return error_response(EngineError(f"{type(exc).__name__}: {exc}", 500), headers())

    def check_model(name: str | None) -> None:
        if name and name not in (model_name, backend.model_name):
            raise EngineError(
                f"The model `{name}` does not exist. Valid aliases: {model_name}.",
                HTTPStatus.NOT_FOUND,
                param="model",
                code="model_not_found",
            )

    def max_tokens_for(requested: int | None, prompt_len: int) -> int:
        if prompt_len >= backend.max_model_len:
            raise context_length_error(prompt_len, backend.max_model_len)
        room = backend.max_model_len - prompt_len
        return room if requested is None else min(requested, room)

    def with_default_stops(params: SamplingParams) -> SamplingParams:
        extra = tuple(t for t in backend.default_stop_token_ids if t not in params.stop_token_ids)
        if not extra or params.ignore_eos:
            return params
        return replace(params, stop_token_ids=params.stop_token_ids + extra)

    async def respond(req, ctx, gen, full, stream):
        if req.stream:
            # Pull the first batch before answering, so that a request the backend refuses gets a
            # proper error status instead of a 200 stream holding an error event.
            try:
                first = await anext(gen)
            except StopAsyncIteration:
                first = []
            except BaseException:
                await gen.aclose()
                raise
            lines = stream(req, ctx, _prepend(first, gen))
            return StreamingResponse(_guarded(lines, gen), media_type="text/event-stream", headers=headers())
        choices = await serving.collect(gen, req.n)
        body = full(req, ctx, choices)
        return JSONResponse(body, headers={VERSION_HEADER: str(body["policy_version"])})

    @app.get("/health")
    async def health():
        return JSONResponse({"status": "ok", "policy_version": backend.policy_version}, headers=headers())

    @app.get("/v1/models")
    async def models():
        card = {
            "id": model_name,
            "object": "model",
            "created": int(time.time()),
            "owned_by": "polar_pl",
            # vLLM's root is the model path it serves: a gateway on this machine loads its
            # tokenizer from there (token-faithful prompts, local token counts)
            "root": str(getattr(backend, "model_dir", None) or backend.model_name),
            "parent": None,
            "max_model_len": backend.max_model_len,
        }
        return JSONResponse({"object": "list", "data": [card]}, headers=headers())

    @app.post("/tokenize")
    async def tokenize(req: TokenizeRequest):
        """vLLM's route: the prompt ids a completion or chat request would get, and their count."""
        check_model(req.model)
        if (req.prompt is None) == (req.messages is None):
            raise EngineError("give exactly one of `prompt` and `messages`", param="prompt")
        if req.messages is not None:
            try:
                _, ids = render_chat(
                    backend.tokenizer,
                    req.messages,
                    req.tools,
                    add_generation_prompt=req.add_generation_prompt,
                    continue_final_message=req.continue_final_message,
                    chat_template_kwargs=req.chat_template_kwargs,
                )
            except RenderError as exc:
                raise EngineError(str(exc), HTTPStatus.BAD_REQUEST, param=exc.param) from exc
        else:
            special = req.add_special_tokens is not False
            ids = backend.tokenizer.encode(req.prompt, add_special_tokens=special)
        strs = backend.tokenizer.convert_ids_to_tokens(ids) if req.return_token_strs else None
        body = {"count": len(ids), "max_model_len": backend.max_model_len, "tokens": ids, "token_strs": strs}
        return JSONResponse(body, headers=headers())

    @app.post("/detokenize")
    async def detokenize(req: DetokenizeRequest):
        check_model(req.model)
        vocab = len(backend.tokenizer)
        if bad := [t for t in req.tokens if not 0 <= t < vocab]:
            raise EngineError(f"token ids out of vocabulary (size {vocab}): {bad[:5]}", param="tokens")
        return JSONResponse({"prompt": backend.tokenizer.decode(req.tokens)}, headers=headers())

    @app.get("/policy_version")
    async def policy_version():
        return JSONResponse({"policy_version": backend.policy_version}, headers=headers())

    @app.get("/weight_info")
    async def weight_info():
        # vLLM's route (dev mode) for the same number, so a version poller works against either.
        return JSONResponse({"weight_version": str(backend.policy_version)}, headers=headers())

    @app.get("/stats")
    async def stats():
        s = backend.stats
        return JSONResponse(
            {
                "steps": s.steps,
                "tokens_generated": s.tokens_generated,
                "max_batch_size": s.max_batch_size,
                "multi_seq_steps": s.multi_seq_steps,
                "requests": s.requests,
                **s.extra,
            },
            headers=headers(),
        )

    def check_admin(request: Request) -> None:
        if admin_token is None:
            raise EngineError(
                "weight updates are off: start the engine with an admin token "
                "(--admin-token-file or $POLAR_ADMIN_TOKEN)",
                HTTPStatus.FORBIDDEN,
            )
        auth = request.headers.get("authorization", "")
        given = auth[7:].strip() if auth[:7].lower() == "bearer " else ""
        if not secrets.compare_digest(given.encode(), admin_token.encode()):
            raise EngineError(
                "weight updates need the engine's admin token (Authorization: Bearer <token>)",
                HTTPStatus.UNAUTHORIZED,
            )

    @app.post("/update_weights_from_disk")
    async def update_weights_from_disk(request: Request):
        check_admin(request)  # before the body is even parsed
        try:
            body = UpdateWeightsFromDiskRequest.model_validate_json(await request.body())
        except ValidationError as exc:
            raise RequestValidationError(exc.errors()) from exc
        try:
            version = await run_in_threadpool(backend.update_weights_from_disk, body.path)
        except (FileNotFoundError, ValueError, KeyError) as exc:
            raise EngineError(
                f"cannot load weights from {body.path}: {exc}", HTTPStatus.BAD_REQUEST, param="path"
            ) from exc
        return JSONResponse(
            {"status": "ok", "policy_version": version}, headers={VERSION_HEADER: str(version)}
        )

    @app.post("/v1/chat/completions")
    async def chat_completions(req: ChatCompletionRequest):
        check_model(req.model)
        try:
            _, prompt_ids = render_chat(
                backend.tokenizer,
                req.messages,
                req.tools,
                add_generation_prompt=req.add_generation_prompt,
                continue_final_message=req.continue_final_message,
                chat_template_kwargs=req.chat_template_kwargs,
            )
        except RenderError as exc:
            raise EngineError(str(exc), HTTPStatus.BAD_REQUEST, param=exc.param) from exc
        reasoning = reasoning_parser is not None and thinking_enabled(req.chat_template_kwargs)
        try:
            params = req.sampling_params(
                max_tokens_for(req.requested_max_tokens(), len(prompt_ids)), reasoning
            )
        except ValueError as exc:
            raise EngineError(str(exc), HTTPStatus.BAD_REQUEST, param="tool_choice") from exc
        params = with_default_stops(params)
        request_id = _request_id("chatcmpl")
        ctx = serving.ResponseContext(
            request_id, model_name, backend.tokenizer, prompt_ids, backend.policy_version, reasoning_parser
        )
        chat = req.model_dump(exclude_none=True)
        gen = backend.generate(GenerationRequest(request_id, tuple(prompt_ids), params, chat))
        return await respond(req, ctx, gen, serving.chat_response, serving.chat_stream)

    @app.post("/v1/completions")
    async def completions(req: CompletionRequest):
        check_model(req.model)
        prompt = req.prompt
        if isinstance(prompt, list) and prompt and isinstance(prompt[0], list | str):
            if len(prompt) != 1:
                raise EngineError("only one prompt per request is supported", param="prompt")
            prompt = prompt[0]
        if isinstance(prompt, str):
            prompt_ids = backend.tokenizer.encode(prompt)
        else:
            prompt_ids = list(prompt)
            vocab = len(backend.tokenizer)
            if bad := [t for t in prompt_ids if not 0 <= t < vocab]:
                raise EngineError(
                    f"prompt token ids out of vocabulary (size {vocab}): {bad[:5]}", param="prompt"
                )
        if not prompt_ids:
            raise EngineError("prompt must not be empty", param="prompt")
        if req.max_tokens == 0 or req.echo or req.suffix is not None:
            raise EngineError("echo, suffix and max_tokens=0 are not supported", param="max_tokens")
        params = with_default_stops(req.sampling_params(max_tokens_for(req.max_tokens, len(prompt_ids))))
        request_id = _request_id("cmpl")
        ctx = serving.ResponseContext(
            request_id, model_name, backend.tokenizer, prompt_ids, backend.policy_version
        )
        gen = backend.generate(GenerationRequest(request_id, tuple(prompt_ids), params, None))
        return await respond(req, ctx, gen, serving.completion_response, serving.completion_stream)

    return app
