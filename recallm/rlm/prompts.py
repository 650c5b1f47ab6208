"""What the root model reads and how its replies are read: small pure functions.

The conversation follows the RLM paper's (our own wording):

* ``system_prompt`` - the REPL, the functions its depth allows, worked decomposition examples in
  ```` ```repl ```` blocks (a needle found with a regular expression, dense labelling with batched
  sub-calls aggregated in code, chunked reading with a combining call, and - with recursion - a
  sub-problem handed to ``rlm_query``), and ``FINAL`` / ``FINAL_VAR`` as text only, outside code;
* ``context_message`` - the first user message: metadata of the context (type, length,
  approximate tokens, item count), a short preview (never the context itself), the query, and
  the first-turn safeguard (look at the context before answering);
* ``turn_reminder`` - appended to every later user message: it repeats the query;
* ``FINAL_ANSWER_REQUEST`` - the one last call when the iteration limit is reached.

Reading replies:

* ``extract_code`` - the code blocks of a reply in order (fenced ```` ```repl ````,
  ```` ```python ```` or unlabelled). A fence opens on a line of its own and closes on a line that
  is only ```` ``` ```` and is not inside a string of the code above it (so ```` ``` ```` in a
  string literal or a comment does not end a block); a block never closed (a reply cut off) is
  not run and is reported in ``unclosed``;
* ``find_final`` - the last ``FINAL(...)`` / ``FINAL_VAR(...)`` at the start of a line outside
  code; ``closed`` is False when its parenthesis never closes (cut off at the token limit);
* ``name_final_var`` - code in which ``FINAL_VAR(x)`` with a bare name becomes ``FINAL_VAR("x")``:
  the variable written is the one returned, whatever string it holds;
* ``observation`` - what the root sees of the cells it ran, each cell's output cut to
  ``max_chars`` characters (with a note saying how much was cut);
* ``visible_text`` - a reply without its reasoning (the text after ``</think>``; nothing when a
  ``<think>`` block never closes) and without recall markers: what goes back into the root's
  history and what a sub-call returns.
"""

from __future__ import annotations

import ast
import io
import re
import tokenize
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from recallm.tokens import END_RECALL, START_RECALL, THINK_END, THINK_START

__all__ = [
    "Final",
    "CodeBlocks",
    "system_prompt",
    "context_metadata",
    "context_message",
    "turn_reminder",
    "extract_code",
    "find_final",
    "name_final_var",
    "observation",
    "truncate",
    "visible_text",
    "NO_CODE_NUDGE",
    "CUT_OFF_NUDGE",
    "FINAL_CUT_OFF",
    "UNCLOSED_BLOCK",
    "FIRST_TURN_SAFEGUARD",
    "FINAL_ANSWER_REQUEST",
]

_OPEN = re.compile(r"^[ \t]*```([A-Za-z0-9_+-]*)[ \t]*$")
_CLOSE = re.compile(r"^[ \t]*```[ \t]*$")
_CODE_LANGS = {"", "repl", "python", "py", "python3"}
_FINAL = re.compile(r"^[ \t]*(FINAL_VAR|FINAL)\(", re.MULTILINE)
_FINAL_ANYWHERE = re.compile(r"\b(FINAL_VAR|FINAL)\(")

NO_CODE_NUDGE = (
    "Your message had neither a ```repl code block nor a FINAL(...). Continue the work with code, "
    "or end with FINAL(answer) or FINAL_VAR(variable_name) on a line of its own."
)
CUT_OFF_NUDGE = (
    "Your message was cut off at the token limit before any code block or FINAL(...). Think less and act: "
    "write a short ```repl code block, or end with FINAL(answer)."
)
FINAL_CUT_OFF = (
    "Your FINAL(...) was cut off before its closing parenthesis, so it was not accepted. Store the answer in a "
    "variable with code and end with FINAL_VAR(variable_name), or write a shorter FINAL(...)."
)
UNCLOSED_BLOCK = "A code block of your message was never closed with ``` (cut off?), so it did not run."
FIRST_TURN_SAFEGUARD = (
    "You have not looked at `context` yet. Your first message should explore it with code "
    "(its size, a few slices, how it is organised); do not give a final answer yet."
)
FINAL_ANSWER_REQUEST = (
    "You have used all your messages: no more code will run. Answer the original question now, with "
    "FINAL(your answer) on a line of its own (or FINAL_VAR(variable_name) for a REPL variable that already "
    "holds it)."
)


@dataclass(frozen=True)
class Final:
    """A final answer found in a reply: ``kind`` is ``FINAL`` (``value`` is the answer) or
    ``FINAL_VAR`` (``value`` is a variable name); ``closed`` is False when it was cut off."""

    kind: str
    value: str
    closed: bool = True


@dataclass(frozen=True)
class CodeBlocks:
    """The code blocks of a reply, the text outside them, and blocks opened but never closed."""

    blocks: list[str]
    outside: str
    unclosed: list[str] = field(default_factory=list)

    def __iter__(self):  # (blocks, outside), as extract_code returned before
        return iter((self.blocks, self.outside))

    def __getitem__(self, index: int):
        return (self.blocks, self.outside)[index]


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


_EXAMPLE_NEEDLE = """Example - a fact that a pattern can find: search with code, then read only the surroundings.
```repl
import re
hits = [m.start() for m in re.finditer(r"access code", context)]
print(len(hits), [context[max(0, h - 200):h + 200] for h in hits[:3]])
```"""
_EXAMPLE_LABELS = """Example - a judgement about every record (here: the topic of each question), which code cannot make: \
batch the records into chunks, ask a sub-model per chunk, parse its answers and aggregate in code.
```repl
records = context.split("\\n")
chunks = [records[i:i + 50] for i in range(0, len(records), 50)]
prompts = ["For each line below, answer with one topic word per line, in order:\\n" + "\\n".join(c) for c in chunks]
answers = llm_query_batched(prompts)
topics = [t.strip().lower() for a in answers for t in a.splitlines() if t.strip()]
from collections import Counter
counts = Counter(topics)
print(len(records), len(topics), counts.most_common(5))
```"""
_EXAMPLE_READ = """Example - a question about a long text: ask it of each part, keep the findings in a variable, \
then combine them with one more call.
```repl
size = 100_000
parts = [context[i:i + size] for i in range(0, len(context), size)]
notes = llm_query_batched([f"Question: {question}\\nQuote what in this part bears on it, or say NONE.\\n\\n{p}" \
for p in parts])
found = [n for n in notes if "NONE" not in n]
answer = llm_query(f"Question: {question}\\nFindings from the parts:\\n" + "\\n---\\n".join(found))
print(answer)
```"""
_EXAMPLE_RECURSIVE = """Example - a sub-problem that needs its own exploration: give it, with the piece of input it \
concerns, to a recursive model, and use its answer in code.
```repl
section = context[start:end]
summary = rlm_query(section, "List every person named in this section with the city they live in, one per line.")
people = [line.split(",") for line in summary.splitlines() if "," in line]
print(len(people), people[:5])
```"""


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
    examples = [_EXAMPLE_NEEDLE]
    if not functions:
        functions.append("- No model sub-calls are available here: solve the task with code alone.")
        delegate = "then compute the answer with code."
    else:
        delegate = (
            "for judgements code cannot make (meaning, labels, summaries), send chunks to the sub-models, "
            "batched, and combine their answers with code."
        )
        examples += [_EXAMPLE_LABELS, _EXAMPLE_READ]
        if rlm_query == "recursive":
            examples.append(_EXAMPLE_RECURSIVE)
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
- `SHOW_VARS()`: list your variables.

How to work:
1. First look at the input's shape: its length, a few slices, how records are separated. Never print all of it.
2. Decompose: use string methods and regular expressions where they suffice; {delegate}
3. Keep intermediate results in variables. Keep your current best answer in a variable named `{answer_var}`.
4. Finish only when the answer is computed and checked.

{chr(10).join(e + chr(10) for e in examples)}
To finish, write on a line of its own, as text and not inside code:
FINAL(your answer)
or, to return a REPL variable that holds the answer:
FINAL_VAR({answer_var})
It is read after the code of the same message has run, and it is not accepted if any of that code failed. Do not \
write FINAL before the work is done.

Each code block may run for {cell_wall_s:g} seconds of its own (time spent waiting on sub-calls does not count); \
you have at most {max_iterations} messages; sub-calls, tokens and time are budgeted."""


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
        f"`context` is a {meta['type']} of {size}. It begins:\n---\n{meta['preview']}{more}\n---\n{ask}\n\n"
        f"{FIRST_TURN_SAFEGUARD}"
    )


def turn_reminder(query: str | None) -> str:
    """The end of every later user message: the query again, and a call to act."""
    what = f'the original question: "{query}"' if query else "the task stated in `context`"
    return (
        f"Your REPL variables are kept. Keep working with code toward {what}. When the answer is computed, "
        "finish with FINAL(...) or FINAL_VAR(...) on a line of its own. Your next message:"
    )


def _inside_string(code: str) -> bool:
    """Whether ``code`` ends inside an unterminated (multi-line) string literal."""
    try:
        for _ in tokenize.generate_tokens(io.StringIO(code).readline):
            pass
    except tokenize.TokenError as exc:
        return "string" in str(exc)
    except SyntaxError as exc:  # newer tokenizers
        return "string" in str(exc)
    return False


def extract_code(reply: str) -> CodeBlocks:
    """The code blocks of ``reply`` in order, the text outside them, the unclosed ones (module doc)."""
    lines = reply.splitlines(keepends=True)
    blocks: list[str] = []
    outside: list[str] = []
    unclosed: list[str] = []
    i = 0
    while i < len(lines):
        opened = _OPEN.match(lines[i].rstrip("\r\n"))
        if not opened:
            outside.append(lines[i])
            i += 1
            continue
        lang = opened.group(1).lower()
        body: list[str] = []
        j = i + 1
        close = None
        while j < len(lines):
            if _CLOSE.match(lines[j].rstrip("\r\n")) and (lang not in _CODE_LANGS or not _inside_string("".join(body))):
                close = j
                break
            body.append(lines[j])
            j += 1
        code = "".join(body)
        if close is None:
            if lang in _CODE_LANGS and code.strip():
                unclosed.append(code)
            else:
                outside.extend(lines[i:])
            break
        if lang in _CODE_LANGS:
            if code.strip():
                blocks.append(code)
        else:
            outside.extend(lines[i : close + 1])
        i = close + 1
    return CodeBlocks(blocks, "".join(outside), unclosed)


def _argument(text: str, start: int) -> tuple[str, bool]:
    """(the text from ``start`` up to the parenthesis that closes an already open one, whether
    it closes at all)."""
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
                return text[start:i], True
        i += 1
    return text[start:].rstrip(), False


def _unquote(value: str) -> str:
    value = value.strip()
    if value[:1] in "\"'" or value[:2].lower() in ('f"', "f'", 'r"', "r'"):
        try:
            literal = ast.literal_eval(value)
        except (ValueError, SyntaxError):
            return value.strip("\"'")
        return str(literal)
    return value


def find_final(text: str, *, anywhere: bool = False) -> Final | None:
    """The last ``FINAL(...)`` or ``FINAL_VAR(...)`` at the start of a line of ``text`` (the text
    outside code blocks; ``anywhere``: also inside a line - the final call). A quoted answer is
    unquoted; anything else is kept as written."""
    matches = list((_FINAL_ANYWHERE if anywhere else _FINAL).finditer(text))
    if not matches:
        return None
    match = matches[-1]
    raw, closed = _argument(text, match.end())
    kind = match.group(1)
    value = _unquote(raw)
    if kind == "FINAL_VAR":
        value = value.strip().strip("`")
    return Final(kind, value, closed)


def name_final_var(code: str) -> str:
    """``code`` with every ``FINAL_VAR(<bare name>)`` call written as ``FINAL_VAR("<name>")``
    (module doc); code that does not parse is returned unchanged (it will fail as written)."""
    if "FINAL_VAR" not in code:
        return code
    try:
        tree = ast.parse(code)
    except SyntaxError:
        return code
    edits = []
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id == "FINAL_VAR"
            and len(node.args) == 1
            and isinstance(node.args[0], ast.Name)
        ):
            arg = node.args[0]
            edits.append((arg.lineno, arg.col_offset, arg.end_col_offset, arg.id))
    if not edits:
        return code
    lines = code.splitlines(keepends=True)
    for lineno, start, end, name in sorted(edits, reverse=True):
        line = lines[lineno - 1].encode("utf-8")  # ast offsets are in UTF-8 bytes
        lines[lineno - 1] = (line[:start] + repr(name).encode() + line[end:]).decode("utf-8")
    return "".join(lines)


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
