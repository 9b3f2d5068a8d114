"""Negative counts are ValueErrors that name the argument, wherever a count is taken."""

from __future__ import annotations

import pytest

import creditflow as cf


@pytest.mark.parametrize("name", ["exclusive_buffers", "floating_buffers"])
def test_negative_buffer_counts_are_value_errors(name: str) -> None:
    with pytest.raises(ValueError, match=name):
        cf.NetworkEnvironment(**{name: -1})


def test_negative_subpartition_counts_and_indices_are_value_errors() -> None:
    with cf.NetworkEnvironment() as env:
        with pytest.raises(ValueError, match="num_subpartitions"):
            env.create_partition("p", -2)
        with pytest.raises(ValueError, match="subpartition"):
            cf.ChannelSpec(env.address, "p", -1)
