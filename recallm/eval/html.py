"""The evaluation report as one HTML page a person can open: ``report.html`` beside ``report.md``.

``write_html`` renders the report's Markdown (the ``markdown`` package, its ``tables`` extension)
with every plot inlined as a ``data:`` URI — one self-contained file, nothing fetched — and adds
**example outputs**: for every run and benchmark, at the longest length, the first right and the
first wrong output of each task, each with its reference answer, the answer read from it and its
recall spans marked (green: verbatim, a copy of its searchable context; red: not verbatim; grey:
no verdict recorded), the rest of the output as written. Everything taken from a model's output is
escaped.
"""

from __future__ import annotations

import base64
import html
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from recallm.io import write_text_atomic

__all__ = ["write_html", "render_output", "pick_examples"]

_STYLE = """
body { font-family: system-ui, sans-serif; max-width: 1100px; margin: 2em auto; padding: 0 1em; color: #222; }
table { border-collapse: collapse; margin: 0.5em 0 1.2em; font-size: 0.9em; }
th, td { border: 1px solid #ccc; padding: 0.25em 0.5em; text-align: left; vertical-align: top; }
th { background: #f3f3f3; }
img { max-width: 100%; }
code { background: #f5f5f5; padding: 0 0.2em; }
.example { border: 1px solid #ddd; border-radius: 6px; padding: 0.6em 0.8em; margin: 0.8em 0; }
.example .meta { font-size: 0.85em; color: #555; margin-bottom: 0.4em; }
.output { white-space: pre-wrap; font-family: ui-monospace, monospace; font-size: 0.85em; background: #fafafa;
  padding: 0.5em; border-radius: 4px; }
.span { border-radius: 3px; padding: 0 1px; }
.span.verbatim { background: #c8f0c8; border: 1px solid #5a5; }
.span.not-verbatim { background: #f8c8c8; border: 1px solid #c55; }
.span.unknown { background: #e4e4e4; border: 1px solid #999; }
.marker { color: #888; font-size: 0.8em; }
.right { color: #171; font-weight: bold; }
.wrong { color: #a11; font-weight: bold; }
.legend span { margin-right: 1em; }
"""


def _inline_images(body: str, out_dir: Path) -> str:
    """``<img src="plots/x.png">`` -> a ``data:`` URI (the page holds its plots)."""

    def inline(match: re.Match) -> str:
        src = match.group(2)
        path = out_dir / src
        if src.startswith(("data:", "http:", "https:", "/")) or not path.is_file():
            return match.group(0)
        data = base64.b64encode(path.read_bytes()).decode("ascii")
        return f'{match.group(1)}data:image/png;base64,{data}{match.group(3)}'

    return re.sub(r'(<img[^>]*\bsrc=")([^"]+)(")', inline, body)


def render_output(text: str, flags: Sequence[bool] | None) -> str:
    """An output as HTML with its recall spans marked by their verdicts (``flags``, in span order;
    grey when absent or when they do not match the spans found in the text)."""
    from rewards.parsing import START_MARKERS, parse_response

    spans = parse_response(text).spans
    usable = flags is not None and len(flags) == len(spans)
    parts, at = [], 0
    for i, span in enumerate(spans):
        opened = max(text.rfind(marker, 0, span.start) for marker in START_MARKERS)
        opened = opened if opened >= at else span.start
        parts.append(html.escape(text[at:opened]))
        kind = "unknown" if not usable else ("verbatim" if flags[i] else "not-verbatim")
        title = {"verbatim": "verbatim span", "not-verbatim": "span not in its context", "unknown": "span"}[kind]
        marker_open = html.escape(text[opened : span.start])
        parts.append(
            f'<span class="marker">{marker_open}</span><span class="span {kind}" title="{title}">'
            f"{html.escape(span.text)}</span>"
        )
        at = span.end
    parts.append(html.escape(text[at:]))
    body = "".join(parts)
    # the end markers left in the text are shown small, like the start markers
    for marker in ("&lt;|end_recall|&gt;", "&lt;/recall&gt;"):
        body = body.replace(marker, f'<span class="marker">{marker}</span>')
    return body


def pick_examples(records: Sequence[Mapping[str, Any]], per_task: int = 1) -> list[Mapping[str, Any]]:
    """At the longest length: the first ``per_task`` right and wrong outputs of each task (index order)."""
    if not records:
        return []
    longest = max(int(r["length"]) for r in records)
    at = sorted((r for r in records if int(r["length"]) == longest), key=lambda r: (r["task"], int(r.get("index", 0))))
    chosen = []
    for task in sorted({r["task"] for r in at}):
        mine = [r for r in at if r["task"] == task]
        chosen += [r for r in mine if r.get("correct")][:per_task]
        chosen += [r for r in mine if not r.get("correct")][:per_task]
    return chosen


def _example(run: str, record: Mapping[str, Any]) -> str:
    right = bool(record.get("correct"))
    verdict = '<span class="right">right</span>' if right else '<span class="wrong">wrong</span>'
    gold = record.get("gold")
    gold_text = ", ".join(str(g) for g in gold) if gold else "–"
    spans = record.get("spans") or {}
    flags = spans.get("flags") if isinstance(spans.get("flags"), list) else None
    return (
        '<div class="example">'
        f'<div class="meta"><b>{html.escape(run)}</b> · {html.escape(str(record.get("example_id")))} · '
        f"{int(record.get('prompt_tokens') or 0)} prompt tokens · {verdict} · reference: "
        f"<code>{html.escape(gold_text)}</code> · answer read: <code>{html.escape(str(record.get('answer') or '–'))}</code>"
        f" · spans {int(spans.get('count') or 0)}, verbatim {int(spans.get('verbatim') or 0)}</div>"
        f'<div class="output">{render_output(str(record.get("output") or ""), flags)}</div>'
        "</div>"
    )


def _examples_section(ctx) -> str:
    out = [
        "<h2>Example outputs</h2>",
        '<p class="legend">At the longest length, the first right and the first wrong output of each task, per run. '
        '<span class="span verbatim">verbatim span</span><span class="span not-verbatim">span that is not a copy '
        'of its context</span><span class="span unknown">span without a recorded verdict</span></p>',
    ]
    benches = sorted({b for s in ctx.summaries.values() for b in (s.get("benchmarks") or {})})
    for bench in benches:
        out.append(f"<h3>{html.escape(bench)}</h3>")
        for run in ctx.summaries:
            for record in pick_examples(ctx.records(run, bench)):
                out.append(_example(run, record))
    return "\n".join(out)


def write_html(path: Path, markdown_text: str, out_dir: Path, ctx) -> Path:
    """``report.html`` (module doc) from the report's Markdown and its context (``ReportContext``)."""
    import markdown

    body = markdown.markdown(markdown_text, extensions=["tables"])
    body = _inline_images(body, Path(out_dir))
    page = (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>RecaLLM evaluation report</title><style>{_STYLE}</style></head><body>\n"
        f"{body}\n{_examples_section(ctx)}\n</body></html>\n"
    )
    return write_text_atomic(Path(path), page)
