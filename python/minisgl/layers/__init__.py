"""The ops a model is built from: plain objects holding tensors (``BaseOP``), not ``nn.Module``.

Import each op from its own module (``minisgl.layers.linear`` ...), so that adding an op adds a file
and changes none.
"""
