"""EpochSampler: determinism, epochs, drop-last, and exact resume."""

import pytest

from grpo_dist.data import EpochSampler


def take(sampler, k):
    return [next(sampler) for _ in range(k)]


def test_same_seed_same_batches_different_seed_different():
    a = take(EpochSampler(10, 3, seed=1, shuffle=True), 9)
    b = take(EpochSampler(10, 3, seed=1, shuffle=True), 9)
    c = take(EpochSampler(10, 3, seed=2, shuffle=True), 9)
    assert a == b
    assert a != c


def test_each_epoch_is_a_new_permutation_with_the_tail_dropped():
    s = EpochSampler(10, 3, seed=0, shuffle=True)
    assert s.steps_per_epoch == 3
    epochs = [take(s, 3) for _ in range(3)]
    for batches in epochs:
        flat = [i for b in batches for i in b]
        assert all(len(b) == 3 for b in batches)
        assert len(set(flat)) == 9 and set(flat) <= set(range(10))  # one index left out per epoch
    assert epochs[0] != epochs[1] != epochs[2]
    assert s.epoch == 3 and s.step_in_epoch == 0


def test_no_shuffle_is_in_order():
    s = EpochSampler(5, 2, seed=0, shuffle=False)
    assert take(s, 4) == [[0, 1], [2, 3], [0, 1], [2, 3]]


@pytest.mark.parametrize("consumed", [0, 1, 2, 3, 4, 5, 7])  # 3 and 6 are epoch boundaries
def test_resume_continues_with_the_same_batches(consumed):
    reference = take(EpochSampler(11, 3, seed=5, shuffle=True), 12)
    first = EpochSampler(11, 3, seed=5, shuffle=True)
    done = take(first, consumed)
    state = first.state_dict()
    resumed = EpochSampler(11, 3, seed=5, shuffle=True)
    resumed.load_state_dict(state)
    assert done + take(resumed, 12 - consumed) == reference


def test_state_saved_at_end_of_epoch_moves_to_next_epoch():
    s = EpochSampler(6, 3, seed=0, shuffle=True)
    s.load_state_dict({"epoch": 0, "step_in_epoch": 2})
    assert (s.epoch, s.step_in_epoch) == (1, 0)
    reference = EpochSampler(6, 3, seed=0, shuffle=True)
    assert next(s) == take(reference, 3)[2]


def test_resume_refuses_changed_data_or_settings():
    s = EpochSampler(10, 3, seed=0, shuffle=True)
    state = s.state_dict()
    other = EpochSampler(9, 3, seed=0, shuffle=True)
    with pytest.raises(ValueError, match="num_samples: saved 10, now 9"):
        other.load_state_dict(state)


def test_dataset_smaller_than_batch():
    with pytest.raises(ValueError, match="data.train_batch_size=8"):
        EpochSampler(5, 8, seed=0, shuffle=True)
