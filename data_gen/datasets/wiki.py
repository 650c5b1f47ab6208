"""A chunked local Wikipedia corpus (the KILT knowledge source, or DPR's 100-word passages): the
fixed-window distractors of multi-hop QA (paper App. C.4: "a fixed-window chunked Wikipedia
corpus from the KILT knowledge source").

``load_wiki_chunks(path, chunk_words, max_passages)`` streams a file or a directory of files and
returns ``(title, text)`` windows of ``chunk_words`` words, at most ``max_passages`` of them (the
whole of KILT is 5.9M pages: bound what a process holds). Accepted, gzipped or not:

* KILT's ``kilt_knowledgesource.json`` (JSON lines ``{"wikipedia_title", "text": [paragraph,
  ...]}``): the page's paragraphs without its title line and ``Section::::`` headings, joined and
  cut into windows;
* already chunked JSON lines ``{"title", "text"}`` (one passage each, kept as it is);
* DPR's ``psgs_w100.tsv`` (``id<TAB>text<TAB>title`` under a header row).
"""

from __future__ import annotations

import json
from functools import lru_cache
from pathlib import Path

from data_gen.datasets.io import check_path, data_files, read_lines
from recallm.errors import RecallmError

__all__ = ["load_wiki_chunks", "WIKI_HINT"]

WIKI_HINT = (
    "give a local copy of KILT's kilt_knowledgesource.json (https://github.com/facebookresearch/KILT) or DPR's "
    "psgs_w100.tsv, a file or a directory"
)


def _page_chunks(record: dict, chunk_words: int):
    title = str(record.get("wikipedia_title") or record.get("title") or "").strip()
    text = record.get("text")
    if isinstance(text, str):  # an already chunked passage
        if text.strip():
            yield title, text.strip()
        return
    words: list[str] = []
    for i, paragraph in enumerate(text or []):
        paragraph = str(paragraph).strip()
        if not paragraph or (i == 0 and paragraph == title) or paragraph.startswith("Section::::"):
            continue
        words += paragraph.removeprefix("BULLET::::").split()
    for start in range(0, len(words), chunk_words):
        window = words[start : start + chunk_words]
        if len(window) >= chunk_words // 2 or start == 0:
            yield title, " ".join(window)


def _file_chunks(path: Path, chunk_words: int):
    name = path.name.lower().removesuffix(".gz")
    lines = read_lines(path)
    if name.endswith(".tsv"):
        header = next(lines, "").split("\t")
        col = {c.strip().lower(): i for i, c in enumerate(header)}
        if "text" not in col:
            raise ValueError(f"{path.name}: a TSV needs a header with a text column (id, text, title)")
        for line in lines:
            cols = line.split("\t")
            if len(cols) > col["text"] and cols[col["text"]].strip():
                title = cols[col["title"]].strip().strip('"') if "title" in col and len(cols) > col["title"] else ""
                yield title, cols[col["text"]].strip().strip('"')
        return
    for line in lines:
        if line.strip():
            record = json.loads(line)
            if isinstance(record, dict):
                yield from _page_chunks(record, chunk_words)


@lru_cache(maxsize=4)
def load_wiki_chunks(path: str, chunk_words: int = 100, max_passages: int = 200_000) -> tuple[tuple[str, str], ...]:
    """The corpus's ``(title, text)`` windows (module doc), read once per process."""
    p = check_path(path, "Wikipedia corpus", WIKI_HINT)
    files = data_files(p) if p.is_dir() else [p]
    if not files:
        raise RecallmError(f"Wikipedia corpus: no .jsonl/.json/.tsv files in {p}; {WIKI_HINT}")
    out: list[tuple[str, str]] = []
    try:
        for file in files:
            for chunk in _file_chunks(file, chunk_words):
                out.append(chunk)
                if len(out) >= max_passages:
                    return tuple(out)
    except (ValueError, OSError, UnicodeDecodeError) as exc:
        raise RecallmError(f"Wikipedia corpus: cannot read {p} ({str(exc).splitlines()[0]}); {WIKI_HINT}") from exc
    if not out:
        raise RecallmError(f"Wikipedia corpus: no passages in {p}; {WIKI_HINT}")
    return tuple(out)
