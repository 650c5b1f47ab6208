"""Long-context tasks for RLMs, generated offline and deterministically from a seed, with scorers.

Four tasks, after the RLM paper's scaling study (lengths from 8K to 1M tokens and beyond) and its
RL experiment:

* ``s_niah`` - single needle in a haystack: one sentence ``The special magic number for
  <key> is <number>.`` among English-word sentences; the query asks for the number. Score 1 if
  the answer contains the number (as a whole number), else 0. Constant information per query.
* ``oolong`` - aggregation (after OOLONG's trec_coarse split): many short records
  ``Date: ... || User: <id> || Instance: <question>``. Each question has a hidden label - the
  kind of answer it asks for: abbreviation, entity, description, human, location, numeric. The
  label must be *read*: every question names the thing it asks about (its founder, its
  population, its capital, its full form ...) together with one or two things of other labels
  about the same subject that it does not ask about ("not the ...", "I already have the ...",
  "only the second is missing", "the remaining one"), in frames shared by every label that put
  the asked thing first, last or in the middle, once or twice. Spotting the attribute phrases
  therefore tells little (a keyword rule scores 0.27-0.38, tests/unit/test_rlm_tasks.py); the
  generator's own grammar (``label_of``) reads every question exactly. Queries: how many instances have label L (a number, partial credit
  ``0.75 ** |error|``); is label A more common, less common or the same frequency as label B;
  which label is the most common. Linear information per query.
* ``oolong_pairs`` - pair enumeration (after OOLONG-Pairs): the same records; the query asks for
  every pair of user ids meeting a condition, one of eight kinds, as in the paper's query set:
  both users have an instance labelled A; both have A and B; both have A or B; both have at
  least k instances labelled A; both have exactly k; both have one labelled A dated after a
  date; and two asymmetric ones - one user has A and the other has B; one has A dated before a
  date and the other has B dated after it. Scored by F1 over the set of unordered pairs. The
  generator arranges for about ``3 * sqrt(users)`` users to meet the condition (no fixed cap;
  ``max_pair_users`` sets one), so the gold set grows with the length.
* ``mrcr`` - multi-round co-reference (after OpenAI's MRCR, the task of the paper's RL run): the
  context is a long conversation (a list of ``{"role", "content"}`` messages) in which a user asks
  for many pieces of writing ("write a poem about tapirs", "a riddle about lighthouses" ...) and
  the assistant writes them; ``needles`` of the requests are the same request (same form, same
  topic) with different answers. The query asks to prepend a random string to the k-th of them.
  Score (as MRCR's grader): 0 if the answer does not start with the string, else the
  ``difflib.SequenceMatcher`` ratio of the rest to that answer. The paper trains on 2 needles at
  32K-64K tokens and evaluates 8 needles at 512K-1M.

One module per task (its generator and its scorer): :mod:`~recallm.rlm.tasks.niah`,
:mod:`~recallm.rlm.tasks.oolong`, :mod:`~recallm.rlm.tasks.oolong_pairs`, :mod:`~recallm.rlm.tasks.mrcr`;
the OOLONG-style questions and records both OOLONG tasks read (:mod:`~recallm.rlm.tasks.questions`,
:mod:`~recallm.rlm.tasks.records`); what every task shares, with the lengths and the reading of a stated
answer (:mod:`~recallm.rlm.tasks.common`); making and scoring an example of any task, and task sets
(:mod:`~recallm.rlm.tasks.registry`). The names below are the package's face.
"""

from recallm.rlm.tasks.common import (
    MAX_LENGTH,
    MIN_LENGTH,
    TASKS,
    TaskExample,
    TaskScore,
    TokenCounter,
    context_text,
    numeric_partial_credit,
    stated_answer,
)
from recallm.rlm.tasks.mrcr import mrcr_score
from recallm.rlm.tasks.oolong_pairs import PAIR_CONDITIONS, pair_condition_met, pairs_f1, parse_pairs
from recallm.rlm.tasks.questions import LABELS, label_of
from recallm.rlm.tasks.records import parse_record_date
from recallm.rlm.tasks.registry import TaskRun, TaskSet, make_task, score_answer, task_specs

__all__ = [
    "TASKS",
    "LABELS",
    "PAIR_CONDITIONS",
    "TaskExample",
    "TaskScore",
    "TokenCounter",
    "TaskSet",
    "TaskRun",
    "make_task",
    "task_specs",
    "score_answer",
    "stated_answer",
    "label_of",
    "parse_pairs",
    "pairs_f1",
    "numeric_partial_credit",
    "pair_condition_met",
    "parse_record_date",
    "context_text",
    "mrcr_score",
    "MIN_LENGTH",
    "MAX_LENGTH",
]
