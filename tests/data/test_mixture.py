"""data.mixture: sources drawn by weight, deterministically, resumably, split across processes.

Each synthetic source is ``arange`` shifted into a range of its own, so a row's first token
says which source it came from and where.
"""

from __future__ import annotations

import numpy as np
import pytest

from theseus.config import ConfigError
from theseus.data.config import DataConfig
from theseus.data.dataset import open_dataset
from theseus.data.loader import Loader, Windows
from theseus.data.mixture import BLOCK, MixtureWindows, block_counts

SEQ, SPAN = 16, 100_000  # source k's tokens are k * SPAN + arange(size)
SIZES = (3000, 5000, 800)


def sources(n: int, seed: int = 0) -> list[Windows]:
    return [Windows(k * SPAN + np.arange(SIZES[k]), SEQ, 1, seed) for k in range(n)]


def mixture(weights, batch_size=16, seed=0, index=0, count=1) -> MixtureWindows:
    return MixtureWindows(sources(len(weights), seed), weights, batch_size, seed, index, count)


def source_of(rows: np.ndarray) -> np.ndarray:
    return rows[..., 0] // SPAN


@pytest.mark.parametrize("weights", [(0.7, 0.3), (0.5, 0.3, 0.2), (3.0, 1.0)])
def test_over_200_batches_each_share_is_within_2_percent_of_its_weight(weights):
    windows = mixture(weights)
    drawn = source_of(np.concatenate([windows.batch(step * 16) for step in range(200)]))
    shares = np.bincount(drawn, minlength=len(weights)) / len(drawn)
    np.testing.assert_allclose(shares, np.array(weights) / sum(weights), atol=0.02)


def test_every_block_holds_the_exact_counts_and_batches_mix_the_sources():
    weights = (0.5, 0.3, 0.2)
    windows = mixture(weights, batch_size=BLOCK // 4)
    counts = block_counts(np.array(weights))
    assert counts.sum() == BLOCK and list(counts) == [512, 307, 205]
    for block in range(3):
        drawn = source_of(np.concatenate([windows.batch(block * BLOCK + i * BLOCK // 4) for i in range(4)]))
        np.testing.assert_array_equal(np.bincount(drawn), counts)
    first = source_of(windows.batch(0))
    assert len(set(first[:16].tolist())) > 1  # drawn in a shuffled order, not source by source


def test_each_source_is_read_in_its_own_epoch_order():
    """The k-th row drawn from a source is window k of that source's own shuffled stream."""
    windows = mixture((0.6, 0.4), seed=3)
    rows = np.concatenate([windows.batch(step * 16) for step in range(300)])
    for k, alone in enumerate(sources(2, seed=3)):
        mine = rows[source_of(rows) == k]
        np.testing.assert_array_equal(mine, alone.rows(np.arange(len(mine))))
        assert len(mine) > alone.per_epoch  # past an epoch boundary


def test_batches_are_a_function_of_seed_and_position():
    a, b, c = (np.stack([mixture((0.7, 0.3), seed=s).batch(p) for p in (0, 16, 4096)]) for s in (0, 0, 1))
    np.testing.assert_array_equal(a, b)
    assert not np.array_equal(a, c)
    late = mixture((0.7, 0.3))
    np.testing.assert_array_equal(late.batch(4096), a[2])  # random access: no history needed


def test_processes_read_disjoint_shares_of_each_global_batch():
    whole = Loader.over(mixture((0.7, 0.3), batch_size=16), prefetch=0)
    parts = [Loader.over(mixture((0.7, 0.3), batch_size=8, index=p, count=2), prefetch=0) for p in range(2)]
    for _ in range(30):
        np.testing.assert_array_equal(next(whole), np.concatenate([next(part) for part in parts]))


@pytest.mark.parametrize("prefetch", [0, 4])
def test_a_restored_loader_continues_bit_for_bit(prefetch):
    straight = Loader.over(mixture((0.7, 0.3)), prefetch=prefetch)
    expected = [next(straight) for _ in range(40)]
    first = Loader.over(mixture((0.7, 0.3)), prefetch=prefetch)
    seen = [next(first) for _ in range(17)]
    state = first.get_state()
    resumed = Loader.over(mixture((0.7, 0.3)), prefetch=prefetch)
    resumed.set_state(state)
    seen += [next(resumed) for _ in range(23)]
    np.testing.assert_array_equal(np.stack(seen), np.stack(expected))
    for loader in (straight, first, resumed):
        loader.close()


def test_a_state_of_other_weights_is_refused():
    state = Loader.over(mixture((0.7, 0.3)), prefetch=0).get_state()
    with pytest.raises(ConfigError, match=r"weights=\[0.7, 0.3\] \(this loader: \[0.5, 0.5\]\)"):
        Loader.over(mixture((0.5, 0.5)), prefetch=0).set_state(state)


def test_a_mixture_of_two_corpora_prepares_each_once_and_normalises_weights(tmp_path, config):
    for name, text in {"a.txt": "a" * 20000, "b.txt": "b" * 15000}.items():
        (tmp_path / name).write_text(text)
    spec = {"a": {"source": "text", "path": str(tmp_path / "a.txt"), "weight": 3},
            "b": {"source": "text", "path": str(tmp_path / "b.txt"), "weight": 1}}
    data = open_dataset(config(mixture=spec))
    assert data.weights == {"a": 0.75, "b": 0.25}
    alone = open_dataset(config(source="text", path=str(tmp_path / "a.txt")))
    assert data.sources["a"].folder == alone.folder  # the same cache folder as the source alone
    assert len(list((tmp_path / "cache").iterdir())) == 2
    rows = next(data.loader("train", 8, 64, seed=0, prefetch=0))
    from_a = (rows == ord("a")).any(axis=1)
    assert np.all(from_a != (rows == ord("b")).any(axis=1))  # each row is from one source
    assert abs(from_a.mean() - 0.75) < 0.1


@pytest.mark.parametrize("entry, message", [
    ({"source": "text", "path": "a.txt", "weight": -0.5},
     "data.mixture.web.weight must be positive, got -0.5: drop the source, or give it a share"),
    ({"source": "text", "path": "a.txt", "weight": 0}, "data.mixture.web.weight must be positive, got 0"),
    ({"source": "text", "path": "a.txt"}, "data.mixture.web.weight must be a positive number, got None"),
    ({"source": "web", "path": "a.txt", "weight": 1},
     "data.mixture.web.source='web' is not a source: use one of stdlib, text, shards"),
    ({"source": "text", "weight": 1}, "data.mixture.web.path is missing: source text reads a file, folder or glob"),
    ({"source": "text", "path": "a.txt", "weight": 1, "tokenizer": "bpe"},
     "data.mixture.web.tokenizer is not a mixture key: a source takes only source, path, weight, text_field, split"),
    ("a.txt", "data.mixture.web must be a mapping of source, path and weight"),
])
def test_a_bad_source_is_one_line_naming_its_key(entry, message, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "a.txt").write_text("text")
    with pytest.raises(ConfigError) as err:
        DataConfig(mixture={"web": entry})
    assert message in str(err.value) and "\n" not in str(err.value)


def test_a_missing_path_is_refused_when_the_source_is_read(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    cfg = DataConfig(mixture={"web": {"source": "text", "path": "missing.txt", "weight": 1}})  # a plan reads no corpus
    with pytest.raises(ConfigError) as err:
        open_dataset(cfg)
    assert str(err.value) == "data.mixture.web.path=missing.txt does not exist: point it at a file, a folder or a glob"


def test_a_fitted_tokenizer_is_refused_for_a_mixture():
    with pytest.raises(ConfigError, match="data.mixture needs one tokenizer for every source, but data.tokenizer=char"):
        DataConfig(tokenizer="char", mixture={"s": {"source": "stdlib", "weight": 1}})
