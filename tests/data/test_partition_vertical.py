"""Vertical partitioners: column splits over guest + hosts, sample overlap, per-party CSVs."""
import numpy as np
import pandas as pd
import pytest

from secureflhv.data import DataError, load_party_csv, load_sklearn, vertical_split, write_vertical_csvs

BC = load_sklearn("breast_cancer")  # 569 x 30


def test_even_split_contiguous_blocks_cover_columns():
    vp = vertical_split(BC, 2, "even", seed=0)
    assert vp.parties == ["guest", "host_1", "host_2"]
    np.testing.assert_array_equal(np.concatenate(vp.columns), np.arange(30))
    assert [len(c) for c in vp.columns] == [10, 10, 10]
    assert vp.column_names[1] == BC.feature_names[10:20]


def test_random_split_disjoint_and_seeded():
    a, b, c = (vertical_split(BC, 3, "random", seed=s) for s in (1, 1, 2))
    allc = np.concatenate(a.columns)
    assert sorted(allc.tolist()) == list(range(30))
    assert all(np.array_equal(x, z) for x, z in zip(a.columns, b.columns))
    assert not all(np.array_equal(x, z) for x, z in zip(a.columns, c.columns))
    assert not np.array_equal(np.concatenate(a.columns), np.arange(30))


def test_explicit_lists_by_index_and_name():
    names = BC.feature_names
    vp = vertical_split(BC, 1, "explicit", columns=[[0, 1, names[5]], [names[7], 29]])
    assert vp.columns[0].tolist() == [0, 1, 5] and vp.columns[1].tolist() == [7, 29]
    with pytest.raises(ValueError, match="columns for host_1: feature 'nope'"):
        vertical_split(BC, 1, "explicit", columns=[[0], ["nope"]])
    with pytest.raises(ValueError, match="columns must give 3"):
        vertical_split(BC, 2, "explicit", columns=[[0], [1]])
    with pytest.raises(ValueError, match="index 30"):
        vertical_split(BC, 1, "explicit", columns=[[0], [30]])


def test_overlap_shares_a_fraction_of_columns():
    vp = vertical_split(BC, 2, "overlap", seed=3, shared_fraction=0.2)
    assert len(vp.shared_columns) == 6
    for cols in vp.columns:
        assert set(vp.shared_columns.tolist()) <= set(cols.tolist())
    private = [set(c.tolist()) - set(vp.shared_columns.tolist()) for c in vp.columns]
    assert not (private[0] & private[1]) and not (private[1] & private[2])
    assert set().union(*private) | set(vp.shared_columns.tolist()) == set(range(30))
    with pytest.raises(ValueError, match="shared_fraction"):
        vertical_split(BC, 2, "overlap", shared_fraction=0.0)


def test_sample_overlap_hosts_hold_part_of_guest_ids():
    vp = vertical_split(BC, 2, "even", seed=4, sample_overlap=0.7)
    assert len(vp.rows[0]) == 569
    for h in (1, 2):
        assert len(vp.rows[h]) == round(0.7 * 569)
        assert set(vp.ids[h].tolist()) <= set(vp.ids[0].tolist())
        assert len(np.unique(vp.rows[h])) == len(vp.rows[h])
    assert not np.array_equal(vp.rows[1], vp.rows[2])
    common = vp.common_rows()
    expect = set(vp.rows[1].tolist()) & set(vp.rows[2].tolist())
    assert set(common.tolist()) == expect
    # row order is shuffled per party: ids do not line up positionally
    assert not np.array_equal(np.sort(vp.rows[0]), vp.rows[0])
    assert vp.ids[0].dtype.kind == "U" and vp.ids[0][0].startswith("id")


def test_bad_vertical_inputs():
    with pytest.raises(ValueError, match="n_hosts"):
        vertical_split(BC, 0)
    with pytest.raises(ValueError, match="n_hosts=30"):
        vertical_split(BC, 30)
    with pytest.raises(ValueError, match="sample_overlap"):
        vertical_split(BC, 1, sample_overlap=0.0)
    with pytest.raises(ValueError, match="scheme 'zig'"):
        vertical_split(BC, 1, "zig")


def test_write_and_load_party_csvs_roundtrip(tmp_path):
    vp = vertical_split(BC, 2, "random", seed=5, sample_overlap=0.8)
    paths = write_vertical_csvs(BC, vp, tmp_path)
    assert set(paths) == {"guest", "host_1", "host_2"}
    guest = load_party_csv(paths["guest"], id_column="id", label_column="y")
    np.testing.assert_array_equal(guest.ids, vp.ids[0])
    np.testing.assert_array_equal(guest.X, BC.X[vp.rows[0]][:, vp.columns[0]])  # exact floats
    np.testing.assert_array_equal(guest.y, BC.y[vp.rows[0]])
    assert guest.feature_names == vp.column_names[0]
    host = load_party_csv(paths["host_1"], id_column="id")
    assert host.y is None and host.ids.dtype.kind == "U"
    np.testing.assert_array_equal(host.X, BC.X[vp.rows[1]][:, vp.columns[1]])
    assert "y" not in pd.read_csv(paths["host_1"]).columns
    with pytest.raises(DataError, match=r"host_2\.csv: label_column 'y' not found"):
        load_party_csv(paths["host_2"], id_column="id", label_column="y")
    with pytest.raises(DataError, match="id_column 'uid' not found"):
        load_party_csv(paths["host_2"], id_column="uid")


def test_ids_keep_leading_zeros_as_strings(tmp_path):
    p = tmp_path / "p.csv"
    p.write_text("id,a,b\n007,1.5,2\n010,3,4\n")
    ds = load_party_csv(p, id_column="id")
    assert ds.ids.tolist() == ["007", "010"]
    p2 = tmp_path / "dup.csv"
    p2.write_text("id,a\n1,1\n1,2\n")
    with pytest.raises(DataError, match="duplicate ids"):
        load_party_csv(p2, id_column="id")
