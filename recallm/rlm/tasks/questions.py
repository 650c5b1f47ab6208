"""The questions of OOLONG-style records, whose label needs reading: the six labels, the frames and
attributes a question is made of, and the generator's own grammar that reads a question's label back
(:func:`label_of`)."""

from __future__ import annotations

import random
import re
import string

from recallm.errors import RecallmError

__all__ = ["LABELS", "LABEL_HELP", "label_of", "question"]

LABELS = ("abbreviation", "entity", "description", "human", "location", "numeric")
LABEL_HELP = (
    "Each instance is a question. Its label is the kind of answer the question asks for, one of: abbreviation "
    "(what an abbreviation stands for), entity (a thing: an animal, a color, a food, an instrument, a sport ...), "
    "description (an explanation, a reason, a definition), human (a person), location (a place), numeric (a number, "
    "a date, a count, an amount). The labels are not written in the data: infer them from the questions."
)


# Every question names the thing it asks about *and* one or two other things about the same subject
# that it does not ask about (each of another label): "not the ...", "I already have the ...", "the
# remaining one". Which named thing is asked is said by the meaning of the sentence - its negation,
# "the first" / "the second", what is left over - not by the position or count of the names, so a
# classifier that spots the attribute phrases below (even the whole list) cannot tell the label.
# {a}: the thing asked about; {d1}, {d2}: things not asked about; {subj}: the subject.
_FRAMES = (
    "I already know the {d1} of {subj}. What is the {a} of {subj}?",
    "What is the {a} of {subj}? Not the {d1} - that one I have.",
    "Forget the {d1} of {subj} and the {d2}; what I need is the {a}.",
    "The {a} of {subj} is what I'm after, not its {d1} or its {d2}.",
    "Between the {d1} of {subj} and its {a}, only the second is missing from my notes; what is it?",
    "Between the {a} of {subj} and its {d1}, only the first is missing from my notes; what is it?",
    "Of the {d1}, the {a} and the {d2} of {subj}, I have written down the {d1} and the {d2}. Tell me the remaining one.",
    "Not the {d1} of {subj}, but the {a} - and not the {d2} either.",
    "I have the {d1} of {subj}, but not the {a}, and the {d2} I have too; could you find the missing one?",
    "Someone told me the {d1} of {subj}, could not give me the {a}, and added the {d2}; do you know the one "
    "they could not give?",
    "Not the {d1} of {subj}: the {a}. Yes, the {a}, not the {d2}.",
)
# label -> (the thing asked about, the kinds of subject it fits); subjects are shared by every label
_ATTRIBUTES: dict[str, tuple[tuple[str, tuple[str, ...]], ...]] = {
    "abbreviation": (
        ("full form", ("acronym",)),
        ("expansion", ("acronym",)),
        ("long form", ("acronym",)),
        ("spelled-out name", ("acronym", "org")),
        ("meaning of the initials", ("acronym",)),
        ("unabbreviated title", ("acronym", "org")),
    ),
    "entity": (
        ("national animal", ("country",)),
        ("signature dish", ("city", "country")),
        ("official colour", ("org", "acronym", "country")),
        ("favourite instrument", ("person",)),
        ("best-known product", ("org", "acronym")),
        ("mascot", ("org", "acronym", "city")),
        ("main crop", ("country", "city")),
        ("preferred sport", ("person",)),
        ("currency", ("country",)),
    ),
    "description": (
        ("origin of the name", ("city", "org", "acronym", "country")),
        ("reason for the fame", ("person", "city", "org")),
        ("purpose", ("org", "acronym", "thing")),
        ("history", ("city", "org", "thing")),
        ("meaning of the motto", ("org", "city", "country")),
        ("significance", ("thing", "org")),
        ("cause of the decline", ("city", "org", "acronym")),
    ),
    "human": (
        ("founder", ("org", "acronym", "city")),
        ("first mayor", ("city",)),
        ("current leader", ("org", "country", "acronym")),
        ("inventor", ("thing",)),
        ("chief architect", ("thing", "org")),
        ("best-known resident", ("city",)),
        ("original owner", ("thing", "org")),
        ("spokesperson", ("org", "acronym")),
    ),
    "location": (
        ("capital", ("country",)),
        ("headquarters", ("org", "acronym")),
        ("birthplace", ("person",)),
        ("exact location", ("org", "thing")),
        ("hometown", ("person",)),
        ("largest port", ("country",)),
        ("nearest airport", ("city",)),
        ("home stadium", ("org",)),
    ),
    "numeric": (
        ("population", ("city", "country")),
        ("founding year", ("org", "city", "acronym")),
        ("height", ("thing", "person")),
        ("total area", ("country", "city")),
        ("number of employees", ("org", "acronym")),
        ("age", ("person",)),
        ("annual budget", ("org", "acronym", "city")),
        ("distance to the coast", ("city",)),
        ("elevation", ("city",)),
    ),
}
_ORG_KINDS = ("company", "society", "museum", "festival", "party", "club", "institute", "foundation")
_ATTR_LABEL = {attr: label for label, attrs in _ATTRIBUTES.items() for attr, _ in attrs}
_ATTR_BY_LENGTH = sorted(_ATTR_LABEL, key=len, reverse=True)
_ATTR_KINDS = {attr: kinds for attrs in _ATTRIBUTES.values() for attr, kinds in attrs}
_ANY_ATTR = "|".join(re.escape(a) for a in _ATTR_BY_LENGTH)


def _frame_pattern(frame: str) -> re.Pattern[str]:
    """The full-sentence grammar of one frame, the asked attribute captured (``label_of``)."""
    out, seen = [], set()
    for literal, field_name, _, _ in string.Formatter().parse(frame):
        out.append(re.escape(literal))
        if field_name is None:
            continue
        if field_name in seen:
            out.append(f"(?P={field_name})")
        elif field_name == "subj":
            out.append("(?P<subj>.+?)")
        else:
            out.append(f"(?P<{field_name}>{_ANY_ATTR})")
        seen.add(field_name)
    return re.compile("".join(out) + r"\Z")


_FRAME_PATTERNS = tuple(_frame_pattern(f) for f in _FRAMES)


def label_of(question: str) -> str:
    """The label of a generated question (what the attribute it asks about asks for), read with
    the generator's own grammar (every frame, parsed whole); a ``RecallmError`` for text no
    generator wrote. Tests use it as a perfect classifier."""
    for pattern in _FRAME_PATTERNS:
        match = pattern.match(question)
        if match:
            return _ATTR_LABEL[match.group("a")]
    raise RecallmError(f"not a generated question: {question!r}")


def _acronym(rng: random.Random) -> str:
    return "".join(rng.choice("ABCDEFGHIJKLMNOPRSTUVW") for _ in range(rng.randint(2, 4)))


def _subject(rng: random.Random, kind: str) -> str:
    from data_gen.text import cities, countries, first_names, words

    if kind == "city":
        return rng.choice(cities())
    if kind == "country":
        return rng.choice(countries())
    if kind == "person":
        return rng.choice(first_names())
    if kind == "acronym":
        return _acronym(rng)
    if kind == "org":
        return f"the {rng.choice(words()).capitalize()} {rng.choice(_ORG_KINDS)}"
    return f"the {rng.choice(words())} {rng.choice(words())}"  # a thing


def question(rng: random.Random, label: str) -> str:
    attr, kinds = rng.choice(_ATTRIBUTES[label])
    kind = rng.choice(kinds)
    others = [a for a, k in _ATTR_KINDS.items() if kind in k and _ATTR_LABEL[a] != label]  # fit the subject
    frame = rng.choice(_FRAMES)
    labels = list(dict.fromkeys(_ATTR_LABEL[a] for a in others))  # (a set's order changes with PYTHONHASHSEED)
    if "{d2}" in frame and len(labels) < 2:
        frame = _FRAMES[0]
    d1_label, d2_label = rng.sample(labels, 2) if len(labels) >= 2 else (labels[0], labels[0])
    d1 = rng.choice([a for a in others if _ATTR_LABEL[a] == d1_label])
    d2 = rng.choice([a for a in others if _ATTR_LABEL[a] == d2_label])
    return frame.format(a=attr, d1=d1, d2=d2, subj=_subject(rng, kind))
