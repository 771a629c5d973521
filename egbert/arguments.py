"""The front door of every command: one argparse parser class, and parsers generated from the
jobs' option dataclasses (`TrainingArguments`, `ModelArguments`, ...).

What every command gets from it:
- kebab-case options (`--train-files`); the underscore spelling (`--train_files`) still works
  and is left out of --help;
- booleans as `--flag` / `--no-flag`, with `--flag true|false` also accepted;
- `--config FILE`: a YAML/JSON mapping of option names to values, under the command line;
- `--print-config`: print the resolved options as YAML (a file for --config) and exit, each
  line with a comment naming where its value came from: the option's default, the recipe (its
  file and stage), the --config file, or the command line;
- an unknown option answered with a usage line and one error line naming it and, where one is
  close, the option meant (exit code 2, no traceback).

Dataclass commands are parsed once, with every default in place before the command line is read:
the dataclass's own, under the job's recipe (`egbert.config.load_recipe`: the family's defaults
for the stage), under the --config file, under the command line. So --help shows the values
really used, and each dataclass validates the options it will run with.
"""

from __future__ import annotations

import argparse
import dataclasses
import difflib
import json
import math
import sys
import types
import typing
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import yaml

from egbert.errors import ConfigError

CONFIG_HELP = "YAML or JSON file of options (option or field names); the command line overrides it"
PRINT_CONFIG_HELP = (
    "print the resolved options as YAML (a file for --config) and exit; a comment on each line "
    "says where its value came from (default, recipe, config file or command line)"
)
# Two of the sources of a value, as --print-config names them (the others: a recipe file, the
# --config file).
COMMAND_LINE = "command line"
DEFAULT = "default"
TRUE_WORDS, FALSE_WORDS = ("true", "yes", "1", "on"), ("false", "no", "0", "off")


def str_to_bool(value: str) -> bool:
    word = str(value).lower()
    if word in TRUE_WORDS or word in FALSE_WORDS:
        return word in TRUE_WORDS
    raise argparse.ArgumentTypeError(f"give true or false, not {value!r}")


class BooleanFlag(argparse.Action):
    """A boolean option: `--flag`, `--flag true|false` and `--no-flag`."""

    def __init__(self, option_strings, dest, default=False, required=False, help=None):
        negatives = [f"--no-{name[2:]}" for name in option_strings if name.startswith("--")]
        super().__init__(
            [*option_strings, *negatives],
            dest,
            nargs="?",
            type=str_to_bool,
            default=default,
            required=required,
            help=help,
            metavar="BOOL",
        )

    def __call__(self, parser, namespace, values, option_string=None) -> None:
        value = True if values is None else values
        negative = option_string is not None and option_string.startswith("--no-")
        setattr(namespace, self.dest, not value if negative else value)


class HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """Descriptions and epilogs as written; each option once, with its aliases and the default
    it really has."""

    def _format_action_invocation(self, action: argparse.Action) -> str:
        if not action.option_strings:
            return super()._format_action_invocation(action)
        names = ", ".join(action.option_strings)
        if action.nargs == 0 or isinstance(action, BooleanFlag):
            return names
        metavar = self._format_args(action, self._get_default_metavar_for_optional(action))
        return f"{names} {metavar}"

    def _get_help_string(self, action: argparse.Action) -> str:
        help_text = action.help or ""
        note = getattr(action, "default_note", None)  # e.g. "depends on --model: ..."
        shown = action.default not in (None, argparse.SUPPRESS) and not action.required
        said = "%(default)" in help_text or "(default:" in help_text
        if (shown or note) and not said and action.option_strings and action.nargs != 0:
            default = action.default
            if isinstance(default, (list, tuple)):
                default = " ".join(map(str, default)) or "none"
            help_text += f" (default: {str(note or default).replace('%', '%%')})"
        return help_text


class ArgumentParser(argparse.ArgumentParser):
    """argparse with egbert's conventions (see the module's docstring)."""

    def __init__(
        self,
        prog: str,
        *,
        config: bool = True,
        hints: dict[str, str] | None = None,
        **kwargs: Any,
    ) -> None:
        kwargs.setdefault("formatter_class", HelpFormatter)
        # no prefixes: `--train-file` must not quietly mean --train-files (run_mlm.py's names
        # are aliases or hints, spelled out)
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(prog=prog, **kwargs)
        # Options of other tools (run_mlm.py's) that this command lacks: what to use instead.
        self.hints = hints or {}
        # What --print-config still needs (the options the defaults depend on).
        self.print_needs: tuple[str, ...] = ()
        # Where each option's value comes from, by dest, for --print-config: the sources of the
        # defaults set (a recipe, a --config file), then the options on the command line.
        self.sources: dict[str, str] = {}
        self.given: set[str] = set()
        if config:
            self.add_argument("--config", metavar="FILE", help=CONFIG_HELP)
            self.add_argument(
                "--print-config", action="store_true", default=False, help=PRINT_CONFIG_HELP
            )

    # ---------------------------------------------------------------- parsing

    def parse_args(self, args: Sequence[str] | None = None, namespace=None) -> argparse.Namespace:
        namespace, extras = self.parse_known_args(args, namespace)
        if extras:
            self.error(self.unrecognized(extras))
        for name in ("config", "print_config"):  # done with: the options alone go on
            if hasattr(namespace, name):
                delattr(namespace, name)
        return namespace

    def parse_known_args(self, args: Sequence[str] | None = None, namespace=None):
        args = self.normalize(list(sys.argv[1:] if args is None else args))
        if "--config" in self._option_string_actions:
            self.apply_early_defaults(args)
        self.check_known(args)
        namespace, extras = super().parse_known_args(args, namespace)
        owns_print = "--print-config" in self._option_string_actions  # not a subcommand's
        if owns_print and getattr(namespace, "print_config", False):
            options = self.resolved_options(namespace)
            print(annotated_yaml(options, {dest: self.source_of(dest) for dest in options}), end="")
            self.exit(0)
        return namespace, extras

    def source_of(self, dest: str) -> str:
        """Where the value of option `dest` came from (see the module's docstring)."""
        return COMMAND_LINE if dest in self.given else self.sources.get(dest, DEFAULT)

    def check_known(self, args: list[str]) -> None:
        """An unknown option is the error to report first, before a missing required one; with
        --print-config, only the options the defaults depend on stay required (the others
        print as null)."""
        required = [action for action in self._actions if action.required]
        for action in required:
            action.required = False
        # Every option starts unset, so that those the command line gives are told apart.
        unset = _Unset()
        dests = [action.dest for action in self._actions if action.dest != argparse.SUPPRESS]
        namespace = argparse.Namespace(**dict.fromkeys(dests, unset))
        try:
            _, extras = super().parse_known_args(args, namespace)
        finally:
            printing = "--print-config" in args and "--print-config" in self._option_string_actions
            for action in required:
                action.required = not printing or action.dest in self.print_needs
        if extras:
            self.error(self.unrecognized(extras))
        self.given = {dest for dest, value in vars(namespace).items() if value is not unset}

    def normalize(self, args: list[str]) -> list[str]:
        """The underscore spellings (`--train_files`, `--no_nsp`) as their kebab-case option."""
        normalized = []
        for index, arg in enumerate(args):
            if arg == "--":
                return normalized + args[index:]
            name, equals, value = arg.partition("=")
            kebab = name.replace("_", "-")
            known = self._option_string_actions
            if name.startswith("--") and name not in known and kebab in known:
                arg = kebab + equals + value
            normalized.append(arg)
        return normalized

    def apply_early_defaults(self, args: list[str]) -> None:
        """Set the defaults before the command line is read: the --config file's values."""
        self.apply_defaults(*self.config_file_values(args))

    def config_file_values(self, args: list[str]) -> tuple[dict[str, Any], str]:
        """The --config file's values by dest (none without one), and the file as a source."""
        pre = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
        pre.add_argument("--config")
        known, _ = pre.parse_known_args(args)
        if not known.config:
            return {}, "config file"
        path = Path(known.config)
        source = f"config file {path}"
        return self.converted(read_config_file(path), source), source

    def converted(self, values: dict[str, Any], source: str) -> dict[str, Any]:
        """`values` (keyed by option or field name) by dest, each converted as if typed on the
        command line (YAML reads `1e-3` as a string)."""
        actions = self.actions_by_name()
        unknown = sorted(set(values) - set(actions) - {"config", "print_config"})
        if unknown:
            hints = {name: self._hint(name) for name in unknown}
            hinted = "; ".join(f"{name}: {hint}" for name, hint in hints.items() if hint)
            raise ConfigError(
                f"{source}: unknown option(s) {', '.join(unknown)}"
                + (f" ({hinted})" if hinted else "")
            )
        return {
            actions[name].dest: _convert(actions[name], value, source)
            for name, value in values.items()
            if name in actions
        }

    def apply_defaults(self, values: dict[str, Any], source: str | dict[str, str]) -> None:
        """Make `values` (by dest) the defaults; an option with a value is no longer required.
        `source`: where they come from (for --print-config), one for all or one per dest."""
        for action in self._actions:
            if values.get(action.dest) is not None:
                action.required = False
        self.set_defaults(**values)
        for dest in values:
            self.sources[dest] = source if isinstance(source, str) else source[dest]

    def resolved_options(self, namespace: argparse.Namespace) -> dict[str, Any]:
        """The options as --print-config writes them: by dest, YAML-safe."""
        skip = {"config", "print_config", "help"}
        dests = {action.dest for action in self._actions} - skip
        return {dest: _plain(getattr(namespace, dest)) for dest in sorted(dests, key=self._order)}

    # ---------------------------------------------------------------- errors

    def unrecognized(self, extras: list[str]) -> str:
        options = [arg for arg in extras if arg.startswith("-")]
        if not options:
            return f"unexpected argument {extras[0]!r}"
        name = options[0].partition("=")[0]
        hint = self._hint(name)
        if hint:
            return f"unrecognized option {name} ({hint})"
        # egbert's own names first: an alias (`--learning-rate`) only where none is close
        meant = suggestion(name, self._visible_option_strings(canonical=True)) or suggestion(
            name, self._visible_option_strings()
        )
        return f"unrecognized option {name}" + (f" (did you mean {meant}?)" if meant else "")

    def _hint(self, name: str) -> str | None:
        """What to use instead of another tool's option `name` (any spelling), if known."""
        return self.hints.get("--" + name.lstrip("-").replace("_", "-"))

    def format_usage(self) -> str:
        self.usage = self._short_usage()
        return super().format_usage()

    def format_help(self) -> str:
        self.usage = self._short_usage()
        return super().format_help()

    def _short_usage(self) -> str | None:
        """One line: the positional arguments, the required options, then [options]
        (argparse's lists every option)."""
        if any(isinstance(action, argparse._SubParsersAction) for action in self._actions):
            return None  # subcommands: argparse's own usage line names them
        positional = [a.metavar or a.dest for a in self._actions if not a.option_strings]
        required = [
            f"{action.option_strings[0]} {action.metavar or action.dest.upper()}"
            for action in self._actions
            if action.required and action.option_strings
        ]
        return " ".join(["%(prog)s", *positional, *required, "[options]"])

    # ---------------------------------------------------------------- helpers

    def actions_by_name(self) -> dict[str, argparse.Action]:
        """Each action by its dest and by its option names in field form (`train_files`)."""
        actions = {}
        for action in self._actions:
            if action.dest == "help":
                continue
            actions[action.dest] = action
            for option in action.option_strings:
                if option.startswith("--") and not option.startswith("--no-"):
                    actions.setdefault(option[2:].replace("-", "_"), action)
        return actions

    def _visible_option_strings(self, canonical: bool = False) -> list[str]:
        """Every long option (`canonical`: each action's first), subcommands' included."""
        parsers = [self] + [
            parser
            for action in self._actions
            if isinstance(action, argparse._SubParsersAction)
            for parser in action.choices.values()
        ]
        return [
            name
            for parser in parsers
            for action in parser._actions
            for name in action.option_strings[: 1 if canonical else None]
            if name.startswith("--")
        ]

    def _order(self, dest: str) -> int:
        return [action.dest for action in self._actions].index(dest)


def suggestion(name: str, options: Sequence[str]) -> str | None:
    """The option `name` most likely meant: a close spelling, else one it extends
    (`--lr-rate`: `--lr`)."""
    words = {option.lstrip("-"): option for option in options}
    word = name.lstrip("-").replace("_", "-")
    close = difflib.get_close_matches(word, list(words), n=1, cutoff=0.6)
    if close:
        return words[close[0]]
    stems = [known for known in words if word.startswith(f"{known}-")]
    return words[max(stems, key=len)] if stems else None


def _convert(action: argparse.Action, value: Any, source: str) -> Any:
    if isinstance(value, list):
        return [_convert(action, item, source) for item in value]
    if isinstance(value, str) and action.type is not None:
        try:
            value = action.type(value)
        except (ValueError, TypeError, argparse.ArgumentTypeError):
            raise ConfigError(f"{source}: bad value {value!r} for {action.dest}") from None
    if action.choices is not None and value is not None and value not in action.choices:
        raise ConfigError(
            f"{source}: {action.dest} must be one of {list(action.choices)}, got {value!r}"
        )
    return value


class _Unset(list):
    """The value of an option before the command line is read (a list, so that an "extend"
    option can copy it and add to it)."""


def annotated_yaml(options: dict[str, Any], sources: dict[str, str]) -> str:
    """`options` as YAML, one line each (lists in brackets), each with a comment that names
    `sources[option]`; a value written on several lines gets its comment on the line above."""
    lines = []
    for name, value in options.items():
        # A list in brackets (flow style None: the collections inside a mapping), a scalar plain.
        flow = None if isinstance(value, (list, dict)) else False
        line = yaml.safe_dump({name: value}, default_flow_style=flow, width=math.inf).rstrip("\n")
        comment = f"# {sources[name]}"
        lines.append(f"{comment}\n{line}" if "\n" in line else f"{line}  {comment}")
    return "\n".join(lines) + "\n"


def _plain(value: Any) -> Any:
    """A value YAML writes and reads back as the same option (paths as strings)."""
    if isinstance(value, (list, tuple)):
        return [_plain(item) for item in value]
    if isinstance(value, Path):
        return str(value)
    return value


# ---------------------------------------------------------------- dataclass commands

Recipe = Callable[[dict[str, Any]], dict[str, Any]]
# Checks the options of several dataclasses that depend on one another (each dataclass checks
# its own fields): called with the job's instances, in the order of its dataclass types.
Check = Callable[..., None]


class DataclassArgumentParser(ArgumentParser):
    """A parser whose options are the fields of `dataclass_types`, one option per field; a
    `recipe` maps the early options it names (e.g. the model family) to the job's defaults.
    `recipe_choices` ({"model": families}): without one of them, --help says which defaults
    depend on it. `notes` ({field: text}) add to the options' help. `check`: the checks across
    the dataclasses."""

    def __init__(
        self,
        dataclass_types: Sequence[type],
        prog: str,
        recipe: Recipe | None = None,
        recipe_keys: Sequence[str] = ("model", "init_from"),
        recipe_choices: dict[str, Sequence[str]] | None = None,
        notes: dict[str, str] | None = None,
        check: Check | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(prog, **kwargs)
        self.dataclass_types = tuple(dataclass_types)
        self.check = check
        self.recipe = recipe
        self.recipe_keys = tuple(recipe_keys)
        self.recipe_choices = recipe_choices or {}
        # The recipe's values by dest: a field that adds to them (`merged_with_defaults`) merges.
        self.recipe_values: dict[str, Any] = {}
        self.print_needs = tuple(self.recipe_choices)
        for cls in self.dataclass_types:
            # a class whose group name is None puts its options among the parser's own
            title = getattr(cls, "_argument_group_name", cls.__name__)
            group = self if title is None else self.add_argument_group(title)
            hints = typing.get_type_hints(cls)
            for spec in dataclasses.fields(cls):
                if spec.init and not spec.name.startswith("_"):
                    names, options = field_argument(spec, hints[spec.name], field_aliases(cls))
                    if notes and spec.name in notes:
                        options["help"] = f"{options['help']} ({notes[spec.name]})"
                    group.add_argument(*names, **options)

    def apply_early_defaults(self, args: list[str]) -> None:
        """Set the recipe of the options it depends on (from the command line, else the file),
        then the file's values over it."""
        from_file, file_source = self.config_file_values(args)
        if self.recipe is not None:
            pre = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
            actions = self.actions_by_name()
            for key in (key for key in self.recipe_keys if key in actions):
                pre.add_argument(*actions[key].option_strings, dest=key)
            typed, _ = pre.parse_known_args(args)
            early = {**from_file, **{k: v for k, v in vars(typed).items() if v is not None}}
            values = self.recipe(early)
            self.recipe_values, sources = self._recipe_defaults(values)
            self.apply_defaults(self.recipe_values, sources)
            for key in set(self.recipe_choices) - set(early) - set(values):
                self._note_defaults_of(key)
        self.apply_defaults(from_file, file_source)

    def _recipe_defaults(self, values: dict[str, Any]) -> tuple[dict[str, Any], dict[str, str]]:
        """A recipe's values by dest, and each one's source: the recipe's file and stage where
        the recipe knows them (`RecipeValues.origins`)."""
        actions = self.actions_by_name()
        origins = getattr(values, "origins", {})
        sources = {
            actions[name].dest: f"recipe {origins[name]}" if name in origins else "recipe"
            for name in values
            if name in actions
        }
        return self.converted(values, f"the {self.prog} recipe"), sources

    def _note_defaults_of(self, key: str) -> None:
        """For --help without option `key`: the options whose default depends on it say so,
        with each choice's value (e.g. "depends on --model: bert 0.001, gpt 0.001, elmo 0.005")."""
        choices = self.recipe_choices[key]
        recipes = {
            choice: self.converted(self.recipe({key: choice}), f"the {self.prog} recipe")
            for choice in choices
        }
        for action in self._actions:
            values = [recipes[choice].get(action.dest, action.default) for choice in choices]
            if any(value != action.default for value in values):
                each = ", ".join(f"{c} {v}" for c, v in zip(choices, values, strict=True))
                action.default_note = f"depends on --{key.replace('_', '-')}: {each}"

    def into_dataclasses(self, namespace: argparse.Namespace) -> tuple[Any, ...]:
        values = merged_with_defaults(self.dataclass_types, vars(namespace), self.recipe_values)
        instances = tuple(
            cls(**{f.name: values[f.name] for f in dataclasses.fields(cls) if f.init})
            for cls in self.dataclass_types
        )
        if self.check is not None:
            self.check(*instances)
        return instances

    def source_of(self, dest: str) -> str:
        """Where the value of option `dest` came from; one merged into the recipe's (see
        `merged_with_defaults`) names both."""
        source, recipe = super().source_of(dest), self.sources.get(dest, "")
        fields = (spec for cls in self.dataclass_types for spec in dataclasses.fields(cls))
        merges = any(spec.name == dest and "merge" in spec.metadata for spec in fields)
        given = dest in self.recipe_values and source != recipe
        return f"{recipe}, then the {source}" if merges and given else source

    def resolved_options(self, namespace: argparse.Namespace) -> dict[str, Any]:
        """The dataclasses' fields once they are built (and validated); a field with a `parse`
        function and a `show` one is written as the text `parse` reads (`--layers -1,-2`)."""
        options = {}
        for instance in self.into_dataclasses(namespace):
            for spec in dataclasses.fields(instance):
                value, show = getattr(instance, spec.name), spec.metadata.get("show")
                options[spec.name] = _plain(value if show is None or value is None else show(value))
        return options


def merged_with_defaults(
    dataclass_types: Sequence[type], values: dict[str, Any], defaults: dict[str, Any]
) -> dict[str, Any]:
    """`values` (by field), where a field's metadata `merge`, a function of (default, value),
    merges its value into its value in `defaults` (a recipe's) instead of replacing it
    (--config-overrides' key=value pairs)."""
    merged = dict(values)
    for spec in (spec for cls in dataclass_types for spec in dataclasses.fields(cls)):
        name, merge = spec.name, spec.metadata.get("merge")
        if merge and defaults.get(name) is not None and merged.get(name) is not None:
            merged[name] = merge(defaults[name], merged[name])
    return merged


def field_aliases(cls: type) -> dict[str, list[str]]:
    """{field: its other option names}: a field's metadata `aliases`, and the class's `_aliases`
    (e.g. transformers' names of the trainer's options, kept together)."""
    return {
        spec.name: [
            *spec.metadata.get("aliases", []),
            *getattr(cls, "_aliases", {}).get(spec.name, []),
        ]
        for spec in dataclasses.fields(cls)
    }


def field_argument(
    spec: dataclasses.Field, hint: Any, aliases: dict[str, list[str]] | None = None
) -> tuple[list[str], dict[str, Any]]:
    """The option strings and add_argument keywords of one dataclass field. Its metadata:
    `help`; `option`, its name where it is not the field's (`--from` for `source`);
    `positional`, an argument without a name; `metavar`; `choices`; `parse`, the function that
    reads its text where the field's type does not; `action` "extend" (`--task a --task b` adds
    up)."""
    metadata = spec.metadata
    # argparse formats help with %: a literal one ("23% slower") is written %%
    help_text = metadata.get("help")
    options: dict[str, Any] = {"help": help_text and help_text.replace("%", "%%")}
    options |= {key: metadata[key] for key in ("metavar", "choices", "action") if key in metadata}
    if metadata.get("positional"):
        names = [spec.name]  # argparse takes a positional argument's dest from its name
    else:
        option = metadata.get("option", f"--{spec.name.replace('_', '-')}")
        names = [option, *(aliases or {}).get(spec.name, [])]
        options["dest"] = spec.name
    if spec.default is not dataclasses.MISSING:
        options["default"] = spec.default
    elif spec.default_factory is not dataclasses.MISSING:
        options["default"] = spec.default_factory()
    elif not metadata.get("positional"):
        options["required"] = True
    base = _without_none(hint)
    if base is bool:
        options["action"] = BooleanFlag
        options.setdefault("default", None)
        return names, options
    # a `parse` function reads the whole value (e.g. float, where a field refuses it; "-1,-2")
    if typing.get_origin(base) in (list, tuple) and "parse" not in metadata:
        options["nargs"] = "+"  # list[int], tuple[int, ...]: one value or more
        base = typing.get_args(base)[0]
    options["type"] = metadata.get("parse", base)
    return names, options


def _without_none(hint: Any) -> Any:
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        rest = [arg for arg in typing.get_args(hint) if arg is not type(None)]
        return rest[0] if len(rest) == 1 else hint
    return hint


def parse_args(
    dataclass_types: tuple[type, ...],
    argv: list[str] | None,
    prog: str,
    description: str,
    defaults: dict[str, Any] | None = None,
    epilog: str | None = None,
    recipe: Recipe | None = None,
    **parser_options: Any,
) -> tuple[Any, ...]:
    """Parse `argv` once into instances of `dataclass_types`. Each option's value comes from the
    command line, else from `--config FILE`, else from `recipe` (the job's defaults for the
    options it reads, e.g. the family's), else from `defaults`, else from its dataclass.
    `parser_options`: DataclassArgumentParser's (recipe_keys, recipe_choices, notes, hints,
    check)."""
    parser = DataclassArgumentParser(
        dataclass_types,
        prog,
        recipe=recipe,
        description=description,
        epilog=epilog,
        **parser_options,
    )
    if defaults:
        parser.apply_defaults(parser.converted(defaults, f"the {prog} defaults"), DEFAULT)
    return parser.into_dataclasses(parser.parse_args(argv))


@dataclasses.dataclass(frozen=True)
class Subcommand:
    """A subcommand (`egbert tokenizer train`): its options' dataclasses, its line in the
    command's --help, and its own --help's description."""

    dataclass_types: tuple[type, ...]
    summary: str
    description: str


def parse_subcommand_args(
    subcommands: dict[str, Subcommand], argv: list[str] | None, prog: str, description: str
) -> tuple[str, tuple[Any, ...]]:
    """Parse `argv`, the name of one of `subcommands` and its options, into (that name, the
    instances of its dataclasses), each subcommand's options as `parse_args` reads a command's."""
    parser = ArgumentParser(prog, config=False, description=description)
    choices = parser.add_subparsers(
        dest="subcommand",
        required=True,
        metavar="{" + ",".join(subcommands) + "}",
        parser_class=DataclassArgumentParser,
    )
    for name, sub in subcommands.items():
        choices.add_parser(
            name,
            dataclass_types=sub.dataclass_types,
            help=sub.summary,
            description=sub.description,
        )
    namespace = parser.parse_args(argv)
    return namespace.subcommand, choices.choices[namespace.subcommand].into_dataclasses(namespace)


def option_aliases(dataclass_types: Sequence[type]) -> dict[str, str]:
    """Other names of fields (`warmup_ratio` for `warmup_steps`), from `field_aliases`."""
    return {
        alias.lstrip("-").replace("-", "_"): name
        for cls in dataclass_types
        for name, aliases in field_aliases(cls).items()
        for alias in aliases
    }


def arguments_from_options(
    dataclass_types: tuple[type, ...],
    options: dict[str, Any],
    defaults: dict[str, Any] | None = None,
    check: Check | None = None,
) -> tuple[Any, ...]:
    """The job's dataclasses from keyword arguments (the Python API of a command): each option
    goes to the dataclass with that field (or an alias of it); `defaults` sit under `options`;
    `check`: the checks across the dataclasses, as the command line's."""
    aliases = option_aliases(dataclass_types)
    defaults = {aliases.get(name, name): value for name, value in (defaults or {}).items()}
    given = {aliases.get(name, name): value for name, value in options.items()}
    values = merged_with_defaults(dataclass_types, defaults | given, defaults)
    known = {f.name for cls in dataclass_types for f in dataclasses.fields(cls)}
    unknown = sorted(set(values) - known)
    if unknown:
        raise ConfigError(
            f"unknown option(s) {', '.join(unknown)}; the options are {', '.join(sorted(known))}"
        )
    instances = tuple(
        cls(**{f.name: values[f.name] for f in dataclasses.fields(cls) if f.name in values})
        for cls in dataclass_types
    )
    if check is not None:
        check(*instances)
    return instances


def read_config_file(path: Path) -> dict[str, Any]:
    """A flat mapping of option names to values from a .yaml/.yml/.json file."""
    if path.is_dir():
        raise ConfigError(f"config file {path} is a folder; pass a YAML or JSON file")
    if not path.is_file():
        raise ConfigError(f"config file {path} not found")
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as error:
        raise ConfigError(
            f"config file {path} is not a UTF-8 text file (byte {error.start}); pass a YAML or "
            "JSON file"
        ) from None
    try:
        values = json.loads(text) if path.suffix == ".json" else yaml.safe_load(text)
    except (json.JSONDecodeError, yaml.YAMLError) as error:
        first_line = str(error).splitlines()[0]
        raise ConfigError(f"config file {path} is not valid YAML/JSON: {first_line}") from None
    if values is None:
        return {}
    if not isinstance(values, dict):
        raise ConfigError(f"config file {path} must be a mapping of option names to values")
    return {str(key).replace("-", "_"): value for key, value in values.items()}
