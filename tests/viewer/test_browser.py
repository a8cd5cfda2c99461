"""The viewer in a real browser: headless Chromium (Debian's `chromium`, driven by Playwright with
the system browser, nothing downloaded) over the store of a real run. It clicks runs -> run ->
step -> session and checks what each page shows, then opens a session with a chain break and a
side call. Screenshots: the test's tmp_path and outputs/test-artefacts/viewer-*.png."""

from __future__ import annotations

import shutil
import sqlite3
import time
from dataclasses import replace
from pathlib import Path

import pytest
from fixture_paths import REPO

from polar_pl.gateway.store.records import SessionInfo, hash_token
from polar_pl.gateway.store.traces import TraceStore, read_records
from polar_pl.monitor.rollouts import read_rollouts
from polar_pl.utils.serving import ServerThread
from polar_pl.viewer.app import create_app

ARTEFACTS = REPO / "outputs" / "test-artefacts"
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-dev-shm-usage",
        "--no-first-run", "--disable-extensions"]  # fmt: skip
BREAKS = "viewer-breaks"

pytestmark = pytest.mark.slow


def add_break_session(store_path: Path) -> None:
    """A session of four calls built from a real record of the run (its token ids) and written
    through the store's own API: a tool turn extends the first call, a side call comes between,
    then a call that rewrites the history after the first answer's first token (compaction)."""
    first = read_records(store_path)[0]
    p, r, lp = list(first.prompt_ids), list(first.response_ids), list(first.response_logprobs)
    tail = [t for t in p[-6:] if t != r[1]]
    base = replace(first, session_id=BREAKS, rollout_id=BREAKS, group_id=BREAKS, normalized_request={},
                   finish_reason="stop")  # fmt: skip
    calls = [
        replace(base, call_index=0),
        replace(base, call_index=1, prompt_ids=p + r + p[-6:], response_ids=r[:3], response_logprobs=lp[:3]),
        replace(base, call_index=2, call_kind="side", prompt_ids=p[:8], response_ids=r[:2],
                response_logprobs=lp[:2]),
        replace(base, call_index=3, prompt_ids=p + r[:1] + tail, response_ids=r[:4], response_logprobs=lp[:4]),
    ]  # fmt: skip
    store = TraceStore(store_path)
    try:
        store.put_session(
            SessionInfo(
                BREAKS, token_hash=hash_token("viewer-test-token"), task_id=first.task_id, harness="mini"
            )
        )
        for rec in calls:
            store.append(rec).result(10)
    finally:
        store.close()


@pytest.fixture(scope="module")
def viewer(short_run, tiny_model_dir):
    run, _ = short_run
    add_break_session(run / "traces.db")
    server = ServerThread(create_app(None, [str(run)], tokenizer=str(tiny_model_dir))).start()
    yield server.url, run
    server.stop()


@pytest.fixture(scope="module")
def page():
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, headless=True, args=ARGS)
        yield browser.new_page(viewport={"width": 1400, "height": 1000})
        browser.close()


def follow(page, selector: str) -> None:
    """Click a link and wait for the page it opens."""
    with page.expect_navigation():
        page.click(selector)


def shot(page, tmp_path: Path, name: str) -> None:
    ARTEFACTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(tmp_path / name), full_page=True)
    shutil.copy(tmp_path / name, ARTEFACTS / name)


def test_runs_steps_groups_sessions_and_a_session_page(viewer, page, tmp_path):
    url, run = viewer
    lines = read_rollouts(run)
    page.goto(url)
    assert page.locator("#runs tr").count() == 2  # header + this run
    follow(page, f"#runs a:text-is('{run.name}')")
    assert page.locator("#steps tr").count() == 3  # header + 2 steps
    assert "none" in page.locator("#steps tr").nth(1).inner_text()  # no chain breaks in one-call sessions
    follow(page, "#steps a:text-is('step 1')")
    step1 = [x for x in lines if x["step"] == 1]
    assert page.locator("table.sessions tr").count() == 1 + len(step1)
    assert page.locator("h2.group").inner_text() == f"group {step1[0]['group_id']}"
    shown = sorted(float(t) for t in page.locator("td.reward").all_inner_texts())
    # shown to 3 decimals: a reward of 0.0625 reads "0.062", exactly 5e-4 off
    assert shown == pytest.approx(sorted(x["reward"] for x in step1), abs=5.001e-4)

    target = step1[0]
    follow(page, f"a.session-link:text-is('{target['rollout_id']}')")
    assert page.locator("#reward").inner_text() == f"{target['reward']:.3f}"
    call = page.locator("#calls tr.call").first
    cells = call.locator("td").all_inner_texts()
    assert cells[1] == "main" and cells[2] == "openai_chat" and cells[5] in ("length", "stop")
    assert cells[7].startswith("v") and cells[6].endswith("ms")
    assert target["answer"].strip()[:20] in cells[4]  # the response text is the harness's answer
    sampled = page.locator("#rows .tok.sampled")
    assert sampled.count() == target["trainable_tokens"]
    assert page.locator("#rows .tok.prompt").count() == target["tokens"] - target["trainable_tokens"]
    tip = sampled.first.get_attribute("title")
    assert "logprob -" in tip and "policy v" in tip
    colour = sampled.first.evaluate("e => getComputedStyle(e).backgroundColor")
    assert colour != page.locator("#rows .tok.prompt").first.evaluate(
        "e => getComputedStyle(e).backgroundColor"
    )
    sampled.first.hover()
    shot(page, tmp_path, "viewer-session.png")


def test_chain_breaks_are_marked_and_side_calls_set_apart(viewer, page, tmp_path):
    url, _ = viewer
    page.goto(f"{url}/session/{BREAKS}?run=0")
    assert page.locator("#reward").inner_text() == "-"  # not a trained attempt: no reward recorded
    heads = page.locator("#rows .row-head").all_inner_texts()
    assert len(heads) == 2 and "first row" in heads[0] and "calls 0, 1 " in heads[0]
    assert "chain break: compaction" in heads[1] and "calls 3 " in heads[1]
    side = page.locator("#side-calls")
    assert side.locator(".row-head").count() == 1 and "chain break: side_call" in side.inner_text()
    assert page.locator("#calls tr.call.side").count() == 1
    shot(page, tmp_path, "viewer-breaks.png")


def test_reading_never_blocks_a_writer(viewer, page):
    """The viewer's connections are read-only: a page loads while a write transaction is open on
    the store, and a writer can take the lock right after."""
    url, run = viewer
    writer = sqlite3.connect(run / "traces.db", isolation_level=None, timeout=0.5)
    try:
        writer.execute("BEGIN IMMEDIATE")
        writer.execute("UPDATE sessions SET data = data WHERE session_id = ?", (BREAKS,))
        t0 = time.monotonic()
        page.goto(f"{url}/session/{BREAKS}?run=0")
        assert page.locator("#calls tr.call").count() == 4 and time.monotonic() - t0 < 5
        writer.execute("COMMIT")
        writer.execute("BEGIN IMMEDIATE")  # no lock left behind by the page load
        writer.execute("COMMIT")
    finally:
        writer.close()
