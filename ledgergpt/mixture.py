"""
mixture.py: the arithmetic of a weighted mixture of data folders (docs/data.md, "Mixtures"): which
source each global sequence comes from. Standard library only: the ledger counts per-source tokens
with the very schedule data.MixtureStream reads by. The weights, in units of 1/1000 reduced by
their divisor (60/15/10/5/5/5: a period of 20), interleave by smooth weighted round-robin (nginx's
upstream balancer): at each position every source's credit grows by its units, and the richest is
taken and pays back the period; test_mixture.py measures the worst window.
"""

import math

from ledgergpt.config import MIXTURE_UNITS, data_sources

# 2^64 / golden ratio: Knuth's multiplicative hash, the seed -> the pattern's phase
GOLDEN = 0x9E3779B97F4A7C15


class Schedule:
    """The schedule for `data` (config.py's mixture text) and `seed`: locate(k) and drawn(n)."""

    def __init__(self, data, seed):
        self.folders, weights = map(list, zip(*data_sources(data)))
        # a short name per folder for logs: its last path component, or all of it if not unique
        last = [folder.rstrip('/').split('/')[-1] or folder for folder in self.folders]
        self.names = [n if last.count(n) == 1 else folder for n, folder in zip(last, self.folders)]
        # none is 0: config.mixture_text checks
        units = [round(weight * MIXTURE_UNITS) for weight in weights]
        self.units = [unit // math.gcd(*units) for unit in units]
        self.period = sum(self.units)
        # the weights the schedule draws by, exactly
        self.weights = [unit / self.period for unit in self.units]
        self.pattern, credit = [], [0] * len(self.units)
        for _ in range(self.period):  # smooth weighted round-robin: ties go to the first source
            credit = [c + u for c, u in zip(credit, self.units)]
            chosen = credit.index(max(credit))
            credit[chosen] -= self.period
            self.pattern.append(chosen)
        self.before = [[0] * len(self.units)]  # before[i][s]: source s's turns in pattern[:i]
        for chosen in self.pattern:
            self.before.append([c + (s == chosen) for s, c in enumerate(self.before[-1])])
        self.offset = (seed * GOLDEN) % 2**64 % self.period

    def _turns(self, m):
        """Each source's turns in positions [0, m) of the unshifted pattern."""
        periods, rest = divmod(m, self.period)
        return [periods * unit + part for unit, part in zip(self.units, self.before[rest])]

    def drawn(self, n):
        """Sequences each source gives to global positions 0 .. n-1."""
        return [b - a for a, b in zip(self._turns(self.offset), self._turns(self.offset + n))]

    def locate(self, k):
        """(source, j): global sequence k is sequence j of source `source`'s own stream."""
        source = self.pattern[(k + self.offset) % self.period]
        return source, self.drawn(k)[source]
