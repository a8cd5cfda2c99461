"""The engine contract's routes (docs/architecture.md, "Engine contract"), as a module-level router whose
thin handlers read their state from `request.app.state` (set by `server.create_app`): `backend`
(a GenerationBackend), `model_name` (the served name), `reasoning_parser` and `admin_token`. Conversion to and
from OpenAI JSON lives in `engine/serving.py`.

  POST /v1/chat/completions      chat, streaming or not, tools, logprobs, token ids
  POST /v1/completions           token-id (or text) prompt in, tokens + logprobs out
  GET  /v1/models, GET /health   discovery and liveness
  POST /tokenize, /detokenize     vLLM's token routes (prompt or messages -> ids; ids -> text)
  POST /update_weights_from_disk {"path": DIR} -> {"policy_version": v}   (Bearer admin token;
                                 off without one: weights must never come from a sandbox)
  POST /update_adapter_from_disk {"path": DIR} -> {"policy_version": v, "model": NAME}   (a PEFT
                                 LoRA folder, merged into the base; same token)
  GET  /policy_version, GET /weight_info (vLLM's shape), GET /stats
Every response carries the header `x-policy-version`. Once an adapter is pushed the engine serves
it as `<served>-lora-v<version>` (listed in /v1/models after the base, as vLLM lists its LoRA
adapters, and named in every answer). Requests may name the base (and get the weights the engine
holds now) or the adapter it holds; an older adapter's name is refused with vLLM's 404
`model_not_found` (checked again when the request is admitted, engine/transformers_backend.py).
A weight or adapter folder that fails its check is a 400 and changes nothing (engine/weights.py).
"""

from __future__ import annotations

import secrets
import time
import uuid
from collections.abc import AsyncGenerator, AsyncIterator
from dataclasses import replace
from http import HTTPStatus

from fastapi import APIRouter, Depends, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, StreamingResponse
from pydantic import ValidationError
from starlette.concurrency import run_in_threadpool

from polar_pl.chat.reasoning import thinking_enabled
from polar_pl.chat.render import RenderError, render_chat
from polar_pl.engine import serving
from polar_pl.engine.backend import GenerationBackend, GenerationRequest, SamplingParams
from polar_pl.engine.errors import EngineError, context_length_error, error_body, model_not_found
from polar_pl.engine.openai_protocol import (
    ChatCompletionRequest,
    CompletionRequest,
    DetokenizeRequest,
    TokenizeRequest,
    UpdateWeightsFromDiskRequest,
)
from polar_pl.engine.weights import REFUSED
from polar_pl.utils.adapters import adapter_model_name, adapter_version

VERSION_HEADER = "x-policy-version"

router = APIRouter()


def backend_of(request: Request) -> GenerationBackend:
    return request.app.state.backend


def version_headers(backend: GenerationBackend) -> dict[str, str]:
    return {VERSION_HEADER: str(backend.policy_version)}


def _request_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex}"


async def _prepend(first, rest: AsyncIterator):
    if first:
        yield first
    async for item in rest:
        yield item


async def _guarded(lines: AsyncIterator[str], gen: AsyncGenerator) -> AsyncIterator[str]:
    """Stream lines; a failure mid-stream becomes an error event, as vLLM sends it; a client that
    goes away aborts the backend request."""
    try:
        async for line in lines:
            yield line
    except EngineError as exc:
        yield serving.sse(error_body(exc))
        yield "data: [DONE]\n\n"
    except Exception as exc:
        yield serving.sse(error_body(EngineError(f"{type(exc).__name__}: {exc}", 500)))
        yield "data: [DONE]\n\n"
    finally:
        await gen.aclose()


def served_name(request: Request) -> str:
    """The name of what the engine serves now: the base's, or its pushed adapter's."""
    adapter = getattr(backend_of(request), "adapter_version", None)
    base = request.app.state.model_name
    return base if adapter is None else adapter_model_name(base, adapter)


def check_model(request: Request, name: str | None) -> str | None:
    """404 for a name the engine does not serve now; the adapter `name` asks for (None: the base)."""
    model_name, backend = request.app.state.model_name, backend_of(request)
    if not name or name in (model_name, backend.model_name):
        return None
    held = getattr(backend, "adapter_version", None)
    if held is None or adapter_version(name, model_name) != held:
        raise model_not_found(name, list(dict.fromkeys([model_name, served_name(request)])))
    return name


def max_tokens_for(backend: GenerationBackend, requested: int | None, prompt_len: int) -> int:
    if prompt_len >= backend.max_model_len:
        raise context_length_error(prompt_len, backend.max_model_len)
    room = backend.max_model_len - prompt_len
    return room if requested is None else min(requested, room)


def with_default_stops(backend: GenerationBackend, params: SamplingParams) -> SamplingParams:
    extra = tuple(t for t in backend.default_stop_token_ids if t not in params.stop_token_ids)
    if not extra or params.ignore_eos:
        return params
    return replace(params, stop_token_ids=params.stop_token_ids + extra)


async def respond(backend: GenerationBackend, req, ctx, gen, full, stream):
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
        return StreamingResponse(
            _guarded(lines, gen), media_type="text/event-stream", headers=version_headers(backend)
        )
    choices = await serving.collect(gen, req.n)
    body = full(req, ctx, choices)
    return JSONResponse(body, headers={VERSION_HEADER: str(body["policy_version"])})


@router.get("/health")
async def health(request: Request):
    backend = backend_of(request)
    return JSONResponse(
        {"status": "ok", "policy_version": backend.policy_version}, headers=version_headers(backend)
    )


@router.get("/v1/models")
async def models(request: Request):
    backend = backend_of(request)
    card = {
        "id": request.app.state.model_name,
        "object": "model",
        "created": int(time.time()),
        "owned_by": "polar_pl",
        # vLLM's root is the model path it serves: a gateway on this machine loads its
        # tokenizer from there (token-faithful prompts, local token counts)
        "root": str(getattr(backend, "model_dir", None) or backend.model_name),
        "parent": None,
        "max_model_len": backend.max_model_len,
    }
    cards = [card]
    if getattr(backend, "adapter_version", None) is not None:
        cards.append({**card, "id": served_name(request), "parent": card["id"]})
    return JSONResponse({"object": "list", "data": cards}, headers=version_headers(backend))


@router.post("/tokenize")
async def tokenize(req: TokenizeRequest, request: Request):
    """vLLM's route: the prompt ids a completion or chat request would get, and their count."""
    backend = backend_of(request)
    check_model(request, req.model)
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
    return JSONResponse(body, headers=version_headers(backend))


@router.post("/detokenize")
async def detokenize(req: DetokenizeRequest, request: Request):
    backend = backend_of(request)
    check_model(request, req.model)
    vocab = len(backend.tokenizer)
    if bad := [t for t in req.tokens if not 0 <= t < vocab]:
        raise EngineError(f"token ids out of vocabulary (size {vocab}): {bad[:5]}", param="tokens")
    return JSONResponse({"prompt": backend.tokenizer.decode(req.tokens)}, headers=version_headers(backend))


@router.get("/policy_version")
async def policy_version(request: Request):
    backend = backend_of(request)
    return JSONResponse({"policy_version": backend.policy_version}, headers=version_headers(backend))


@router.get("/weight_info")
async def weight_info(request: Request):
    # vLLM's route (dev mode) for the same number, so a version poller works against either.
    backend = backend_of(request)
    return JSONResponse({"weight_version": str(backend.policy_version)}, headers=version_headers(backend))


@router.get("/stats")
async def stats(request: Request):
    backend = backend_of(request)
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
        headers=version_headers(backend),
    )


def require_admin(request: Request) -> None:
    """The dependency of the weight route: the engine's admin token as `Authorization: Bearer`."""
    admin_token = request.app.state.admin_token
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


async def _load_from_disk(request: Request, load: str, what: str) -> JSONResponse:
    """POST {"path": DIR} -> the backend's `load`(DIR); a folder it cannot load is a 400. The body
    is parsed here, after the admin check (a declared body would be validated first)."""
    try:
        body = UpdateWeightsFromDiskRequest.model_validate_json(await request.body())
    except ValidationError as exc:
        raise RequestValidationError(exc.errors()) from exc
    try:
        version = await run_in_threadpool(getattr(backend_of(request), load), body.path)
    except (*REFUSED, KeyError) as exc:
        raise EngineError(
            f"cannot load {what} from {body.path}: {exc}", HTTPStatus.BAD_REQUEST, param="path"
        ) from exc
    answer = {"status": "ok", "policy_version": version, "model": served_name(request)}
    return JSONResponse(answer, headers={VERSION_HEADER: str(version)})


@router.post("/update_weights_from_disk", dependencies=[Depends(require_admin)])
async def update_weights_from_disk(request: Request):
    return await _load_from_disk(request, "update_weights_from_disk", "weights")


@router.post("/update_adapter_from_disk", dependencies=[Depends(require_admin)])
async def update_adapter_from_disk(request: Request):
    return await _load_from_disk(request, "update_adapter_from_disk", "the adapter")


@router.post("/v1/chat/completions")
async def chat_completions(req: ChatCompletionRequest, request: Request):
    backend, reasoning_parser = backend_of(request), request.app.state.reasoning_parser
    adapter = check_model(request, req.model)
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
            max_tokens_for(backend, req.requested_max_tokens(), len(prompt_ids)), reasoning
        )
    except ValueError as exc:
        raise EngineError(str(exc), HTTPStatus.BAD_REQUEST, param="tool_choice") from exc
    params = with_default_stops(backend, params)
    request_id = _request_id("chatcmpl")
    ctx = serving.ResponseContext(
        request_id,
        served_name(request),
        backend.tokenizer,
        prompt_ids,
        backend.policy_version,
        reasoning_parser,
    )
    chat = req.model_dump(exclude_none=True)
    gen = backend.generate(GenerationRequest(request_id, tuple(prompt_ids), params, chat, adapter))
    return await respond(backend, req, ctx, gen, serving.chat_response, serving.chat_stream)


@router.post("/v1/completions")
async def completions(req: CompletionRequest, request: Request):
    backend = backend_of(request)
    adapter = check_model(request, req.model)
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
            raise EngineError(f"prompt token ids out of vocabulary (size {vocab}): {bad[:5]}", param="prompt")
    if not prompt_ids:
        raise EngineError("prompt must not be empty", param="prompt")
    if req.max_tokens == 0 or req.echo or req.suffix is not None:
        raise EngineError("echo, suffix and max_tokens=0 are not supported", param="max_tokens")
    params = with_default_stops(
        backend, req.sampling_params(max_tokens_for(backend, req.max_tokens, len(prompt_ids)))
    )
    request_id = _request_id("cmpl")
    ctx = serving.ResponseContext(
        request_id, served_name(request), backend.tokenizer, prompt_ids, backend.policy_version
    )
    gen = backend.generate(GenerationRequest(request_id, tuple(prompt_ids), params, None, adapter))
    return await respond(backend, req, ctx, gen, serving.completion_response, serving.completion_stream)
