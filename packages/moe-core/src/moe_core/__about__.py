__version__ = "0.2.0"

# Plugin API (major, minor): a plugin built for (major, m) works with core (major, M >= m).
PLUGIN_API = (1, 1)
