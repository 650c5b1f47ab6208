"""Answer metrics: small pure functions, each in [0, 1].

Normalisation is SQuAD-style: lower case, punctuation and the articles a/an/the removed,
whitespace collapsed; comparisons are on the resulting *token sequences*, never on raw
substrings (``"2"`` is not inside ``"12"``).
"""

from __future__ import annotations

import math
import re
import string
from collections.abc import Iterable, Mapping, Sequence

__all__ = [
    "normalize_tokens",
    "exact_match",
    "sub_em",
    "extract_choice",
    "normalize_math",
    "split_items",
    "net_recall",
    "parse_ranking",
    "ndcg_at_k",
    "parse_citations",
    "citation_scores",
    "as_aliases",
]

_PUNCT = re.compile(f"[{re.escape(string.punctuation)}‘’“”–—]")
_ARTICLES = {"a", "an", "the"}


def normalize_tokens(text: str) -> tuple[str, ...]:
    """Lower case, drop punctuation and articles, split on whitespace."""
    text = _PUNCT.sub(" ", str(text).lower())
    return tuple(t for t in text.split() if t not in _ARTICLES)


def as_aliases(value) -> list[str]:
    """A gold answer given as a string or a sequence of alias strings -> list of strings."""
    if isinstance(value, str):
        return [value]
    if value is None:
        return []
    return [str(v) for v in value]


def _contains(hay: tuple[str, ...], needle: tuple[str, ...]) -> bool:
    n = len(needle)
    if n == 0 or n > len(hay):
        return False
    first = needle[0]
    return any(hay[i] == first and hay[i : i + n] == needle for i in range(len(hay) - n + 1))


def exact_match(prediction: str | None, golds: Iterable[str]) -> float:
    """1 if the normalised prediction equals a normalised gold alias (numbers compared as numbers)."""
    if prediction is None:
        return 0.0
    pred = normalize_tokens(prediction)
    pred_num = _as_number(normalize_math(prediction))
    for gold in golds:
        if pred and pred == normalize_tokens(gold):
            return 1.0
        gold_num = _as_number(normalize_math(gold))
        if pred_num is not None and gold_num is not None and math.isclose(pred_num, gold_num, rel_tol=0, abs_tol=1e-9):
            return 1.0
    return 0.0


def sub_em(prediction: str | None, golds: Iterable[str]) -> float:
    """1 if a gold alias and the prediction contain one another as normalised token sequences."""
    if prediction is None:
        return 0.0
    pred = normalize_tokens(prediction)
    if not pred:
        return 0.0
    for gold in golds:
        g = normalize_tokens(gold)
        if g and (_contains(pred, g) or _contains(g, pred)):
            return 1.0
    return 0.0


_CHOICE_PREFIX = re.compile(r"^(?:the\s+)?(?:correct\s+)?(?:answer|option|choice)(?:\s+is)?\s*[:\-]?\s*", re.IGNORECASE)
_CHOICE_MARKED = re.compile(r"^[(\[]?([A-Za-z])(?:[)\].:,]|$)")
_CHOICE_BARE = re.compile(r"^([A-Z])\s+(.+)$", re.DOTALL)


def extract_choice(answer: str | None, n_choices: int, choice_texts: Sequence[str] | None = None) -> int | None:
    """The chosen option (0-based) of a multiple-choice answer, strictly.

    Accepted: the letter alone or marked (``B``, ``(B)``, ``B.``, ``B) text``, ``Option B``,
    ``The answer is B``); a bare letter followed by that option's exact text (``B Paris``);
    or the exact (normalised) text of one option. Not accepted: a capital letter somewhere in
    a sentence (``A cat is ...`` is not option A unless option A's text is ``cat is ...``).
    """
    if answer is None:
        return None
    text = _CHOICE_PREFIX.sub("", answer.strip().strip("*").strip())
    m = _CHOICE_MARKED.match(text)
    if m:
        index = ord(m.group(1).upper()) - ord("A")
        return index if 0 <= index < n_choices else None
    if choice_texts:
        m = _CHOICE_BARE.match(text)
        if m:
            index = ord(m.group(1)) - ord("A")
            if 0 <= index < min(n_choices, len(choice_texts)):
                rest = normalize_tokens(m.group(2))
                if rest and rest == normalize_tokens(choice_texts[index]):
                    return index
        norm = normalize_tokens(text)
        for i, choice in enumerate(choice_texts[:n_choices]):
            if norm and norm == normalize_tokens(choice):
                return i
    return None


_BOXED = re.compile(r"\\boxed\s*\{(.*)\}", re.DOTALL)


def normalize_math(text: str) -> str:
    """Strip ``\\boxed{}``, ``$``, a trailing period and thousands separators."""
    text = str(text).strip()
    m = _BOXED.search(text)
    if m:
        text = m.group(1)
    text = text.replace("$", "").strip().rstrip(".").strip()
    if re.fullmatch(r"[-+]?\d{1,3}(,\d{3})+(\.\d+)?", text):
        text = text.replace(",", "")
    return text


def _as_number(text: str) -> float | None:
    try:
        value = float(text)
    except ValueError:
        m = re.fullmatch(r"([-+]?\d+)\s*/\s*(\d+)", text)
        if not m or int(m.group(2)) == 0:
            return None
        value = int(m.group(1)) / int(m.group(2))
    return value if math.isfinite(value) else None


_ITEM_SPLIT = re.compile(r"\s*[\n;,]\s*")


def split_items(answer: str | None) -> list[str]:
    """A list answer (one per line, ``;``- or ``,``-separated) -> its non-empty items."""
    if not answer:
        return []
    items = []
    for raw in _ITEM_SPLIT.split(answer.strip().strip("[]")):
        item = raw.strip().strip("-*•").strip().strip("'\"").strip()
        if normalize_tokens(item):
            items.append(item)
    return items


def net_recall(answer: str | None, gold_items: Sequence) -> float:
    """(gold items found - predicted items matching no gold item) / number of gold items, >= 0.

    Each gold item is a string or a list of aliases; a predicted item matches when its
    normalised token sequence equals an alias's. Items are separated by newlines, ``;`` or
    ``,``; an unmatched item ``x and y`` is tried as the two items ``x`` and ``y``. Listing
    everything in sight does not pay.
    """
    golds = [{normalize_tokens(a) for a in as_aliases(g)} for g in gold_items]
    if not golds:
        return 0.0

    def match(tokens: tuple[str, ...]) -> list[int]:
        return [i for i, aliases in enumerate(golds) if tokens in aliases]

    found = [False] * len(golds)
    wrong = 0
    for item in split_items(answer):
        pieces = [normalize_tokens(item)]
        if not match(pieces[0]) and " and " in item:
            pieces = [normalize_tokens(p) for p in item.split(" and ") if normalize_tokens(p)]
        for piece in pieces:
            hits = match(piece)
            for i in hits:
                found[i] = True
            wrong += not hits
    return max(0.0, (sum(found) - wrong) / len(golds))


_BRACKETED = re.compile(r"\[([^\[\]]+)\]")


def parse_ranking(answer: str | None) -> list[str]:
    """Document ids of a ranking answer, in order, first occurrence only.

    ``[3] > [12] > [7]`` (bracketed ids) or ``3 > 12 > 7`` / ``3, 12, 7``.
    """
    if not answer:
        return []
    ids = _BRACKETED.findall(answer)
    if not ids:
        ids = [p for p in re.split(r"\s*(?:>|,|\n|\s)\s*", answer.strip()) if p]
    out: list[str] = []
    seen: set[str] = set()
    for raw in ids:
        doc = raw.strip().strip(".").strip()
        if doc and doc not in seen:
            seen.add(doc)
            out.append(doc)
    return out


def ndcg_at_k(ranking: Sequence[str], relevance: Mapping[str, float], k: int = 10) -> float:
    """NDCG@k with graded relevance: gains ``2**rel - 1``, discount ``log2(rank + 1)``."""
    rel = {str(key): float(value) for key, value in relevance.items()}
    ideal = sorted((g for g in rel.values() if g > 0), reverse=True)[:k]
    idcg = sum((2**g - 1) / math.log2(i + 2) for i, g in enumerate(ideal))
    if idcg <= 0:
        return 0.0
    dcg = sum((2 ** rel.get(str(doc), 0.0) - 1) / math.log2(i + 2) for i, doc in enumerate(ranking[:k]))
    return dcg / idcg


_CITED_ITEM = re.compile(r"([^\[\]\n;]*?)\s*((?:\[[^\[\]]+\]\s*)+)")


def parse_citations(answer: str | None) -> list[tuple[str, list[str]]]:
    """``Entity [2][5], Other [7]`` -> ``[("Entity", ["2", "5"]), ("Other", ["7"])]``.

    Items without a citation (``Entity`` alone on a line) come back with an empty id list,
    citations without text (``[4]``) with an empty text.
    """
    if not answer:
        return []
    items: list[tuple[str, list[str]]] = []
    for line in re.split(r"[\n;]", answer):
        pos = 0
        for m in _CITED_ITEM.finditer(line):
            text = m.group(1).strip().strip(",").strip()
            ids = [i.strip() for group in _BRACKETED.findall(m.group(2)) for i in group.split(",") if i.strip()]
            items.append((text, ids))
            pos = m.end()
        rest = line[pos:].strip().strip(",").strip()
        for piece in filter(None, (p.strip() for p in rest.split(","))):
            items.append((piece, []))
    return [(text, ids) for text, ids in items if text or ids]


def citation_scores(answer: str | None, entities: Sequence[Mapping], k: int = 5) -> tuple[float, float]:
    """(citation F1, answer coverage) of an entity-citation answer over its first ``k`` items.

    ``entities``: gold entities ``{"answers": aliases, "docs": supporting ids}``. An item
    matches the first unmatched gold entity whose alias it equals (normalised). Citation
    precision: cited ids that support the item's matched entity / all cited ids; recall:
    matched items with at least one supporting citation / min(k, #gold). Coverage: matched
    items / min(k, #gold).
    """
    if not entities:
        return 0.0, 0.0
    gold = [
        ({normalize_tokens(a) for a in as_aliases(e.get("answers"))}, {str(d) for d in (e.get("docs") or [])})
        for e in entities
    ]
    target = min(k, len(gold))
    used = [False] * len(gold)
    cited = supported = matched = supported_items = 0
    for text, ids in parse_citations(answer)[:k]:
        norm = normalize_tokens(text)
        match = next((i for i, (aliases, _) in enumerate(gold) if not used[i] and norm in aliases), None)
        cited += len(ids)
        if match is None:
            continue
        used[match] = True
        matched += 1
        good = sum(1 for d in ids if d in gold[match][1])
        supported += good
        supported_items += good > 0
    precision = supported / cited if cited else 0.0
    recall = supported_items / target
    f1 = 2 * precision * recall / (precision + recall) if precision + recall > 0 else 0.0
    return f1, matched / target
