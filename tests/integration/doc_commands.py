"""The commands and code examples of the documentation, read from the markdown files themselves.

A fenced ``bash`` block is what a reader pastes into a shell: its lines are joined where they end in a backslash,
blank lines and comment lines are dropped, and a trailing ``# comment`` is cut off (a ``#`` outside quotes at the
start of a word). Lines that only set the shell up for the next ones (``export ...``, ``source ...``, ``NAME=value``)
are kept as the *preamble* of every later command of the same block, so that each command can be run on its own
with the block's setup before it. Inline code spans that start with a given prefix (e.g. ``.venv/bin/``) are
commands too. Fenced ``python`` blocks are returned whole.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

SHELL_LANGUAGES = ("bash", "sh", "shell")
_FENCE = re.compile(r"^(\s*)```\s*([\w+-]*)\s*$")
_ASSIGNMENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")
_SUBSTITUTION_OR_QUOTED = re.compile(r"\$\([^()]*\)|'[^']*'|\"[^\"]*\"")
_INLINE = re.compile(r"`([^`]+)`")


@dataclass(frozen=True)
class Block:
    """One fenced block: the file, the line of its first content line, its language and its lines."""

    path: str
    line: int
    language: str
    lines: tuple[str, ...]

    @property
    def text(self) -> str:
        return "\n".join(self.lines) + "\n"


@dataclass(frozen=True)
class Command:
    """One shell command of the documentation, where it is (``README.md:58``) and the setup lines before it."""

    where: str
    text: str
    preamble: tuple[str, ...] = ()


def fenced_blocks(markdown: str, path: str = "") -> list[Block]:
    """Every fenced block of ``markdown`` (an unclosed block ends the file), in order."""
    blocks: list[Block] = []
    opened: tuple[int, str, str] | None = None  # (line, language, indent)
    lines: list[str] = []
    for number, raw in enumerate(markdown.splitlines(), start=1):
        fence = _FENCE.match(raw)
        if opened is None and fence:
            opened, lines = (number + 1, fence.group(2).lower(), fence.group(1)), []
        elif opened is not None and fence and not fence.group(2):
            blocks.append(Block(path, opened[0], opened[1], tuple(lines)))
            opened = None
        elif opened is not None:
            lines.append(raw.removeprefix(opened[2]))
    if opened is not None:
        blocks.append(Block(path, opened[0], opened[1], tuple(lines)))
    return blocks


def strip_comment(line: str) -> str:
    """``line`` without a trailing shell comment: a ``#`` outside quotes that starts a word."""
    quote = ""
    for i, char in enumerate(line):
        if quote:
            if char == quote:
                quote = ""
        elif char in "'\"":
            quote = char
        elif char == "#" and (i == 0 or line[i - 1].isspace()):
            return line[:i].rstrip()
    return line.rstrip()


def logical_lines(lines: tuple[str, ...] | list[str], first_line: int = 1) -> list[tuple[int, str]]:
    """(line number, command) for each command of a shell block: continuations joined, comments dropped."""
    commands: list[tuple[int, str]] = []
    pending: list[str] = []
    start = first_line
    for offset, raw in enumerate(lines):
        stripped = raw.strip()
        if not pending:
            start = first_line + offset
            if not stripped or stripped.startswith("#"):
                continue
        if stripped.endswith("\\") and not stripped.endswith("\\\\"):
            pending.append(stripped[:-1].strip())
            continue
        pending.append(strip_comment(stripped))
        commands.append((start, " ".join(part for part in pending if part)))
        pending = []
    if pending:
        commands.append((start, " ".join(part for part in pending if part)))
    return commands


def is_setup(command: str) -> bool:
    """Whether a command only sets the shell up for the next ones (an export, a source, a variable)."""
    head = command.split(maxsplit=1)[0]
    if head in ("export", "source", "."):
        return True
    # NAME=value alone (its value may be quoted or a command substitution); NAME=value cmd runs cmd
    return bool(_ASSIGNMENT.match(command)) and len(_SUBSTITUTION_OR_QUOTED.sub("x", command).split()) == 1


def block_commands(block: Block) -> list[Command]:
    """The commands of a shell block, each with the block's setup lines that come before it."""
    commands: list[Command] = []
    preamble: list[str] = []
    for line, text in logical_lines(block.lines, block.line):
        commands.append(Command(f"{block.path}:{line}", text, tuple(preamble)))
        if is_setup(text):
            preamble.append(text)
    return commands


def shell_commands(path: Path, root: Path) -> list[Command]:
    """Every command of every fenced shell block of the markdown file ``path`` (named relative to ``root``)."""
    name = path.relative_to(root).as_posix()
    blocks = fenced_blocks(path.read_text(), name)
    return [cmd for block in blocks if block.language in SHELL_LANGUAGES for cmd in block_commands(block)]


def inline_commands(markdown: str, path: str, prefix: str) -> list[Command]:
    """Every inline code span of ``markdown`` outside fenced blocks that starts with ``prefix`` (a span may wrap
    across lines; it is read as one line)."""
    outside = markdown.splitlines()
    for block in fenced_blocks(markdown):
        for number in range(block.line - 1, min(block.line + len(block.lines) + 1, len(outside) + 1)):
            outside[number - 1] = ""  # the fences and the block's lines
    text = "\n".join(outside)
    found = []
    for match in _INLINE.finditer(text):
        span = " ".join(match.group(1).split())
        if span.startswith(prefix):
            found.append(Command(f"{path}:{text.count(chr(10), 0, match.start()) + 1}", span))
    return found


def python_blocks(path: Path, root: Path) -> list[Block]:
    """Every fenced ``python`` block of the markdown file ``path``."""
    name = path.relative_to(root).as_posix()
    return [block for block in fenced_blocks(path.read_text(), name) if block.language == "python"]
