"""``recallm-rlm show``: one trajectory as a readable, self-contained HTML page.

The page has a header (task, outcome, answer, score, usage, isolation, settings), then each
RLM instance - the root first, recursive children nested under the sub-call that started them
- as its turns: the model's reply (reasoning folded away), each code cell with its output,
error and time, the sub-calls the turn made (kind, tokens, latency, prompt and answer
previews, folded), and how the instance ended. Everything is escaped; no scripts, no external
files.
"""

from __future__ import annotations

import html
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from recallm.io import write_text_atomic
from recallm.rlm.trajectory import load_trajectory, reading
from recallm.tokens import THINK_END

__all__ = ["render_html", "write_html"]

_CSS = """
body{font-family:system-ui,sans-serif;margin:2em auto;max-width:1100px;color:#222;line-height:1.4}
h1{font-size:1.4em} h2{font-size:1.15em;margin-top:1.5em}
pre{background:#f6f8fa;padding:.6em;overflow-x:auto;white-space:pre-wrap;word-break:break-word;margin:.3em 0}
pre.code{background:#eef3ff} pre.err{background:#fff0f0;color:#900}
table{border-collapse:collapse} td,th{border:1px solid #ccc;padding:.2em .5em;text-align:left;vertical-align:top}
.turn{border-left:4px solid #4a7;padding-left:1em;margin:1em 0}
.child{border-left:4px solid #a74;padding-left:1em;margin:.5em 0 .5em 1em}
.meta{color:#666;font-size:.9em} .bad{color:#b00;font-weight:bold} .good{color:#070;font-weight:bold}
details{margin:.3em 0} summary{cursor:pointer}
"""


def _e(value: Any) -> str:
    return html.escape("" if value is None else str(value))


def _pre(text: Any, cls: str = "") -> str:
    return f'<pre class="{cls}">{_e(text)}</pre>' if text not in (None, "") else ""


def _subcall(event: dict[str, Any], events: Sequence[dict[str, Any]]) -> str:
    tokens = ""
    if event.get("prompt_tokens") is not None:
        tokens = f", {event.get('prompt_tokens')}+{event.get('completion_tokens')} tokens"
    title = (
        f"{_e(event.get('kind'))}"
        f"{'[' + _e(event['index']) + ']' if event.get('index') is not None else ''}"
        f" - {_e(event.get('latency_s'))}s{_e(tokens)}"
        f"{', attempts ' + _e(event['attempts']) if event.get('attempts', 1) not in (None, 1) else ''}"
    )
    if event.get("error"):
        title += ' <span class="bad">failed</span>'
    body = f"<b>prompt</b> ({_e(event.get('prompt_chars'))} chars){_pre(event.get('prompt'))}"
    body += f"<b>answer</b>{_pre(event.get('response'))}"
    if event.get("error"):
        body += _pre(event["error"], "err")
    if event.get("child"):
        body += f'<div class="child">{_instance(events, str(event["child"]))}</div>'
    return f"<details><summary>{title}</summary>{body}</details>"


def _instance(events: Sequence[dict[str, Any]], rlm: str) -> str:
    mine = [e for e in events if e.get("rlm") == rlm]
    start = next((e for e in mine if e.get("event") == "start"), {})
    end = next((e for e in mine if e.get("event") == "end"), None)
    parts = [f"<h2>RLM {_e(rlm)} (depth {_e(start.get('depth'))})</h2>"]
    if start.get("query"):
        parts.append(f"<p><b>query</b></p>{_pre(start['query'])}")
    context = start.get("context") or {}
    parts.append(
        f'<p class="meta">context: {_e(context.get("type"))}, {_e(context.get("chars"))} characters '
        f"(~{_e(context.get('approx_tokens'))} tokens)</p>"
    )
    messages = start.get("messages") or []
    if messages:
        prompt = "\n\n".join(f"[{m.get('role')}]\n{m.get('content')}" for m in messages)
        parts.append(f"<details><summary>root prompt (turn 1)</summary>{_pre(prompt)}</details>")
    subcalls: dict[int, list[dict[str, Any]]] = {}
    for e in mine:
        if e.get("event") == "subcall":
            subcalls.setdefault(int(e.get("turn") or 0), []).append(e)
    for turn in (e for e in mine if e.get("event") == "turn"):
        number = int(turn.get("turn") or 0)
        reply = str(turn.get("reply") or "")
        title = "the final call" if turn.get("final_call") else f"turn {number}"
        head = (
            f"<h3>{title}</h3><p class='meta'>{_e(turn.get('prompt_tokens'))} prompt + "
            f"{_e(turn.get('completion_tokens'))} completion tokens, {_e(turn.get('latency_s'))}s, "
            f"{_e(turn.get('finish_reason'))}</p>"
        )
        body = [head]
        if THINK_END in reply:
            body.append(f"<details><summary>reasoning</summary>{_pre(reply[: reply.rfind(THINK_END)])}</details>")
        body.append(_pre(turn.get("visible")))
        for i, cell in enumerate(turn.get("cells") or [], 1):
            status = " timed out" if cell.get("timed_out") else ""
            status += " (REPL restarted)" if cell.get("restarted") else ""
            body.append(f"<p><b>cell {i}</b> <span class='meta'>{_e(cell.get('elapsed'))}s{_e(status)}</span></p>")
            body.append(_pre(cell.get("code"), "code"))
            out = cell.get("stdout") or ""
            if int(cell.get("stdout_chars") or 0) > len(out):
                out += f"\n[... {int(cell['stdout_chars']) - len(out):,} more characters not sent by the sandbox]"
            body.append(_pre(out))
            body.append(_pre(cell.get("error"), "err"))
        calls = subcalls.get(number, [])
        if calls:
            body.append(f"<p><b>{len(calls)} sub-call(s)</b></p>")
            body.extend(_subcall(c, events) for c in calls)
        for note in turn.get("notes") or []:
            body.append(f"<p class='bad'>{_e(note)}</p>")
        if turn.get("final"):
            body.append(f"<p class='good'>ended by {_e(turn['final'])}</p>")
        parts.append(f'<div class="turn">{"".join(body)}</div>')
    if end is not None:
        cls = "good" if end.get("outcome") in ("final", "plain_text") else "bad"
        parts.append(
            f"<p>outcome: <span class='{cls}'>{_e(end.get('outcome'))}</span> - {_e(end.get('reason'))}</p>"
            f"<p><b>answer</b></p>{_pre(end.get('answer'))}"
        )
    return "".join(parts)


def render_html(events: Sequence[dict[str, Any]], title: str = "RLM trajectory") -> str:
    """The page of a trajectory's events (module doc)."""
    root_start = next((e for e in events if e.get("event") == "start" and e.get("rlm") == "0"), {})
    root_end = next((e for e in events if e.get("event") == "end" and e.get("rlm") == "0"), {})
    score = next((e for e in events if e.get("event") == "score"), None)
    rows = [
        ("task", root_start.get("task_id")),
        ("outcome", f"{root_end.get('outcome')} - {root_end.get('reason')}"),
        ("answer", root_end.get("answer")),
        ("usage", json.dumps(root_end.get("usage"))),
        ("isolation", root_start.get("isolation")),
    ]
    if score is not None:
        rows.insert(3, ("score", f"{score.get('score')} (correct: {score.get('correct')}) {score.get('metrics')}"))
        rows.append(("reference", json.dumps(score.get("reference"))[:2000]))
    table = "".join(f"<tr><th>{_e(k)}</th><td>{_e(v)}</td></tr>" for k, v in rows)
    settings = root_start.get("settings")
    settings_html = (
        f"<details><summary>settings</summary>{_pre(json.dumps(settings, indent=2))}</details>" if settings else ""
    )
    return (
        f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>{_e(title)}</title><style>{_CSS}</style></head>"
        f"<body><h1>{_e(title)}</h1><table>{table}</table>{settings_html}{_instance(events, '0')}</body></html>\n"
    )


def write_html(trajectory: str | Path, out: str | Path | None = None) -> Path:
    """Render ``trajectory`` to ``out`` (default: next to it, ``.html``); returns the page's path."""
    trajectory = Path(trajectory)
    events = load_trajectory(trajectory)
    out = Path(out) if out is not None else trajectory.with_suffix(".html")
    with reading(trajectory):
        page = render_html(events, title=f"RLM trajectory: {trajectory.name}")
    return write_text_atomic(out, page)
