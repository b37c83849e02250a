"""embedding: rows of a constant table for int32 ids, against ``torch.nn.functional.embedding``
on the table rounded to the graph dtype (the op stores it so): a lookup moves data, so the
outputs are equal bit for bit."""

from __future__ import annotations

import numpy as np
import pytest

from trtcore import ops

from .conftest import DTYPES, NP_DTYPES, OneOp, as_float64, builds_rtx


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", [((2, 7), 50, 16), ((9,), 32, 8), ((1, 1), 1, 4), ((3, 1), 1000, 1)],
                         ids=lambda c: f"ids{c[0]}-V{c[1]}-H{c[2]}")
def test_embedding_matches_torch(case: tuple, dtype: str, rng: np.random.Generator) -> None:
    import torch

    ids_shape, vocab, hidden = case
    table = rng.standard_normal((vocab, hidden))  # float64; the op converts to the graph dtype
    ids = rng.integers(0, vocab, ids_shape).astype(np.int32)
    ids.flat[0] = vocab - 1  # the last row is reachable
    stored = table.astype(NP_DTYPES[dtype])
    want = torch.nn.functional.embedding(torch.from_numpy(ids.astype(np.int64)), torch.from_numpy(as_float64(stored))).numpy()
    net = OneOp(lambda g, i: ops.embedding(g, i["input_ids"], table), {"input_ids": ids}, dtype=dtype,
                dynamic={"input_ids": range(len(ids_shape))})
    got = net.run()["out"]
    assert got.dtype == NP_DTYPES[dtype]
    np.testing.assert_array_equal(as_float64(got), want)  # exact: every stored value is a float64 too
    if builds_rtx(dtype, case[0] == (2, 7)):
        [(_, shape, _)] = net.check_rtx()
        assert shape == (-1,) * len(ids_shape) + (hidden,)
