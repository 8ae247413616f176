"""Drop-in adapters for frameworks users already run (docs/integrations.md).

Each submodule plugs sunroom kernels into one framework's own seam, and needs that framework
installed (an extra of its name); importing this package imports none of them.
"""
