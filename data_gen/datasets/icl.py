"""Many-shot in-context learning: intent classification on BANKING77 and MASSIVE (category ``icl``).

The context is a long list of labelled demonstrations (``text -> label``); the question gives a
held-out text and asks for its label. A handful (``gold_demos``, default 4-12) of demonstrations
with the query's label are placed at random positions and are the gold evidence; every
streamed demonstration has another label, so the gold ones are all the query's label in the
prompt. Varied per example: label format (``number``: each intent gets a random number, fixed
for the example; ``text``: the intent's name in words, ``card_arrival`` -> ``card arrival``),
demonstration layout (``text -> label`` or ``Input:``/``Label:`` lines), question position.

Source formats (any container of ``data_gen.datasets.io``):

* BANKING77: the release CSV (``text,category``) or the Hugging Face layout (``text``,
  ``label`` — a ``ClassLabel``, decoded from a saved dataset or a parquet's metadata);
* MASSIVE: the release JSONL per locale (``utt``, ``intent``, ``locale``) or the Hugging Face
  layout (``utt``, ``intent`` as a ``ClassLabel``); records of other locales than ``locale``
  are dropped.
"""

from __future__ import annotations

import random
from collections import defaultdict

from data_gen.base import QUESTION_POSITIONS, Draft, Piece, Task, check_choice, int_range, register
from data_gen.datasets.common import first
from data_gen.datasets.io import check_path, load_records
from data_gen.datasets.negatives import random_order
from recallm.errors import RecallmError

__all__ = ["Banking77", "Massive", "LABEL_FORMATS", "DEMO_FORMATS"]

LABEL_FORMATS = ("number", "text")
DEMO_FORMATS = ("arrow", "fields")

_LOADED: dict[tuple, tuple[list[tuple[str, str]], dict[str, list[int]], list[str]]] = {}


def _demo(fmt: str, text: str, label: str) -> str:
    return f"{text} -> {label}" if fmt == "arrow" else f"Input: {text}\nLabel: {label}"


def label_text(label: str) -> str:
    return " ".join(label.replace("_", " ").replace("-", " ").split())


class _ICL(Task):
    category = "icl"
    min_tokens = 1024  # room for the gold pieces (up to a dozen) and some distractors
    dataset_label = ""
    hint = ""
    text_keys: tuple[str, ...] = ("text",)
    label_keys: tuple[str, ...] = ("label",)

    def __init__(
        self,
        path: str | None = None,
        split: str = "train",
        label_formats=LABEL_FORMATS,
        demo_formats=DEMO_FORMATS,
        gold_demos=(4, 12),
        question_positions=QUESTION_POSITIONS,
        data_source: str | None = None,
    ) -> None:
        super().__init__(data_source)
        self.path = str(check_path(path, self.dataset_label, self.hint))
        self.split = str(split)
        self.label_formats = check_choice("label_formats", label_formats, LABEL_FORMATS)
        self.demo_formats = check_choice("demo_formats", demo_formats, DEMO_FORMATS)
        self.gold_demos = int_range("gold_demos", gold_demos)
        if self.gold_demos[0] < 1:
            raise RecallmError(f"gold_demos must be at least 1, got {gold_demos}")
        self.question_positions = check_choice("question_positions", question_positions, QUESTION_POSITIONS)

    def keep(self, record: dict) -> bool:
        return True

    def data(self) -> tuple[list[tuple[str, str]], dict[str, list[int]], list[str]]:
        """(examples (text, label), indices per label, labels that can be queried)."""
        key = (self.name, self.path, self.split, getattr(self, "locale", None))
        if key not in _LOADED:
            records = load_records(self.path, dataset=self.dataset_label, hint=self.hint, split=self.split, cache=False)
            examples, by_label = [], defaultdict(list)
            for record in records:
                if not self.keep(record):
                    continue
                text, label = first(record, *self.text_keys), first(record, *self.label_keys)
                if text is None or label is None or not str(text).strip() or not str(label).strip():
                    continue
                by_label[str(label).strip()].append(len(examples))
                examples.append((" ".join(str(text).split()), str(label).strip()))
            if isinstance(next(iter(by_label), None), str) and any(lab.isdigit() for lab in by_label):
                raise RecallmError(
                    f"{self.dataset_label}: labels in {self.path} are bare numbers without names; give the data set "
                    f"with its label names (a saved dataset or parquet with a ClassLabel feature, or the release files)"
                )
            queryable = sorted(lab for lab, idx in by_label.items() if len(idx) >= 2)
            if len(by_label) < 2 or not queryable:
                raise RecallmError(
                    f"{self.dataset_label}: {self.path} needs at least two labels, one with two or more examples; "
                    f"{self.hint}"
                )
            _LOADED[key] = (examples, dict(by_label), queryable)
        return _LOADED[key]

    def draft(self, rng: random.Random) -> Draft:
        examples, by_label, queryable = self.data()
        label = rng.choice(queryable)
        same = by_label[label]
        query_i = rng.choice(same)
        query_text = examples[query_i][0]
        candidates = [i for i in same if i != query_i and examples[i][0] != query_text]
        if not candidates:
            candidates = [i for i in same if i != query_i]
        k = min(rng.randint(*self.gold_demos), len(candidates))
        gold_idx = rng.sample(candidates, k)
        label_fmt = rng.choice(self.label_formats)
        demo_fmt = rng.choice(self.demo_formats)
        labels = sorted(by_label)
        if label_fmt == "number":
            numbers = rng.sample(range(len(labels)), len(labels))
            shown = {lab: str(n) for lab, n in zip(labels, numbers, strict=True)}
        else:
            shown = {lab: label_text(lab) for lab in labels}
        placed = [Piece(_demo(demo_fmt, examples[i][0], shown[label]), gold=True) for i in gold_idx]
        order_rng = random.Random(rng.random())

        def distractors():
            for i in random_order(len(examples), order_rng):
                text, lab = examples[i]
                if lab != label:
                    yield Piece(_demo(demo_fmt, text, shown[lab]))

        instruction, which = self.pick_instruction(rng, kind="numbers" if label_fmt == "number" else "names")
        question = (
            f"Question: what is the label of this input?\n{query_text} ->"
            if demo_fmt == "arrow"
            else f"Question: what is the label of this input?\nInput: {query_text}\nLabel:"
        )
        return Draft(
            instruction=instruction,
            question=question,
            placed=placed,
            distractors=distractors(),
            answers=[shown[label]],
            augmentations={"label_format": label_fmt, "demo_format": demo_fmt, "n_gold": k, "instruction": which},
            separator="\n" if demo_fmt == "arrow" else "\n\n",
            question_position=self.pick_question_position(rng, self.question_positions),
            trace_info={"label": shown[label], "intent": label},
        )


_INSTRUCTIONS = (
    "Below are example messages, each with its intent label ({kind}). Classify the message in the question the same way.",
    "Each example below pairs a text with an intent label; the labels are {kind}. Give the label of the new text.",
    "Learn the labelling from the examples that follow (labels are {kind}), then label the input in the question.",
    "The following labelled examples define a set of intents ({kind}). Answer with the label that fits the query.",
    "Study these input-label pairs, whose labels are {kind}, and reply with the correct label for the final input only.",
)


@register
class Banking77(_ICL):
    name = "banking77"
    dataset_label = "BANKING77"
    hint = (
        "download train.csv of BANKING77 from https://github.com/PolyAI-LDN/task-specific-datasets (or save "
        "PolyAI/banking77 with datasets' save_to_disk) and pass path=<file or directory>"
    )
    instructions = _INSTRUCTIONS
    text_keys = ("text", "utterance")
    label_keys = ("category", "label", "intent")


@register
class Massive(_ICL):
    name = "massive"
    dataset_label = "MASSIVE"
    hint = (
        "download the MASSIVE release (amazon-massive-dataset-1.1, data/en-US.jsonl) from "
        "https://github.com/alexa/massive (or save AmazonScience/massive with datasets' save_to_disk) and pass "
        "path=<file or directory>"
    )
    instructions = _INSTRUCTIONS
    text_keys = ("utt", "text")
    label_keys = ("intent", "label")

    def __init__(self, locale: str | None = "en-US", **kwargs) -> None:
        super().__init__(**kwargs)
        self.locale = locale

    def keep(self, record: dict) -> bool:
        if self.locale and record.get("locale") not in (None, self.locale):
            return False
        partition = record.get("partition")  # the release JSONL holds every split
        return partition is None or partition == self.split or self.split not in ("train", "dev", "test")
