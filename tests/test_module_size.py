"""The sizes that keep egbert readable (STYLE.md): no module past 700 lines, no function past 60
(docstrings aside) unless a comment on the line above its `def` says why it reads better whole,
and a Trainer class of at most 400 lines, the loop and its stages, with the rest in its satellites
(egbert/training/), that takes at most 8 parameters (what belongs together comes as one object:
its data, its metrics, what is saved with the model). A module that long no longer reads top to
bottom in a sitting; it is split along its seams."""

from __future__ import annotations

import ast
from pathlib import Path

import egbert

MODULE_LIMIT = 700
FUNCTION_LIMIT = 60
TRAINER_LIMIT = 400
TRAINER_PARAMETER_LIMIT = 8  # of Trainer.__init__, self aside
# a comment on the line above a longer function's `def` (or its decorators) that says why
WHOLE_ON_PURPOSE = "reads better whole"

PACKAGE = Path(egbert.__file__).parent


def sources() -> dict[str, str]:
    found = {
        str(path.relative_to(PACKAGE)): path.read_text(encoding="utf-8")
        for path in PACKAGE.rglob("*.py")
    }
    assert len(found) > 20, "the walk found egbert's modules"
    return found


def lines_without_docstring(node: ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef) -> int:
    """The node's lines from its `def`/`class` line to its end, less its docstring's."""
    count = node.end_lineno - node.lineno + 1
    first = node.body[0]
    value = first.value if isinstance(first, ast.Expr) else None
    if isinstance(value, ast.Constant) and isinstance(value.value, str):
        count -= first.end_lineno - first.lineno + 1
    return count


def said_why(lines: list[str], node: ast.AST) -> bool:
    start = min([node.lineno, *(d.lineno for d in node.decorator_list)])
    return start >= 2 and WHOLE_ON_PURPOSE in lines[start - 2]


def test_no_module_is_longer_than_the_limit():
    lengths = {name: len(text.splitlines()) for name, text in sources().items()}
    too_long = {name: lines for name, lines in lengths.items() if lines > MODULE_LIMIT}
    assert not too_long, f"split these modules (lines over {MODULE_LIMIT}): {too_long}"


def test_no_function_is_longer_than_the_limit_unless_a_comment_says_why():
    too_long = {}
    for name, text in sources().items():
        lines = text.splitlines()
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                length = lines_without_docstring(node)
                if length > FUNCTION_LIMIT and not said_why(lines, node):
                    too_long[f"{name}:{node.lineno} {node.name}"] = length
    assert not too_long, f"split these functions (lines over {FUNCTION_LIMIT}): {too_long}"


def the_trainer_class() -> tuple[str, ast.ClassDef]:
    """(module, node) of egbert's one Trainer class."""
    trainers = [
        (name, node)
        for name, text in sources().items()
        for node in ast.walk(ast.parse(text))
        if isinstance(node, ast.ClassDef) and node.name == "Trainer"
    ]
    assert len(trainers) == 1, trainers
    return trainers[0]


def parameters(function: ast.FunctionDef) -> list[str]:
    """The names a call can pass, self aside: positional, keyword-only, *args and **kwargs."""
    arguments = function.args
    named = [*arguments.posonlyargs, *arguments.args, *arguments.kwonlyargs]
    named += [star for star in (arguments.vararg, arguments.kwarg) if star is not None]
    return [argument.arg for argument in named if argument.arg != "self"]


def test_the_trainer_class_is_the_loop_and_its_stages():
    name, trainer = the_trainer_class()
    assert lines_without_docstring(trainer) <= TRAINER_LIMIT, name


def test_the_trainer_takes_what_it_needs_in_few_parameters():
    name, trainer = the_trainer_class()
    methods = [node for node in trainer.body if isinstance(node, ast.FunctionDef)]
    init = next(method for method in methods if method.name == "__init__")
    taken = parameters(init)
    assert len(taken) <= TRAINER_PARAMETER_LIMIT, f"{name}: Trainer.__init__ takes {taken}"


def test_the_walk_measures_what_it_names():
    """The counts above are the AST's: a 3-line body under a 2-line docstring is 4 lines, a
    comment above the def excuses it, the limit's own constant is the one compared, and a
    function's parameters are every name a call can pass, self aside."""
    text = 'def f():\n    """Doc\n    string."""\n    a = 1\n    b = 2\n    return a + b\n'
    node = ast.parse(text).body[0]
    assert lines_without_docstring(node) == 4
    assert not said_why(text.splitlines(), node)
    excused = f"# {WHOLE_ON_PURPOSE}: one recipe\n" + text
    assert said_why(excused.splitlines(), ast.parse(excused).body[0])
    every_kind = ast.parse("def g(self, a, /, b, *rest, c, **options): pass").body[0]
    assert parameters(every_kind) == ["a", "b", "c", "rest", "options"]
