"""Group-relative advantages and the DAPO group filter against hand-computed numbers."""

import pytest
import torch

from tokengrad.objective.advantages import ADVANTAGE_SCALES, compute_advantages, keep_groups


def _t(rows):
    return torch.tensor(rows, dtype=torch.float64)


def test_group_scale_hand_values():
    # group [1, 0, 0, 1]: mean 0.5, centred [.5, -.5, -.5, .5];
    # unbiased std = sqrt((4 * 0.25) / 3) = 0.5773503; 0.5 / (0.5773503 + 1e-6) = 0.8660239
    adv = compute_advantages(_t([[1, 0, 0, 1]]))
    torch.testing.assert_close(adv, _t([[0.8660239, -0.8660239, -0.8660239, 0.8660239]]), atol=1e-6, rtol=0)
    # group [2, 4, 9]: mean 5, centred [-3, -1, 4]; unbiased var = (9 + 1 + 16) / 2 = 13, std 3.6055513
    # -> [-3, -1, 4] / 3.6055523 = [-0.8320501, -0.2773500, 1.1094001]
    adv = compute_advantages(_t([[2, 4, 9]]))
    torch.testing.assert_close(adv, _t([[-0.8320501, -0.2773500, 1.1094001]]), atol=1e-6, rtol=0)


def test_none_scale_is_centred_rewards():
    # Dr. GRPO: [2, 4, 9] - 5 = [-3, -1, 4]; [1, 0] - 0.5 = [0.5, -0.5]
    torch.testing.assert_close(compute_advantages(_t([[2, 4, 9]]), scale="none"), _t([[-3, -1, 4]]))
    torch.testing.assert_close(compute_advantages(_t([[1, 0]]), scale="none"), _t([[0.5, -0.5]]))


def test_batch_scale_uses_batch_std():
    # group means [0.5, 3] -> centred [[.5, -.5], [0, 0]]; batch rewards [1, 0, 3, 3], mean 1.75,
    # squared deviations .5625 + 3.0625 + 1.5625 + 1.5625 = 6.75, unbiased var 6.75 / 3 = 2.25, std 1.5
    adv = compute_advantages(_t([[1, 0], [3, 3]]), scale="batch", eps=0.0)
    torch.testing.assert_close(adv, _t([[1 / 3, -1 / 3], [0, 0]]))


@pytest.mark.parametrize("scale", sorted(ADVANTAGE_SCALES))
def test_group_of_size_one_gets_zero(scale):
    # one completion per prompt: the reward equals its group mean, so the advantage is 0, not NaN
    adv = compute_advantages(_t([[5.0], [3.0]]), scale=scale)
    assert torch.equal(adv, _t([[0.0], [0.0]]))


def test_all_equal_group_gets_zero_and_others_unaffected():
    # [1, 1, 1]: centred 0, std 0 -> 0 / (0 + 1e-6) = 0; [0, 1, 1]: mean 2/3, centred [-2/3, 1/3, 1/3],
    # unbiased var = (4/9 + 1/9 + 1/9) / 2 = 1/3, std 0.5773503 -> [-1.1547005, 0.5773503, 0.5773503]
    adv = compute_advantages(_t([[1, 1, 1], [0, 1, 1]]))
    torch.testing.assert_close(adv, _t([[0, 0, 0], [-1.1547005, 0.5773503, 0.5773503]]), atol=2e-6, rtol=0)


def test_keep_groups_drops_uniform_groups():
    rewards = _t([[1, 0, 1], [1, 1, 1], [0, 0, 0], [0.5, 0.5, 0.25]])
    assert keep_groups(rewards).tolist() == [True, False, False, True]
    assert keep_groups(_t([[1.0], [0.0]])).tolist() == [False, False]  # size-1 groups carry no signal


def test_bad_inputs_raise():
    with pytest.raises(ValueError, match=r"known advantage scales: \['batch', 'group', 'none'\]"):
        compute_advantages(_t([[1, 0]]), scale="std")
    with pytest.raises(ValueError, match=r"\[B, G\].*\[4\]"):
        compute_advantages(_t([1, 0, 1, 0]))
    with pytest.raises(ValueError, match="NaN"):
        keep_groups(_t([[1, float("nan")]]))
