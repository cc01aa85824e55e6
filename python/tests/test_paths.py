"""A path with a NUL character is refused with lockstep.Error, never saved to or read from the
path cut short at the NUL (src/util/files.h)."""
import pytest

import lockstep


def test_a_path_with_a_nul_is_an_error_not_a_shorter_path(tmp_path):
    cut = tmp_path / "a"
    with_nul = str(cut) + "\0b"
    tensors = {"w": lockstep.ones([2, 2])}
    with pytest.raises(lockstep.Error, match="NUL character"):
        lockstep.save_file(tensors, with_nul)
    model = lockstep.nn.Linear(2, 2)
    with pytest.raises(lockstep.Error, match="NUL character"):
        lockstep.save_checkpoint(with_nul, model)
    assert not cut.exists()
    lockstep.save_file(tensors, str(cut))
    with pytest.raises(lockstep.Error, match="NUL character"):
        lockstep.load_file(with_nul)
    with pytest.raises(lockstep.Error, match="NUL character"):
        lockstep.load_checkpoint(with_nul, model)
