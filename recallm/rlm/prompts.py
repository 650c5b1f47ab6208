"""What the root model reads and how its replies are read: small pure functions.

* ``system_prompt`` - the root's instructions (our own wording), listing only the functions its
  depth allows; ``context_message`` - the first user message: metadata of the context (type,
  length, approximate tokens, item count) and a short preview, never the context itself;
* ``extract_code`` - the code blocks of a reply (fenced ```` ```repl ```` or ```` ```python ````,
  or unlabelled), in order; ``find_final`` - a ``FINAL(...)`` / ``FINAL_VAR(...)`` written as text
  on its own line outside the code blocks (the last one wins);
* ``observation`` - what the root sees of the cells it ran, each cell's output cut to
  ``max_chars`` characters (with a note saying how much was cut);
* ``visible_text`` - a reply without its reasoning (the text after ``</think>``; nothing when a
  ``<think>`` block never closes) and without
  recall markers: what goes back into the root's history and what a sub-call returns.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from recallm.tokens import END_RECALL, START_RECALL, THINK_END, THINK_START

__all__ = [
    "Final",
    "system_prompt",
    "context_metadata",
    "context_message",
    "extract_code",
    "find_final",
    "observation",
    "truncate",
    "visible_text",
    "NO_CODE_NUDGE",
    "CUT_OFF_NUDGE",
    "LAST_TURN",
]

_FENCE = re.compile(r"```([A-Za-z0-9_+-]*)[ \t]*\n(.*?)```", re.DOTALL)
_CODE_LANGS = {"", "repl", "python", "py", "python3"}
_FINAL = re.compile(r"^[ \t]*(FINAL_VAR|FINAL)\(", re.MULTILINE)

NO_CODE_NUDGE = (
    "Your message had neither a ```repl code block nor a FINAL(...). Continue the work with code, "
    "or end with FINAL(answer) or FINAL_VAR(variable_name)."
)
CUT_OFF_NUDGE = (
    "Your message was cut off at the token limit before any code block or FINAL(...). Think less and act: "
    "write a short ```repl code block, or end with FINAL(answer)."
)
LAST_TURN = (
    "This is your last message: its code still runs, and then the task ends. Finish in it with "
    "FINAL(answer) or FINAL_VAR(variable_name)."
)


@dataclass(frozen=True)
class Final:
    """A final answer found in a reply: ``kind`` is ``FINAL`` (``value`` is the answer) or
    ``FINAL_VAR`` (``value`` is a variable name)."""

    kind: str
    value: str


def visible_text(text: str) -> str:
    """``text`` after its reasoning (after ``</think>``; a think block that never closes hides
    everything after ``<think>``), recall markers removed, stripped."""
    at = text.rfind(THINK_END)
    if at >= 0:
        text = text[at + len(THINK_END) :]
    elif THINK_START in text:
        text = text[: text.find(THINK_START)]
    return text.replace(START_RECALL, "").replace(END_RECALL, "").strip()


def context_metadata(context: Any, preview_chars: int = 400) -> dict[str, Any]:
    """Type, length in characters, approximate tokens, items (for lists and dicts) and a preview."""
    if isinstance(context, str):
        text = context
        meta: dict[str, Any] = {"type": "str"}
    else:
        import json

        text = json.dumps(context, ensure_ascii=False)
        meta = {"type": type(context).__name__}
        if isinstance(context, (list, tuple, dict)):
            meta["items"] = len(context)
    meta["chars"] = len(text)
    meta["approx_tokens"] = len(text) // 4
    meta["preview"] = text[:preview_chars]
    return meta


def system_prompt(
    *,
    llm_query: bool,
    rlm_query: str,
    max_observation_chars: int,
    cell_wall_s: float,
    max_iterations: int,
    sub_context_chars: int,
    answer_var: str = "answer",
) -> str:
    """The root's instructions. ``rlm_query`` is ``recursive`` (a child RLM), ``fallback`` (at the
    depth limit it is a plain model call) or ``off``."""
    functions = []
    if llm_query:
        functions.append(
            f"- `llm_query(prompt)` -> str: ask a language model one question. It reads at most about "
            f"{sub_context_chars:,} characters, so give it a chunk of the input, not all of it.\n"
            "- `llm_query_batched(prompts)` -> list[str]: many prompts at once, run concurrently; far faster "
            "than calling llm_query in a loop. Answers come back in order; a failed one starts with "
            "'[llm_query error'."
        )
    if rlm_query == "recursive":
        functions.append(
            "- `rlm_query(context, query)` -> str: give a piece of input and a question to a new recursive "
            "model with its own REPL (for sub-problems too large or too complex for one llm_query).\n"
            "- `rlm_query_batched(contexts, queries)` -> list[str]: many of those at once, concurrently."
        )
    elif rlm_query == "fallback":
        functions.append(
            "- `rlm_query(context, query)` / `rlm_query_batched(contexts, queries)`: at this depth they ask a "
            "plain model (like llm_query) with the context followed by the query."
        )
    if not functions:
        functions.append("- No model sub-calls are available here: solve the task with code alone.")
        delegate = "then compute the answer with code."
    else:
        delegate = (
            "for judgements code cannot make (meaning, labels, summaries), send chunks to the sub-models, "
            "batched, and combine their answers with code."
        )
    return f"""You answer a task whose input is too large to read in one go. The input is not in this conversation: \
it is stored in a Python REPL as the variable `context`. You work by writing Python code. Put code in fenced blocks:

```repl
print(len(context))
```

The blocks of your message run in order, in one persistent namespace, and you then see what they printed (at most \
{max_observation_chars:,} characters per block), so print what you need to see: counts, slices, short samples, \
findings. Variables stay between messages.

In the REPL:
- `context`: the input.
{chr(10).join(functions)}
- `FINAL(answer)`: finish with this answer. `FINAL_VAR("name")`: finish with the value of the REPL variable `name`.
- `SHOW_VARS()`: list your variables.

How to work:
1. First look at the input's shape: its length, a few slices, how records are separated. Never print all of it.
2. Decompose: use string methods and regular expressions where they suffice; {delegate}
3. Keep intermediate results in variables. Keep your current best answer in a variable named `{answer_var}`: \
if the budget runs out, that is what is returned.
4. Finish only when the answer is computed: write FINAL(...) or FINAL_VAR("{answer_var}") on a line of its own \
outside code blocks (it is read after your code has run), or call it inside code.

Each code block may run for {cell_wall_s:g} seconds; you have at most {max_iterations} messages; sub-calls, tokens \
and time are budgeted."""


def context_message(context: Any, query: str | None, preview_chars: int = 400) -> str:
    meta = context_metadata(context, preview_chars)
    size = f"{meta['chars']:,} characters (about {meta['approx_tokens']:,} tokens)"
    if "items" in meta:
        size = f"{meta['items']:,} items, {size} as JSON"
    more = "" if meta["chars"] <= preview_chars else f"\n[... {meta['chars'] - preview_chars:,} more characters]"
    ask = (
        f"The question to answer: {query}"
        if query
        else "The task's instructions are inside `context` itself (look at its beginning and end first)."
    )
    return (
        f"`context` is a {meta['type']} of {size}. It begins:\n---\n{meta['preview']}{more}\n---\n{ask}\n"
        "Start by exploring `context` with code."
    )


def extract_code(reply: str) -> tuple[list[str], str]:
    """(the code blocks of ``reply`` in order, the text outside them)."""
    blocks, outside, last = [], [], 0
    for match in _FENCE.finditer(reply):
        lang = match.group(1).lower()
        outside.append(reply[last : match.start()])
        last = match.end()
        if lang in _CODE_LANGS:
            if match.group(2).strip():
                blocks.append(match.group(2))
        else:
            outside.append(match.group(0))
    outside.append(reply[last:])
    return blocks, "".join(outside)


def _argument(text: str, start: int) -> str:
    """The text from ``start`` up to the parenthesis that closes an already open one."""
    depth, quote, i = 1, None, start
    while i < len(text):
        ch = text[i]
        if quote:
            if ch == "\\":
                i += 1
            elif text.startswith(quote, i):
                i += len(quote) - 1
                quote = None
        elif text.startswith(('"""', "'''"), i):
            quote = text[i : i + 3]
            i += 2
        elif ch in "\"'":
            quote = ch
        elif ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
            if depth == 0:
                return text[start:i]
        i += 1
    return text[start:].rstrip().removesuffix(")")


def _unquote(value: str) -> str:
    value = value.strip()
    if value[:1] in "\"'" or value[:2].lower() in ('f"', "f'", 'r"', "r'"):
        try:
            literal = ast.literal_eval(value)
        except (ValueError, SyntaxError):
            return value.strip("\"'")
        return str(literal)
    return value


def find_final(text: str) -> Final | None:
    """The last ``FINAL(...)`` or ``FINAL_VAR(...)`` at the start of a line of ``text`` (the text
    outside code blocks). A quoted answer is unquoted; anything else is kept as written."""
    matches = list(_FINAL.finditer(text))
    if not matches:
        return None
    match = matches[-1]
    raw = _argument(text, match.end())
    kind = match.group(1)
    value = _unquote(raw)
    if kind == "FINAL_VAR":
        value = value.strip().strip("`")
    return Final(kind, value)


def truncate(text: str, max_chars: int, total: int | None = None) -> str:
    """``text`` cut to ``max_chars`` with a note of how much is missing (``total``: the real
    length when ``text`` was already cut upstream)."""
    total = len(text) if total is None else max(total, len(text))
    if total <= max_chars and len(text) <= max_chars:
        return text
    shown = text[:max_chars]
    return f"{shown}\n[... output cut: {total - len(shown):,} more characters not shown; print less ...]"


def observation(cells: Sequence[dict[str, Any]], max_chars: int) -> str:
    """The user message that reports the cells of one reply (each: ``stdout``, ``stdout_chars``,
    ``error``)."""
    parts = []
    for i, cell in enumerate(cells, 1):
        out = truncate(cell.get("stdout") or "", max_chars, cell.get("stdout_chars"))
        parts.append(f"[block {i} output]\n{out if out.strip() else '(nothing printed)'}")
        if cell.get("error"):
            parts.append(f"[block {i} error]\n{truncate(cell['error'], max_chars)}")
    return "\n\n".join(parts)
