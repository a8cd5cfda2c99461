"""The viewer's pages (FastAPI, server-rendered Jinja templates; no JavaScript needed).

/                          runs: steps, sessions, first and last step's reward
/run/{r}                   steps of a run: reward mean ± std, pass rate, groups, break kinds
/run/{r}/step/{k}          the step's groups and their sessions (reward, status, harness, breaks)
/session/{id}?run={r}      one session: each model call, then the merged rows as token strips
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from fastapi import FastAPI, HTTPException, Request
from fastapi.responses import HTMLResponse, PlainTextResponse
from jinja2 import Environment, FileSystemLoader, Undefined, select_autoescape

from polar_pl.viewer import data

TEMPLATES = Path(__file__).with_name("templates")


def _env() -> Environment:
    env = Environment(loader=FileSystemLoader(TEMPLATES), autoescape=select_autoescape(["jinja"]))
    env.filters["num"] = lambda v, fmt=".3f": "-" if v is None or isinstance(v, Undefined) else format(v, fmt)
    return env


def create_app(store: str | None, runs: list[str], tokenizer: str | None = None) -> FastAPI:
    """store: a trace store file; runs: run directories (or folders holding them); tokenizer: a
    model directory to decode tokens with when a run does not name its own."""
    if store is None and not runs:
        raise ValueError("polar-pl view needs --store or --run")
    app = FastAPI(title="polar_pl viewer", docs_url=None, redoc_url=None)
    env = _env()

    def page(name: str, **ctx: Any) -> HTMLResponse:
        return HTMLResponse(env.get_template(f"{name}.html.jinja").render(**ctx))

    def all_runs() -> list[data.Run]:
        return data.load_runs(store, runs)

    def get_run(r: int) -> data.Run:
        found = all_runs()
        if not 0 <= r < len(found):
            raise HTTPException(404, f"no run {r}")
        return found[r]

    @app.get("/healthz", response_class=PlainTextResponse)
    def healthz() -> str:
        return "ok"

    @app.get("/", response_class=HTMLResponse)
    def index() -> HTMLResponse:
        rows = []
        for i, run in enumerate(all_runs()):
            steps = run.steps()
            first = data.step_summary(next(iter(steps.values()))) if steps else {}
            last = data.step_summary(list(steps.values())[-1]) if steps else {}
            rows.append(
                {
                    "i": i,
                    "run": run,
                    "steps": len(steps),
                    "sessions": len(run.lines),
                    "first": first,
                    "last": last,
                }
            )
        return page("index", runs=rows)

    @app.get("/run/{r}", response_class=HTMLResponse)
    def run_page(r: int) -> HTMLResponse:
        run = get_run(r)
        steps = [{"step": k, **data.step_summary(v)} for k, v in run.steps().items()]
        return page("run", r=r, run=run, steps=steps)

    @app.get("/run/{r}/step/{k}", response_class=HTMLResponse)
    def step_page(r: int, k: int) -> HTMLResponse:
        run = get_run(r)
        lines = run.steps().get(k)
        if lines is None:
            raise HTTPException(404, f"run {r} has no step {k}")
        groups = [{"id": g, **data.step_summary(v), "sessions": v} for g, v in data.by_group(lines).items()]
        return page("step", r=r, run=run, k=k, groups=groups, summary=data.step_summary(lines))

    @app.get("/session/{session_id}", response_class=HTMLResponse)
    def session_page(session_id: str, request: Request, run: int | None = None) -> HTMLResponse:
        the_run = get_run(run) if run is not None else None
        st = the_run.store if the_run is not None else (Path(store) if store else None)
        if st is None:
            raise HTTPException(404, "no trace store")
        records = data.session_records(st, session_id)
        info = data.session_info(st, session_id)
        if not records and info is None:
            raise HTTPException(404, f"no session {session_id} in {st}")
        line = data.rollout_line(the_run, session_id)
        tok_dir = data.tokenizer_dir(the_run, tokenizer)
        tok = data.load_tokenizer(tok_dir) if tok_dir else None
        reward = float(line.get("reward") or 0.0)
        calls = [
            {"rec": rec, "req": data.request_summary(rec), "text": data.response_text(rec, tok)}
            for rec in records
        ]
        rows = data.rows_of(records, reward, tok) if records else []
        return page(
            "session",
            r=run,
            run=the_run,
            sid=session_id,
            info=info,
            line=line,
            calls=calls,
            main_rows=[x for x in rows if x.call_kind != "side"],
            side_rows=[x for x in rows if x.call_kind == "side"],
            decoded=tok is not None,
            dumps=data.dumps,
        )

    return app
