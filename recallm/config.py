"""Reading config values by type — the one home of it.

Three layers:

* **Command-line overrides** (``check_overrides``), for every Hydra command before anything runs:
  each ``key=value`` must have the type of the default it replaces (an integer where the default is
  an integer, a number where it is a float, ``true``/``false`` where it is a boolean, a mapping
  where it is a mapping; ``null`` is always accepted here — the command's own checks say where a
  value is required). ``+key=value`` may add only a *known* setting: a key that some shipped config
  of the same group sets (``+sft.embed.steps=100`` on a recipe without it), or one under an open
  node (an empty mapping such as ``engine_kwargs: {}``, or a node the command declares open);
  anything else — ``+sft.lr=123.0``, which nothing reads — is refused with the nearest real keys.
* **Values a command reads** (``check_value``): type, range, choices, required — one line naming
  the key, e.g. ``workers must be >= 1, got 0``. ``as_number`` and ``check_range`` convert and
  check one number.
* **A config section as a settings dataclass** (``typed``): the dataclass is the section's schema —
  its fields are the known keys (any other key is refused, with the known ones listed), their
  annotations the types (each value converted, or one line naming ``section.key``), their defaults
  the defaults (held there once: readers take the attribute, never ``.get(key, default)``); a field
  without a default is required. ``dataclass_values`` is the same without building the instance.
"""

from __future__ import annotations

import contextlib
import dataclasses
import difflib
import math
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

from recallm.errors import RecallmError

__all__ = [
    "check_overrides",
    "check_value",
    "as_number",
    "check_range",
    "dataclass_values",
    "typed",
    "register_schema",
    "MAX_WORKERS",
    "MAX_COUNT",
    "MAX_BATCH",
    "MAX_TOKENS",
    "MAX_CHARS",
    "MAX_SECONDS",
    "MAX_MB",
    "MAX_RETRIES",
    "MAX_SEED",
]

T = TypeVar("T")
#: The ranges many settings share (a field's ``metadata`` ``max``; ``tests/unit/test_setting_ranges.py`` probes
#: every numeric field). Each bounds a typo, not a machine: what a run can afford is checked against the model and
#: the machine where it is sized (LoRA ranks, rows, tokens).
MAX_WORKERS = 1024  # processes, threads, concurrent requests of one run
MAX_COUNT = 10**9  # steps, examples, rows, iterations, items of a budget
MAX_BATCH = 1 << 16  # examples in one batch
MAX_TOKENS = 1 << 22  # tokens of one sequence, generation or window (4M: beyond any model's context)
MAX_CHARS = 1 << 30  # characters of one text
MAX_SECONDS = 30 * 86400  # a timeout, a wait or a wall-clock limit (30 days)
MAX_MB = 1 << 24  # MiB of a memory or size limit (16 TiB)
MAX_RETRIES = 100  # retries of one request
MAX_SEED = 2**63 - 1  # a seed (63 bits: torch, numpy and parquet's int64 take it)
_ABSENT = object()
_KINDS = {int: "an integer", float: "a number", bool: "true or false", str: "a string", dict: "a mapping {key: value}"}


# --------------------------------------------------------------------------- values a command reads
def _describe(value: Any) -> str:
    return repr(value) if not hasattr(value, "_metadata") else repr(_plain(value))


def _plain(value: Any) -> Any:
    from omegaconf import OmegaConf

    if OmegaConf.is_config(value):
        return OmegaConf.to_container(value, resolve=False)
    return value


def _is_kind(value: Any, kind: type) -> bool:
    if kind is bool:
        return isinstance(value, bool)
    if isinstance(value, bool):
        return False
    if kind is int:
        return isinstance(value, int)
    if kind is float:
        return isinstance(value, (int, float))
    if kind is dict:
        return isinstance(value, Mapping) or (hasattr(value, "_metadata") and hasattr(value, "keys"))
    return isinstance(value, kind)


def _get(cfg: Any, key: str) -> Any:
    from omegaconf import OmegaConf

    if OmegaConf.is_config(cfg):
        return OmegaConf.select(cfg, key, default=None)
    node = cfg
    for part in key.split("."):
        if not isinstance(node, Mapping):
            return None
        node = node.get(part)
    return node


def check_value(
    cfg: Any,
    key: str,
    kind: type,
    *,
    optional: bool = False,
    min: float | None = None,  # noqa: A002  (the natural name)
    max: float | None = None,  # noqa: A002
    choices: Sequence[Any] | None = None,
) -> Any:
    """The value at dotted ``key`` of ``cfg`` (a DictConfig or nested mappings), checked: of ``kind``
    (``int``, ``float``, ``bool``, ``str``, ``dict``; a bool is not a number), in ``[min, max]``, one
    of ``choices``; ``None`` only if ``optional``. A one-line ``RecallmError`` naming ``key``."""
    value = _get(cfg, key)
    if value is None:
        if optional:
            return None
        raise RecallmError(f"{key} must be set ({_KINDS.get(kind, kind.__name__)}), got null")
    if kind is str and isinstance(value, (int, float)) and not isinstance(value, bool):
        value = str(value)  # a name or path that looks like a number on the command line
    if not _is_kind(value, kind):
        raise RecallmError(f"{key} must be {_KINDS.get(kind, kind.__name__)}, got {_describe(value)}")
    if min is not None and value < min:
        raise RecallmError(f"{key} must be >= {min}, got {value}")
    if max is not None and value > max:
        raise RecallmError(f"{key} must be <= {max}, got {value}")
    if choices is not None and value not in choices:
        raise RecallmError(f"{key} must be one of {', '.join(map(str, choices))}, got {_describe(value)}")
    return value


def as_number(value: Any, name: str, kind: type = float) -> Any:
    """``kind(value)``, or a ``RecallmError`` naming ``name`` (booleans are not numbers; an integer is
    not taken from a number with a fraction)."""
    try:
        if isinstance(value, bool) or (kind is int and isinstance(value, float) and not value.is_integer()):
            raise TypeError
        number = kind(value)
    except (TypeError, ValueError, OverflowError):
        raise RecallmError(f"{name} must be {'an integer' if kind is int else 'a number'}, got {value!r}") from None
    if kind is float and not math.isfinite(number):
        raise RecallmError(f"{name} must be a finite number, got {value!r}")
    if kind is int and not -(2**63) <= number < 2**63:
        raise RecallmError(f"{name} is out of range (a 64-bit integer), got {value!r}")
    return number


def _hints(cls: type) -> dict[str, Any]:
    import typing

    return typing.get_type_hints(cls)


def _section_type(hint: Any) -> Any:
    """``X`` of a field annotated ``X`` or ``X | None``."""
    import types
    import typing

    if typing.get_origin(hint) not in (typing.Union, types.UnionType):
        return hint
    args = [a for a in typing.get_args(hint) if a is not type(None)]
    return args[0] if len(args) == 1 else hint


def _mapping_entry(hint: Any) -> type | None:
    """``X`` of a field annotated ``dict[str, X]`` (or ``Mapping[str, X]``) where ``X`` is a dataclass."""
    import collections.abc
    import typing

    if typing.get_origin(hint) not in (dict, collections.abc.Mapping):
        return None
    args = typing.get_args(hint)
    return args[1] if len(args) == 2 and dataclasses.is_dataclass(args[1]) else None


def _key(where: str, name: str) -> str:
    return f"{where}.{name}" if where else name


def dataclass_values(cls: type, cfg: Mapping[str, Any] | None, where: str) -> dict[str, Any]:
    """The values ``cfg`` sets for the fields of dataclass ``cls``, each converted to the field's
    declared type (``int``, ``float``, ``str``, ``bool``; ``list[...]``/``tuple[...]`` take a list,
    ``dict[...]`` a mapping (``dict[str, X]`` of a settings dataclass ``X``: each entry read with
    ``typed``), ``Any`` anything; ``X | None`` also takes None, which elsewhere means
    "not set": the field's default is kept). A key that is not a
    field, or a value of the wrong kind, is a one-line ``RecallmError`` naming ``where``; a field
    whose type is itself a settings dataclass is read with ``typed`` (or with the dataclass's own
    ``from_mapping(value, where)`` where it has one). Needs postponed annotations
    (string field types)."""
    if cfg is not None and not isinstance(cfg, Mapping):
        cfg = _plain(cfg)
        if not isinstance(cfg, Mapping):
            raise RecallmError(f"{where} must be a mapping {{key: value}}, got {cfg!r}")
    cfg = dict(cfg or {})
    declared = {f.name: str(f.type) for f in dataclasses.fields(cls)}
    unknown = sorted(set(cfg) - set(declared))
    if unknown:
        raise RecallmError(f"{where or 'the config'} has unknown keys {unknown}; known: {sorted(declared)}")
    values: dict[str, Any] = {}
    for name, value in cfg.items():
        kind = declared[name]
        if value is None:
            if kind.endswith("| None") or kind == "Any":
                values[name] = None
            # else: null on a field that takes no null is "not set": the field's default (or required)
            continue
        kind = kind.split("|")[0].strip()
        if kind in ("int", "float"):
            values[name] = as_number(value, _key(where, name), int if kind == "int" else float)
        elif kind == "str":
            if isinstance(value, (Mapping, list, tuple)) or hasattr(value, "_metadata"):
                raise RecallmError(f"{_key(where, name)} must be a string, got {_describe(value)}")
            values[name] = str(value)  # a name or path that looks like a number on the command line
        elif kind == "bool":
            if not isinstance(value, bool):
                raise RecallmError(f"{_key(where, name)} must be true or false, got {_describe(value)}")
            values[name] = value
        elif kind == "Any":
            values[name] = _plain(value)
        elif kind.startswith(("list", "tuple", "Sequence")):
            value = _plain(value)
            if not isinstance(value, (list, tuple)):
                raise RecallmError(f"{_key(where, name)} must be a list, got {value!r}")
            values[name] = list(value) if kind.startswith("list") else tuple(value)
        elif kind.startswith(("dict", "Mapping")):
            value = _plain(value)
            if not isinstance(value, Mapping):
                raise RecallmError(f"{_key(where, name)} must be a mapping {{key: value}}, got {value!r}")
            entry = _mapping_entry(_hints(cls).get(name))
            if entry is not None:  # dict[str, <a settings dataclass>]: each entry read with its schema
                value = {k: typed(entry, v, f"{_key(where, name)}.{k}") for k, v in value.items()}
            values[name] = dict(value)
        elif dataclasses.is_dataclass(nested := _section_type(_hints(cls).get(name))):
            # a nested section with its own schema; one that checks itself in from_mapping (the RLM's
            # settings) is read with it
            reader = getattr(nested, "from_mapping", None)
            values[name] = reader(value, _key(where, name)) if reader else typed(nested, value, _key(where, name))
        else:
            raise TypeError(f"{cls.__name__}.{name}: field type {declared[name]} is not read from a config")
    return values


def typed(cls: type[T], cfg: Mapping[str, Any] | None, where: str) -> T:
    """``cls(**values)``: the settings dataclass ``cls`` built from config section ``cfg`` (module
    doc). Unknown keys, values of the wrong kind and missing required fields are one-line
    ``RecallmError``s naming ``where``; so are values outside a field's ``metadata`` ``min``/``max``/
    ``above`` (an open lower bound: ``above: 0`` is "positive")/``choices`` (``field(default=1, metadata={"min": 1})``) and a ``RecallmError`` of the dataclass's
    own checks (``__post_init__``), prefixed with ``where`` (``where.key must ...`` when the message
    starts with a field's name, else ``where: message``)."""
    values = dataclass_values(cls, cfg, where)
    for f in dataclasses.fields(cls):
        value, key = values.get(f.name), f"{where}.{f.name}" if where else f.name
        if value is None:
            continue
        if "min" in f.metadata and value < f.metadata["min"]:
            raise RecallmError(f"{key} must be >= {f.metadata['min']}, got {value}")
        if "above" in f.metadata and not value > f.metadata["above"]:  # (an open lower bound: a size, a rate)
            bound = "positive" if f.metadata["above"] == 0 else f"> {f.metadata['above']}"
            raise RecallmError(f"{key} must be {bound}, got {value}")
        if "max" in f.metadata and value > f.metadata["max"]:
            raise RecallmError(f"{key} must be <= {f.metadata['max']}, got {value}")
        if "choices" in f.metadata and value not in f.metadata["choices"]:
            raise RecallmError(f"{key} must be one of {', '.join(map(str, f.metadata['choices']))}, got {value!r}")
    missing = [
        f.name
        for f in dataclasses.fields(cls)
        if f.init
        and f.name not in values
        and f.default is dataclasses.MISSING
        and f.default_factory is dataclasses.MISSING
    ]
    if missing:
        raise RecallmError(f"{_key(where, missing[0])} is required")
    try:
        return cls(**values)
    except RecallmError as exc:
        message = str(exc)
        if not where or message.startswith(where):
            raise
        names = {f.name for f in dataclasses.fields(cls)}
        about_a_field = message.split(" ", 1)[0].split(".", 1)[0] in names  # "max_depth must be ..."
        raise RecallmError(f"{where}.{message}" if about_a_field else f"{where}: {message}") from None


def register_schema(
    name: str, cls: type, *, plus_keys: Sequence[str] = (), sections: Sequence[str] = ()
) -> None:
    """Store settings dataclass ``cls`` in Hydra's ConfigStore as ``schema/<name>``: a YAML's defaults
    list puts it under a section (``- /schema/<name>@<section>``), or, first in a primary config's
    list, under the config's own keys (``- /schema/<name>@_here_``), so the node has every field
    with its default, and Hydra checks overrides against the field types. The node is writable
    (a frozen dataclass would make it read-only, and Hydra could not merge the YAML onto it).
    ``plus_keys``: fields left out of the node, set with ``+section.key=...`` (``typed`` still
    reads them with their type). ``sections``: fields registered untyped (``Any``), ``typed`` still
    reading them with their declared type after composition: those whose node something else fills
    — a config group or another registered schema, which Hydra then merges in as it is (a ``dict``
    or dataclass field would refuse it) — and mappings that default to null (OmegaConf cannot set
    a mapping, ``curves={a:x}``, on a null ``dict | None`` node)."""
    from hydra.core.config_store import ConfigStore
    from omegaconf import OmegaConf

    if plus_keys or sections:
        hints = _hints(cls)
        kept = [
            (
                f.name,
                Any if f.name in sections else hints[f.name],
                dataclasses.field(default=f.default, default_factory=f.default_factory),
            )
            for f in dataclasses.fields(cls)
            if f.name not in plus_keys
        ]
        cls = dataclasses.make_dataclass(cls.__name__, kept)
        # a module-level name, so that a composed config (which refers to its schema's class) pickles
        # with the plain pickle too (multiprocessing), not only with cloudpickle (Ray)
        cls.__module__, cls.__qualname__ = __name__, f"_schema_{name}"
        globals()[cls.__qualname__] = cls
    node = OmegaConf.structured(cls)
    _writable(node)
    ConfigStore.instance().store(group="schema", name=name, node=node)


def _writable(node: Any) -> None:
    """Clear the read-only flag of ``node`` and of every node under it (each frozen dataclass sets
    its own)."""
    from omegaconf import DictConfig, OmegaConf

    OmegaConf.set_readonly(node, None)
    if isinstance(node, DictConfig) and not node._is_missing() and not node._is_none():
        for key in node.keys():
            child = node._get_node(key)
            if isinstance(child, DictConfig):
                _writable(child)


def check_range(value: float, name: str, lo: float, hi: float, *, hi_open: bool = False) -> None:
    if not (lo <= value < hi if hi_open else lo <= value <= hi):
        raise RecallmError(f"{name} must be in [{lo}, {hi}{')' if hi_open else ']'}, got {value}")


# ------------------------------------------------------------------------ command-line overrides
def _group_overrides(config_name: str, parsed: Sequence[Any], overrides: Sequence[str]) -> list[bool]:
    """Which overrides choose config groups or set Hydra's own node (they shape the defaults tree) and
    which set values: Hydra's own split (``hydra._internal.defaults_list.Overrides``: a group of the
    config repository - the primary config's search path included - unless the value is a mapping)."""
    from hydra.core.global_hydra import GlobalHydra
    from hydra.errors import HydraException

    try:
        _, repo = GlobalHydra.instance().config_loader()._parse_overrides_and_create_caching_repo(
            config_name, list(overrides)
        )
    except HydraException as exc:
        raise RecallmError(f"bad override: {_first_line(exc)}") from None
    return [
        o.is_hydra_override() or (repo.group_exists(o.key_or_group) and not isinstance(o.value(), dict))
        for o in parsed
    ]


def _apply_overrides(values: Sequence[Any], cfg: Any) -> None:
    """The value overrides applied to a composed config, as Hydra's ``compose`` applies them."""
    from hydra._internal.config_loader_impl import ConfigLoaderImpl
    from omegaconf import OmegaConf

    OmegaConf.set_struct(cfg, True)
    ConfigLoaderImpl._apply_overrides_to_config(list(values), cfg)


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    line = text.splitlines()[0] if text else type(exc).__name__
    cause = str(exc.__cause__ or "").strip()
    if cause and cause.splitlines()[0] not in line:  # Hydra's "Error merging override x=y": the cause says why
        line = f"{line} ({cause.splitlines()[0]})"
    return line


def _flatten(node: Any, prefix: str = "") -> dict[str, Any]:
    """Dotted paths of every mapping key under ``node`` (plain containers) -> value."""
    out: dict[str, Any] = {}
    if isinstance(node, Mapping):
        for k, v in node.items():
            path = f"{prefix}.{k}" if prefix else str(k)
            out[path] = v
            out.update(_flatten(v, path))
    return out


def _group_settings(config_dir: Path, choices: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """package -> {relative dotted key: value} of every option file of each chosen config group of
    ``config_dir`` (files placed at the global package are left out)."""

    out: dict[str, dict[str, Any]] = {}
    for choice in choices:
        group, _, package = str(choice).partition("@")
        if group.startswith("hydra") or ".." in group:
            continue
        folder = config_dir / group
        if not folder.is_dir():
            continue
        known: dict[str, Any] = {}
        for file in sorted(folder.glob("*.yaml")):
            is_global, flat = _option_file(file)
            if not is_global:
                known.update(flat)
        out[package or group.replace("/", ".")] = known
    return out


def _option_file(file: Path) -> tuple[bool, dict[str, Any]]:
    """Whether a config file is placed at the global package (``# @package _global_``), and its dotted
    keys -> raw values (none for a file that does not load: a broken option file is Hydra's to report)."""
    from omegaconf import OmegaConf

    is_global = "@package _global_" in file.read_text(encoding="utf-8", errors="replace")[:2000]
    try:
        return is_global, _flatten(OmegaConf.to_container(OmegaConf.load(file), resolve=False))
    except Exception:  # noqa: BLE001
        return is_global, {}


def _required_keys(
    config_dir: Path, config_name: str, choices: Mapping[str, Any], group_overrides: Sequence[str]
) -> list[str]:
    """The keys a chosen file of ours leaves required (``???``) as the last of our files to set them, at their
    place in the composed config. Hydra does not require them: merging ``???`` over a value an earlier config
    set (verl's default for ``trainer.default_local_dir``, a schema's default, ``configs/pipeline.yaml``'s
    ``run_dir`` under a paper experiment) keeps that value, so a recipe's ``???`` would be silently ignored;
    a file merged later that sets the key (a recipe filling a group's ``???``) makes it not required. Where
    every file of ours that sets a key says ``???`` no order is needed; a key some set and others leave
    ``???`` is decided by Hydra's merge order (its defaults list, computed only then). Called with Hydra
    initialised on ``config_dir``."""
    values: dict[str, list[Any]] = {}
    files = [(config_dir / f"{config_name}.yaml", "")]
    for choice, option in choices.items():
        group, _, package = str(choice).partition("@")
        if group.startswith("hydra") or ".." in group or not isinstance(option, str):
            continue
        files.append((config_dir / group / f"{option}.yaml", package or group.replace("/", ".")))
    for file, where in files:
        if not file.is_file():
            continue
        is_global, flat = _option_file(file)
        for key, value in flat.items():
            if not key.startswith("defaults"):
                values.setdefault(key if is_global or not where else f"{where}.{key}", []).append(value)
    mixed = {key for key, found in values.items() if "???" in found and any(v != "???" for v in found)}
    last = _last_settings(config_dir, config_name, group_overrides) if mixed else {}
    return [
        key
        for key, found in values.items()
        if (key in mixed and last.get(key) == "???") or (key not in mixed and all(v == "???" for v in found))
    ]


def _last_settings(config_dir: Path, config_name: str, group_overrides: Sequence[str]) -> dict[str, Any]:
    """Each key's value in the last file of ours that sets it, in Hydra's merge order (its defaults list)."""
    from hydra.core.global_hydra import GlobalHydra
    from hydra.types import RunMode

    loader = GlobalHydra.instance().config_loader()
    last: dict[str, Any] = {}
    for item in loader.compute_defaults_list(config_name, list(group_overrides), RunMode.RUN).defaults:
        path = item.config_path or ""
        if path.startswith("hydra/") or ".." in path or not (file := config_dir / f"{path}.yaml").is_file():
            continue  # Hydra's own, verl's, a registered schema: not a file of ours
        for key, value in _option_file(file)[1].items():
            if not key.startswith("defaults"):
                last[f"{item.package}.{key}" if item.package else key] = value
    return last


def _lookup(cfg: Any, key: str) -> Any:
    from omegaconf import OmegaConf
    from omegaconf.errors import MissingMandatoryValue

    try:
        value = OmegaConf.select(cfg, key, default=_ABSENT, throw_on_missing=True, throw_on_resolution_failure=False)
    except MissingMandatoryValue:  # `???`: there, no type
        return "???"
    except Exception:  # noqa: BLE001  (an odd key: treat as absent)
        return _ABSENT
    if value is _ABSENT:  # there, but its interpolation does not resolve yet (`out_dir: outputs/sft/${sft.name}`
        return _written(cfg, key)  # while model.path is unset): the value as written
    return value


def _written(cfg: Any, key: str) -> Any:
    """The node at ``key`` as written (an interpolation unresolved), or ``_ABSENT`` where there is none."""
    from omegaconf import OmegaConf

    node = cfg
    for part in key.split("."):
        if not OmegaConf.is_dict(node):
            return _ABSENT
        try:
            node = node._get_node(part)
        except Exception:  # noqa: BLE001  (no such key)
            return _ABSENT
        if node is None:
            return _ABSENT
    return node if OmegaConf.is_config(node) else node._value()


def _type_error(key: str, default: Any, value: Any) -> str | None:
    from omegaconf import OmegaConf

    if value is None or default is None or default is _ABSENT or (isinstance(default, str) and default == "???"):
        return None
    if isinstance(default, bool):
        kind: type | None = bool
    elif isinstance(default, int):
        # a default of 0 is how YAML files write a number that is off (verl: `entropy_coeff: 0`
        # for a float field); only a non-zero integer default asks for an integer
        kind = int if default != 0 else float
    elif isinstance(default, float):
        kind = float
    elif OmegaConf.is_dict(default) or isinstance(default, Mapping):
        kind = dict
    elif isinstance(default, str):
        if OmegaConf.is_config(value) or isinstance(value, (Mapping, list)):
            return f"{key} must be a single value (a string), got {_describe(value)}"
        return None
    else:
        return None
    if _is_kind(value, kind):
        return None
    return f"{key} must be {_KINDS[kind]}, got {_describe(value)}"


def _suggest(reference: Any, groups: Mapping[str, Mapping[str, Any]], parent: str, name: str) -> str:
    """The real settings nearest to ``parent.name``: same name deeper down, or close spellings."""
    from omegaconf import OmegaConf

    paths = {f"{package}.{k}" for package, known in groups.items() for k in known}
    paths = {p for p in paths if not parent or p.startswith(parent + ".")}
    node = reference if not parent else _lookup(reference, parent)
    if OmegaConf.is_dict(node):
        paths |= {f"{parent}.{p}" if parent else p for p in _flatten(OmegaConf.to_container(node, resolve=False))}
    same = sorted(p for p in paths if p.endswith("." + name) or p == name)[:4]
    if same:
        return f"did you mean {' or '.join(same)}?"
    siblings = sorted(k.rpartition(".")[2] for k in paths if k.rpartition(".")[0] == parent)
    close = difflib.get_close_matches(name, siblings, n=3)
    if close:
        return f"did you mean {' or '.join(f'{parent}.{c}' if parent else c for c in close)}?"
    return f"{parent or 'the config'} has: {', '.join(siblings[:30])}"


def _new_key(
    key: str,
    reference: Any,
    groups: Mapping[str, Mapping[str, Any]],
    open_keys: Sequence[str],
    closed: Callable[[str], bool] | None,
) -> tuple[bool, Any]:
    """Whether ``+key`` may be added; and the type-giving value a shipped option file sets for it."""
    from omegaconf import OmegaConf

    for package, known in groups.items():
        if key.startswith(package + ".") and key[len(package) + 1 :] in known:
            return True, known[key[len(package) + 1 :]]
    if any(key == k or key.startswith(k + ".") for k in open_keys):
        return True, _ABSENT
    if closed is not None and not closed(key):
        return True, _ABSENT
    parts = key.split(".")
    for i in range(len(parts) - 1, -1, -1):
        parent = ".".join(parts[:i])
        node = reference if not parent else _lookup(reference, parent)
        if node is _ABSENT:
            continue
        if node is None or (OmegaConf.is_dict(node) and len(node) == 0) or not OmegaConf.is_dict(node):
            return True, _ABSENT  # a free-form (empty or null) node, or one Hydra itself will refuse
        return False, (parent, parts[i])
    return False, ("", parts[0])


def _typed_example(cfg: Any, key: str) -> Any:
    """A value of the type the node at ``key`` declares (a registered schema's ``int | None`` field
    holds None by default but refuses ``abc``; an ``int`` field holding 0 refuses 1.5), or None where
    it declares none."""
    from omegaconf import OmegaConf
    from omegaconf.nodes import BooleanNode, FloatNode, IntegerNode

    parent, _, name = key.rpartition(".")
    node = cfg if not parent else _lookup(cfg, parent)
    if not OmegaConf.is_dict(node):
        return None
    try:
        child = node._get_node(name)
    except Exception:  # noqa: BLE001  (no such node)
        return None
    examples = {IntegerNode: 1, FloatNode: 1.0, BooleanNode: False}
    return next((v for kind, v in examples.items() if isinstance(child, kind)), None)


def _raw_value(override: Any) -> Any:
    """The value of an override as written (``yes`` stays a string), or ``_ABSENT`` for one that
    interpolates (``${...}``) or sweeps."""
    try:
        value = override.value()
    except Exception:  # noqa: BLE001  (a sweep or an odd value)
        return _ABSENT
    if isinstance(value, str) and "${" in value:
        return _ABSENT
    return value


def _explain(parsed: Sequence[Any], base: Any) -> None:
    """Raise the first type problem of ``parsed`` overrides against the values of ``base`` (the config
    without overrides), in ``check_overrides``' words; nothing if none is found."""
    for override in parsed:
        if override.is_delete() or override.package is not None:
            continue
        default = _typed_example(base, override.key_or_group)  # a registered schema's field: its node's type
        if default is None:  # (not the value: a field may hold null, or 0 in an integer field)
            default = _lookup(base, override.key_or_group)
        if default is _ABSENT:
            continue
        try:
            value = override.value()
        except Exception:  # noqa: BLE001  (a sweep or an odd value: Hydra's message stands)
            continue
        problem = _type_error(override.key_or_group, default, value)
        if problem:
            raise RecallmError(problem)


def _needs_plus(
    values: Sequence[Any],
    reference: Any,
    config_dir: Path,
    open_keys: Sequence[str],
    closed: Callable[[str], bool] | None,
) -> None:
    """A ``key=value`` for a known setting the chosen config does not set (``sft.full.steps`` on a recipe
    that counts epochs): say to add it with ``+``, as the module doc's rule allows."""
    groups = _group_settings(config_dir, dict(reference.hydra.runtime.choices))
    for override in values:
        key = override.key_or_group
        if override.is_add() or override.is_delete() or _lookup(reference, key) is not _ABSENT:
            continue
        allowed, _ = _new_key(key, reference, groups, open_keys, closed)
        if allowed and any(key.startswith(package + ".") and key[len(package) + 1 :] in known for package, known in groups.items()):
            raise RecallmError(
                f"{key} is not set by the chosen config, so Hydra cannot override it: add it with "
                f"+{override.input_line}"
            )


def check_overrides(
    config_name: str,
    overrides: Sequence[str],
    *,
    config_dir: str | Path | None = None,
    open_keys: Sequence[str] = (),
    closed: Callable[[str], bool] | None = None,
    job_name: str | None = None,
    keep_hydra: bool = False,
) -> Any:
    """Compose ``config_name`` with ``overrides`` as Hydra would and check them (module doc); returns
    the composed config (without its ``hydra`` node unless ``keep_hydra``: then with it, as Hydra's run
    would compose it for job ``job_name``, every override recorded in ``hydra.overrides``). A bad
    override, or one Hydra cannot apply, is a one-line ``RecallmError``. ``open_keys``: nodes under
    which any key may be added; ``closed``: the keys the unknown-key rule applies to (default: all).

    Hydra composes once: the defaults tree with the overrides that choose config groups (and Hydra's
    own), which is also the reference each value override is checked against (the value it replaces),
    then the value overrides applied to a copy the way Hydra's ``compose`` applies them
    (``ConfigLoaderImpl._apply_overrides_to_config``, after the same split of the overrides). A line
    with a sweep is composed by Hydra whole (it refuses it)."""
    import copy

    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import HydraException
    from omegaconf import OmegaConf, open_dict
    from omegaconf.errors import OmegaConfBaseException

    from recallm.paths import CONFIG_DIR

    config_dir = Path(config_dir or CONFIG_DIR)
    overrides = list(overrides)
    try:
        parsed = OverridesParser.create().parse_overrides(overrides)
    except HydraException as exc:
        raise RecallmError(f"bad override: {_first_line(exc)}") from None

    def _composed(items: list[str]):
        try:
            return compose(config_name, overrides=items, return_hydra_config=True)
        except (HydraException, OmegaConfBaseException) as exc:
            raise RecallmError(f"bad override: {_first_line(exc)}") from None

    with contextlib.ExitStack() as stack:
        if not GlobalHydra.instance().is_initialized():
            stack.enter_context(
                initialize_config_dir(config_dir=str(config_dir), version_base="1.3", job_name=job_name or "app")
            )
        if any(o.is_sweep_override() for o in parsed):
            _composed(overrides)  # Hydra's own message
            raise RecallmError(f"bad override: a sweep ({', '.join(o.input_line for o in parsed if o.is_sweep_override())})")
        is_group = _group_overrides(config_name, parsed, overrides)
        group_lines = [o.input_line for o, g in zip(parsed, is_group, strict=True) if g]
        reference = _composed(group_lines)
        required = _required_keys(config_dir, config_name, dict(reference.hydra.runtime.choices), group_lines)
        values = [o for o, g in zip(parsed, is_group, strict=True) if not g]
        cfg = copy.deepcopy(reference)
        try:
            _apply_overrides(values, cfg)
        except (HydraException, OmegaConfBaseException) as exc:
            _explain(values, reference)  # a value of the wrong type for a registered schema's field: our words
            _needs_plus(values, reference, config_dir, open_keys, closed)
            raise RecallmError(f"bad override: {_first_line(exc)}") from None
    groups = _group_settings(config_dir, dict(cfg.hydra.runtime.choices))
    for override, group in zip(parsed, is_group, strict=True):
        key = override.key_or_group
        if group or override.is_delete() or override.package is not None:
            continue
        default = _lookup(reference, key)
        if default is _ABSENT:
            allowed, found = _new_key(key, reference, groups, open_keys, closed)
            if not allowed:
                parent, name = found
                where = f"{parent} has no key {name}" if parent else f"there is no setting {name}"
                raise RecallmError(
                    f"unknown setting {key}: {where}, nothing would read it ({_suggest(reference, groups, parent, name)})"
                )
            default = found
        try:
            value = OmegaConf.select(cfg, key, throw_on_missing=False)
        except OmegaConfBaseException as exc:
            raise RecallmError(f"{key}: cannot resolve its value ({_first_line(exc)})") from None
        raw = _raw_value(override)
        if raw is not _ABSENT:  # as written: a schema's typed node has converted `yes` to true already
            value = raw
        problem = _type_error(key, default, value)
        if problem:
            raise RecallmError(problem)
    given = {o.key_or_group for o, g in zip(parsed, is_group, strict=True) if not g}
    for key in required:
        parent, _, leaf = key.rpartition(".")
        node = OmegaConf.select(cfg, parent, default=None) if parent else cfg  # (the leaf itself unresolved)
        if key not in given and OmegaConf.is_dict(node) and leaf in node and not OmegaConf.is_missing(node, leaf):
            with open_dict(node):
                node[leaf] = "???"  # required again: whoever reads it says so (cli_errors: one line naming it)
    if keep_hydra:  # the reference was composed with the group overrides only: record them all, as Hydra does
        from hydra._internal.config_loader_impl import get_overrides_dirname

        task = [o for o in parsed if not o.is_hydra_override()]
        dirname = cfg.hydra.job.config.override_dirname
        with open_dict(cfg.hydra):
            cfg.hydra.overrides.task = [o.input_line for o in task]
            cfg.hydra.overrides.hydra = [o.input_line for o in parsed if o.is_hydra_override()]
            cfg.hydra.job.override_dirname = get_overrides_dirname(
                overrides=task, exclude_keys=list(dirname.exclude_keys), item_sep=dirname.item_sep, kv_sep=dirname.kv_sep
            )
        return cfg
    with open_dict(cfg):
        cfg.pop("hydra", None)
    return cfg
