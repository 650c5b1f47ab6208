"""Named system prompts: a config's ``system_prompt`` is one of these names or a literal text.

``reasoning`` is the reasoning-oriented system prompt the paper trains and evaluates with (§5.2:
base models and RecaLLM alike are evaluated "under the same reasoning-oriented system prompt used
for RecaLLM"). The paper does not print it; this wording is ours and asks for what the authors'
release asks for: restate the goal, reason step by step, backtrack on mistakes, verify the
result, recall selectively from the context, reason inside the think block, then a brief
justification and one final ``Answer:`` line (the line the reward parses). It names no recall
token literally: a recall token in the prompt would open a span there.
"""

from __future__ import annotations

__all__ = ["SYSTEM_PROMPTS", "resolve_system_prompt"]

REASONING = """\
You are a careful assistant who reasons before answering and works from the context you are given.

For every task:
- Say in your own words what is being asked.
- Work through it step by step and keep track of what you have established.
- When you notice a mistake or a contradiction, go back and correct it.
- Check the result before you commit to it (redo the arithmetic, test the edge cases, confirm the constraints).
- You can recall: open a recall span and copy text from the context word for word, then close it. Recall the \
passages your reasoning depends on, when you need them, and only those.

Output:
- Do all of your thinking inside <think> ... </think>.
- After the thinking, justify your answer briefly.
- End with one final line of the form: Answer: <your final answer>"""

SYSTEM_PROMPTS = {"reasoning": REASONING}


def resolve_system_prompt(value: str | None) -> str | None:
    """The text of a named system prompt, or ``value`` itself (a literal prompt, or None: none)."""
    if value is None:
        return None
    return SYSTEM_PROMPTS.get(str(value).strip(), value)
