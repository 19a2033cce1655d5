"""The `attnviz` command's dispatch, in this process (the installed command is tested in test_installed.py)."""

from attnviz import __version__
from attnviz.app import command
from attnviz.models.shipped import bundled_models


def test_help_lists_every_command_and_the_bundled_models(capsys):
    assert command.main(["--help"]) == 0
    shown = capsys.readouterr().out
    assert all(name in shown for name in command.COMMANDS) and all(name in shown for name in bundled_models())
    assert set(command.COMMANDS) == set(command.RUNNERS)


def test_no_command_or_a_wrong_one_is_refused_with_the_list(capsys):
    assert command.main([]) == 2 and "commands:" in capsys.readouterr().out
    assert command.main(["scna"]) == 2
    assert "no command 'scna'" in capsys.readouterr().err
    assert command.main(["--version"]) == 0 and capsys.readouterr().out.strip() == f"attnviz {__version__}"


def test_subcommands_reach_their_modules_under_their_own_name(capsys):
    import pytest

    for name in ("scan", "importance", "bench", "train-tiny", "serve"):
        with pytest.raises(SystemExit) as ended:
            command.main([name, "--help"])
        assert ended.value.code == 0
        assert capsys.readouterr().out.startswith(f"usage: attnviz {name}")
