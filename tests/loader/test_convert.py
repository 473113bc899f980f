import numpy as np
import torch

from dalistream.loader import BufferPool


def test_a_released_buffer_is_reused():
    pool = BufferPool()
    first = pool.get("image", (4, 3), torch.float32)
    ptr = first.data_ptr()
    del first
    assert pool.get("image", (4, 3), torch.float32).data_ptr() == ptr


def test_buffers_still_referenced_are_never_reused():
    pool = BufferPool(keep=8)
    held = pool.get("x", (4, 3), torch.float32)            # the loop still holds the batch
    owner = pool.get("x", (4, 3), torch.float32)
    view = owner[1:]                                       # a view keeps the storage
    taken = {held.data_ptr(), owner.data_ptr()}
    del owner
    owner = pool.get("x", (4, 3), torch.float32)
    alias = owner.numpy()                                  # so does a NumPy alias
    taken.add(owner.data_ptr())
    del owner
    owner = pool.get("x", (4, 3), torch.float32).requires_grad_(False)
    loss = torch.nn.Linear(3, 1)(owner).sum()              # autograd saves the input for backward
    taken.add(owner.data_ptr())
    del owner
    assert len(taken) == 4
    assert pool.get("x", (4, 3), torch.float32).data_ptr() not in taken
    assert view.shape == (3, 3) and alias.shape == (4, 3) and loss.requires_grad


def test_other_shapes_get_their_own_buffer():
    pool = BufferPool()
    a = pool.get("x", (2,), torch.int64)
    del a
    assert pool.get("x", (3,), torch.int64).shape == (3,)
    assert pool.get("y", (3,), torch.float32).dtype == torch.float32
    np.testing.assert_equal(len(pool.pools["x"]), 2)
