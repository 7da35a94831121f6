"""The version every manifest and command line records (one place; ``shardmaker.__version__``)."""

__version__ = "0.1.0"
