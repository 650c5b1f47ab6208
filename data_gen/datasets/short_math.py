"""Short-context math: DAPO-Math (integer answers) and multiple-choice math (category ``short_math``).

No context documents: the prompt is the instruction and the problem, so a row's length is the
problem's own. These are natural-length tasks (``natural_length``; drafts with
``fit_length=False``): the target length is an upper bound, and a problem whose prompt exceeds it
is drawn again (``data_gen.generate.draft_row``). The reward's recall part is ``always``;
``Draft.evidence`` is False.

Source formats (any container of ``data_gen.datasets.io``):

* ``dapo_math``: DAPO-Math-17k's parquet (``prompt`` — chat messages or a string — with the
  problem wrapped in DAPO's fixed instructions, which are removed; ``reward_model.ground_truth``),
  or records with ``problem``/``question`` and ``answer``. Only integer answers are kept,
  duplicates of a problem are dropped.
* ``mcqa_math``: AQuA-RAT (``question``, ``options: ["A)21", ...]``, ``correct: "B"``),
  MathQA (``Problem``, ``options: "a ) 38 , b ) 27 , ..."``, ``correct: "a"``), or generic
  records ``question`` + ``choices`` (list) + ``answer`` (letter, 0-based index or option text).
  Varied per example: choice layout (``A. text`` or ``(A) text``).
"""

from __future__ import annotations

import random
import re

from data_gen.base import Draft, Task, check_choice, register
from data_gen.datasets.common import CHOICE_FORMATS, first, format_choices
from data_gen.datasets.io import check_path, load_records
from recallm.errors import RecallmError

__all__ = ["DapoMath", "MCQAMath"]

_INT = re.compile(r"[-+]?\d+")
_DAPO_HEAD = re.compile(r"^\s*Solve the following math problem.*?\n\s*\n", re.DOTALL)
_DAPO_TAIL = re.compile(r"\n\s*\n\s*Remember to put your answer.*$", re.DOTALL)


def _prompt_text(prompt) -> str:
    if isinstance(prompt, str):
        return prompt
    if isinstance(prompt, (list, tuple)):
        users = [m.get("content", "") for m in prompt if isinstance(m, dict) and m.get("role", "user") == "user"]
        return str(users[-1]) if users else ""
    return ""


def _integer(value) -> str | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return str(value)
    text = str(value if value is not None else "").strip().strip("$").strip()
    text = re.sub(r"^\\boxed\{(.*)\}$", r"\1", text).replace(",", "") if text else text
    if _INT.fullmatch(text):
        return str(int(text))
    if re.fullmatch(r"[-+]?\d+\.0+", text):
        return str(int(float(text)))
    return None


def parse_dapo(records: list[dict]) -> list[tuple[str, str]]:
    out, seen = [], set()
    for record in records:
        problem = first(record, "problem", "question")
        if problem is None:
            problem = _DAPO_TAIL.sub("", _DAPO_HEAD.sub("", _prompt_text(record.get("prompt")), count=1))
        answer = first(record, "answer", "solution")
        if answer is None and isinstance(record.get("reward_model"), dict):
            answer = record["reward_model"].get("ground_truth")
        problem, answer = str(problem or "").strip(), _integer(answer)
        if problem and answer is not None and problem not in seen:
            seen.add(problem)
            out.append((problem, answer))
    return out


_OPTION_PREFIX = re.compile(r"^\s*\(?([A-Za-z])\s*[).:]\s*")
_MATHQA_SPLIT = re.compile(r"(?:^|,)\s*([a-e])\s*\)\s*")


def _options(value) -> list[str]:
    if isinstance(value, str):  # MathQA: "a ) 38 , b ) 27.675 , c ) 30"
        parts = _MATHQA_SPLIT.split(value)
        return [p.strip().rstrip(",").strip() for p in parts[2::2]]
    return [_OPTION_PREFIX.sub("", str(v)).strip() for v in value or []]


def parse_mcqa(records: list[dict]) -> list[tuple[str, list[str], int]]:
    out = []
    for record in records:
        question = str(first(record, "question", "Problem", "problem", default="")).strip()
        choices = _options(first(record, "choices", "options", default=[]))
        answer = first(record, "correct", "answer", "label")
        index = None
        if isinstance(answer, int) and not isinstance(answer, bool):
            index = answer
        elif isinstance(answer, str):
            a = answer.strip().strip("()").strip()
            if len(a) == 1 and a.isalpha():
                index = ord(a.upper()) - ord("A")
            elif a in choices:
                index = choices.index(a)
        if question and len(choices) >= 2 and index is not None and 0 <= index < len(choices) and all(choices):
            out.append((question, choices, index))
    return out


_LOADED: dict[tuple, list] = {}


class _ShortMath(Task):
    category = "short_math"
    natural_length = True  # the target is an upper bound (see module doc)
    min_tokens = 64  # below this no prompt fits: the chat template, the instruction and a problem take more
    max_tokens = 1024  # about the longest prompt (the paper's short-math length): past it every problem fits
    dataset_label = ""
    hint = ""

    def __init__(self, path: str | None = None, split: str = "train", data_source: str | None = None) -> None:
        super().__init__(data_source)
        self.path = str(check_path(path, self.dataset_label, self.hint))
        self.split = str(split)

    def parse(self, records: list[dict]) -> list:
        raise NotImplementedError

    def data(self) -> list:
        key = (self.name, self.path, self.split)
        if key not in _LOADED:
            records = load_records(self.path, dataset=self.dataset_label, hint=self.hint, split=self.split, cache=False)
            items = self.parse(records)
            if not items:
                raise RecallmError(f"{self.dataset_label}: no usable problem in {self.path}; {self.hint}")
            _LOADED[key] = items
        return _LOADED[key]


@register
class DapoMath(_ShortMath):
    name = "dapo_math"
    dataset_label = "DAPO-Math-17k"
    hint = (
        "download the parquet of BytedTsinghua-SIA/DAPO-Math-17k from huggingface.co (or save it with datasets' "
        "save_to_disk) and pass path=<file or directory>"
    )
    instructions = (
        "Solve the following math problem. Its answer is an integer; give that integer as the final answer.",
        "Work out the problem below step by step and answer with a single integer.",
        "Here is a math problem whose answer is a whole number. Solve it and state the number.",
        "Find the integer that answers the problem below. Reason carefully before you answer.",
    )

    def parse(self, records: list[dict]) -> list[tuple[str, str]]:
        return parse_dapo(records)

    def draft(self, rng: random.Random) -> Draft:
        problems = self.data()
        problem, answer = problems[rng.randrange(len(problems))]
        instruction, which = self.pick_instruction(rng)
        return Draft(
            instruction=instruction,
            question=f"Problem: {problem}",
            placed=[],
            distractors=iter(()),
            answers=[answer],
            augmentations={"instruction": which},
            question_position="beginning",  # no context: the problem follows the instruction directly
            evidence=False,
            trace_info={"answer": answer},
            fit_length=False,
        )


@register
class MCQAMath(_ShortMath):
    name = "mcqa_math"
    dataset_label = "multiple-choice math (AQuA-RAT / MathQA)"
    hint = (
        "download AQuA-RAT's train.json from https://github.com/google-deepmind/AQuA (or save allenai/math_qa with "
        "datasets' save_to_disk) and pass path=<file or directory>"
    )
    instructions = (
        "Solve the math problem below and choose the correct option. Answer with the option's letter.",
        "Work through the following multiple-choice math question and reply with the letter of the right answer.",
        "Pick the correct answer to the math problem from the options given. Give only its letter.",
        "Here is a math question with several options. Solve it and state which option (by letter) is correct.",
    )

    def __init__(self, choice_formats=CHOICE_FORMATS, **kwargs) -> None:
        super().__init__(**kwargs)
        self.choice_formats = check_choice("choice_formats", choice_formats, CHOICE_FORMATS)

    def parse(self, records: list[dict]) -> list[tuple[str, list[str], int]]:
        return parse_mcqa(records)

    def draft(self, rng: random.Random) -> Draft:
        items = self.data()
        question, choices, index = items[rng.randrange(len(items))]
        fmt = rng.choice(self.choice_formats)
        letter = chr(ord("A") + index)
        instruction, which = self.pick_instruction(rng)
        return Draft(
            instruction=instruction,
            question=f"Problem: {question}\n{format_choices(fmt, choices)}",
            placed=[],
            distractors=iter(()),
            answers=[letter],
            augmentations={"choice_format": fmt, "instruction": which},
            ground_truth={"choices": list(choices)},
            question_position="beginning",
            evidence=False,
            trace_info={"answer": letter, "choice": choices[index]},
            fit_length=False,
        )
