"""Answer metrics: small pure functions, each in [0, 1].

Normalisation is SQuAD-style: lower case, punctuation and the articles a/an/the removed,
whitespace collapsed; comparisons are on the resulting *token sequences*, never on raw
substrings (``"2"`` is not inside ``"12"``).

Every parser here runs in time linear in the answer's length, whatever the answer (a GRPO
rollout is up to ~20K characters of arbitrary text): no regular expression has a quantified
prefix that can be retried from every start position, and lists are de-duplicated before the
per-item work.
"""

from __future__ import annotations

import math
import re
import string
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from itertools import islice
from typing import NamedTuple

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
    "cited_ids",
    "named_items",
    "canonical",
    "CitationScores",
    "citation_id_scores",
    "entity_citation_scores",
    "citation_scores",
    "NDCG_GAINS",
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
    if isinstance(value, (int, float)):  # a numeric answer
        return [str(value)]
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


_BOXED = "\\boxed"
_SPACES = re.compile(r"\s*")
_THOUSANDS = re.compile(r"[-+]?\d{1,3}(,\d{3})+(\.\d+)?")
_FRACTION = re.compile(r"([-+]?\d+)\s*/\s*(\d+)")
_MAX_DIGITS = 4000  # below Python's int-from-string limit (4300 digits)


def _boxed(text: str) -> str | None:
    """The content of ``\\boxed{...}``: from the first ``\\boxed`` followed by ``{`` to the last
    ``}`` of the text (None without one). One left-to-right pass and one ``rfind``."""
    pos = text.find(_BOXED)
    while pos != -1:
        brace = _SPACES.match(text, pos + len(_BOXED)).end()
        if brace < len(text) and text[brace] == "{":
            close = text.rfind("}")
            return text[brace + 1 : close] if close > brace else None
        pos = text.find(_BOXED, brace)
    return None


def normalize_math(text: str) -> str:
    """Strip ``\\boxed{}``, ``$``, a trailing period and thousands separators."""
    text = str(text).strip()
    boxed = _boxed(text)
    if boxed is not None:
        text = boxed
    text = text.replace("$", "").strip().rstrip(".").strip()
    if _THOUSANDS.fullmatch(text):
        text = text.replace(",", "")
    return text


def _as_number(text: str) -> float | None:
    try:
        value = float(text)
    except ValueError:
        m = _FRACTION.fullmatch(text)
        if not m or len(m.group(1)) > _MAX_DIGITS or len(m.group(2)) > _MAX_DIGITS or int(m.group(2)) == 0:
            return None
        try:
            value = int(m.group(1)) / int(m.group(2))
        except OverflowError:  # a ratio of two huge integers
            return None
    return value if math.isfinite(value) else None


_ITEM_SEPARATORS = re.compile(r"[\n;,]")


def _clean_item(raw: str) -> str:
    return raw.strip().strip("-*•").strip().strip("'\"").strip()


def split_items(answer: str | None) -> list[str]:
    """A list answer (one per line, ``;``- or ``,``-separated) -> its non-empty items."""
    if not answer:
        return []
    items = []
    for raw in _ITEM_SEPARATORS.split(answer.strip().strip("[]")):
        item = _clean_item(raw)
        if item and normalize_tokens(item):
            items.append(item)
    return items


def net_recall(answer: str | None, gold_items: Sequence) -> float:
    """(gold items found - predicted items matching no gold item) / number of gold items, >= 0.

    Each gold item is a string or a list of aliases; a predicted item matches when its
    normalised token sequence equals an alias's. Items are separated by newlines, ``;`` or
    ``,``; an unmatched item ``x and y`` is tried as the two items ``x`` and ``y``. Listing
    everything in sight does not pay.
    """
    golds: dict[tuple[str, ...], list[int]] = {}
    n_gold = 0
    for i, g in enumerate(gold_items):
        n_gold += 1
        for alias in {normalize_tokens(a) for a in as_aliases(g)}:
            golds.setdefault(alias, []).append(i)
    if not n_gold or not answer:
        return 0.0
    found: set[int] = set()
    wrong = 0
    # every distinct raw item once, with its multiplicity (a repeated wrong item is wrong each time)
    for raw, times in Counter(_ITEM_SEPARATORS.split(answer.strip().strip("[]"))).items():
        item = _clean_item(raw)
        tokens = normalize_tokens(item) if item else ()
        if not tokens:
            continue
        pieces = [tokens]
        if tokens not in golds and " and " in item:
            pieces = [t for t in (normalize_tokens(p) for p in item.split(" and ")) if t]
        for piece in pieces:
            hits = golds.get(piece)
            if hits:
                found.update(hits)
            else:
                wrong += times
        if wrong >= n_gold:  # the score is max(0, found - wrong) / n_gold: nothing more can raise it
            return 0.0
    return max(0.0, (len(found) - wrong) / n_gold)


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


NDCG_GAINS = ("linear", "exponential")


def ndcg_at_k(ranking: Sequence[str], relevance: Mapping[str, float], k: int = 10, gain: str = "linear") -> float:
    """NDCG@k with graded relevance and discount ``log2(rank + 1)``.

    ``gain``: ``linear`` (the grade itself: MS MARCO's and TREC DL's standard, as ``trec_eval``
    computes it) or ``exponential`` (``2**grade - 1``, Burges et al.). Unknown ids gain 0; the
    ideal ranking sorts the positive grades of ``relevance``.
    """
    if gain not in NDCG_GAINS:
        raise ValueError(f"unknown NDCG gain {gain!r}; expected one of {', '.join(NDCG_GAINS)}")
    rel = {str(key): float(value) for key, value in relevance.items()}
    value = (lambda g: g) if gain == "linear" else (lambda g: 2.0**g - 1.0)
    ideal = sorted((g for g in rel.values() if g > 0), reverse=True)[:k]
    idcg = sum(value(g) / math.log2(i + 2) for i, g in enumerate(ideal))
    if idcg <= 0:
        return 0.0
    dcg = sum(value(rel.get(str(doc), 0.0)) / math.log2(i + 2) for i, doc in enumerate(ranking[:k]))
    return dcg / idcg


_CITATION_GROUP = re.compile(r"(?:\[[^\[\]]+\]\s*)+")  # adjacent bracketed ids: a literal-led loop, linear
_LINES = re.compile(r"[\n;]")


def _ids(group: str) -> list[str]:
    return [i.strip() for inner in _BRACKETED.findall(group) for i in inner.split(",") if i.strip()]


def _citation_items(answer: str):
    for line in _LINES.split(answer):
        pos = 0
        for m in _CITATION_GROUP.finditer(line):
            before = line[pos : m.start()]
            cut = max(before.rfind("["), before.rfind("]"))
            text = before[cut + 1 :].strip().strip(",").strip()
            yield text, _ids(m.group())
            pos = m.end()
        rest = line[pos:].strip().strip(",").strip()
        for piece in filter(None, (p.strip() for p in rest.split(","))):
            yield piece, []


def parse_citations(answer: str | None, limit: int | None = None) -> list[tuple[str, list[str]]]:
    """``Entity [2][5], Other [7]`` -> ``[("Entity", ["2", "5"]), ("Other", ["7"])]``.

    Per line (``\\n`` or ``;``): each run of bracketed ids cites the text before it, back to the
    previous run or to a stray bracket (text before a stray bracket is dropped); the text after
    the last run is split on commas into items without citations. So items without a citation
    (``Entity`` alone on a line) come back with an empty id list, citations without text
    (``[4]``) with an empty text. Linear in the answer's length; ``limit``: the first items only
    (the rest is not parsed).
    """
    if not answer:
        return []
    return list(islice(((text, ids) for text, ids in _citation_items(answer) if text or ids), limit))


def cited_ids(text: str | None) -> set[str]:
    """Every document id cited in ``text`` (``[3]``, ``[3, 7]``): the ids of every bracket pair
    (without brackets inside), as ``parse_citations`` reads them. Linear, each distinct bracket once."""
    if not text:
        return set()
    return {i.strip() for inner in set(_BRACKETED.findall(text)) for i in inner.split(",") if i.strip()}


_ITEM_BREAKS = re.compile(r"(?:\[[^\[\]]+\]\s*)+|[\n;\[\]]")  # citation runs, line ends, stray brackets
_PUNCT_BUT_COMMA = re.compile(f"[{re.escape(string.punctuation.replace(',', ''))}‘’“”–—]")
_ARTICLE_TOKENS = re.compile(r"(?<![^\s\x00])(?:a|an|the)(?![^\s\x00])")
_BLANKS = re.compile(r"[^\S\x00]+")  # a run of whitespace (the item break \x00 is none)
_EDGE_BLANKS = re.compile(r" ?\x00 ?")


def canonical(text: str) -> str:
    """``normalize_tokens`` joined by single spaces (a hashable key)."""
    return " ".join(normalize_tokens(text))


def named_items(answer: str | None) -> set[str]:
    """Canonical names (``canonical``) of an answer's items: the texts between citation runs, line
    breaks and stray brackets, each whole and cut at its commas (``Paris, Texas [1]`` names
    ``paris texas``, ``paris`` and ``texas``; a NUL character counts as a line break). The answer is
    normalised as a whole by a few ``re``/``str`` passes in C; nothing runs per item in Python."""
    if not answer:
        return set()
    base = _PUNCT_BUT_COMMA.sub(" ", _ITEM_BREAKS.sub("\x00", answer).lower())
    keys: set[str] = set()
    for variant in (base.replace(",", " "), base.replace(",", "\x00") if "," in base else None):
        if variant is not None:
            flat = _BLANKS.sub(" ", _ARTICLE_TOKENS.sub(" ", variant)).strip(" ")
            keys.update(_EDGE_BLANKS.sub("\x00", flat).split("\x00"))
    keys.discard("")
    return keys


class CitationScores(NamedTuple):
    f1: float
    precision: float
    recall: float
    coverage: float


def citation_id_scores(
    answer: str | None,
    entities: Sequence[Mapping],
    k: int = 5,
    *,
    recalled_ids: set[str] | None = None,
    unrecalled_credit: float = 1.0,
) -> CitationScores:
    """Citation scores over exact document ids (the paper's in-domain entity citation, App. E.2).

    ``entities``: gold entities ``{"answers": aliases, "docs": supporting ids}``; the gold ids are
    every supporting id. Of the distinct ids the answer cites, the correct ones are gold ids.
    Precision: correct / cited; recall: min(correct, m) / m with m = min(k, #gold ids) (top-k);
    F1 of the two. Coverage: gold entities the answer names (an item equal to one of its aliases,
    normalised), min(named, k') / k' with k' = min(k, #entities).

    ``unrecalled_credit``: weight of a cited id that no recall span cites (``recalled_ids``), in
    the numerators and the denominator of precision alike; 1 (every citation counts fully) is the
    paper's definition, 0.5 the authors' release.
    """
    if not entities:
        return CitationScores(0.0, 0.0, 0.0, 0.0)
    gold_ids = {str(d) for e in entities for d in (e.get("docs") or ())}
    cited = cited_ids(answer)

    def weight(doc: str) -> float:
        return 1.0 if recalled_ids is None or doc in recalled_ids else unrecalled_credit

    cited_weight = sum(weight(d) for d in cited)
    correct = sum(weight(d) for d in cited & gold_ids)
    precision = correct / cited_weight if cited_weight > 0 else 0.0
    m = min(k, len(gold_ids))
    recall = min(correct, m) / m if m else 0.0
    f1 = 2 * precision * recall / (precision + recall) if precision + recall > 0 else 0.0
    names = named_items(answer)
    named = sum(any(canonical(a) in names for a in as_aliases(e.get("answers"))) for e in entities)
    target = min(k, len(entities))
    return CitationScores(f1, precision, recall, min(named, target) / target)


def entity_citation_scores(answer: str | None, entities: Sequence[Mapping], k: int = 5) -> tuple[float, float]:
    """(citation F1, answer coverage) of an entity-citation answer over its first ``k`` items,
    citations judged per entity (this project's earlier definition, kept as ``citation_mode:
    entities``).

    An item matches the first unmatched gold entity whose alias it equals (normalised). Citation
    precision: cited ids that support the item's matched entity / all cited ids; recall: matched
    items with at least one supporting citation / min(k, #gold). Coverage: matched items /
    min(k, #gold).
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
    for text, ids in parse_citations(answer, limit=k):
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


citation_scores = entity_citation_scores  # the earlier name of the per-entity variant
