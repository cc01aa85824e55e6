"""Copies a submodule of the extension module into a package module's namespace."""


def reexport(namespace, ext_module):
    names = []
    for name in dir(ext_module):
        if name.startswith("__"):
            continue
        namespace[name] = getattr(ext_module, name)
        if not name.startswith("_"):
            names.append(name)
    return names
