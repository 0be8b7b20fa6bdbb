"""topo's version: what a saved plan records, and what ``topo --version`` prints."""
__version__ = "0.1.0"
