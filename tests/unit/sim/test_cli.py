"""The command line: bad arguments give one clear line and exit status 2."""

import pytest
from tokenyard.sim.__main__ import main


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["serve", "--model", "nope"], "unknown model preset 'nope'"),
        (["serve", "--gpu", "v100"], "unknown GPU preset 'v100'"),
        (["serve", "--model", "llama-3.1-70b", "--gpu", "l40s"], "does not fit on 1 x l40s"),
        (["serve", "--tp", "x"], "argument --tp: invalid int value"),
        (["serve", "--time-scale", "0"], "must be positive"),
        (["launch"], "invalid choice"),
    ],
)
def test_bad_arguments_exit_2_with_one_line(argv, message, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1
