"""The command-line tools, and :mod:`tools.workshop`, the developer tooling several of them share.
A regular package, so that ``tools.workshop`` is this folder's even where another ``tools`` is
installed; the checkout's environment (``make install``) has the checkout on its path."""
