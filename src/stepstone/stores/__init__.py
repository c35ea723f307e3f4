"""The built-in backends, one module each: ``memory``, ``file``, ``sqlite``, ``cosmos``.

They are imported lazily by ``open_store``; import a module directly to use its class.
"""
