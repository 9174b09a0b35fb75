"""The measurements: the collapse metrics and their inputs and norms, the attention and
activation statistics, the frozen path network, the paper's bounds and their norms, the
statistics a result's figures print, and the one check for a forward pass that
overflowed."""
