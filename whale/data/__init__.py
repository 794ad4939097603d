"""The paper's full datasets: resumable, checksummed downloads (``whale.data.fetch``) and their
preparation into a store's splits (``whale.data.full``). ``spec.experiment.data.source: full`` selects them;
the shipped sample files stay the default (docs/data.md)."""
