"""``recallm-rlm to-sft``: successful RLM trajectories as SFT data for ``recallm-sft``.

The paper's recipe (App. A) trains the root on its own good turns. Filtering, per trajectory
then per turn:

* trajectories without a ``score`` event (not scored) are skipped; those whose answer was not
  correct (``correct`` false: a wrong count that still earned OOLONG's partial credit, a pair set
  with F1 < 1) are dropped;
* trajectories whose root took fewer than ``min_turns`` turns are dropped (single-turn runs);
* a turn whose sample (the messages the root read + its reply) is longer than
  ``max_turn_chars`` characters is dropped (over-long turns);
* FINAL template errors are fixed (the paper reports them in 16% (FINAL) and 13% (FINAL_VAR) of
  turns): a FINAL called inside code is taken out of the code block and written after it, as the
  prompt asks (``FINAL(x)`` / ``FINAL_VAR("x")`` of a variable become ``FINAL_VAR(x)``, a literal
  becomes ``FINAL(literal)``, an expression becomes ``FINAL(<the answer it gave>)``); a turn whose
  FINAL was refused (after a failed block, cut off, a missing variable) is not trained on - it
  stays in the history of the turns after it.

Each kept root turn becomes one record in the format ``recallm.sft.data.load_sft_file`` reads
(that of ``data_gen``'s ``SFTExample``): ``messages`` (the conversation up to the turn, as the
root read it), ``prompt_text`` (rendered with the tokenizer's chat template and its generation
prompt), ``prompt_ids`` (``tokenizer(prompt_text, add_special_tokens=False)``), ``completion``
(the raw reply, FINAL fixed; when the template's generation prompt opens a think block, the
reply's own ``<think>`` is dropped - the prompt holds it - and a reply without reasoning gets
``</think>`` first, so the answer lies outside the block) and ``completion_ids`` (its
tokens + the end-of-sequence token), ``answer``, ``category`` (``rlm``), ``data_source``
(``rlm/<task>``), ``ground_truth`` (the reference, as JSON), ``source`` (``rlm_trajectory``),
plus ``trajectory``, ``turn`` and ``score``.
"""

from __future__ import annotations

import ast
import json
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from recallm.errors import RecallmError
from recallm.io import atomic_path, record_files
from recallm.rlm.trajectory import load_trajectory, reading, root_conversation, trajectory_files
from recallm.tokens import THINK_END, THINK_START

__all__ = ["write_sft_data", "select_turns", "fix_final"]


def _written_final(call: ast.Call, answer: str | None) -> str | None:
    """The text form of a FINAL / FINAL_VAR call found in code (None: cannot say)."""
    name = call.func.id  # type: ignore[attr-defined]
    if len(call.args) != 1 or call.keywords:
        return None
    arg = call.args[0]
    if isinstance(arg, ast.Name):
        return f"FINAL_VAR({arg.id})"
    if isinstance(arg, ast.Constant) and isinstance(arg.value, str) and name == "FINAL_VAR":
        return f"FINAL_VAR({arg.value})" if arg.value.isidentifier() else f"FINAL({arg.value})"
    if isinstance(arg, ast.Constant) and name == "FINAL":
        return f"FINAL({arg.value})"
    return f"FINAL({answer})" if answer is not None and name == "FINAL" else None


def fix_final(reply: str, code: str, answer: str | None) -> str | None:
    """``reply`` with the FINAL call of its code block ``code`` moved out of the block and written
    after it (module doc); None when it cannot be fixed (the call is not a statement of its own)."""
    at = reply.rfind(code)
    if at < 0:
        return None
    try:
        tree = ast.parse(code)
    except SyntaxError:
        return None
    finals = [
        node
        for node in tree.body
        if isinstance(node, ast.Expr)
        and isinstance(node.value, ast.Call)
        and isinstance(node.value.func, ast.Name)
        and node.value.func.id in ("FINAL", "FINAL_VAR")
    ]
    if len(finals) != 1:
        return None
    written = _written_final(finals[0].value, answer)  # type: ignore[arg-type]
    if written is None:
        return None
    lines = code.splitlines(keepends=True)
    node = finals[0]
    kept = lines[: node.lineno - 1] + lines[node.end_lineno :]
    new_code = "".join(kept)
    if not new_code.strip():
        new_code = "print('done')\n"
    rest = reply[at + len(code) :]
    fence_end = rest.find("\n")
    if fence_end < 0:  # the closing fence ends the reply
        return reply[:at] + new_code + rest + "\n" + written
    return reply[:at] + new_code + rest[: fence_end + 1] + written + "\n" + rest[fence_end + 1 :]


def select_turns(
    events: list[dict[str, Any]], *, min_turns: int = 2, max_turn_chars: int = 100_000
) -> tuple[list[tuple[list[dict[str, str]], str, int]], str | None, dict[str, int]]:
    """(the kept root turns: messages, reply (FINAL fixed), turn number; why the trajectory was
    dropped or None; counts of turns dropped or fixed)."""
    counts = {"turns_too_long": 0, "turns_final_refused": 0, "final_fixed": 0, "final_unfixable": 0}
    score = next((e for e in events if e.get("event") == "score"), None)
    if score is None:
        return [], "unscored", counts
    if not score.get("correct"):
        return [], "not_correct", counts
    turns = root_conversation(events, "0")
    if len(turns) < min_turns:
        return [], "too_few_turns", counts
    turn_events = [e for e in events if e.get("event") == "turn" and e.get("rlm") == "0"]
    end = next((e for e in events if e.get("event") == "end" and e.get("rlm") == "0"), {})
    kept = []
    for number, ((messages, reply), event) in enumerate(zip(turns, turn_events, strict=True), 1):
        size = sum(len(m.get("content", "")) for m in messages) + len(reply)
        if size > max_turn_chars:
            counts["turns_too_long"] += 1
            continue
        if any("was not accepted" in n or "cut off before its closing" in n for n in event.get("notes") or []):
            counts["turns_final_refused"] += 1
            continue
        if event.get("final") == "FINAL called in code":
            cell = next((c for c in reversed(event.get("cells") or []) if c.get("final") is not None), None)
            fixed = fix_final(reply, cell["code"], end.get("answer")) if cell else None
            if fixed is None:
                counts["final_unfixable"] += 1
                continue
            counts["final_fixed"] += 1
            reply = fixed
        kept.append((messages, reply, number))
    return kept, None, counts


@dataclass(frozen=True)
class SFTDataSettings:
    """The schema of ``sft_data`` in ``configs/rlm.yaml`` (``recallm-rlm to-sft``), read with
    ``recallm.config.typed``."""

    trajectories: Any  # a trajectory file or directory, or a list of them
    out_file: str
    tokenizer_path: str | None = None  # None: the root model's tokenizer
    min_turns: int = 2  # trajectories with fewer root turns are dropped
    max_turn_chars: int = 100_000  # longer turns are dropped

    def paths(self) -> list[str]:
        return [self.trajectories] if isinstance(self.trajectories, str) else [str(p) for p in self.trajectories]


def write_sft_data(
    paths: Iterable[str | Path],
    tokenizer,
    out_file: str | Path,
    *,
    min_turns: int = SFTDataSettings.min_turns,
    max_turn_chars: int = SFTDataSettings.max_turn_chars,
) -> dict[str, int]:
    """Write the SFT records of the trajectories in ``paths`` (files or directories) to
    ``out_file``; returns counts: trajectories read, kept, dropped per reason, records written,
    turns dropped as too long."""
    if min_turns < 1 or max_turn_chars < 1:
        raise RecallmError(f"min_turns and max_turn_chars must be >= 1, got {min_turns}, {max_turn_chars}")
    if tokenizer.eos_token_id is None:
        raise RecallmError("the tokenizer has no end-of-sequence token; SFT completions need one")
    files = trajectory_files(paths)
    if not files:
        raise RecallmError("no trajectory files (*.jsonl) found in the given paths")
    counts = {"trajectories": len(files), "kept": 0, "records": 0, "turns_too_long": 0}
    out_file = Path(out_file)
    with atomic_path(out_file) as tmp, tmp.open("w", encoding="utf-8") as f:  # whole or not at all
        for path in files:
            events = load_trajectory(path)
            with reading(path):
                _write_one(f, tokenizer, path, events, counts, min_turns, max_turn_chars)
    record_files(out_file.parent, [out_file.name])  # its checksum, verified where SFT reads it
    return counts


def _write_one(f, tokenizer, path, events, counts, min_turns, max_turn_chars) -> None:
    """One trajectory's SFT records into ``f``; its counts into ``counts``."""
    kept, dropped, turn_counts = select_turns(events, min_turns=min_turns, max_turn_chars=max_turn_chars)
    for key, value in turn_counts.items():
        if value or key in counts:
            counts[key] = counts.get(key, 0) + value
    if dropped is not None:
        counts[f"dropped_{dropped}"] = counts.get(f"dropped_{dropped}", 0) + 1
        return
    counts["kept"] += 1
    score = next(e for e in events if e.get("event") == "score")
    end = next((e for e in events if e.get("event") == "end" and e.get("rlm") == "0"), {})
    task = str(score.get("task") or "task")
    for messages, reply, number in kept:
        f.write(json.dumps(_record(tokenizer, messages, reply, number, path, score, end, task)) + "\n")
        counts["records"] += 1


def _record(tokenizer, messages, reply, number, path, score, end, task) -> dict[str, Any]:
    prompt_text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    completion = reply
    if prompt_text.endswith(THINK_START + "\n"):  # the prompt opens the think block; the reply continues it
        if completion.startswith(THINK_START + "\n"):
            completion = completion[len(THINK_START) + 1 :]
        elif THINK_END not in completion:
            completion = f"{THINK_END}\n{completion}"
    prompt_ids = list(tokenizer(prompt_text, add_special_tokens=False)["input_ids"])
    completion_ids = list(tokenizer(completion, add_special_tokens=False)["input_ids"]) + [tokenizer.eos_token_id]
    return {
        "messages": messages,
        "prompt_text": prompt_text,
        "prompt_ids": prompt_ids,
        "completion": completion + tokenizer.eos_token,
        "completion_ids": completion_ids,
        "spans": [],
        "answer": end.get("answer"),
        "category": "rlm",
        "data_source": f"rlm/{task}",
        "ground_truth": json.dumps(score.get("reference") or {}),
        "source": "rlm_trajectory",
        "trajectory": str(path),
        "turn": number,
        "score": score.get("score"),
    }
