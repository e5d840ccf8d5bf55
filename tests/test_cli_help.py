"""What `lightning-gae --help` and each subcommand's --help tell a user: every subcommand, in plain text."""

import pytest

from lightning_gae.cli import main


def test_help_lists_every_subcommand_with_a_line(capsys):
    main(["--help"])
    text = capsys.readouterr().out
    for name in ("fit", "validate", "test", "predict", "compare"):
        assert any(line.split()[:1] == [name] and len(line.split()) > 3 for line in text.splitlines()), name


@pytest.mark.parametrize("subcommand", ["compare"])
def test_subcommand_help_is_plain_text(subcommand, capsys):
    with pytest.raises(SystemExit) as done:
        main([subcommand, "--help"])
    assert done.value.code == 0
    text = capsys.readouterr().out
    assert f"lightning-gae {subcommand}" in text
    assert "``" not in text and ":func:" not in text and ":class:" not in text
