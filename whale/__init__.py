"""WHALE on Kubernetes. Importing the package imports nothing else: `whale --version` (:mod:`whale.__main__`)
answers without loading the command line."""

#: the distribution whose version `whale --version` prints
DISTRIBUTION = "whale-k8s"


def version() -> str:
    """The installed version (`whale --version`); imports nothing else of whale."""
    from importlib import metadata

    try:
        return metadata.version(DISTRIBUTION)
    except metadata.PackageNotFoundError:
        return "unknown (not installed: run `make install`)"
