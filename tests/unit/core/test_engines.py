"""What tokenyard reads back from an engine's command line (tokenyard.core.engines)."""

import pytest
from tokenyard.core import engines


@pytest.mark.parametrize(
    ("kind", "args", "expected"),
    [
        ("vLLM", ["--max-num-seqs=64", "--trust-remote-code"], 64),
        ("vLLM", ["--max-num-seqs", "16"], 16),
        ("vLLM", ["--max_num_seqs=8"], 8),  # vLLM's parser takes underscores too
        ("vLLM", ["--max-num-seqs=4", "--max-num-seqs=12"], 12),  # the last one wins, as in argparse
        ("vLLM", ["--max-running-requests=9"], None),  # SGLang's flag means nothing to vLLM
        ("SGLang", ["--max-running-requests", "32"], 32),
        ("SGLang", ["--max-num-seqs=32"], None),
        ("Custom", ["--max-num-seqs=5"], 5),
        ("vLLM", [], None),
        ("vLLM", ["--max-num-seqs=many"], None),
        ("vLLM", ["--max-num-seqs=0"], None),
        ("vLLM", ["--max-num-seqs"], None),  # no value: the engine would refuse to start
        ("TensorRT", ["--max-num-seqs=8"], None),  # a kind tokenyard does not know
    ],
)
def test_the_batch_size_the_engine_args_configure(kind, args, expected):
    assert engines.configured_batch_size(kind, args) == expected
