"""shoal's event backbone: the catalogue, subjects, codec, State and the pure fold.

Pure data and the JetStream log adapter only: no mlx, no web framework here.
"""
