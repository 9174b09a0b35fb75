"""The figures of every analysis: pure functions of a result Dataset, in one style."""
