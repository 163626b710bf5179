"""The reader of the docs' commands (tests/integration/doc_commands.py), and the Python blocks of README.md and
docs/architecture.md that are excerpts: each must still match the code or test it is taken from."""

from __future__ import annotations

import ast

import yaml

from bench.processes import ROOT
from tests.integration.doc_commands import (
    Block,
    block_commands,
    fenced_blocks,
    inline_commands,
    is_setup,
    logical_lines,
    python_blocks,
    shell_commands,
    strip_comment,
)

DOC = """Intro with `.venv/bin/python -m apps.main seed=1` and `other` code, and one that wraps: `.venv/bin/python
-m apps.main a=1`.

```bash
# a comment line
export A=1 B=$(mktemp -d)   # trailing comment
.venv/bin/python -m apps.main x=1 \\
  y='a # not a comment' z="#no"   # but this is

PID=$(lsof -t -iTCP:1 -sTCP:LISTEN)
RAY_ADDRESS=h:1 flower-superlink --insecure &
kill $PID
```

```python
print("`.venv/bin/not-inline`")
```
"""


def test_fenced_blocks_keep_language_line_and_lines() -> None:
    blocks = fenced_blocks(DOC, "d.md")
    assert [(b.language, b.line) for b in blocks] == [("bash", 5), ("python", 16)]
    assert blocks[1].lines == ('print("`.venv/bin/not-inline`")',)


def test_an_unclosed_block_ends_the_file() -> None:
    assert fenced_blocks("```bash\nls\n") == [Block("", 2, "bash", ("ls",))]


def test_comments_are_cut_outside_quotes_only() -> None:
    assert strip_comment("ls   # list") == "ls"
    assert strip_comment("echo 'a # b' \"#c\" d#e") == "echo 'a # b' \"#c\" d#e"
    assert strip_comment("# all") == ""


def test_continuations_are_joined_and_comment_and_blank_lines_dropped() -> None:
    lines = ["# c", "", "a \\", "  b   # note", "c"]
    assert logical_lines(lines, first_line=10) == [(12, "a b"), (14, "c")]


def test_setup_lines_are_the_preamble_of_the_later_commands_of_their_block() -> None:
    commands = block_commands(fenced_blocks(DOC, "d.md")[0])
    assert [c.text for c in commands] == [
        "export A=1 B=$(mktemp -d)",
        ".venv/bin/python -m apps.main x=1 y='a # not a comment' z=\"#no\"",
        "PID=$(lsof -t -iTCP:1 -sTCP:LISTEN)",
        "RAY_ADDRESS=h:1 flower-superlink --insecure &",
        "kill $PID",
    ]
    assert [c.where for c in commands] == ["d.md:6", "d.md:7", "d.md:10", "d.md:11", "d.md:12"]
    assert commands[1].preamble == ("export A=1 B=$(mktemp -d)",)
    assert commands[4].preamble == ("export A=1 B=$(mktemp -d)", "PID=$(lsof -t -iTCP:1 -sTCP:LISTEN)")


def test_what_counts_as_setup() -> None:
    assert is_setup("export X=1") and is_setup("source .venv/bin/activate") and is_setup('M="a b"')
    assert is_setup("PID=$(lsof -t -iTCP:1)")
    assert not is_setup("RAY_ADDRESS=h:1 flower-superlink &") and not is_setup("kill $PID")


def test_inline_commands_outside_blocks_with_the_prefix() -> None:
    found = inline_commands(DOC, "d.md", ".venv/bin/")
    assert [(c.where, c.text) for c in found] == [
        ("d.md:1", ".venv/bin/python -m apps.main seed=1"),
        ("d.md:1", ".venv/bin/python -m apps.main a=1"),
    ]


def test_every_setup_line_of_the_docs_comes_before_a_command() -> None:
    """A setup line is run only as the preamble of the commands after it: one with none after it goes untested."""
    for doc in ("README.md", "docs/running.md", "docs/architecture.md"):
        commands = shell_commands(ROOT / doc, ROOT)
        for cmd in commands:
            if is_setup(cmd.text):
                assert any(cmd.text in later.preamble for later in commands if not is_setup(later.text)), cmd


# --- Python blocks that are excerpts ---------------------------------------------------------------------------

#: Where each class of an excerpt is defined (the page names the file in the text around the block).
EXCERPT_SOURCES = {
    "FederatedAveraging": "strategies/fedavg.py",
    "DPFedAvg": "strategies/dp_fedavg.py",
    "HalfRoundsLedger": "tests/privacy/test_ledger.py",
    "DoubleCounting": "tests/privacy/test_ledger.py",
    "Halve": "tests/privacy/test_pipeline.py",
    "HalvedFedAvg": "tests/privacy/test_pipeline.py",
    "train": "tests/integration/mechanism_app/halved_app.py",
    "query": "tests/integration/mechanism_app/halved_app.py",
}


def _members(cls: ast.ClassDef) -> tuple[list[str], set[str]]:
    """(base names, method and class-attribute names) of a class."""
    names = {node.name for node in cls.body if isinstance(node, ast.FunctionDef)}
    names |= {
        t.id for node in cls.body if isinstance(node, ast.Assign) for t in node.targets if isinstance(t, ast.Name)
    }
    return [ast.unparse(base) for base in cls.bases], names


def _classes(source: str) -> dict[str, ast.ClassDef]:
    return {node.name: node for node in ast.walk(ast.parse(source)) if isinstance(node, ast.ClassDef)}


def _functions(source: str) -> dict[str, ast.FunctionDef]:
    return {node.name: node for node in ast.parse(source).body if isinstance(node, ast.FunctionDef)}


def _code(function: ast.FunctionDef) -> list[str]:
    """A function's decorators and statements, its docstring left out."""
    body = function.body[1:] if ast.get_docstring(function) is not None else function.body
    return [ast.unparse(node) for node in [*function.decorator_list, *body]]


def test_class_excerpts_of_architecture_match_the_files_they_come_from() -> None:
    for block in python_blocks(ROOT / "docs/architecture.md", ROOT):
        if "ServerApp()" in block.text:
            continue  # a program: tests/integration/test_readme_commands.py runs it
        shown, functions = _classes(block.text), _functions(block.text)
        assert shown or functions, f"{block.path}:{block.line}: neither an excerpt nor a ServerApp program"
        for name, function in functions.items():  # a function excerpt is the function, decorators and statements
            assert name in EXCERPT_SOURCES, f"{block.path}:{block.line}: say where {name} is (EXCERPT_SOURCES)"
            assert _code(function) == _code(_functions((ROOT / EXCERPT_SOURCES[name]).read_text())[name]), name
        for name, cls in shown.items():
            assert name in EXCERPT_SOURCES, f"{block.path}:{block.line}: say where {name} is (EXCERPT_SOURCES)"
            real = _classes((ROOT / EXCERPT_SOURCES[name]).read_text())[name]
            bases, members = _members(cls)
            real_bases, real_members = _members(real)
            assert bases == real_bases and members <= real_members, (name, members - real_members)


def test_the_yaml_excerpt_is_the_strategy_file() -> None:
    blocks = [b for b in fenced_blocks((ROOT / "docs/architecture.md").read_text()) if b.language == "yaml"]
    assert len(blocks) == 1
    assert yaml.safe_load(blocks[0].text) == yaml.safe_load((ROOT / "conf/strategy/dp_fedavg.yaml").read_text())


def _calls(source: str) -> dict[str, dict[str, str]]:
    """Each call of the source by its callee's text: its keyword arguments' source."""
    return {
        ast.unparse(node.func): {kw.arg or "**": ast.unparse(kw.value) for kw in node.keywords}
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.Call)
    }


def test_the_readme_excerpt_is_part_of_the_architecture_program() -> None:
    """README.md shows two lines of docs/architecture.md's ServerApp (which runs): the same calls, each with a
    subset of the program's keyword arguments."""
    (excerpt,) = python_blocks(ROOT / "README.md", ROOT)
    (program,) = [b for b in python_blocks(ROOT / "docs/architecture.md", ROOT) if "ServerApp()" in b.text]
    shown, full = _calls(excerpt.text), _calls(program.text)
    for callee in ("DPFedSAM", "strategy.start"):
        assert callee in shown and callee in full, callee
        assert shown[callee].items() <= full[callee].items(), (callee, shown[callee], full[callee])
