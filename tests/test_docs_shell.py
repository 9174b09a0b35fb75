"""Every command in the README and the docs reads as a shell reads it.

The shell blocks of README.md and docs/**/*.md (```bash, ```sh, ```shell, ```console, and
```text or untagged blocks whose first line is a command) are checked three ways:

* ``bash -n``: each block parses (an unquoted ``1/sqrt(L)`` does not);
* each command line, with its command word replaced by ``printf``, expands in bash to the
  words ``shlex.split`` gives: tests/test_cli.py runs the ``probe`` lines through
  ``shlex.split``, so what it runs is what a user's shell runs;
* the ones that are cheap and offline (``--dry-run``, ``probe models``) run through bash
  with the installed ``probe``.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
#: The tags of blocks that are shell whatever their first line.
SHELL_TAGS = {"bash", "sh", "shell", "console", "zsh"}
#: The words a command line of an untagged or ```text block starts with (after any
#: VAR=value assignments); a block whose first line starts otherwise is not shell (a
#: folder tree, a program's output, a registry entry).
COMMANDS = {
    "probe", "make", "pip", "python", "python3", "torchrun", "cd", "export", "git",
    "bash", "sh", "chromium", "mkdocs", "jupyter", "ls", "open", "cat",
    ".venv/bin/python", ".venv/bin/probe", ".venv/bin/pip",
}  # fmt: skip
ASSIGNMENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*=\S*")
FENCE = re.compile(r"^(\s*)(`{3,}|~{3,})\s*([^\s`{]*)")


@dataclass(frozen=True)
class Block:
    page: Path
    line: int  # of the opening fence, 1-based
    tag: str
    text: str  # the shell text: a console block's prompts stripped, its output dropped

    @property
    def name(self) -> str:
        return f"{self.page.relative_to(ROOT)}:{self.line}"


def _fenced(page: Path) -> list[tuple[int, str, str]]:
    """(line of the opening fence, tag, body) of every fenced block of ``page``."""
    lines = page.read_text(encoding="utf-8").splitlines()
    found, i = [], 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        indent, fence, tag = m.groups()
        close = re.compile(rf"^\s*{re.escape(fence[0])}{{{len(fence)},}}\s*$")
        j = i + 1
        while j < len(lines) and not close.match(lines[j]):
            j += 1
        body = [line.removeprefix(indent) for line in lines[i + 1 : j]]
        found.append((i + 1, tag.lower(), "\n".join(body) + "\n"))
        i = j + 1
    return found


def command_lines(text: str) -> list[str]:
    """The commands of a shell text, one a line: continuations joined, comments and blank
    lines left out."""
    joined = re.sub(r"\\\n\s*", " ", text)
    return [
        line.strip()
        for line in joined.splitlines()
        if line.strip() and not line.lstrip().startswith("#")
    ]


def _command_word(line: str) -> str:
    words = line.split()
    while words and ASSIGNMENT.fullmatch(words[0]):
        words = words[1:]
    return words[0] if words else ""


def shell_blocks(pages: list[Path] = PAGES) -> list[Block]:
    """Every shell block of ``pages``."""
    blocks = []
    for page in pages:
        for line, tag, body in _fenced(page):
            prompts = [row for row in body.splitlines() if row.startswith("$ ")]
            if prompts:  # a console transcript: the prompted lines are the commands
                text = "\n".join(row.removeprefix("$ ") for row in prompts) + "\n"
            else:
                text = body
            if tag in SHELL_TAGS:
                blocks.append(Block(page, line, tag, text))
            elif tag in ("", "text"):
                first = command_lines(text)
                if first and _command_word(first[0]) in COMMANDS:
                    blocks.append(Block(page, line, tag, text))
    return blocks


BLOCKS = shell_blocks()


def test_the_pages_have_shell_blocks() -> None:
    names = {block.name.split(":")[0] for block in BLOCKS}
    assert {"README.md", "docs/getting-started.md", "docs/sweep.md", "docs/toy.md"} <= names
    # the untagged and ```text ones are found too, and a folder tree or an output is not
    tags = {block.tag for block in BLOCKS}
    assert {"", "text", "bash"} <= tags
    assert not [b for b in BLOCKS if b.text.lstrip().startswith(("probe/", "residual_0"))]


def syntax_error(text: str) -> str:
    """bash -n's complaint about ``text``, or ""."""
    done = subprocess.run(
        ["bash", "-n"], input=text, capture_output=True, text=True, check=False, timeout=30
    )
    return done.stderr.strip() if done.returncode else ""


@pytest.mark.parametrize("block", BLOCKS, ids=lambda block: block.name)
def test_block_parses_in_bash(block: Block) -> None:
    error = syntax_error(block.text)
    assert not error, f"{block.name} (```{block.tag}) is not valid bash:\n{block.text}\n{error}"


def test_the_check_finds_an_unquoted_parenthesis() -> None:
    bad = "probe sweep gpt2 --init random --branch-scale 1,1/sqrt(L) --dry-run\n"
    assert "syntax error near unexpected token `('" in syntax_error(bad)
    assert not syntax_error(bad.replace("1,1/sqrt(L)", "'1,1/sqrt(L)'"))


def bash_words(line: str, cwd: Path) -> list[str]:
    """The words bash passes to ``line``'s command (its VAR=value prefixes left out), run in
    ``cwd`` with the command word replaced by printf."""
    # The assignments and the command word, which in these pages neither quote nor expand.
    head = re.match(r"\s*(?:[A-Za-z_][A-Za-z0-9_]*=\S*\s+)*\S+", line)
    assert head, line
    script = "printf '%s\\0'" + line[head.end() :]
    done = subprocess.run(
        ["bash", "-c", script], cwd=cwd, capture_output=True, text=True, check=False, timeout=30
    )
    assert done.returncode == 0, f"{line}\n{done.stderr}"
    return done.stdout.split("\0")[:-1]


LINES = list(
    dict.fromkeys(
        (block.name, line)
        for block in BLOCKS
        if not syntax_error(block.text)  # test_block_parses_in_bash reports the others
        for line in command_lines(block.text)
    )
)


@pytest.mark.parametrize("name, line", LINES, ids=[f"{n}:{line[:40]}" for n, line in LINES])
def test_bash_reads_the_words_the_tests_run(name: str, line: str, tmp_path: Path) -> None:
    """A command's words in bash are its words in shlex.split, which tests/test_cli.py runs:
    no globbing, expansion or quoting that the tests would not see."""
    words = shlex.split(line, comments=True)
    while words and ASSIGNMENT.fullmatch(words[0]):
        words = words[1:]
    assert bash_words(line, tmp_path) == words[1:], f"{name}: {line}"


#: The commands cheap enough to run in full through bash: a dry run and the family table.
RUNNABLE = [
    (name, line)
    for name, line in LINES
    if line.startswith("probe ") and ("--dry-run" in line.split() or line == "probe models")
]


def test_some_commands_run_through_bash() -> None:
    assert any("--dry-run" in line for _, line in RUNNABLE)
    assert any("'1,1/sqrt(L)'" in line for _, line in RUNNABLE)


@pytest.mark.parametrize("name, line", RUNNABLE, ids=[f"{n}:{line[:40]}" for n, line in RUNNABLE])
def test_command_runs_through_bash(name: str, line: str, tmp_path: Path) -> None:
    bin_dir = str(Path(sys.executable).parent)
    env = {
        **os.environ,
        "PATH": bin_dir + os.pathsep + os.environ.get("PATH", ""),
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
    }
    done = subprocess.run(
        ["bash", "-c", line],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        check=False,
        timeout=300,
    )
    assert done.returncode == 0, f"{name}: {line}\n{done.stdout}\n{done.stderr}"
    assert not any(tmp_path.iterdir()), "a dry run or a listing wrote files"
