"""``recallm-rlm export``: successful RLM trajectories as SFT data for ``recallm-sft``.

The paper's recipe (App. A) trains the root on its own good turns. Filtering, per trajectory
then per turn:

* trajectories without a ``score`` event (not scored) are skipped; those with score <= 0 are
  dropped (score-0 runs);
* trajectories whose root took fewer than ``min_turns`` turns are dropped (single-turn runs);
* a turn whose sample (the messages the root read + its reply) is longer than
  ``max_turn_chars`` characters is dropped (over-long turns).

Each kept root turn becomes one record in the format ``recallm.sft.data.load_sft_file`` reads
(that of ``data_gen``'s ``SFTExample``): ``messages`` (the conversation up to the turn, as the
root read it), ``prompt_text`` (rendered with the tokenizer's chat template and its generation
prompt), ``prompt_ids`` (``tokenizer(prompt_text, add_special_tokens=False)``), ``completion``
(the raw reply; when the template's generation prompt opens a think block, the reply's own
``<think>`` is dropped - the prompt holds it - and a reply without reasoning gets ``</think>``
first, so the answer lies outside the block) and ``completion_ids`` (its
tokens + the end-of-sequence token), ``answer``, ``category`` (``rlm``), ``data_source``
(``rlm/<task>``), ``ground_truth`` (the reference, as JSON), ``source`` (``rlm_trajectory``),
plus ``trajectory``, ``turn`` and ``score``.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from recallm.errors import RecallmError
from recallm.rlm.trajectory import load_trajectory, root_conversation, trajectory_files
from recallm.tokens import THINK_END, THINK_START

__all__ = ["export_sft", "select_turns"]


def select_turns(
    events: list[dict[str, Any]], *, min_turns: int = 2, max_turn_chars: int = 100_000
) -> tuple[list[tuple[list[dict[str, str]], str, int]], str | None]:
    """(the kept root turns: messages, reply, turn number; why the trajectory was dropped or None)."""
    score = next((e for e in events if e.get("event") == "score"), None)
    if score is None:
        return [], "unscored"
    if float(score.get("score") or 0.0) <= 0.0:
        return [], "score_zero"
    turns = root_conversation(events, "0")
    if len(turns) < min_turns:
        return [], "too_few_turns"
    kept = []
    for number, (messages, reply) in enumerate(turns, 1):
        size = sum(len(m.get("content", "")) for m in messages) + len(reply)
        if size <= max_turn_chars:
            kept.append((messages, reply, number))
    return kept, None


def export_sft(
    paths: Iterable[str | Path],
    tokenizer,
    out_file: str | Path,
    *,
    min_turns: int = 2,
    max_turn_chars: int = 100_000,
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
    out_file.parent.mkdir(parents=True, exist_ok=True)
    with out_file.open("w", encoding="utf-8") as f:
        for path in files:
            events = load_trajectory(path)
            kept, dropped = select_turns(events, min_turns=min_turns, max_turn_chars=max_turn_chars)
            if dropped is not None:
                counts[f"dropped_{dropped}"] = counts.get(f"dropped_{dropped}", 0) + 1
                continue
            counts["kept"] += 1
            counts["turns_too_long"] += len(root_conversation(events, "0")) - len(kept)
            score = next(e for e in events if e.get("event") == "score")
            end = next((e for e in events if e.get("event") == "end" and e.get("rlm") == "0"), {})
            task = str(score.get("task") or "task")
            for messages, reply, number in kept:
                f.write(json.dumps(_record(tokenizer, messages, reply, number, path, score, end, task)) + "\n")
                counts["records"] += 1
    return counts


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
