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


def test_a_stopped_serve_stops_its_server(tmp_path):
    """systemd, ``docker stop`` or a test stop ``attnviz serve`` with SIGTERM, which reaches it alone: the server it
    started must stop with it, not run on without a parent (a test's servers were found running an hour later)."""
    import os
    import signal
    import subprocess
    import sys
    import time

    pid_file = tmp_path / "server.pid"
    server = f"import os, time; open({str(pid_file)!r}, 'w').write(str(os.getpid())); time.sleep(120)"
    serve = subprocess.Popen([sys.executable, "-c", "import sys; from attnviz.app.command import run_until_stopped; "
                              f"sys.exit(run_until_stopped([sys.executable, '-c', {server!r}]))"])
    try:
        deadline = time.monotonic() + 60
        while not (pid_file.exists() and pid_file.read_text()):
            assert time.monotonic() < deadline and serve.poll() is None, "the server never started"
            time.sleep(0.1)
        server_pid = int(pid_file.read_text())
        serve.send_signal(signal.SIGTERM)
        assert serve.wait(timeout=30) == 128 + signal.SIGTERM  # the server's end, as a shell reports it
        try:
            os.kill(server_pid, 0)
        except ProcessLookupError:
            pass  # gone, and reaped by serve
        else:
            os.kill(server_pid, signal.SIGKILL)
            raise AssertionError("the server outlived attnviz serve")
    finally:
        serve.kill()
