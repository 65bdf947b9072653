"""Shared pytest fixtures."""

import os

import pytest

import prepare


@pytest.fixture(scope='session', autouse=True)
def device_cache(tmp_path_factory):
    """The ledger's GEMM probes are cached per machine (sums.cache_path): the tests keep theirs in a folder of
    their own, shared by the processes they start, instead of the user's ~/.cache."""
    os.environ['XDG_CACHE_HOME'] = str(tmp_path_factory.mktemp('cache'))


@pytest.fixture(scope='session')
def pystdlib_data(tmp_path_factory):
    """Path (str) of a small prepared pystdlib data folder, built once per test session in about a second:
    150 of the standard library's .py files (11 of them val), our own BPE with a 512-token vocab,
    ~1.1M train + ~41K val tokens (uint16 shards, tokenizer.json, meta.json)."""
    out = str(tmp_path_factory.mktemp('pystdlib_data'))
    prepare.prepare_pystdlib(out, tokenizer='bpe:512', workers=2, max_files=150)
    return out
