"""A judge model behind any OpenAI-compatible endpoint, for the model-judged metrics.

The paper's evaluation needs a judge in four places: HELMET's LongQA (NarrativeQA: fluency x
correctness), Summ (fluency, key-point recall, sentence precision, their F1), the citation NLI of
HELMET's Cite category, and the lost-in-thought injection, which cuts each reasoning trace where
the model *first attempts* to look a value up (App. A.3; the paper used Gemma-3-27B-IT). Any
OpenAI-compatible server does (a local vLLM server of a judge model, or a hosted API): the
endpoint is ``eval.judge`` (``base_url``, ``model``, ``api_key_env``, sampling and retry
settings, as ``recallm.clients.EndpointConfig``); ``eval.judge: null`` (or no ``model``) means no
judge, and every judged metric falls back to a deterministic one, labelled as such in the
records (``judged`` = 0) and in the report:

=====================  =========================================  ================================
use                    judge                                      fallback
=====================  =========================================  ================================
LongQA (NarrativeQA)   fluency (0/1) x correctness (0-3) / 3      ROUGE-L F1 against the answers
Summ                   fluency x F1(key-point recall, precision)  ROUGE-Lsum F1 against the summary
citation NLI           does the premise entail the claim?         the claim is a substring of the
                                                                  premise, or ROUGE-L recall >= 0.7
first retrieval        the first segment where the lookup starts  the first mention of the key
=====================  =========================================  ================================

The rubrics follow HELMET's judge prompts (``scripts/eval_gpt4_longqa.py``,
``scripts/eval_gpt4_summ.py``) in substance; the wording here is our own. Each judge answer ends
with a JSON object; one that cannot be read is None, and the caller scores that example with the
fallback (and says so). A request that fails for good (after the client's retries) is a
``RecallmError``: the run stops, finished examples are kept, a rerun resumes.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from recallm.errors import RecallmError

__all__ = [
    "Judge",
    "make_judge",
    "read_json",
    "segments",
    "fallback_entails",
    "PROMPT_VERSION",
]

log = logging.getLogger(__name__)

T = TypeVar("T")
R = TypeVar("R")

#: changes when a prompt changes (part of a run's fingerprint)
PROMPT_VERSION = 1

LONGQA_PROMPT = """You grade an answer to a question about a long story (a novel or a film script). You do not see the story; instead you get reference answers that would earn full marks.

Give two scores.
Fluency: 0 if the answer is incoherent, repeats itself, is cut off or is gibberish; 1 if it is coherent, fluent and complete.
Correctness: 0 if it agrees with none of the reference answers; 1 if it agrees with part of one (for instance the question asks for a person and a date and only the date is right); 2 if it fully agrees with one but also says things unrelated to the question; 3 if it fully agrees with one and everything it says is relevant. Relevant extra detail is fine: "They head for the North Pole" earns 3 when the reference is "the North Pole".

Think it through briefly, then finish with a JSON object such as {{"fluency": 1, "correctness": 2}}.

Question: {question}
Reference answers: {answers}
Answer to grade: {prediction}"""

FLUENCY_PROMPT = """You judge the fluency of a {kind}. Fluent text is coherent, does not repeat itself and is grammatical.
Score 0: incoherent, repetitive (even in different words), empty or gibberish.
Score 1: coherent, non-repetitive and fluent; a last sentence cut off mid-way is acceptable.

Finish with a JSON object such as {{"fluency": 1}}.

Text: <<<{text}>>>"""

RECALL_PROMPT = """You check which key points of an expert's summary of {subject} are present in a candidate summary. A key point is present when the candidate states its facts (wording may differ).

Go through the key points one by one, then finish with a JSON object listing the numbers of the present key points and their count, such as {{"supported_key_points": [1, 3], "recall": 2}}.

Key points:
{keypoints}

Candidate summary: <<<{summary}>>>"""

PRECISION_PROMPT = """You check how many sentences of a candidate summary of {subject} are supported by an expert's summary. A sentence is supported when its main facts agree with the expert summary; small details the expert summary omits (exact dates, names of people, laws or places) do not matter. A sentence whose main facts are missing from or contradict the expert summary, or that only adds commentary or analysis, is not supported.

Go through the sentences one by one, then finish with a JSON object giving the supported sentences and the total number of sentences, such as {{"precision": 3, "sentence_count": 5}}.

Expert summary: <<<{expert}>>>

Candidate summary: <<<{summary}>>>"""

NLI_PROMPT = """Premise: <<<{premise}>>>

Hypothesis: <<<{hypothesis}>>>

Does the premise on its own entail the hypothesis, that is, is every claim of the hypothesis supported by the premise? Finish with a JSON object: {{"entails": 1}} if it does, {{"entails": 0}} if it does not."""

LOCATE_PROMPT = """A model was given a long dictionary of key-value entries and a math problem whose integer answer is a key; it had to solve the problem and then give the value stored under that key. Its reasoning is below, split into numbered segments.

Find the first segment in which the model starts to retrieve the value for the key {key}: it says it will look the key up, starts scanning or listing dictionary entries, quotes an entry, or states a value for the key. Solving the math problem (even writing "x = {key}") is not yet retrieval. If the model never tries to retrieve the value, the answer is -1.

Finish with a JSON object such as {{"segment": 7}} (or {{"segment": -1}}).

Reasoning:
{segments}"""


def read_json(text: str) -> dict[str, Any] | None:
    """The last JSON object in ``text`` (a fenced ```json block counts), or None."""
    candidates = re.findall(r"\{[^{}]*\}", text, flags=re.DOTALL)
    for candidate in reversed(candidates):
        try:
            value = json.loads(candidate)
        except json.JSONDecodeError:
            continue
        if isinstance(value, dict):
            return value
    return None


def _number(value: Any, lo: float, hi: float) -> float | None:
    try:
        if isinstance(value, bool):
            raise TypeError
        number = float(value)
    except (TypeError, ValueError):
        return None
    return number if lo <= number <= hi else None


def segments(text: str) -> list[tuple[int, int]]:
    """Character intervals of the sentences and lines of a reasoning trace (the judge's units;
    blank stretches are not segments)."""
    out = []
    for match in re.finditer(r"[^\n]+", text):
        start = match.start()
        for part in re.finditer(r".+?(?:[.!?](?=\s)|$)", match.group(0)):
            a, b = start + part.start(), start + part.end()
            while a < b and text[a].isspace():
                a += 1
            if a < b:
                out.append((a, b))
    return out


def fallback_entails(premise: str, hypothesis: str) -> bool:
    """The deterministic stand-in for NLI: the normalised hypothesis is a substring of the
    normalised premise, or ROUGE-L recall of the hypothesis by the premise is at least 0.7."""
    from recallm.eval.scoring import helmet_normalize, rouge_l

    hyp, prem = helmet_normalize(hypothesis), helmet_normalize(premise)
    if not hyp:
        return False
    if hyp in prem:
        return True
    return rouge_l(premise, hypothesis)["rougeL_recall"] >= 0.7


class Judge:
    """A judge model at one OpenAI-compatible endpoint (see module doc)."""

    def __init__(self, client) -> None:
        self.client = client

    @property
    def model(self) -> str:
        return self.client.config.model

    def describe(self) -> dict[str, Any]:
        """What identifies the judge's scores (for a run's fingerprint; the URL is left out, so a
        requeued job on another node still resumes)."""
        cfg = self.client.config
        return {"model": cfg.model, "temperature": cfg.temperature, "prompts": PROMPT_VERSION}

    def ping(self) -> None:
        self.client.ping()

    def close(self) -> None:
        self.client.close()

    def map(self, fn: Callable[[T], R], items: Iterable[T]) -> list[R]:
        """``fn`` over ``items`` with the endpoint's concurrency, in order."""
        items = list(items)
        if len(items) <= 1:
            return [fn(item) for item in items]
        with ThreadPoolExecutor(max_workers=max(1, min(self.client.config.concurrency, len(items)))) as pool:
            return list(pool.map(fn, items))

    def ask(self, prompt: str) -> str:
        from recallm.clients import ChatError

        try:
            return self.client.chat([{"role": "user", "content": prompt}]).text
        except ChatError as exc:
            raise RecallmError(
                f"judge endpoint {self.client.config.base_url}: a request failed for good ({exc}); "
                "finished examples are saved, rerun to resume"
            ) from None

    # --- the judgements ----------------------------------------------------------------------

    def longqa(self, question: str, answers: Sequence[str], prediction: str) -> float | None:
        """HELMET's LongQA judge score in [0, 1]: fluency (0/1) x correctness (0-3) / 3."""
        reply = read_json(
            self.ask(LONGQA_PROMPT.format(question=question, answers=list(answers), prediction=prediction))
        )
        if reply is None:
            return None
        fluency, correctness = _number(reply.get("fluency"), 0, 1), _number(reply.get("correctness"), 0, 3)
        if fluency is None or correctness is None:
            return None
        return fluency * correctness / 3.0

    def summary(
        self, summary: str, keypoints: Sequence[str], expert: str, *, subject: str, kind: str = "summary"
    ) -> dict[str, float] | None:
        """HELMET's Summ judge: fluency, key-point recall, sentence precision and
        ``f1 = fluency * 2 R P / (R + P)`` (three judge calls)."""
        prompts = [
            FLUENCY_PROMPT.format(kind=kind, text=summary),
            RECALL_PROMPT.format(
                subject=subject, keypoints="\n".join(f"{i + 1}. {k}" for i, k in enumerate(keypoints)), summary=summary
            ),
            PRECISION_PROMPT.format(subject=subject, expert=expert, summary=summary),
        ]
        replies = [read_json(text) for text in self.map(self.ask, prompts)]
        if any(r is None for r in replies):
            return None
        f, r, p = replies
        fluency = _number(f.get("fluency"), 0, 1)
        found = _number(r.get("recall"), 0, float("inf"))
        supported, sentences = _number(p.get("precision"), 0, float("inf")), _number(p.get("sentence_count"), 0, 1e9)
        if fluency is None or found is None or supported is None or sentences is None:
            return None
        recall = min(1.0, found / len(keypoints)) if keypoints else 0.0
        precision = min(1.0, supported / sentences) if sentences > 0 else 0.0
        f1 = fluency * 2 * recall * precision / (recall + precision) if recall + precision > 0 else 0.0
        return {"fluency": fluency, "recall": recall, "precision": precision, "f1": f1}

    def entails(self, premise: str, hypothesis: str) -> bool | None:
        """The NLI judgement: does ``premise`` entail ``hypothesis``?"""
        reply = read_json(self.ask(NLI_PROMPT.format(premise=premise, hypothesis=hypothesis)))
        value = None if reply is None else _number(reply.get("entails"), 0, 1)
        return None if value is None else value >= 0.5

    def first_retrieval(self, trace: str, key: str) -> int | None:
        """Where the first retrieval attempt of ``trace`` (a reasoning trace) starts: a character
        offset, -1 when the judge finds no attempt, None when its answer cannot be read."""
        parts = segments(trace)
        if not parts:
            return -1
        listing = "\n".join(f"[{i + 1}] {trace[a:b]}" for i, (a, b) in enumerate(parts))
        reply = read_json(self.ask(LOCATE_PROMPT.format(key=key, segments=listing)))
        number = None if reply is None else _number(reply.get("segment"), -1, len(parts))
        if number is None or number == 0 or number != int(number):
            return None
        return -1 if number < 0 else parts[int(number) - 1][0]


def make_judge(cfg: Mapping[str, Any] | None) -> Judge | None:
    """The judge of ``eval.judge`` (None without one: the fallbacks are used). Keys:
    ``base_url``, ``model``, ``api_key_env``, ``temperature`` (default 0), ``max_tokens``
    (default 2048), ``timeout``, ``concurrency``, ``retries``, ``backoff``, ``extra_body``."""
    if cfg is None:
        return None
    if not isinstance(cfg, Mapping):
        raise RecallmError(f"eval.judge must be a mapping or null, got {cfg!r}")
    if not cfg.get("model"):
        return None
    from recallm.clients import ChatClient, EndpointConfig
    from recallm.config import dataclass_values

    dataclass_values(EndpointConfig, cfg, "eval.judge")  # its schema: the endpoint's fields (unknown keys, kinds)
    settings = {"temperature": 0.0, "max_tokens": 2048, **dict(cfg)}  # a judge's own defaults
    return Judge(ChatClient(EndpointConfig.from_mapping(settings, "eval.judge"), "judge"))
