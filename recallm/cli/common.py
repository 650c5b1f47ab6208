"""The one way a Hydra command of the project reads its command line: ``hydra_command``.

    main = hydra_command("pipeline", run, check=check, flags={"--status": "which jobs are done"})

What every such command does, in this order:

1. ``SUBCOMMAND ARGS...`` for a word in ``subcommands`` hands the rest of the line to that function
   (things that are not a run of this config: ``recallm-grpo plot``, ``recallm-rlm train``).
2. A first word in ``modes`` becomes the override ``mode=WORD`` (``recallm-rlm show``); ``positional``
   names the setting a mode's next bare word sets (``recallm-rlm show PATH`` -> ``trajectory=PATH``).
3. The command's own ``flags`` (``--status``) are taken off the line and passed to ``run`` as
   keyword arguments (``status=True``); they are not settings. A flag of ``looking`` (``--status``,
   ``--dry-run``: the command only looks) runs ``run`` without Hydra's output directory (step 5), so it
   writes nothing.
4. The overrides are composed the way Hydra will and checked (``recallm.config.check_overrides``:
   the type of each override against the default it replaces, settings nothing reads), then the
   command's own ``check(cfg)`` (required values, ranges, kinds of path). A mistake is one
   ``error: ...`` line on stderr and exit code 2 — before Hydra creates its output directory, so
   nothing at all is written. Lines with Hydra's own flags (``--help``, ``--cfg``, ``-m``, ...) go
   to Hydra unchecked.
5. Hydra's run of the job (its output directory, ``.hydra/`` files, logging) calls ``run(cfg, **flags)``
   with the config step 4 composed and checked — the one composition of the command (a line with Hydra's
   own flags, ``--cfg``, ``--help``, is Hydra's own ``main``); or, with ``hydra_run=False``,
   ``run(cfg, **flags)`` is called directly with that config, no output directory (``recallm-grpo``
   and ``recallm-rlm train``, which hand it to verl's own trainer; Hydra's own flags are not theirs).
   A non-zero integer from ``run`` is the exit code.

The config tree is ``recallm.paths.CONFIG_DIR`` (the source checkout's ``configs/`` or the copy a
wheel carries). Commands that take no config tree use ``argparse`` and say why in their module doc.
"""

from __future__ import annotations

import logging
import re
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from recallm.errors import EXIT_USAGE, cli_errors

__all__ = ["hydra_command", "precheck"]


@cli_errors
def precheck(
    config_name: str,
    argv: Sequence[str],
    check: Callable[[Any], None] | None = None,
    *,
    open_keys: Sequence[str] = (),
    closed: Callable[[str], bool] | None = None,
    job_name: str | None = None,
) -> Any:
    """Check a command line (module doc, step 4); returns the composed config. With ``job_name``, the
    config keeps its ``hydra`` node, as Hydra's run composes it for that job (``check`` sees it without)."""
    from omegaconf import open_dict

    from recallm.config import check_overrides

    cfg = check_overrides(config_name, argv, open_keys=open_keys, closed=closed, job_name=job_name,
                          keep_hydra=job_name is not None)  # fmt: skip
    if check is not None:
        task = cfg
        if job_name is not None:
            task = cfg.copy()
            with open_dict(task):
                task.pop("hydra", None)
        check(task)
    if job_name is not None:  # Hydra's run directory (after the command's own checks: it is often under out_dir)
        from recallm.io import check_out_dir

        check_out_dir(str(cfg.hydra.run.dir), "hydra.run.dir")
    return cfg


def _quote(value: str) -> str:
    if re.fullmatch(r"[\w./~:+-]+", value):
        return value
    return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"


def rewrite_argv(
    argv: Sequence[str], modes: Sequence[str] = (), positional: Mapping[str, str] | None = None
) -> list[str]:
    """``MODE [VALUE] overrides...`` -> ``mode=MODE [KEY=VALUE] overrides...`` (module doc, step 2)."""
    args = list(argv)
    if args and args[0] in modes:
        mode = args.pop(0)
        key = (positional or {}).get(mode)
        if key and args and "=" not in args[0] and not args[0].startswith("-"):
            args[0] = f"{key}={_quote(args[0])}"
        args.insert(0, f"mode={mode}")
    return args


def hydra_command(
    config_name: str,
    run: Callable[..., Any],
    *,
    check: Callable[[Any], None] | None = None,
    open_keys: Sequence[str] = (),
    closed: Callable[[str], bool] | None = None,
    flags: Mapping[str, str] | None = None,
    modes: Sequence[str] = (),
    positional: Mapping[str, str] | None = None,
    subcommands: Mapping[str, Callable[[list[str]], int]] | None = None,
    quiet: Sequence[str] = ("transformers",),
    quiet_level: int = logging.WARNING,
    hydra_run: bool = True,
    looking: Sequence[str] = (),
) -> Callable[[list[str] | None], int | None]:
    """The ``main`` of a console script that runs ``configs/<config_name>.yaml`` (module doc).

    ``flags``: the command's own ``--flag``s (name -> help), passed to ``run`` as booleans; ``looking``: those of
    them with which the command only looks (no Hydra output directory is written);
    ``quiet``: loggers turned down to ``quiet_level`` while it runs."""
    flags = dict(flags or {})
    command = sys._getframe(1).f_globals.get("__name__", run.__module__)  # the recallm.cli module defining main

    def main(argv: list[str] | None = None) -> int | None:
        from recallm.cli.schemas import register

        register()  # the config schemas the shipped YAML puts under its sections
        args = list(sys.argv[1:] if argv is None else argv)
        if subcommands and args[:1] and args[0] in subcommands:
            return _exit(subcommands[args[0]](args[1:]))
        args = rewrite_argv(args, modes, positional)
        if "--help" in args or "-h" in args:  # the command's own help: its groups and main keys (below)
            return _exit(_help(config_name, [a for a in args if a not in ("--help", "-h")], command, flags, subcommands))
        given = {name[2:].replace("-", "_"): name in args for name in flags}
        args = [a for a in args if a not in flags]
        if not hydra_run or any(given[name[2:].replace("-", "_")] for name in looking):  # composed once, run as is
            return _exit(run(precheck(config_name, args, check, open_keys=open_keys, closed=closed), **given))
        if any(arg.startswith("-") for arg in args):  # Hydra's own flags: Hydra's own run
            return _run_hydra(config_name, args, run, given, quiet, quiet_level, command)
        job = _job_name(run)
        cfg = precheck(config_name, args, check, open_keys=open_keys, closed=closed, job_name=job)
        return _run_composed(cfg, job, run, given, quiet, quiet_level)

    main.__doc__ = f"recallm command on configs/{config_name}.yaml" + "".join(
        f"; {name}: {text}" for name, text in flags.items()
    )
    return main


def _exit(code: Any) -> int | None:
    if isinstance(code, int) and not isinstance(code, bool) and code:
        sys.exit(code)
    return 0


def _prog_and_about(command: str) -> tuple[str, str]:
    module = sys.modules.get(command)
    command = _module_name(command)
    prog = "recallm-" + command.rsplit(".", 1)[-1].replace("_", "-")
    about = " ".join(((module.__doc__ if module else None) or "").split("\n\n")[0].split()).replace("`", "")
    return prog, about or prog


def _defaults_groups(file: Path) -> list[tuple[str, str | None, str]]:
    """(group, default option, the section it fills) of a config file's defaults list: its config groups, not schemas or verl's."""
    from omegaconf import OmegaConf

    try:
        defaults = OmegaConf.to_container(OmegaConf.load(file)).get("defaults") or []
    except Exception:  # noqa: BLE001  (no such file: no groups)
        return []
    out = []
    for item in defaults:
        if not isinstance(item, dict):
            continue
        (key, value), *_ = item.items()
        group, _, package = str(key).removeprefix("override ").strip().lstrip("/").partition("@")
        if group and not group.startswith(("schema", "hydra")):
            out.append((group, None if value is None else str(value), package.removeprefix("_global_.") or group))
    return out


def _flat(node: Any, prefix: str = "", depth: int = 99) -> list[tuple[str, Any]]:
    """(dotted key, value) of every leaf under ``node``; mappings ``depth`` levels down are one entry."""
    from omegaconf import OmegaConf

    if not OmegaConf.is_dict(node):
        return [(prefix, node)]
    out: list[tuple[str, Any]] = []
    for key in node.keys():
        child = node._get_node(key)
        path = f"{prefix}.{key}" if prefix else str(key)
        if OmegaConf.is_dict(child) and depth <= 1:
            out.append((path, f"{{{len(child)} keys: {path}.<key>=... sets one}}"))
        elif OmegaConf.is_dict(child):
            out += _flat(child, path, depth - 1)
        else:
            out.append((path, OmegaConf.to_container(child, resolve=False) if OmegaConf.is_list(child) else child._value()))
    return out


def _raw(cfg: Any, path: str) -> Any:
    """The value at ``path`` as written (an interpolation unresolved)."""
    from omegaconf import OmegaConf

    parent, _, key = path.rpartition(".")
    node = OmegaConf.select(cfg, parent, default=None) if parent else cfg
    if not OmegaConf.is_dict(node) or key not in node:
        return None
    child = node._get_node(key)
    return OmegaConf.to_container(child, resolve=False) if OmegaConf.is_config(child) else child._value()


def _choices(config_name: str, args: list[str]) -> dict[str, str]:
    """The option each config group ends up with, the line's and the recipes' ``override``s applied."""
    import contextlib

    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    from recallm.paths import CONFIG_DIR

    with contextlib.ExitStack() as stack:
        if not GlobalHydra.instance().is_initialized():
            stack.enter_context(initialize_config_dir(config_dir=str(CONFIG_DIR), version_base="1.3"))
        cfg = compose(config_name, overrides=args, return_hydra_config=True)
    return {str(k): str(v) for k, v in cfg.hydra.runtime.choices.items() if v is not None}


def _help(
    config_name: str,
    args: list[str],
    command: str,
    flags: Mapping[str, str],
    subcommands: Mapping[str, Any] | None,
) -> int:
    """``--help`` of a Hydra command: what it does, its config groups (the options, the default marked) and
    its main keys with their values (the command's own keys and the chosen recipe's), from the config the
    rest of the line composes; ``--cfg job`` (``--print-config``) prints the whole of it."""
    from omegaconf import OmegaConf

    from recallm.config import check_overrides
    from recallm.errors import RecallmError
    from recallm.paths import CONFIG_DIR

    prog, about = _prog_and_about(command)
    lines = [about if about.startswith(prog) else f"{prog}: {about}", "", f"usage: {prog} [group=option ...] [key=value ...]" + "".join(f" [{f}]" for f in flags)]
    lines += [f"       {prog} {name} ..." for name in subcommands or {}]
    try:
        cfg = check_overrides(config_name, args)
    except RecallmError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    choices: dict[str, Any] = {}
    primary = CONFIG_DIR / f"{config_name}.yaml"
    groups = _defaults_groups(primary)
    for group, option, _ in list(groups):  # a recipe's own groups (grpo's platform)
        groups += [g for g in _defaults_groups(CONFIG_DIR / group / f"{option}.yaml") if g not in groups]
    chosen = {g: o for g, o, _ in groups}
    sections = {g: section for g, _, section in groups}
    chosen.update({g: o for g, o in _choices(config_name, args).items() if g in chosen})  # as composed
    seen = set()
    for group, _, _ in groups:
        folder = CONFIG_DIR / group
        if group in seen or not folder.is_dir():
            continue
        seen.add(group)
        options = sorted(f.stem for f in folder.glob("*.yaml"))
        choices[group] = ", ".join(f"[{o}]" if o == chosen.get(group) else o for o in options)
    if choices:
        lines += ["", "config groups (group=option; [the one chosen]):"]
        lines += [f"  {group}: {options}" for group, options in choices.items()]
    keys: list[tuple[str, Any]] = []
    own = OmegaConf.load(primary) if primary.is_file() else OmegaConf.create()
    own_keys = {k for k, _ in _flat(own) if not k.startswith(("defaults", "hydra"))}
    verl_tree = "ppo_trainer" in str(own.get("defaults"))  # verl's own config: only the keys our files set
    for key in cfg.keys():  # the command's own keys; a group's section is listed under its group below
        child = cfg._get_node(key)
        if key in sections.values() or key in ("hydra", "defaults"):
            continue
        if OmegaConf.is_dict(child):
            keys += [(k, v) for k, v in _flat(child, str(key)) if k in own_keys]
        elif not verl_tree or key in own_keys:
            keys.append((str(key), child._value()))
    for group, option in chosen.items():  # the chosen recipe's keys
        file = CONFIG_DIR / group / f"{option}.yaml"
        if "/" in group or not file.is_file():
            continue
        if "@package _global_" in file.read_text()[:2000]:  # a recipe that sets keys all over (grpo's)
            for path, _ in _flat(OmegaConf.load(file)):
                if not path.startswith("defaults"):
                    keys.append((path, _raw(cfg, path)))
        elif OmegaConf.is_dict(node := OmegaConf.select(cfg, sections[group], default=None)):
            keys += _flat(node, sections[group], depth=2)
    if keys:
        lines += ["", "main keys (key=value overrides any of them; the values the line above composes):"]
        seen_keys = set()
        for key, value in keys:
            if key in seen_keys:
                continue
            seen_keys.add(key)
            shown = OmegaConf.to_container(value) if OmegaConf.is_config(value) else value
            if isinstance(shown, list) and any(isinstance(v, dict) for v in shown):
                shown = f"[{len(shown)} entries: {key}.0.<key>=... sets one]"
            lines.append(f"  {key}: {'null' if shown is None else shown}")
    whole = "--print-config" if "--print-config" in flags else "--cfg job"
    lines += ["", f"{prog} ... {whole} prints the whole composed config; README.md documents each command."]
    print("\n".join(lines))
    return 0


def _help_header(command: str) -> list[str]:
    """Overrides that make ``--help`` open with the command's name and what it does (the first
    paragraph of its module's doc) instead of Hydra's "app is powered by Hydra"."""
    prog, about = _prog_and_about(command)
    return [f"hydra.help.app_name={prog}", f"hydra.help.header={_quote(about)}"]


def _module_name(module: str) -> str:
    """``module``'s importable name: ``__main__`` under ``python -m recallm.cli.sft`` is ``recallm.cli.sft``."""
    if module == "__main__":
        return getattr(getattr(sys.modules.get("__main__"), "__spec__", None), "name", None) or module
    return module


def _job_name(run: Callable[..., Any]) -> str:
    """The name Hydra gives the job (its log file, ``hydra.job.name``): the module defining ``run``."""
    return _module_name(run.__module__).rsplit(".", 1)[-1]


def _task(
    run: Callable[..., Any], given: dict[str, bool], quiet: Sequence[str], level: int, result: dict[str, Any]
) -> Callable[[Any], None]:
    """The task function Hydra runs: ``run`` with the command's flags and loggers turned down, its exit code
    in ``result["code"]``; a refused run (exit 2) removes Hydra's run directory (nothing written)."""

    def task(cfg) -> None:
        for name in quiet:
            logging.getLogger(name).setLevel(level)
        try:
            result["code"] = run(cfg, **given)
        except SystemExit as exc:
            if exc.code == EXIT_USAGE:  # refused: nothing written, not even Hydra's own run directory
                _remove_hydra_dir()
            raise

    return task


def _run_composed(
    cfg: Any, job: str, run: Callable[..., Any], given: dict[str, bool], quiet: Sequence[str], level: int
) -> int | None:
    """Hydra's run of a job (its output directory, ``.hydra/`` files, logging, callbacks) on the config
    step 4 composed and checked, so the command composes it once: what ``hydra.main`` does after its own
    composition (``hydra._internal.hydra.Hydra.run``, Hydra 1.3)."""
    from hydra import initialize_config_dir
    from hydra._internal.callbacks import Callbacks
    from hydra.core.global_hydra import GlobalHydra
    from hydra.core.utils import configure_log, run_job
    from hydra.types import HydraContext, RunMode
    from omegaconf import open_dict

    from recallm.paths import CONFIG_DIR

    result: dict[str, Any] = {}
    task = _task(run, given, quiet, level, result)
    _make_run_dir(str(cfg.hydra.run.dir))
    with open_dict(cfg.hydra):
        cfg.hydra.mode = RunMode.RUN
    configure_log(cfg.hydra.hydra_logging, cfg.hydra.verbose)
    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base="1.3", job_name=job):
        callbacks = Callbacks(cfg)
        callbacks.on_run_start(config=cfg, config_name=cfg.hydra.job.config_name)
        context = HydraContext(config_loader=GlobalHydra.instance().config_loader(), callbacks=callbacks)
        ret = run_job(task_function=task, config=cfg, job_dir_key="hydra.run.dir", job_subdir_key=None,
                      hydra_context=context)  # fmt: skip
        callbacks.on_run_end(config=cfg, config_name=cfg.hydra.job.config_name, job_return=ret)
        _ = ret.return_value  # the run's exception, if it raised one
    return _exit(result.get("code"))


@cli_errors
def _make_run_dir(run_dir: str) -> None:
    """Create Hydra's run directory (Hydra would, with a traceback where it cannot: under ``/proc``, in a
    read-only place): one line naming ``hydra.run.dir`` instead."""
    from recallm.errors import RecallmError

    try:
        Path(run_dir).mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise RecallmError(
            f"hydra.run.dir={run_dir} cannot be created ({exc.strerror}): give a directory you can write, or "
            "leave hydra.run.dir at its default"
        ) from None


def _remove_hydra_dir() -> None:
    """Remove this invocation's Hydra output directory (``.../hydra/<time stamp>``), then the
    directories above it that are left empty (``hydra/``, an ``out_dir`` Hydra created, ``outputs/``),
    up to the working directory."""
    import shutil

    from hydra.core.hydra_config import HydraConfig

    try:
        out = Path(HydraConfig.get().runtime.output_dir)
    except (ValueError, AttributeError):
        return
    for logger in (logging.getLogger(), *[logging.getLogger(n) for n in list(logging.root.manager.loggerDict)]):
        for handler in list(getattr(logger, "handlers", [])):  # the job's log file, opened by Hydra
            if isinstance(handler, logging.FileHandler) and Path(handler.baseFilename).is_relative_to(out.resolve()):
                logger.removeHandler(handler)
                handler.close()
    shutil.rmtree(out, ignore_errors=True)
    cwd = Path.cwd().resolve()
    for parent in out.parents:
        if (
            parent.resolve() == cwd
            or cwd.is_relative_to(parent.resolve())
            or not parent.is_dir()
            or any(parent.iterdir())
        ):
            break
        parent.rmdir()


def _run_hydra(
    config_name: str,
    args: list[str],
    run: Callable[..., Any],
    given: dict[str, bool],
    quiet: Sequence[str],
    level: int,
    command: str,
) -> int | None:
    import hydra

    from recallm.paths import CONFIG_DIR

    result: dict[str, Any] = {}
    task = _task(run, given, quiet, level, result)
    task.__module__ = _module_name(run.__module__)  # Hydra names the job after the calling module (`sft`, ...)
    if "--help" in args or "-h" in args:  # Hydra's help would name the app `app` ("app is powered by Hydra")
        args = [*args, *_help_header(command)]
    saved = sys.argv
    sys.argv = [saved[0], *args]
    try:
        hydra.main(config_path=str(CONFIG_DIR), config_name=config_name, version_base="1.3")(task)()
    finally:
        sys.argv = saved
    return _exit(result.get("code"))
