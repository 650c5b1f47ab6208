"""Judged metrics: a judge model behind any OpenAI-compatible endpoint, and HELMET's citation NLI.

The paper's evaluation needs a judge in four places: HELMET's LongQA (NarrativeQA: fluency x
correctness), Summ (fluency, key-point recall, sentence precision, their F1), the citation NLI of
HELMET's Cite category, and the lost-in-thought injection, which cuts each reasoning trace where
the model *first attempts* to look a value up (App. A.3; the paper used Gemma-3-27B-IT). Any
OpenAI-compatible server does (a local vLLM server of a judge model, or a hosted API): the
endpoint is ``eval.judge`` (``base_url``, ``model``, ``api_key_env``, sampling and retry
settings, as ``recallm.clients.EndpointConfig``); ``eval.judge.model: null`` means no judge.

**As HELMET judges** (``scripts/eval_gpt4_longqa.py``, ``scripts/eval_gpt4_summ.py``): the
prompts are HELMET's own, read from the HELMET checkout the run names (``helmet_dir``; the
``helmet`` benchmark's ``judge_prompts: helmet``, the default) - their rubrics and worked examples
are part of what the numbers mean, so they are used as upstream wrote them rather than reworded;
``judge_prompts: ours`` uses the short rubrics below instead (a documented deviation, shown in the
report). The LongQA judge reads what HELMET's reads (``recallm.eval.scoring.judge_answer``: the
output with newlines turned into spaces, after ``Answer:``); the summary judges read the whole
output. A verdict is read as HELMET reads it (``helmet_json``: the last ``{...}`` of the answer);
one that cannot be read is **dropped from the mean** (upstream's ``count_score`` and ``"gpt-4-scores"
in d``), never replaced by another metric. A request that fails for good (after the client's
retries) is a ``RecallmError``: the run stops, finished examples are kept, a rerun resumes.

**The citation NLI** (``eval.judge.nli``): ``true_t5`` runs HELMET's NLI model,
``google/t5_xxl_true_nli_mixture`` as a user downloads it (``eval.judge.nli_model``: its local
directory), with transformers, batched: the input ``premise: {passage} hypothesis: {claim}``, greedy
generation of at most 10 tokens, entailment when the decoded text is exactly ``1`` (``eval_alce.py``
``_run_nli_autoais``). ``llm`` (the default) asks the judge endpoint instead (a documented deviation);
without either, a deterministic stand-in (``fallback_entails``) - labelled as such in the records
(``judged`` = 0) and the report.

=====================  =========================================  ================================
use                    judge                                      without a judge
=====================  =========================================  ================================
LongQA (NarrativeQA)   fluency (0/1) x correctness (0-3) / 3      ROUGE-L F1 against the answers
Summ                   fluency x F1(key-point recall, precision)  ROUGE-Lsum F1 against the summary
citation NLI           true_t5 (HELMET's model) or the endpoint   the claim is a substring of the
                                                                  premise, or ROUGE-L recall >= 0.7
first retrieval        the first segment where the lookup starts  the first mention of the key
=====================  =========================================  ================================
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from recallm.errors import RecallmError

__all__ = [
    "Judge",
    "JudgePrompts",
    "NLISettings",
    "TrueNLI",
    "make_judge",
    "make_nli",
    "helmet_json",
    "load_helmet_prompts",
    "read_json",
    "segments",
    "fallback_entails",
    "PROMPT_VERSION",
]

log = logging.getLogger(__name__)

T = TypeVar("T")
R = TypeVar("R")

#: changes when a prompt changes (part of a run's fingerprint)
PROMPT_VERSION = 2

# Our own short rubrics (``judge_prompts: ours``); HELMET's are read from its checkout (``load_helmet_prompts``).
# Their fields are HELMET's: {question} {correct_answers} {parsed_output}; {text}; {keypoints} {summary};
# {expert_summary} {summary}.
LONGQA_PROMPT = """You grade an answer to a question about a long story (a novel or a film script). You do not see the story; instead you get reference answers that would earn full marks.

Give two scores.
Fluency: 0 if the answer is incoherent, repeats itself, is cut off or is gibberish; 1 if it is coherent, fluent and complete.
Correctness: 0 if it agrees with none of the reference answers; 1 if it agrees with part of one (for instance the question asks for a person and a date and only the date is right); 2 if it fully agrees with one but also says things unrelated to the question; 3 if it fully agrees with one and everything it says is relevant. Relevant extra detail is fine: "They head for the North Pole" earns 3 when the reference is "the North Pole".

Think it through briefly, then finish with a JSON object such as {{"fluency": 1, "correctness": 2}}.

Question: {question}
Reference answers: {correct_answers}
Answer to grade: {parsed_output}"""

FLUENCY_PROMPT = """You judge the fluency of a summary. Fluent text is coherent, does not repeat itself and is grammatical.
Score 0: incoherent, repetitive (even in different words), empty or gibberish.
Score 1: coherent, non-repetitive and fluent; a last sentence cut off mid-way is acceptable.

Finish with a JSON object such as {{"fluency": 1}}.

Text: <<<{text}>>>"""

RECALL_PROMPT = """You check which key points of an expert's summary of {subject} are present in a candidate summary. A key point is present when the candidate states its facts (wording may differ).

Go through the key points one by one, then finish with a JSON object giving the number of present key points, such as {{{{"recall": 2}}}}.

Key points:
{{keypoints}}

Candidate summary: <<<{{summary}}>>>"""

PRECISION_PROMPT = """You check how many sentences of a candidate summary of {subject} are supported by an expert's summary. A sentence is supported when its main facts agree with the expert summary; small details the expert summary omits (exact dates, names of people, laws or places) do not matter. A sentence whose main facts are missing from or contradict the expert summary, or that only adds commentary or analysis, is not supported.

Go through the sentences one by one, then finish with a JSON object giving the supported sentences and the total number of sentences, such as {{{{"precision": 3, "sentence_count": 5}}}}.

Expert summary: <<<{{expert_summary}}>>>

Candidate summary: <<<{{summary}}>>>"""

#: HELMET's judge prompts: (file under the checkout's scripts/, variable) per role
HELMET_PROMPTS = {
    "longqa": ("eval_gpt4_longqa.py", "judge_prompt"),
    "fluency": ("eval_gpt4_summ.py", "fluency_prompt"),
    "fluency_book": ("eval_gpt4_summ.py", "fluency_prompt_book"),
    "recall": ("eval_gpt4_summ.py", "recall_prompt"),
    "recall_book": ("eval_gpt4_summ.py", "recall_prompt_book"),
    "precision": ("eval_gpt4_summ.py", "precision_prompt"),
    "precision_book": ("eval_gpt4_summ.py", "precision_prompt_book"),
}


@dataclass(frozen=True)
class JudgePrompts:
    """The judge's prompt templates (HELMET's field names); ``*_book`` for InfiniteBench's novels,
    the others for Multi-LexSum's lawsuits. ``source``: ``ours`` or where HELMET's were read."""

    longqa: str
    fluency: str
    fluency_book: str
    recall: str
    recall_book: str
    precision: str
    precision_book: str
    source: str = "ours"

    @classmethod
    def ours(cls) -> JudgePrompts:
        return cls(
            longqa=LONGQA_PROMPT,
            fluency=FLUENCY_PROMPT,
            fluency_book=FLUENCY_PROMPT,
            recall=RECALL_PROMPT.format(subject="a civil rights lawsuit"),
            recall_book=RECALL_PROMPT.format(subject="a novel"),
            precision=PRECISION_PROMPT.format(subject="a civil rights lawsuit"),
            precision_book=PRECISION_PROMPT.format(subject="a novel"),
        )


def load_helmet_prompts(helmet_dir: str | Path) -> JudgePrompts:
    """HELMET's judge prompts, read from a checkout (``scripts/eval_gpt4_longqa.py`` and
    ``scripts/eval_gpt4_summ.py``: their module-level string constants, parsed, never run)."""
    import ast

    root = Path(helmet_dir).expanduser() / "scripts"
    found: dict[str, str] = {}
    parsed: dict[str, dict[str, str]] = {}
    for role, (name, variable) in HELMET_PROMPTS.items():
        path = root / name
        if name not in parsed:
            try:
                tree = ast.parse(path.read_text(encoding="utf-8"))
            except (OSError, SyntaxError, UnicodeDecodeError) as exc:
                raise RecallmError(
                    f"HELMET's judge prompts: cannot read {path} ({type(exc).__name__}); set helmet_dir to a "
                    "princeton-nlp/HELMET checkout, or judge_prompts=ours"
                ) from None
            parsed[name] = {
                target.id: node.value.value
                for node in tree.body
                if isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant)
                and isinstance(node.value.value, str)
                for target in node.targets
                if isinstance(target, ast.Name)
            }  # fmt: skip
        if variable not in parsed[name]:
            raise RecallmError(f"HELMET's judge prompts: {path} defines no {variable}; is it a HELMET checkout?")
        found[role] = parsed[name][variable]
    return JudgePrompts(**found, source=f"HELMET ({root})")


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


def helmet_json(text: str, fenced: bool = False) -> dict[str, Any] | None:
    """A judge's verdict as HELMET reads it (``parse_json`` of ``scripts/eval_gpt4_*.py``): the
    last non-greedy ``{...}`` of the answer, parsed; with ``fenced`` (the summary judges), a last
    ```json ...``` block when that fails. None when it is not a JSON object."""
    matches = re.findall(r"\{.*?\}", text, flags=re.DOTALL)
    if not matches:
        return None
    candidates = [matches[-1]]
    if fenced:
        blocks = re.findall(r"(?:```json)(.+)(?:```)", text, flags=re.DOTALL)
        candidates += blocks[-1:]
    for candidate in candidates:
        try:
            value = json.loads(candidate)
        except json.JSONDecodeError:
            continue
        return value if isinstance(value, dict) else None
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

    def longqa(
        self, question: str, answers: Sequence[str], prediction: str, prompts: JudgePrompts | None = None
    ) -> float | None:
        """HELMET's LongQA judge score in [0, 1]: fluency (0/1) x correctness (0-3) / 3 (HELMET
        reports the product x 100/3). ``prediction`` is what the judge reads
        (``recallm.eval.scoring.judge_answer``); None when the verdict cannot be read."""
        prompts = prompts or JudgePrompts.ours()
        text = prompts.longqa.format(question=question, correct_answers=list(answers), parsed_output=prediction)
        reply = helmet_json(self.ask(text))
        if reply is None:
            return None
        fluency, correctness = _number(reply.get("fluency"), 0, 1), _number(reply.get("correctness"), 0, 3)
        if fluency is None or correctness is None:
            return None
        return fluency * correctness / 3.0

    def summary(
        self, summary: str, keypoints: Sequence[str], expert: str, *, book: bool, prompts: JudgePrompts | None = None
    ) -> dict[str, float] | None:
        """HELMET's Summ judge (three calls: fluency, key-point recall, sentence precision), as
        ``eval_gpt4_summ.py`` scores them: recall = found / key points, precision = supported /
        sentences, ``f1 = fluency * 2 R P / (R + P)`` (not clipped, as upstream). ``book``:
        InfiniteBench's novels (the ``*_book`` prompts), else Multi-LexSum. None when any of the
        three verdicts cannot be read (upstream drops the example)."""
        prompts = prompts or JudgePrompts.ours()
        text = summary.strip()
        listing = "\n".join(f"{i + 1}. {k}" for i, k in enumerate(keypoints))
        asks = [
            (prompts.fluency_book if book else prompts.fluency).format(text=text),
            (prompts.recall_book if book else prompts.recall).format(keypoints=listing, summary=text),
            (prompts.precision_book if book else prompts.precision).format(expert_summary=expert, summary=text),
        ]
        replies = [helmet_json(answer, fenced=True) for answer in self.map(self.ask, asks)]
        if any(r is None for r in replies):
            return None
        f, r, p = replies
        fluency = _number(f.get("fluency"), 0, 1)
        found = _number(r.get("recall"), 0, float("inf"))
        supported, sentences = _number(p.get("precision"), 0, float("inf")), _number(p.get("sentence_count"), 0, 1e9)
        if fluency is None or found is None or supported is None or sentences is None:
            return None
        recall = found / len(keypoints) if keypoints else 0.0
        precision = supported / sentences if sentences > 0 else 0.0
        f1 = fluency * 2 * recall * precision / (recall + precision) if recall + precision > 0 else 0.0
        return {"fluency": fluency, "recall": recall, "precision": precision, "f1": f1}

    def entails(self, premise: str, hypothesis: str) -> bool | None:
        """The NLI judgement asked of the endpoint: does ``premise`` entail ``hypothesis``?"""
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


@dataclass(frozen=True)
class NLISettings:
    """The citation NLI of ``eval.judge`` (keys beside the endpoint's)."""

    nli: str = "llm"
    """``true_t5`` (HELMET's TRUE NLI model, ``nli_model``) | ``llm`` (the judge endpoint; without one, the
    deterministic fallback)"""
    nli_model: str | None = None
    """a local copy of google/t5_xxl_true_nli_mixture (or any T5 NLI model of its kind)"""
    nli_batch_size: int = 8
    nli_device: str = "auto"
    """``auto`` (CUDA when there is one, else CPU), ``cpu``, ``cuda``, ``cuda:1``..."""
    nli_dtype: str = "auto"
    """``auto`` (bfloat16 on CUDA as HELMET loads it, float32 on the CPU), ``bfloat16``, ``float32``"""

    def __post_init__(self) -> None:
        if self.nli not in ("llm", "true_t5"):
            raise RecallmError(f"eval.judge.nli must be llm or true_t5, got {self.nli!r}")
        if self.nli == "true_t5" and not self.nli_model:
            raise RecallmError(
                "eval.judge.nli=true_t5 needs eval.judge.nli_model: a local copy of google/t5_xxl_true_nli_mixture "
                "(huggingface-cli download google/t5_xxl_true_nli_mixture --local-dir ...)"
            )
        if self.nli_batch_size < 1:
            raise RecallmError(f"eval.judge.nli_batch_size must be >= 1, got {self.nli_batch_size}")
        if self.nli_dtype not in ("auto", "bfloat16", "float32", "float16"):
            raise RecallmError(
                f"eval.judge.nli_dtype must be auto, bfloat16, float16 or float32, got {self.nli_dtype!r}"
            )


_NLI_KEYS = tuple(NLISettings.__dataclass_fields__)


def _split(cfg: Mapping[str, Any]) -> tuple[dict[str, Any], NLISettings]:
    from recallm.config import dataclass_values

    cfg = dict(cfg)
    nli = {k: cfg.pop(k) for k in _NLI_KEYS if k in cfg}
    return cfg, NLISettings(**dataclass_values(NLISettings, nli, "eval.judge"))


class TrueNLI:
    """HELMET's citation NLI (``eval_alce.py`` ``_run_nli_autoais``), batched: a T5 model reads
    ``premise: {premise} hypothesis: {hypothesis}`` and generates greedily (at most 10 tokens);
    the claim is entailed when the decoded text is exactly ``1``. Batching pads the inputs (the
    attention mask keeps each row's result that of the row alone)."""

    def __init__(self, settings: NLISettings) -> None:
        import torch
        from transformers import AutoModelForSeq2SeqLM, AutoTokenizer

        path = Path(str(settings.nli_model)).expanduser()
        if not (path / "config.json").is_file():
            raise RecallmError(
                f"eval.judge.nli_model: {path} is not a model directory (no config.json); download "
                "google/t5_xxl_true_nli_mixture there"
            )
        device = settings.nli_device
        if device == "auto":
            device = "cuda" if torch.cuda.is_available() else "cpu"
        dtype = settings.nli_dtype
        if dtype == "auto":
            dtype = "bfloat16" if device.startswith("cuda") else "float32"
        self.settings, self.path, self.device = settings, path, device
        self.tokenizer = AutoTokenizer.from_pretrained(str(path))
        self.model = AutoModelForSeq2SeqLM.from_pretrained(str(path), dtype=getattr(torch, dtype)).to(device).eval()
        self.name = f"true_t5 ({path.name})"

    def describe(self) -> dict[str, Any]:
        return {"nli": "true_t5", "model": str(self.path)}

    def entails_batch(self, pairs: Sequence[tuple[str, str]]) -> list[bool]:
        import torch

        out: list[bool] = []
        size = self.settings.nli_batch_size
        for start in range(0, len(pairs), size):
            texts = [f"premise: {p} hypothesis: {h}" for p, h in pairs[start : start + size]]
            batch = self.tokenizer(texts, return_tensors="pt", padding=True).to(self.device)
            with torch.inference_mode():
                ids = self.model.generate(**batch, max_new_tokens=10, do_sample=False, num_beams=1)
            out += [text == "1" for text in self.tokenizer.batch_decode(ids, skip_special_tokens=True)]
        return out


class JudgeNLI:
    """The citation NLI asked of the judge endpoint (``nli: llm``); None for an unreadable verdict."""

    def __init__(self, judge: Judge) -> None:
        self.judge = judge
        self.name = f"llm ({judge.model})"

    def describe(self) -> dict[str, Any]:
        return {"nli": "llm", **self.judge.describe()}

    def entails_batch(self, pairs: Sequence[tuple[str, str]]) -> list[bool | None]:
        return self.judge.map(lambda pair: self.judge.entails(*pair), pairs)


def make_nli(cfg: Mapping[str, Any] | None, judge: Judge | None):
    """The citation NLI of ``eval.judge`` (``TrueNLI`` for ``nli: true_t5``, else the judge's
    endpoint), or None: the deterministic fallback."""
    settings = _split(cfg)[1] if cfg is not None else NLISettings()
    if settings.nli == "true_t5":
        return TrueNLI(settings)
    return JudgeNLI(judge) if judge is not None else None


def make_judge(cfg: Mapping[str, Any] | None) -> Judge | None:
    """The judge of ``eval.judge`` (None without one: the fallbacks are used). Keys:
    ``base_url``, ``model``, ``api_key_env``, ``temperature`` (default 0), ``max_tokens``
    (default 2048), ``timeout``, ``concurrency``, ``retries``, ``backoff``, ``extra_body``; and
    the citation NLI's (``NLISettings``: ``nli``, ``nli_model``, ...), read by ``make_nli``."""
    if cfg is None:
        return None
    if not isinstance(cfg, Mapping):
        raise RecallmError(f"eval.judge must be a mapping or null, got {cfg!r}")
    cfg, _ = _split(cfg)
    if not cfg.get("model"):
        return None
    from recallm.clients import ChatClient, EndpointConfig
    from recallm.config import dataclass_values

    dataclass_values(EndpointConfig, cfg, "eval.judge")  # its schema: the endpoint's fields (unknown keys, kinds)
    settings = {"temperature": 0.0, "max_tokens": 2048, **dict(cfg)}  # a judge's own defaults
    return Judge(ChatClient(EndpointConfig.from_mapping(settings, "eval.judge"), "judge"))
