"""HELMET (Yen et al., 2025), all seven categories of the paper's Table 2.

=========  ===================================================  =====================================
category   tasks                                                metric (HELMET's)
=========  ===================================================  =====================================
Recall     json_kv, ruler_niah_mk_2, ruler_niah_mk_3,           substring exact match; RULER recall
           ruler_niah_mv (generated offline)
RAG        nq, triviaqa, hotpotqa, popqa (KILT passages)        substring exact match
Re-rank    msmarco_rerank                                       NDCG@10 (trec_eval)
Cite       alce_asqa, alce_qampari                              STR-EM / QAMPARI recall@5, citation
                                                                recall and precision (NLI judge)
LongQA     narrativeqa, infbench_qa, infbench_choice            judge (fluency x correctness),
                                                                ROUGE-L F1, exact match
Summ       infbench_sum, multi_lexsum                           judge F1 (fluency x key-point recall
                                                                / sentence precision)
ICL        trec_coarse, trec_fine, banking77, clinic150, nlu    exact match (labels are random ints)
=========  ===================================================  =====================================

How an example is made, as HELMET makes it (``recallm.eval.benchmarks.helmet.tasks`` holds the
per-task facts): the test items of a task are drawn in a seeded order (the same items at every
length); the number of passages, shots or documents comes from HELMET's table for the length
(the HELMET length at or above the target: 4K, 8K, ..., 128K; RAG and re-ranking read HELMET's
per-length files ``..._k{k}_...jsonl``); two demonstrations where HELMET uses them; the prompt is
HELMET's template in the model's chat template (with the suite's system prompt, as the paper
evaluates every task with chat templates); long documents are first cut to ``length - reserve``
tokens; and the whole prompt is truncated at the end of its context so that it leaves HELMET's
generation budget free (``length - gen_tokens`` tokens at most). A cell of nominal length ``L``
is fitted to ``eval.fit_lengths[L]`` when the suite maps it (the 128K cells at 125K).

Scoring reads the answer region (after ``</think>``) and, as HELMET takes the best of the raw
and the parsed output, each metric is the best over the readings: the region, the line after
HELMET's prefix (``Answer:``, ``label:``, ``Ranking:``) and the text after the last ``Answer:``.
Judged metrics use ``settings.judge`` (``eval.judge``) or, without one, a labelled fallback
(``recallm.eval.judge``). The summary's ``extra`` holds the categories per length and their
averages (Table 2 averages lengths 8K-128K; the report does that).

``helmet_json_kv`` is the Recall category's ``json_kv`` alone (the suites before this one).
"""

from __future__ import annotations

import json
import logging
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from data_gen.fit import PromptRenderer
from data_gen.text import uuid_str
from recallm.errors import RecallmError
from recallm.eval.benchmarks.base import Benchmark, BenchmarkOptions
from recallm.eval.benchmarks.helmet.tasks import (
    CATEGORIES,
    HELMET_SEED,
    REPORTED,
    TASKS,
    HelmetTask,
    Sample,
    Source,
    alce_source,
    icl_source,
    infbench_source,
    json_kv_source,
    kilt_source,
    msmarco_source,
    multi_lexsum_source,
    narrativeqa_source,
    ruler_file_source,
    size_at,
)
from recallm.eval.types import Example, Generation, Score, Spec

__all__ = ["Helmet", "HelmetJsonKV"]

log = logging.getLogger(__name__)

OMITTED = " ... [the rest of the text is omitted]"
_TASK_KEYS = {"path", "demo_path", "keypoints_path", "per_cell", "shots"}
_OPEN_SOURCES = 48  # loaded task files kept (items the run asks only; the rest of each file is dropped)


class _Pool:
    """The items one task asks from one file, in the source's seeded order: items failing
    ``accept`` are skipped (NarrativeQA's documents shorter than 128K tokens); once ``needed``
    are found the rest of the file is let go."""

    def __init__(self, source: Source, needed: int) -> None:
        self.source, self.needed = source, needed
        self.rest = iter(source.items)
        self.kept: list[Any] = []

    def get(self, index: int, accept=None) -> Any:
        while len(self.kept) <= index:
            item = next(self.rest, None)
            if item is None:
                return None
            if accept is None or accept(item):
                self.kept.append(item)
            if len(self.kept) >= self.needed:
                self.rest = iter(())
                self.source.items = []
        return self.kept[index]


@dataclass(frozen=True)
class HelmetOptions(BenchmarkOptions):
    """The schema of ``eval.benchmarks.helmet`` (``Helmet``'s options)."""

    tasks: Any = field(default_factory=lambda: list(TASKS))
    """a task name or a list of them"""
    task_params: dict[str, Any] = field(default_factory=dict)
    """per task: ``path``, ``demo_path``, ``keypoints_path``, ``per_cell``, ``shots`` and the task's own options"""
    helmet_dir: str | None = None
    dataset_root: str | None = None
    haystack_path: str | None = None
    recall_data: str = "files"
    """``files``: the Recall category from HELMET's own files (``helmet_dir``: data/json_kv, data/ruler), prompted and
    cut at the end of the context as HELMET does; ``generated``: generated offline (json_kv with HELMET's counts, the
    needle tasks with our RULER generator; a deviation, shown in the report)"""
    judge_prompts: str = "helmet"
    """``helmet``: HELMET's judge prompts, read from ``helmet_dir`` (needed when a judge scores LongQA or
    Summ); ``ours``: our short rubrics (a deviation, shown in the report)"""


class Helmet(Benchmark):
    """See module doc. Options: ``tasks`` (default: all 21), ``task_params`` (per task: ``path``,
    ``demo_path``, ``keypoints_path``, ``per_cell``, ``shots`` and the task's own options),
    ``helmet_dir`` (a HELMET checkout with its data downloaded), ``dataset_root`` (local copies of
    the raw data sets), ``haystack_path`` (RULER's essays, for ``ruler_niah_mv``).
    ``per_cell`` null: HELMET's own counts (100; 500 for ICL)."""

    name = "helmet"
    min_length = 256
    Options = HelmetOptions

    def __init__(self, cfg, settings) -> None:
        super().__init__(cfg, settings)
        tasks = self.cfg["tasks"]
        self.task_names = [tasks] if isinstance(tasks, str) else list(tasks or [])
        unknown = [t for t in self.task_names if t not in TASKS]
        if unknown or not self.task_names:
            raise RecallmError(f"{self.name}: unknown tasks {unknown}; known: {', '.join(TASKS)}")
        if len(set(self.task_names)) != len(self.task_names):
            raise RecallmError(f"{self.name}: tasks repeat: {self.task_names}")
        params = dict(self.cfg["task_params"] or {})
        bad = [t for t in params if t not in TASKS]
        if bad:
            raise RecallmError(f"{self.name}.task_params: unknown tasks {bad}; known: {', '.join(TASKS)}")
        self.tasks: dict[str, HelmetTask] = {t: TASKS[t] for t in self.task_names}
        self.params: dict[str, dict[str, Any]] = {}
        for name, task in self.tasks.items():
            extra = dict(params.get(name) or {})
            allowed = _TASK_KEYS | set(task.options)
            unknown_keys = sorted(set(extra) - allowed)
            if unknown_keys:
                raise RecallmError(
                    f"{self.name}.task_params.{name}: unknown keys {unknown_keys}; known: {sorted(allowed)}"
                )
            for key in ("per_cell", "shots"):
                value = extra.get(key)
                if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 0):
                    raise RecallmError(
                        f"{self.name}.task_params.{name}.{key} must be a non-negative integer, got {value!r}"
                    )
            self.params[name] = {**task.options, **extra}
        if self.cfg["recall_data"] not in ("files", "generated"):
            raise RecallmError(f"{self.name}.recall_data must be files or generated, got {self.cfg['recall_data']!r}")
        generated = self.cfg["recall_data"] == "generated"
        ruler_tasks = [t.options["ruler_task"] for t in self.tasks.values() if t.family == "ruler" and generated]
        self._ruler = None
        if ruler_tasks:
            from recallm.eval.benchmarks.ruler import Ruler

            self._ruler = Ruler(
                {
                    "lengths": self.lengths,
                    "per_cell": 1,
                    "tasks": ruler_tasks,
                    "haystack_path": self.cfg["haystack_path"],
                },
                settings,
            )
        self._pools: OrderedDict[tuple[str, str], _Pool] = OrderedDict()
        self._doc_tokens: dict[str, int] = {}
        if self.cfg["judge_prompts"] not in ("helmet", "ours"):
            raise RecallmError(f"{self.name}.judge_prompts must be helmet or ours, got {self.cfg['judge_prompts']!r}")
        self._prompts = None

    @property
    def judge_prompts(self):
        """The judge's prompts (HELMET's, read from ``helmet_dir``, or ours)."""
        if self._prompts is None:
            from recallm.eval.judge import JudgePrompts, load_helmet_prompts

            if self.cfg["judge_prompts"] == "ours":
                self._prompts = JudgePrompts.ours()
            elif self.cfg["helmet_dir"] is None:
                raise RecallmError(
                    f"{self.name}: the LongQA and Summ judge uses HELMET's prompts, read from its checkout: set "
                    f"eval.benchmarks.{self.name}.helmet_dir (or judge_prompts=ours)"
                )
            else:
                self._prompts = load_helmet_prompts(self.cfg["helmet_dir"])
        return self._prompts

    def protocol(self) -> dict[str, Any]:
        """How this run differs from HELMET's protocol, as named options (the report's header)."""
        judge, nli = self.settings.judge, self.settings.nli
        judged = [t for t in self.tasks.values() if t.judged and t.family != "alce"]
        cite = [t for t in self.tasks.values() if t.family == "alce"]
        out: dict[str, Any] = {}
        if judged:
            out["judge"] = judge.model if judge is not None else "none (ROUGE fallbacks)"
            if judge is not None:
                out["judge_prompts"] = self.cfg["judge_prompts"]
        if cite:
            out["citation_nli"] = nli.name if nli is not None else "none (substring / ROUGE-L fallback)"
        recall = any(t.family in ("ruler", "json_kv") for t in self.tasks.values())
        if recall and self.cfg["recall_data"] == "generated":
            out["recall_data"] = "generated offline (not HELMET's files; over-long prompts lose pairs, not context)"
        return out

    # --- planning ------------------------------------------------------------------------------

    def from_files(self, task: HelmetTask) -> bool:
        return task.data_backed or self.cfg["recall_data"] == "files"

    def target(self, length: int) -> int:
        """HELMET's cell of ``length`` tokens (``input_max_length``): the prompt leaves the task's
        generation budget free (the suite's ``fit_lengths`` does not apply)."""
        return length

    def per_cell_of(self, name: str) -> int:
        value = self.params[name].get("per_cell")
        if value is not None:
            return int(value)
        return int(self.per_cell) if self.per_cell is not None else self.tasks[name].per_cell

    def shots_of(self, name: str) -> int:
        value = self.params[name].get("shots")
        return int(value) if value is not None else self.tasks[name].shots

    def path_of(self, name: str, which: str, target: int | None = None) -> str | None:
        """The local path of ``which`` (``path`` / ``demo_path`` / ``keypoints_path``) of a task."""
        task = self.tasks[name]
        path = self.params[name].get(which)
        if path is None:
            default = task.files.get(which)
            if default is None:
                return None
            root_key = "helmet_dir" if "{helmet_dir}" in default else "dataset_root"
            root = self.cfg[root_key]
            if root is None:
                raise RecallmError(
                    f"{self.name} {name}: set eval.benchmarks.{self.name}.{root_key} (or task_params.{name}.{which}); "
                    f"it needs {task.hint}"
                )
            path = default.replace("{helmet_dir}", str(root)).replace("{dataset_root}", str(root))
        path = str(path)
        if "{length}" in path:
            if target is None:
                return path
            path = path.replace("{length}", str(target))
        if "{k}" in path:
            if target is None:
                return path
            path = path.replace("{k}", str(size_at(task.sizes, target)))
        return path

    def specs(self) -> list[Spec]:
        from data_gen.datasets.io import check_path

        if self.name == "helmet_json_kv" and self.per_cell is None:
            raise RecallmError(f"benchmark {self.name}: per_cell is required")
        if self._ruler is not None:
            self._ruler.specs()  # (checks the essays' path)
        specs = []
        for name, task in self.tasks.items():
            if self.from_files(task):  # every file the plan reads exists (its content is checked when read)
                for which in ("path", "demo_path"):
                    for length in self.lengths:
                        path = self.path_of(name, which, self.target(length))
                        if path is not None and (which == "path" or self.shots_of(name)):
                            check_path(path, f"{self.name} {name} ({which})", task.hint)
                if task.judged and task.family != "alce" and self.settings.judge is not None:
                    self.judge_prompts  # noqa: B018  (HELMET's prompts are read before anything runs)
                if task.judged and self.settings.judge is not None:
                    keypoints = self.path_of(name, "keypoints_path")
                    if keypoints is not None:
                        check_path(keypoints, f"{self.name} {name} (judge key points)", task.hint)
            n = self.per_cell_of(name)
            specs += [Spec(length, self.name, i, name) for length in self.lengths for i in range(n)]
        return specs

    def describe(self) -> dict[str, Any]:
        out = super().describe()
        if any(t.judged for t in self.tasks.values()):
            out["judge"] = self.settings.judge.describe() if self.settings.judge is not None else "fallback"
            if self.settings.nli is not None and any(t.family == "alce" for t in self.tasks.values()):
                out["nli"] = self.settings.nli.describe()
        out["scoring"] = "helmet-2"  # upstream's readings, aggregation and judge inputs (earlier runs differ)
        return out

    # --- building ------------------------------------------------------------------------------

    def _pool(self, name: str, target: int) -> _Pool:
        task = self.tasks[name]
        path = self.path_of(name, "path", target)
        key = (name, str(path))
        if key not in self._pools:
            seed = int(self.rng("items", name).getrandbits(31))
            shots = self.shots_of(name)
            family = task.family
            if family == "kilt":
                source = kilt_source(task, path, self.path_of(name, "demo_path"), seed, shots)
            elif family == "msmarco":
                source = msmarco_source(task, path, self.path_of(name, "demo_path"), seed, shots)
            elif family == "alce":
                source = alce_source(task, path, self.path_of(name, "demo_path"), seed, shots)
            elif family == "narrativeqa":
                source = narrativeqa_source(task, path, seed, shots)
            elif family == "infbench":
                keypoints = self.path_of(name, "keypoints_path") if self.settings.judge is not None else None
                source = infbench_source(task, path, keypoints, seed, shots)
            elif family == "multi_lexsum":
                keypoints = self.path_of(name, "keypoints_path") if self.settings.judge is not None else None
                source = multi_lexsum_source(task, path, keypoints, seed, shots)
            elif family == "json_kv":
                source = json_kv_source(task, path, HELMET_SEED, shots, self.per_cell_of(name))
            elif family == "ruler":
                source = ruler_file_source(task, path, HELMET_SEED, self.per_cell_of(name))
            elif family == "icl":
                source = icl_source(task, path, HELMET_SEED, self.per_cell_of(name))
            else:  # pragma: no cover - the table has no other family
                raise RecallmError(f"{self.name} {name}: unknown family {family}")
            self._pools[key] = _Pool(source, self.per_cell_of(name))
            while len(self._pools) > _OPEN_SOURCES:
                self._pools.popitem(last=False)
        self._pools.move_to_end(key)
        return self._pools[key]

    def build(self, spec: Spec, renderer: PromptRenderer) -> Example:
        task = self.tasks[spec.task]
        target = self.target(spec.length)
        if task.family == "ruler" and not self.from_files(task):
            ruler_spec = Spec(spec.length, "ruler", spec.index, task.options["ruler_task"])
            ex = self._ruler.build(ruler_spec, renderer, budget=target - task.gen_tokens)
            return Example(spec, ex.messages, ex.prompt_text, ex.prompt_tokens, dict(ex.reference))
        rng = self.rng(spec.task, spec.length, spec.index)
        if task.family == "json_kv" and not self.from_files(task):
            return self._json_kv(spec, task, target, renderer, rng)
        pool = self._pool(spec.task, target)
        accept = None
        minimum = self.params[spec.task].get("min_document_tokens")
        if minimum:
            accept = self._long_enough(spec.task, int(minimum), renderer)
        item = pool.get(spec.index, accept)
        if item is None:
            raise RecallmError(
                f"{self.name} {spec.task}: {self.path_of(spec.task, 'path', target)} has only {len(pool.kept)} usable "
                f"items, fewer than per_cell={self.per_cell_of(spec.task)}"
            )
        size = size_at(task.sizes, target) if task.sizes else 0
        try:
            sample = pool.source.make(item, size, rng)
        except (KeyError, TypeError, IndexError, ValueError, AttributeError) as exc:  # a record of another layout
            raise RecallmError(
                f"{self.name} {spec.task}: an item of {self.path_of(spec.task, 'path', target)} is not in the expected "
                f"layout ({type(exc).__name__}: {exc}); {task.hint}"
            ) from None
        return self._fit(spec, task, sample, renderer, target)

    def _long_enough(self, name: str, minimum: int, renderer: PromptRenderer):
        """``accept`` for long-document tasks: the document has at least ``minimum`` tokens
        (HELMET keeps NarrativeQA stories over 128K tokens and Multi-LexSum cases over 64K)."""

        def text_of(item) -> str:
            if name == "narrativeqa":
                return item["document"]["text"]
            return "\n\n".join(str(s) for s in item["sources"])

        def accept(item) -> bool:
            text = text_of(item)
            if len(text) < minimum:  # a token has at least one character
                return False
            key = str(hash(text))
            if key not in self._doc_tokens:
                self._doc_tokens[key] = len(renderer.token_starts(text))
            return self._doc_tokens[key] >= minimum

        return accept

    def _fit(self, spec: Spec, task: HelmetTask, sample: Sample, renderer: PromptRenderer, target: int) -> Example:
        """HELMET's truncation: the document cut to ``target - reserve`` tokens (long-document
        tasks), then the context cut at its end until the prompt leaves ``gen_tokens`` free."""
        fields = dict(sample.fields)
        if task.reserve:
            keep = max(1, target - task.reserve)
            starts = renderer.token_starts(fields["context"])
            if len(starts) > keep:
                tail = len(renderer.token_starts(OMITTED))
                # HELMET's truncate_llama2 keeps tokens 0..keep-tail (inclusive), then the note
                fields["context"] = fields["context"][: int(starts[max(1, keep - tail + 1)])] + OMITTED
        budget = target - task.gen_tokens
        for _ in range(8):
            content = task.template.format(**fields)
            prompt, _ = renderer.render(content)
            tokens = renderer.length(prompt)
            if tokens <= budget:
                break
            context = fields["context"]
            starts = renderer.token_starts(context)
            excess = tokens - budget
            if not context or excess >= len(starts):
                if not context:
                    raise RecallmError(
                        f"{self.name} {spec.task}: the prompt without its context has {tokens} tokens, more than "
                        f"{budget} ({target} minus the {task.gen_tokens} HELMET keeps for generation)"
                    )
                fields["context"] = ""
                continue
            fields["context"] = context[: int(starts[len(starts) - excess])]
        messages = renderer.messages(content)
        reference = {
            **sample.reference,
            "task": spec.task,
            "truncated_context": fields["context"] != sample.fields["context"],
        }
        return Example(spec, messages, prompt, tokens, reference)

    def _json_kv(self, spec: Spec, task: HelmetTask, target: int, renderer: PromptRenderer, rng) -> Example:
        """HELMET's JSON key-value retrieval, generated: ``k`` UUID pairs (HELMET's count for the
        length, fewer if the model's tokenizer needs), the asked key at one of six depths, two
        other pairs of the object as demonstrations."""
        budget = target - task.gen_tokens
        k = size_at(task.sizes, target, scale=True)
        used: set[str] = set()

        def fresh() -> str:
            value = uuid_str(rng)
            while value in used:
                value = uuid_str(rng)
            used.add(value)
            return value

        pairs = [(fresh(), fresh()) for _ in range(k)]
        depth = (spec.index % 6) / 5
        for _ in range(8):
            gold = min(len(pairs) - 1, round(depth * (len(pairs) - 1)))
            key, value = pairs[gold]
            demo_pairs = [p for i, p in enumerate(pairs) if i != gold][:: max(1, (len(pairs) - 1) // 2)][:2]
            demos = "".join(f"Key: {json.dumps(a)}\nCorresponding value: {json.dumps(b)}\n\n" for a, b in demo_pairs)
            fields = {"context": "JSON data:\n" + json.dumps(dict(pairs)), "demos": demos, "question": json.dumps(key)}
            content = task.template.format(**fields)
            prompt, _ = renderer.render(content)
            tokens = renderer.length(prompt)
            if tokens <= budget or len(pairs) <= 2:
                break
            keep = max(2, int(len(pairs) * budget / tokens) - 1)
            pairs = pairs[:keep]
        if tokens > budget:
            raise RecallmError(f"{self.name} json_kv: {target} tokens are too few for a JSON object of 2 pairs")
        reference = {"answers": [value], "key": key, "value": value, "task": "json_kv", "pairs": len(pairs)}
        return Example(spec, renderer.messages(content), prompt, tokens, reference)

    # --- scoring -------------------------------------------------------------------------------

    def _region(self, text: str) -> str:
        """The output HELMET scores: with thinking (``after_think``), the text after the last
        ``</think>``, stripped, or the whole output when there is none (``eval.py --thinking``)."""
        import re

        if self.settings.answer_region == "full":
            return text
        match = re.search(r"(.*</think>)(.*)", text, flags=re.DOTALL)
        return match.group(2).strip() if match else text

    def score(self, example: Example, generation: Generation, followup: Generation | None) -> Score:
        return self.score_batch([example], [generation], [followup])[0]

    def score_batch(
        self, examples: Sequence[Example], generations: Sequence[Generation], followups: Sequence[Generation | None]
    ) -> list[Score]:
        jobs = [lambda e=e, g=g: self._score_one(e, g) for e, g in zip(examples, generations, strict=True)]
        judge = self.settings.judge
        if judge is None:
            return [job() for job in jobs]
        return judge.map(lambda job: job(), jobs)

    def _score_one(self, example: Example, generation: Generation) -> Score:
        """One output scored as HELMET's ``post_process`` of its task does (``data.py``)."""
        from recallm.eval import scoring as m

        name = example.spec.task
        task = self.tasks[name]
        ref = example.reference
        if task.family == "ruler":
            return self._ruler_recall(example, generation)
        region = self._region(generation.text)
        parsed = m.helmet_parse_output(region, task.prefix)
        answer = parsed or region.strip() or None
        judge = self.settings.judge
        metrics: dict[str, float | None] = {}
        if task.family in ("json_kv", "kilt"):  # calculate_metrics of the output and of its parse, the max
            values = m.helmet_metrics([region, parsed], ref["answers"], rouge=False)
            metrics = {k: values[k] for k in ("substring_exact_match", "exact_match", "f1")}
            score = values["substring_exact_match"]
        elif task.family == "icl":  # only the parse after "label:"
            values = m.helmet_metrics([parsed], ref["answers"], rouge=False)
            metrics = {"exact_match": values["exact_match"]}
            score = values["exact_match"]
        elif task.family == "msmarco":  # the rankings parsed from the output
            ranking = m.parse_rankings(region)
            score = m.trec_ndcg(ranking, ref["qrels"], 10)
            metrics = {"NDCG@10": score, "NDCG@5": m.trec_ndcg(ranking, ref["qrels"], 5)}
            answer = " > ".join(ranking)[:200] or None
        elif task.family == "alce":
            score, metrics, answer = self._cite(task, region, ref)
        elif task.family == "infbench" and task.options["kind"] == "choice":
            values = m.helmet_metrics([region, parsed], ref["answers"], rouge=False)
            score = float(values["exact_match"] or ref["answers"][1].lower() in region.lower())
            metrics = {"exact_match": score}
        elif task.family == "infbench" and task.options["kind"] == "qa":
            score = m.helmet_metrics([region, parsed], ref["answers"])["rougeL_f1"]
            metrics = {"rougeL_f1": score}
        elif task.family == "narrativeqa":
            judged = (
                judge.longqa(ref["question"], ref["answers"], m.judge_answer(region), self.judge_prompts)
                if judge
                else None
            )
            fallback = m.helmet_metrics([region, parsed], ref["answers"])["rougeL_f1"]
            score = judged if judged is not None else fallback
            # an unreadable verdict leaves judge_score out: dropped from the mean, as HELMET drops it
            metrics = {"judge_score": judged, "rougeL_f1": fallback, "judged": float(judged is not None)}
        else:  # summaries: the judge reads the whole output
            summary = region.strip()
            judged = None
            if judge is not None and ref.get("keypoints"):
                book = task.family == "infbench"
                judged = judge.summary(summary, ref["keypoints"], ref["expert"], book=book, prompts=self.judge_prompts)
            fallback = m.helmet_metrics([region, parsed], ref["answers"])["rougeLsum_f1"]
            score = judged["f1"] if judged is not None else fallback
            metrics = {"rougeLsum_f1": fallback, "judged": float(judged is not None)}
            if judged is not None:
                metrics.update({f"judge_{k}": v for k, v in judged.items()})
            answer = summary[:200] or None
        clean = {k: float(v) for k, v in metrics.items() if v is not None}
        return Score(score=float(score), correct=float(score) >= 1.0, answer=answer, metrics=clean)

    def _ruler_recall(self, example: Example, generation: Generation) -> Score:
        """HELMET's Recall needle tasks: ``ruler_recall``, the share of answers that are
        case-insensitive substrings of the output (``data.py`` ``load_ruler``; no parsing)."""
        from recallm.eval.scoring import string_match_all

        region = self._region(generation.text)
        value = string_match_all(region, example.reference["answers"])
        return Score(score=value, correct=value == 1.0, answer=region[:200] or None, metrics={"ruler_recall": value})

    def _cite(self, task: HelmetTask, region: str, ref: Mapping[str, Any]) -> tuple[float, dict[str, float], str]:
        """ALCE (``eval_alce.py``): newlines become spaces; correctness (ASQA STR-EM / QAMPARI
        recall@5) on the output without citations, citation recall and precision (NLI) on the
        output with them. An output without a claim has no citation metrics (upstream skips it);
        ``score`` is the mean of the three metrics it has."""
        import re

        from recallm.eval import scoring as m
        from recallm.eval.judge import fallback_entails

        output = re.sub(r"\n+", " ", region).replace("<|im_end|>", "")
        qampari = task.name == "alce_qampari"
        nli = self.settings.nli
        fell_back = []

        def entails(pairs: Sequence[tuple[str, str]]) -> list[bool]:
            verdicts = nli.entails_batch(pairs) if nli is not None else [None] * len(pairs)
            out = []
            for (premise, hypothesis), verdict in zip(pairs, verdicts, strict=True):
                if verdict is None:
                    fell_back.append(1)
                    if qampari:  # the claim is "question item": the item is what a passage must hold
                        hypothesis = hypothesis[len(ref["question"]) :].strip() or hypothesis
                    verdict = fallback_entails(premise, hypothesis)
                out.append(bool(verdict))
            return out

        cited = m.citation_scores(output, ref["docs"], entails, question=ref["question"], qampari=qampari)
        if qampari:
            correct = m.qampari_scores(output, ref["answers"])["qampari_rec_top5"]
            metrics = {"qampari_rec_top5": correct}
        else:
            correct, hit = m.asqa_str_em(output, ref["qa_pairs"])
            metrics = {"str_em": correct, "str_hit": hit}
        if cited is not None:
            metrics.update(cited)
        metrics["judged"] = float(nli is not None and not fell_back)
        parts = [correct] + ([cited["citation_rec"], cited["citation_prec"]] if cited is not None else [])
        return sum(parts) / len(parts), metrics, output[:300]

    # --- the summary ---------------------------------------------------------------------------

    def summarize(self, records: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
        """Per task and length, HELMET's number (``collect_results.py``): the mean of the task's
        reported metrics (``REPORTED``), each averaged over the examples that have it; categories
        average their tasks; per cell the example count (``n``) and the examples a metric was left
        out of (``dropped``: unreadable verdicts, claim-less ALCE outputs)."""
        cells: dict[str, dict[int, list[Mapping[str, Any]]]] = {}
        judged: dict[str, list[float]] = {}
        for r in records:
            cells.setdefault(r["task"], {}).setdefault(int(r["length"]), []).append(r)
            if self.tasks.get(r["task"]) is not None and self.tasks[r["task"]].judged:
                judged.setdefault(r["task"], []).append(float((r.get("metrics") or {}).get("judged", 0.0)))
        tasks: dict[str, dict[str, float | None]] = {}
        counts: dict[str, dict[str, dict[str, int]]] = {}
        fallback_used: set[str] = set()
        for t, by_length in cells.items():
            main, fallback = REPORTED.get(t, (("score",), ()))
            tasks[t], counts[t] = {}, {}
            for n, recs in sorted(by_length.items()):
                names = main
                if fallback and not any(all(k in (r.get("metrics") or {}) for k in main) for r in recs):
                    names = fallback  # no judged value at all: the fallback metric, labelled
                    fallback_used.add(t)
                values, dropped = [], 0
                for k in names:
                    have = [float((r.get("metrics") or {})[k]) for r in recs if k in (r.get("metrics") or {})]
                    if k == "score":
                        have = [float(r["score"]) for r in recs]
                    dropped = max(dropped, len(recs) - len(have))
                    if have:
                        values.append(sum(have) / len(have))
                tasks[t][str(n)] = sum(values) / len(values) if len(values) == len(names) else None
                counts[t][str(n)] = {"n": len(recs), "dropped": dropped}
        categories: dict[str, Any] = {}
        for category in CATEGORIES:
            names = [t for t in tasks if TASKS.get(t) is not None and TASKS[t].category == category]
            if not names:
                continue
            lengths = sorted({int(n) for t in names for n in tasks[t]})
            by_length = {}
            for n in lengths:
                values = [tasks[t].get(str(n)) for t in names]
                by_length[str(n)] = (
                    sum(values) / len(values)
                    if all(v is not None for v in values) and len(values) == len(names)
                    else None
                )
            present = [v for v in by_length.values() if v is not None]
            categories[category] = {
                "tasks": names,
                "by_length": by_length,
                "average": sum(present) / len(present) if present else None,
                "complete": all(str(n) in tasks[t] for t in names for n in lengths),
            }
        judge = self.settings.judge
        out: dict[str, Any] = {
            "tasks": tasks,
            "counts": counts,
            "categories": categories,
            "judge": judge.model if judge is not None else None,
            "judged_share": {t: sum(v) / len(v) for t, v in judged.items()},
            "fallback_metric": sorted(fallback_used),
            "protocol": self.protocol(),
        }
        if self._ruler is not None:
            out.update({k: v for k, v in self._ruler.summarize(records).items() if k != "protocol"})
        return out


class HelmetJsonKV(Helmet):
    """HELMET's JSON key-value retrieval alone (``json_kv`` of the Recall category); no options."""

    name = "helmet_json_kv"
    Options = BenchmarkOptions

    def __init__(self, cfg, settings) -> None:
        Benchmark.__init__(self, cfg, settings)
        self.cfg = {**Helmet.own_options(), "tasks": ["json_kv"], "recall_data": "generated"}
        self.task_names = ["json_kv"]
        self.tasks = {"json_kv": TASKS["json_kv"]}
        self.params = {"json_kv": {}}
        self._ruler = None
        self._pools = OrderedDict()
        self._doc_tokens = {}
        self._prompts = None

    def describe(self) -> dict[str, Any]:
        out = {k: v for k, v in Benchmark.describe(self).items() if k in ("lengths", "per_cell", "fit_lengths")}
        return {**out, "prompt": "helmet", "scoring": "helmet-2"}  # (earlier runs: our template; best of four readings)
