"""ledgergpt's modules, shared by the commands at the top level (train, prepare, ledger, sample,
export, evals, bench) and model.py. Standard library only here: `python ledger.py` runs in a bare
Python."""
