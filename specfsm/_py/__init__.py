"""The pure-Python twin of the compiled core: the same modules, names and behaviour."""
