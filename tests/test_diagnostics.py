import numpy as np
import torch

from flower_pfl.engine.attention_log import AttentionAccumulator
from flower_pfl.reports.diagnostics import label_grouping, save_attention


def test_running_mean_per_pair_by_hand(tmp_path):
    acc = AttentionAccumulator()
    acc.add(["a", "b"], {"w": torch.tensor([[0.6, 0.4], [0.2, 0.8]]), "b": torch.eye(2)})
    acc.add(["b", "c"], {"w": torch.tensor([[1.0, 0.0], [0.5, 0.5]]), "b": torch.eye(2)})
    ids, means = acc.mean()
    mean = means["w"]
    assert ids == ["a", "b", "c"]
    assert np.allclose(mean[0, :2], [0.6, 0.4]) and np.isnan(mean[0, 2])  # a and c never met
    assert np.isclose(mean[1, 1], (0.8 + 1.0) / 2)  # b with itself in both rounds
    assert np.allclose(mean[2, 1:], [0.5, 0.5])
    save_attention(acc, tmp_path / "attention", title="t")
    assert (tmp_path / "attention.png").stat().st_size > 1000
    saved = np.load(tmp_path / "attention.npz")
    assert np.array_equal(saved["ids"], ["a", "b", "c"]) and np.allclose(np.diag(saved["b"]), 1.0)


def test_rank_orders_rows_and_columns(tmp_path):
    acc = AttentionAccumulator()
    acc.add([10, 20], {"w": torch.tensor([[0.9, 0.1], [0.3, 0.7]])})
    ids, means = acc.mean(rank={10: 1, 20: 0})
    assert ids == [20, 10] and np.allclose(means["w"], [[0.7, 0.3], [0.1, 0.9]])
    save_attention(acc, tmp_path / "a", rank={10: 1, 20: 0})
    assert np.load(tmp_path / "a.npz")["rank"].tolist() == [0, 1]


def test_label_grouping_by_hand():
    sim = np.array([[1.0, 0.9, 0.1], [0.9, 1.0, 0.2], [0.1, 0.2, 1.0]])
    mask = np.array([[True, True, False], [True, True, False], [False, False, True]])
    stats = label_grouping(sim, mask, [3, 3, 5])
    assert stats["kept_same_label"] == 1.0 and stats["kept_pairs"] == 2
    assert stats["chance_same_label"] == 2 / 6
    assert stats["mean_similarity_same_label"] == 0.9 and np.isclose(stats["mean_similarity_other_label"], 0.15)


def test_label_set_and_strongest_partner_by_hand():
    from flower_pfl.reports.diagnostics import label_set, strongest_partner_agreement

    assert label_set([50, 45, 5, 0]) == (0, 1) and label_set([0, 0]) == ()
    mean = np.array([[0.5, 0.3, 0.2, np.nan],
                     [0.1, 0.6, 0.05, 0.25],
                     [0.2, 0.1, 0.4, 0.3],
                     [np.nan, 0.0, np.nan, 1.0]])  # client 3 met only client 1
    groups = [(0, 1), (0, 1), (2, 3), (2, 3)]
    stats = strongest_partner_agreement(mean, groups)
    # strongest partners: 0 -> 1 (same), 1 -> 3 (other), 2 -> 3 (same), 3 -> 1 (other)
    assert stats["strongest_same_group"] == 0.5 and stats["clients"] == 4
    assert np.isclose(stats["chance_same_group"], (1 / 2 + 1 / 3 + 1 / 3 + 0) / 4)


def test_every_round_is_kept_and_saved(tmp_path):
    acc = AttentionAccumulator()
    acc.add([7, 8], {"w": torch.tensor([[0.9, 0.1], [0.4, 0.6]])})
    acc.add([9, 7, 8], {"w": torch.full((3, 3), 1 / 3)})
    acc.save_rounds(tmp_path / "rounds")
    saved = np.load(tmp_path / "rounds.npz")
    assert saved["ids"].tolist() == [["7", "8", ""], ["9", "7", "8"]] and saved["num_participants"].tolist() == [2, 3]
    assert np.allclose(saved["w"][0, :2, :2], [[0.9, 0.1], [0.4, 0.6]]) and np.isnan(saved["w"][0, 2]).all()
    assert np.allclose(saved["w"][1], 1 / 3)
