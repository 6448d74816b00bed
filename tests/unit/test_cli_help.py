"""The CLI explains itself: every option of every command has a help text."""

from __future__ import annotations

import argparse

from wavepipe.cli import build_parser


def _parsers(parser: argparse.ArgumentParser):
    yield parser.prog, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                yield from _parsers(sub)


def test_every_option_of_every_command_has_a_help_text():
    missing = [
        f"{prog} {'/'.join(a.option_strings)}"
        for prog, parser in _parsers(build_parser())
        for a in parser._actions
        if a.option_strings and not a.help
    ]
    assert missing == []


def test_run_help_names_the_exit_codes():
    run = dict(_parsers(build_parser()))["wavepipe run"]
    assert "exit codes: 0 done; 1" in run.format_help().replace("\n", " ")
