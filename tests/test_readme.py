"""The README's commands run as written: one spelling (the venv active, as the README says),
every kernelab command parses against the CLI as it is, and the cheap ones run."""

import re
import shlex
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from kernelab import ledger
from kernelab.cli import app

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()
runner = CliRunner()

#: Commands of the README cheap enough to run here (no GPU, no files of the user's).
CHEAP = [
    "--version",
    "ops",
    "bench rmsnorm --floors-for h200",
    "history",
    "history rmsnorm --dtype bfloat16 --csv",
]


def commands() -> list[list[str]]:
    """Every shell command in the README's shell blocks (```bash, ```sh or plain ```), as
    words: continuation lines joined, comments dropped."""
    out = []
    for lang, body in re.findall(r"```(\w*)\n(.*?)```", README, flags=re.S):
        if lang not in ("", "bash", "sh"):
            continue
        for line in body.replace("\\\n", " ").splitlines():
            words = shlex.split(line, comments=True)
            if words:
                out.append(words)
    return out


def test_the_readme_says_how_its_commands_run():
    assert "source .venv/bin/activate" in README
    firsts = {words[0] for words in commands()}
    assert firsts == {"kernelab", "python", "make"}, firsts
    assert ".venv/bin/kernelab" not in README and "PYTHONPATH" not in README


def _parse(args: list[str]) -> None:
    cmd, path = app, ["kernelab"]
    while isinstance(cmd, click.Group):
        if args[0].startswith("-"):  # a group option such as --version
            known = {o for p in cmd.params for o in p.opts}
            assert args[0] in known, f"{' '.join(path)}: no option {args[0]}"
            return
        name, args = args[0], args[1:]
        sub = cmd.get_command(click.Context(cmd), name)
        assert sub is not None, f"{' '.join(path)}: no command {name!r}"
        cmd, path = sub, [*path, name]
    try:
        cmd.make_context(" ".join(path), list(args))
    except click.exceptions.Exit as exc:
        assert exc.exit_code == 0, f"{' '.join(path)} {args}: exit {exc.exit_code}"


def test_every_kernelab_command_parses():
    kernelab = [w[1:] for w in commands() if w[0] == "kernelab"]
    assert len(kernelab) > 20
    for args in kernelab:
        try:
            _parse(args)
        except click.UsageError as exc:
            pytest.fail(f"README: kernelab {' '.join(args)}: {exc.format_message()}")


def test_python_and_make_commands_name_what_exists():
    makefile = (ROOT / "Makefile").read_text()
    for words in commands():
        if words[0] == "python":
            assert (ROOT / words[1]).is_file(), words
        elif words[0] == "make":
            target = words[1]
            assert re.search(rf"^{re.escape(target)}:", makefile, flags=re.M), words


def test_the_cheap_commands_run(tmp_path, monkeypatch):
    path = tmp_path / "ledger.sqlite"
    monkeypatch.setenv("KERNELAB_LEDGER", str(path))
    # A ledger that exists, as after a first bench: the read-only commands never create one.
    ledger.open(str(path)).close()
    written = {" ".join(w[1:]) for w in commands() if w[0] == "kernelab"}
    assert set(CHEAP) <= written, set(CHEAP) - written
    for line in CHEAP:
        result = runner.invoke(app, shlex.split(line))
        assert result.exit_code == 0, f"kernelab {line}:\n{result.output}"
