"""Scoring of benchmark outputs: small pure functions.

* Where the answer is: ``answer_region`` (the text after the think block, or the whole output
  for a model that does not think) and ``final_answer`` (after the last ``Answer:`` marker, as
  the reward's parser reads it).
* RULER (``scripts/eval/evaluate.py`` and ``synthetic/constants.py`` of NVIDIA/RULER):
  ``ruler_postprocess`` (strip; control characters become newlines), ``string_match_all`` (the
  fraction of references found in the prediction) and ``string_match_part`` (1 if any reference
  is found). RULER's code tests ``ref.lower() in pred.lower()``; we keep the case-insensitive
  substring test but not its lenient edge: a reference must not be part of a longer alphanumeric
  run (``"12"`` is not found in ``"x123"``, a lenient match the reference code would count).
* HELMET json_kv: ``substring_exact_match`` - the SQuAD-normalised gold (lower case,
  punctuation and articles removed, whitespace collapsed) is a substring of the normalised
  prediction, as HELMET's ``substring_exact_match_score``.
* Lost in thought: ``find_key`` (the first whole-number occurrence of a key),
  ``injection_prefix`` (a dictionary entry's text up to its value), ``value_follows``.
* Recall spans judged on text, for outputs without token ids (a server's): ``text_span_stats``.
"""

from __future__ import annotations

import re
import string
from collections.abc import Sequence

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
    "injection_prefix",
    "close_open_span",
    "value_follows",
    "text_span_stats",
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


def _found(reference: str, prediction: str) -> bool:
    """``reference`` occurs in ``prediction`` (both lower-cased) and is not part of a longer
    alphanumeric run: ``"12"`` is found in ``"is 12."`` but not in ``"x123"``."""
    ref = reference.lower()
    if not ref:
        return False
    pattern = (
        (r"(?<![0-9a-z])" if ref[0].isalnum() else "") + re.escape(ref) + (r"(?![0-9a-z])" if ref[-1].isalnum() else "")
    )
    return re.search(pattern, prediction.lower()) is not None


def string_match_all(prediction: str, references: Sequence[str]) -> float:
    """Fraction of ``references`` found (case-insensitive, whole-token substring) in ``prediction``."""
    if not references:
        raise ValueError("string_match_all needs at least one reference")
    return sum(_found(ref, prediction) for ref in references) / len(references)


def string_match_part(prediction: str, references: Sequence[str]) -> float:
    """1 if any of ``references`` is found (case-insensitive, whole-token substring) in ``prediction``."""
    if not references:
        raise ValueError("string_match_part needs at least one reference")
    return float(any(_found(ref, prediction) for ref in references))


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


def injection_prefix(fmt: str, key: str) -> str:
    """A dictionary entry's exact text up to its value, in the layouts of
    ``data_gen.tasks.kv._Dictionary.line``: ``{key}: `` (lines), ``{key},`` (CSV),
    ``"{key}": "`` (JSON)."""
    from data_gen.tasks.kv import _Dictionary

    marker = "\x00VALUE\x00"
    line = _Dictionary.line(fmt, key, marker)
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
    verbatim = 0
    for span in spans:
        opened = max(output.rfind(marker, 0, span.start) for marker in START_MARKERS)
        verbatim += span.text in prompt_text + output[: max(opened, 0)]
    return SpanStats(count=len(spans), verbatim=verbatim, source="text")
